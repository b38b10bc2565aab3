"""The worker loops: wake due timers (sleeps, retry delays, wait timeouts, signals), recover runs
whose driver died (their lease lapsed), and drive them with bounded concurrency.

Polling the journal is the safety net that makes several worker processes on one database
cooperate; between polls the worker sleeps only until the next timer it knows of. A lease
decides which worker drives a run, so two workers may both see a run as due and only one
drives it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import os
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from functools import partial

from qjsflow.runner.bindings import Bindings
from qjsflow.runner.config import Retention
from qjsflow.runner.engine.drive import RunDriver
from qjsflow.runner.errors import JournalUnavailable
from qjsflow.runner.store import (
    WORKER_BEAT_MS,
    JournalStore,
    JournalTransaction,
    RunStatus,
    WorkerRecord,
)
from qjsflow.runner.telemetry.metrics import METRICS
from qjsflow.runner.tenancy.flow_gates import admit_due
from qjsflow.runner.tenancy.scopes import split_run_key

__all__ = ["Worker", "worker_command"]

_log = logging.getLogger("qjsflow.worker")
# Prunes the runs that ended before a time under a retention setting: (runs, snapshots) pruned.
Pruner = Callable[[int, Retention], Awaitable[tuple[int, int]]]
IDLE_HORIZON_MS = 1000
_BLOCKED_LOOKED_AT = 100  # blocked runs looked at per claim


def _doubled(delay_s: float, first_s: float, cap_s: float) -> float:
    """The next wait of a back-off: twice the last (the first: `first_s`), at most `cap_s`."""
    return min(cap_s, max(first_s, delay_s * 2))


class _Backoff:
    """Exponential back-off while the journal cannot be written, capped, logged once a wait."""

    first_s = 0.5
    cap_s = 30.0

    def __init__(self) -> None:
        self.delay_s = 0.0
        self.pending: JournalUnavailable | None = None
        self.waits = 0  # for tests and operators: how many times the worker backed off

    def failed(self, error: JournalUnavailable) -> None:
        self.pending = error

    def succeeded(self) -> None:
        self.delay_s = 0.0
        self.pending = None

    def take(self) -> float:
        """The wait before trying again, if a failure is pending; 0 otherwise."""
        if self.pending is None:
            return 0.0
        self.delay_s = _doubled(self.delay_s, self.first_s, self.cap_s)
        _log.warning("journal writes are failing (%s); retrying in %.1f s", self.pending,
                     self.delay_s)  # fmt: skip
        self.pending = None
        self.waits += 1
        return self.delay_s


class _Retries:
    """Runs whose drive failed in this worker's host (a bug, a damaged journal: not the run's
    own code, which fails the run). Such a run stays claimable; it is tried again after a
    delay that doubles from the poll interval up to a cap, not at once and forever with a
    traceback each time."""

    cap_s = 60.0
    _kept = 10_000  # runs remembered at most (a run another worker finished is never retried)

    def __init__(self, first_s: float) -> None:
        self.first_s = max(first_s, 0.05)
        self._due: dict[str, tuple[float, float]] = {}  # run -> (retry at, delay), monotonic

    def failed(self, run_id: str) -> float:
        """Note a failure; the delay before the run is tried again."""
        _, delay = self._due.pop(run_id, (0.0, 0.0))
        delay = _doubled(delay, self.first_s, self.cap_s)
        self._due[run_id] = (time.monotonic() + delay, delay)
        if len(self._due) > self._kept:  # the oldest first: dicts keep insertion order
            del self._due[next(iter(self._due))]
        return delay

    def succeeded(self, run_id: str) -> None:
        self._due.pop(run_id, None)

    def waiting(self, run_id: str) -> bool:
        """Whether the run's retry is not yet due."""
        due = self._due.get(run_id)
        return due is not None and due[0] > time.monotonic()


class Worker:
    def __init__(
        self,
        store: JournalStore,
        driver: RunDriver,
        bindings: Bindings,
        *,
        concurrency: int = 8,
        poll_interval_s: float = 0.2,
        shutdown_grace_s: float = 10.0,
        idle_horizon_ms: int = IDLE_HORIZON_MS,
        prune: Pruner | None = None,
        fire: Callable[[int], Awaitable[int]] | None = None,
        ready: Callable[[], None] | None = None,
        secret_providers: tuple[str, ...] = (),
    ) -> None:
        self.store = store
        self.driver = driver
        self.bindings = bindings
        self.concurrency = max(1, concurrency)
        self.poll_interval_s = poll_interval_s
        self.shutdown_grace_s = shutdown_grace_s
        # `until_idle` waits for timers due within this long (0 on a virtual clock, which
        # does not move while the worker waits: qjsflow.testing).
        self.idle_horizon_ms = idle_horizon_ms
        self.drives = 0
        self.untaken = 0  # claims whose lease could not be taken (nothing driven)
        self.backoff = _Backoff()
        self.retries = _Retries(poll_interval_s)
        self.pruned = 0  # runs this worker pruned under the retention setting
        # Pruning is an operation over the journal and the scope databases: handed in by the
        # runner (runner/operations/retention.py), so the engine depends on no operation.
        self.prune = prune
        # Fires the schedules due at a time (run clock, ms): handed in by the runner
        # (runner/operations/schedules.py), as pruning is.
        self.fire = fire
        self._next_fire = 0.0  # on the monotonic clock
        self._next_admit = 0.0
        self._gates_waiting = False  # whether the last look found runs still queued
        self.admitted = 0  # queued runs this worker's looks admitted
        # Called once, when the worker is registered in the journal and about to claim runs.
        self.ready = ready
        self._reported_kills: dict[str, int] = {}
        # Per scope: drives this worker gave it over its weight (see _fair_order).
        self._virtual: collections.defaultdict[str, float] = collections.defaultdict(float)
        self._next_report = 0.0  # on the monotonic clock
        self._next_census = 0.0
        self._next_prune = 0.0  # on the monotonic clock
        self.secret_providers = secret_providers
        self._next_beat: int | None = None  # on the run clock; None: not registered yet

    async def serve(self, *, until_idle: bool = False, stop: asyncio.Event | None = None) -> None:
        """Run until `stop` is set (then finish or release what is held), or, with
        `until_idle`, until nothing is in progress and no timer is due within a second."""
        stop = stop or asyncio.Event()
        tasks: dict[str, asyncio.Task[bool]] = {}
        # Set when a drive ends (or the journal tells of work), cleared as the worker begins
        # its looks (gates, then claims): whatever happens after that wakes the pause that
        # follows them, and keeps a worker run until idle from stopping on what it missed.
        ended = asyncio.Event()
        # Told by the journal of runs made claimable elsewhere (PostgreSQL's NOTIFY): it looks
        # at once, as after a drive's end; the poll stays a backstop.
        listening = self.store.listen(ended.set)
        try:
            while not stop.is_set():
                try:
                    await self._beat(_wall_ms())
                    now = self.driver.now_ms()
                    await self._report(now)
                    await self._prune(now)
                    await self._fire(now)
                    woken = ended.is_set()
                    ended.clear()
                    await self._admit(now, ended=woken)
                    claimable = await self._claim(tasks, ended, now)
                    if until_idle and not tasks and not claimable and not ended.is_set():
                        due = await self.store.next_due()
                        if due is None or due > now + self.idle_horizon_ms:
                            return
                    await self._pause(ended, stop, looked_at=now)
                except JournalUnavailable as error:
                    await self._back_off(error, stop)
                if self.backoff.pending is not None:
                    await self._back_off(None, stop)
        finally:
            if listening is not None:
                listening.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await listening
            await self._shut_down(tasks)
            if self._next_beat is not None:
                with contextlib.suppress(JournalUnavailable):
                    await self.store.transact(
                        partial(_beat, worker_id=self.driver.worker_id, now=_wall_ms(),
                                stopped=True),
                        durable=False,
                    )  # fmt: skip

    async def _beat(self, now: int) -> None:
        """Register this worker as it starts, then heart-beat every `WORKER_BEAT_MS` (on the
        wall clock, whatever clock runs use: liveness is the real world's): what it binds and
        serves is in the journal for `qjsflow workers`, the console and `start`."""
        if self._next_beat is not None and now < self._next_beat:
            return
        if self._next_beat is None:
            record = WorkerRecord(
                worker_id=self.driver.worker_id, host=socket.gethostname(), pid=os.getpid(),
                version=_version(), tools=tuple(sorted(self.bindings.tools)), scopes=(),
                secret_providers=self.secret_providers, started_at=now, heartbeat_at=now,
                stopped_at=None,
            )  # fmt: skip
            await self.store.transact(partial(_register, worker=record, now=now), durable=False)
        else:
            await self.store.transact(
                partial(_beat, worker_id=self.driver.worker_id, now=now), durable=False
            )
        self._next_beat = now + WORKER_BEAT_MS
        if self.ready is not None:  # registered: `qjsflow workers` and `start` see it now
            self.ready()
            self.ready = None
        # Scopes' weights and concurrency limits as the journal now says, on every worker alike.
        await self.driver.limits.refresh(self.store, self.driver.configs)
        if METRICS.available:
            states = collections.Counter(w.state(now) for w in await self.store.list_workers())
            for state in ("live", "gone", "stopped"):
                METRICS.workers.labels(state=state).set(states.get(state, 0))

    async def _back_off(self, error: JournalUnavailable | None, stop: asyncio.Event) -> None:
        """The journal cannot be written (a full disk, a lost server): wait, longer each time
        up to a cap, and say so once per wait rather than once per failed drive."""
        if error is not None:
            self.backoff.failed(error)
        delay = self.backoff.take()
        if delay:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)

    async def _report(self, now: int) -> None:
        """The metrics only this loop knows: scheduling lag, the pool, and (every 15 s, a
        count over the journal) runs by scope and status."""
        if not METRICS.available or time.monotonic() < self._next_report:
            return
        self._next_report = time.monotonic() + 2.0
        due = await self.store.next_due()
        METRICS.scheduling_lag.set(max(0.0, (now - due) / 1000) if due is not None else 0.0)
        pool = self.driver.pool
        stats = pool.stats()
        METRICS.executors.labels(state="idle").set(stats["idle"])
        METRICS.executors.labels(state="busy").set(stats["live"] - stats["idle"])
        for reason, total in pool.killed.items():
            METRICS.executors_killed.labels(reason=reason).inc(
                total - self._reported_kills.get(reason, 0)
            )
            self._reported_kills[reason] = total
        if time.monotonic() >= self._next_census:
            self._next_census = time.monotonic() + 15.0
            METRICS.runs.clear()
            for (scope, status), count in (await self.store.count_runs_by_scope()).items():
                METRICS.runs.labels(scope=scope, status=status).set(count)

    async def _fire(self, now: int) -> None:
        """Fire the due schedules, at most once a poll interval: a busy worker turns its loop
        at every drive's end, and a schedule's tick is a second or more."""
        if self.fire is None or time.monotonic() < self._next_fire:
            return
        self._next_fire = time.monotonic() + self.poll_interval_s
        try:
            await self.fire(now)
        except JournalUnavailable:
            raise
        except Exception:  # a schedule's host failure must not stop the worker's loop
            _log.exception("firing the due schedules failed; looking again next poll")

    async def _admit(self, now: int, *, ended: bool) -> None:
        """Admit the queued runs whose gates have room (runner/tenancy/flow_gates.py): room
        comes when a run of a key ends, or a window opens. Looked at once a poll interval,
        and at once after a drive ends while the last look found runs waiting (that drive
        may have freed a place; a worker with no gated runs pays nothing more a drive)."""
        if time.monotonic() < self._next_admit and not (ended and self._gates_waiting):
            return
        self._next_admit = time.monotonic() + self.poll_interval_s
        admitted, self._gates_waiting = await admit_due(self.store, now)
        self.admitted += admitted

    async def _prune(self, now: int) -> None:
        """Under a retention setting, prune ended runs once every `every_s` (several workers
        may prune at once: each batch deletes what is still there)."""
        retention = self.driver.config.retention
        if retention is None or self.prune is None or time.monotonic() < self._next_prune:
            return
        self._next_prune = time.monotonic() + retention.every_s
        runs, snapshots = await self.prune(now - int(retention.older_than_s * 1000), retention)
        self.pruned += runs
        if runs or snapshots:
            _log.info("pruned %d ended runs and %d snapshots", runs, snapshots)

    async def _claim(
        self, tasks: dict[str, asyncio.Task[bool]], ended: asyncio.Event, now: int
    ) -> list[str]:
        free = self.concurrency - len(tasks)
        if free <= 0:
            return []
        claimable = await self._fair_order(now, free + len(tasks))
        # A blocked run is this worker's to drive only if it has the tool the run is missing.
        blocked = await self.store.blocked_runs(now, _BLOCKED_LOOKED_AT)
        claimable += [
            run_id for run_id, missing, version in blocked
            if await self._can_unblock(run_id, missing, version)
        ]  # fmt: skip
        claimable = [run_id for run_id in claimable if not self.retries.waiting(run_id)]
        limits = self.driver.limits.concurrency
        driving = await self.store.driving_by_scope(now) if limits else {}
        for run_id in claimable:
            if run_id in tasks or len(tasks) >= self.concurrency:
                continue
            scope = split_run_key(run_id)[0]
            if scope in limits and driving.get(scope, 0) >= limits[scope]:
                continue  # the scope drives as many runs at once as it may, on all workers
            driving[scope] = driving.get(scope, 0) + 1
            self._virtual[scope] += 1 / self._weight(scope)
            task = asyncio.get_running_loop().create_task(self._drive(run_id))
            tasks[run_id] = task
            task.add_done_callback(functools.partial(_forget, tasks, run_id, ended))
        return claimable

    async def _fair_order(self, now: int, wanted: int) -> list[str]:
        """Due runs in the order to drive them, fair across scopes (weighted fair queueing):
        each scope has a virtual time — the drives this worker gave it, divided by its weight
        (`ScopeLimits`: its configuration's, or `RunnerConfig.scope_weights`, else 1) — and
        its next runs come at that time plus their turn in the scope over the weight; oldest
        first within a scope. A few turns
        more than needed are read, so a scope at its concurrency limit leaves room to others."""
        turns = await self.store.claimable_turns(now, wanted * 4)
        virtual = self._virtual
        if turns:  # only the differences between the scopes waiting now matter
            floor = min(virtual[scope] for _, scope, _ in turns)
            for scope in {scope for _, scope, _ in turns}:
                virtual[scope] -= floor
        turns.sort(key=lambda due: virtual[due[1]] + due[2] / self._weight(due[1]))
        return [run_id for run_id, _, _ in turns]

    def _weight(self, scope: str) -> float:
        return self.driver.limits.weight(scope)

    async def _can_unblock(self, run_id: str, missing: str, version: int | None) -> bool:
        """Whether this worker has what a blocked run is missing: a tool, or a secret (of its
        scope's configuration version, resolved from this process's environment; or of this
        process's env file, for a run that recorded no version)."""
        if not missing.startswith("secret "):
            return self.bindings.tool(missing) is not None
        scope, name = split_run_key(run_id)[0], missing[len("secret ") :]
        if version is None:
            environment = self.driver.config.environments.get(scope)
        else:
            parsed = await self.driver.configs.version(self.store, scope, version)
            environment = await self.driver.environment_of(scope, parsed)
        return environment is not None and name in environment.secrets

    async def _drive(self, run_id: str) -> bool:
        """Drive a claimed run; False when no lease was taken (nothing was driven: the pause
        after the claim is not cut short for it, or a run whose row a lost worker's session
        still locks would be tried again at once, hundreds of times a second)."""
        try:
            began = time.monotonic()
            run = await self.driver.claim(run_id, self.bindings)
            if run is None:
                self.untaken += 1
                _log.debug("run %s: its lease could not be taken; not driven", run_id)
                return False
            self.drives += 1
            _log.info("drove %s in %.3f s: %s", run_id, time.monotonic() - began, run.status)
            if run.status == RunStatus.blocked:  # once: no worker without the tool drives it again
                _log.warning(
                    "run %s is blocked: this worker lacks %s; a worker that has it will "
                    "continue the run",
                    run_id,
                    run.waiting_for,
                )
            self.backoff.succeeded()
            self.retries.succeeded(run_id)
        except asyncio.CancelledError:
            raise
        except JournalUnavailable as error:
            self.backoff.failed(error)
        except Exception:  # one run's host failure must not stop the worker
            delay = self.retries.failed(run_id)
            _log.exception("driving run %s failed; trying it again in %.1f s", run_id, delay)
        return True

    async def _pause(self, ended: asyncio.Event, stop: asyncio.Event, *, looked_at: int) -> None:
        """Sleep until a drive's end since the last claim, a timer that comes due after that
        claim looked (`looked_at`), a stop, or the poll interval.

        A drive that ended before this pause began ends it at once: its slot is free (waiting
        on the drives still held would sleep through it, with none held for the whole poll
        interval). A timer already due when the claim looked was seen by it: if its run was
        not taken (every slot busy, its scope at its limit, its lease live elsewhere, a retry
        not yet due), waking for it again at once would only look again, in a busy loop."""
        timeout = self.poll_interval_s
        due = await self.store.next_due()
        if due is not None and due > looked_at:
            timeout = min(timeout, max(0.0, (due - self.driver.now_ms()) / 1000))
        waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(ended.wait())]
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        for waiter in waiters:
            waiter.cancel()

    async def _shut_down(self, tasks: dict[str, asyncio.Task[bool]]) -> None:
        """Let drives in progress finish; past the grace period, cancel them (their leases are
        released on the way out, so another worker takes over at once)."""
        running = list(tasks.values())
        if not running:
            return
        _log.warning("stopping: finishing %d drives in progress (at most %.0f s, then their "
                     "leases are handed back)", len(running), self.shutdown_grace_s)  # fmt: skip
        _, late = await asyncio.wait(running, timeout=self.shutdown_grace_s)
        for task in late:
            task.cancel()
        for task in late:
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _forget(
    tasks: dict[str, asyncio.Task[bool]], run_id: str, ended: asyncio.Event, done: object
) -> None:
    tasks.pop(run_id, None)
    untaken = (
        isinstance(done, asyncio.Task)
        and not done.cancelled()
        and done.exception() is None
        and done.result() is False
    )
    if not untaken:  # a drive ended: its slot is free, and the claim may look again now
        ended.set()


def worker_command(
    db: str,
    *,
    tools: str | None = None,
    lease_ttl_s: float | None = None,
    until_idle: bool = False,
    concurrency: int | None = None,
    poll_s: float | None = None,
) -> list[str]:
    """The argv of a `qjsflow worker` process on this interpreter (for the demo, the crash
    tests and the benchmarks, which run workers as real processes)."""
    command = [sys.executable, "-m", "qjsflow.runner.cli", "--db", db]
    if tools is not None:
        command += ["--tools", tools]
    if lease_ttl_s is not None:
        command += ["--lease-ttl", str(lease_ttl_s)]
    command.append("worker")
    if until_idle:
        command.append("--until-idle")
    if concurrency is not None:
        command += ["--concurrency", str(concurrency)]
    if poll_s is not None:
        command += ["--poll", str(poll_s)]
    return command


_WORKERS_KEPT_MS = 86_400_000  # a worker not heard of for a day is dropped from the list


def _register(tx: JournalTransaction, *, worker: WorkerRecord, now: int) -> None:
    tx.forget_workers(before=now - _WORKERS_KEPT_MS)
    tx.register_worker(worker)


def _beat(tx: JournalTransaction, *, worker_id: str, now: int, stopped: bool = False) -> None:
    tx.worker_beat(worker_id, now, stopped=stopped)


def _wall_ms() -> int:
    return int(time.time() * 1000)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415  (only here)

    try:
        return version("qjsflow")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"
