"""Driving a run: take its lease, replay it in an executor, record where it ended.

A drive holds a lease on its run `(worker_id, lease_expires_at, epoch)`, renewed by a heartbeat
while it runs; every journal write of the drive is fenced by the epoch, so a driver whose lease
was taken over (it was paused past its lease, say) can write nothing more and stops. Within one
process a run is also driven by one coroutine at a time (a lock per run).

A run a caller waits to see driven (a resume, a signal) that no driver holds, with nothing to
settle before it is driven (no cancel or pause asked, a scope with no budgets or concurrency
limit), is read without a write transaction and its lease taken later: by the drive's first
write (its end, for a drive that only replays to where it waits), or after
`RunDriver.take_after_s` if none comes sooner. Taking it checks the epoch the drive read: if
another driver took the run meanwhile, nothing of this drive is written, as for a lease taken
over. Nothing reaches the outside world before the lease is taken, as every effect is
recorded first. Such a drive that sent nothing and suspended where it began, on a run still as
it read it, takes no lease at all: its end only reads the run, and its events and usage are
written behind the answer (`_end_unchanged`; docs/ARCHITECTURE.md, "An end that changed
nothing"). Those records also certify what is kept of the run, at the journal's mark: the
next such end, while nothing has been committed since, reads nothing at all
(`_end_if_unchanged`; docs/ARCHITECTURE.md, "An end already certified").
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Protocol

from qjsflow.bridge import dumps_text
from qjsflow.bridge.failure import failure_from_json
from qjsflow.bridge.hints import with_run_hint
from qjsflow.bridge.printable import printable
from qjsflow.bridge.types import (
    Completed,
    DriveOutcome,
    Failed,
    JournalEntry,
    Suspended,
)
from qjsflow.runner.bindings import Bindings
from qjsflow.runner.config import RunnerConfig
from qjsflow.runner.engine.host import DriveHost
from qjsflow.runner.engine.kept import Kept, KeptBeginnings, OpenSteps
from qjsflow.runner.engine.locations import Locator, SourceMap, author_frames
from qjsflow.runner.engine.locks import KeyedLocks
from qjsflow.runner.engine.requests import run_request
from qjsflow.runner.engine.steps import set_aside, still_waiting
from qjsflow.runner.errors import JournalUnavailable, RunNotFound, StoredCodeDamaged
from qjsflow.runner.scopedb import ScopeDatabases
from qjsflow.runner.store import (
    ENDED as TERMINAL,
)
from qjsflow.runner.store import (
    THROTTLE_TIMER,
    BundleRecord,
    JournalStore,
    JournalTransaction,
    Lease,
    LeaseLost,
    RunRecord,
    Unleased,
    with_compute,
)
from qjsflow.runner.telemetry import tracing
from qjsflow.runner.telemetry.metrics import METRICS
from qjsflow.runner.tenancy.budgets import (
    AT_DRIVE,
    MINUTE_MS,
    Budgets,
    Charges,
    DriveUsage,
    Throttle,
    current_windows,
    exhausted,
    forget_before,
)
from qjsflow.runner.tenancy.capabilities import Reach
from qjsflow.runner.tenancy.scopes import split_run_key
from qjsflow.sandbox import ExecutorPool

__all__ = ["SIGNAL_TIMER", "BeforeLease", "RunDriver", "park_paused"]

_log = logging.getLogger("qjsflow.driver")
SIGNAL_TIMER = "signal"  # a timer key that wakes a waiting run when an event arrives


class BeforeLease(Protocol):
    """Work written in the transaction that takes a run's lease, before it is taken; True
    when it wrote something (the drive's end then makes it durable, whatever the drive did)."""

    def __call__(self, tx: JournalTransaction, *, now: int) -> bool: ...


_MAX_DRIVES_PER_CALL = 10_000
_BUNDLES_KEPT = 64
_CRASH_RETRIES = 2


class RunDriver:
    # A drive that has written nothing this long after it read its run takes its lease: the
    # run shows as running, and no other worker drives it meanwhile.
    take_after_s = 0.005

    def __init__(
        self,
        store: JournalStore,
        pool: ExecutorPool,
        config: RunnerConfig,
        scopes: ScopeDatabases,
    ) -> None:
        self.scopes = scopes
        self.store = store
        self.pool = pool
        self.config = config
        self.worker_id = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
        self._locks = KeyedLocks()
        self._bundles: dict[tuple[str, str, str], BundleRecord] = {}
        self._swept: dict[str, int] = {}  # scope -> the minute its old usage was last dropped
        self._maps: dict[BundleRecord, SourceMap] = {}  # read on a bundle's first error
        # Drives in progress in this process, to stop one at once when its run is taken away.
        self._active: dict[str, tuple[_LeaseWatch, asyncio.Task[object]]] = {}
        self._kept = KeptBeginnings()  # waiting runs' beginnings, from their last drive here

    def now_ms(self) -> int:
        return int(self.config.clock() * 1000)

    @property
    def _ttl_ms(self) -> int:
        return int(self.config.lease_ttl_s * 1000)

    async def drive(
        self,
        run_id: str,
        bindings: Bindings,
        *,
        first: BeforeLease | None = None,
        read_first: bool = False,
    ) -> RunRecord:
        """Drive `run_id` until it suspends on something not yet due, or ends. A run whose
        lease another live driver holds is returned as it is. `first` is written in the
        transaction that takes the lease, before it (an operator's resume lifting a pause).
        With `read_first` (a caller waiting for this drive: a resume, a signal), the run may be
        read before its lease is taken (`_read_begin`), and `first` must write nothing to a
        run that is not paused and has no cancel or pause asked. A worker's claim takes the
        lease first: claims skip leased runs (a run in flight is not claimed again, here or by
        another worker) and number each scope's turns without them. A resume may begin from
        what the run's last drive here left kept (runner/engine/kept.py)."""
        run = await self.claim(run_id, bindings, first=first, read_first=read_first)
        if run is None:
            run = await self.store.get_run(run_id)
        if run is None:
            raise RunNotFound(run_id)
        return run

    async def claim(
        self,
        run_id: str,
        bindings: Bindings,
        *,
        first: BeforeLease | None = None,
        read_first: bool = False,
    ) -> RunRecord | None:
        """`drive`, or None when no lease was taken (another driver holds the run, or a lost
        one's session still locks its row): nothing was done, and nothing is read."""
        async with self._locks.hold(run_id):
            kept = self._kept.take(run_id, self.now_ms())  # dropped: the end keeps it again
            read_first = read_first and self._may_read_first(run_id)
            if kept is not None and read_first:
                begun = self._from_kept(kept)
                final = await self._drive_taken(begun, bindings, keep=True, mark=kept.mark)
                if final is not None:
                    return final
                # Taken since it was kept (by another driver, or an operator): read afresh.
            now = self.now_ms()
            taken: _Taken | None = None
            if read_first:
                taken = await self.store.transact(
                    partial(_read_begin, run_id=run_id, worker_id=self.worker_id, now=now,
                            take=self._late_take),
                    durable=False, writes=False,
                )  # fmt: skip
            if taken is None:
                # The lease and the drive's beginning in one transaction: one journal hop fewer.
                taken = await self.store.transact(
                    partial(_take_and_begin, run_id=run_id, worker_id=self.worker_id, now=now,
                            ttl_ms=self._ttl_ms, budgets=self.config.scope_budgets,
                            first=first),
                    durable=False,
                )  # fmt: skip
            if taken is None:
                return None
            final = await self._drive_taken(taken, bindings, keep=read_first)
            return final or await self.store.get_run(run_id)

    @property
    def _late_take(self) -> partial[None]:
        """How a drive read before its lease takes it (`_take_read`), less the run's facts."""
        return partial(_take_read, worker_id=self.worker_id, ttl_ms=self._ttl_ms,
                       clock=self.now_ms)  # fmt: skip

    def _from_kept(self, kept: Kept) -> tuple[Lease, _Begun, bool]:
        """A drive's beginning from what a drive before it left kept (runner/engine/kept.py): as
        `_read_begin` would read it, with no wake-up timer to serve (one set since, by a
        signal elsewhere, wakes the run again); its lease is taken only if the run's epoch
        and row are still as kept."""
        run = kept.run
        later = partial(self._late_take, run_id=run.run_id, epoch=kept.epoch,
                        snapshot_id=run.snapshot_id, woken=False, kept=run)  # fmt: skip
        lease = Lease(run.run_id, self.worker_id, kept.epoch + 1, take=later)
        return lease, (run, kept.journal, kept.open, {}), False

    async def _drive_taken(
        self, taken: _Taken, bindings: Bindings, *, keep: bool, mark: bytes | None = None
    ) -> RunRecord | None:
        """Drive a run whose beginning is `taken` (kept, and certified at the journal's `mark`:
        `_end_if_unchanged`); the run as the drive left it, or None when its lease was lost
        (another driver has the run, or took it since it was read)."""
        lease, begun, wrote = taken
        if lease.taken_from is not None:
            _log.warning("run %s: taken over from %s, whose lease lapsed", lease.run_id,
                         lease.taken_from[:100])  # fmt: skip
        if isinstance(begun, RunRecord):
            return begun  # over, cancelled or paused: released with its beginning
        final: RunRecord | None = None
        try:
            final = await self._drive_leased(lease, bindings, begun, wrote, keep=keep, mark=mark)
        except LeaseLost:
            pass  # another driver has the run now; it writes the rest
        finally:
            if final is None:  # not released with the drive's last transaction
                await self.store.release_lease(lease)
        return final

    def _may_read_first(self, run_id: str) -> bool:
        """Whether a drive of `run_id` may read it before taking its lease: not in a scope
        whose budgets are looked at as a drive begins, nor in one whose drives at once are
        counted by their leases (a worker would count a run not yet leased as not driven)."""
        scope = split_run_key(run_id)[0]
        config = self.config
        return _set_budgets(config.scope_budgets, scope) is None and (
            scope not in config.scope_concurrency
        )

    def alone(self) -> bool:
        """Whether at most one drive is in progress in this process: the event loop would
        only wait for its transactions (`JournalStore.commit_here`)."""
        return len(self._active) <= 1

    def driving(self, run_id: str) -> bool:
        """Whether this process drives `run_id` now."""
        return run_id in self._active

    def forget(self, run_id: str) -> None:
        """Drop what is kept of `run_id`'s beginning (runner/engine/kept.py): an event
        delivered to it here makes it stale (a drive from it would suspend, find the event at
        its end, and drive the run again)."""
        self._kept.forget(run_id)

    def stop(self, run_id: str) -> None:
        """Stop this process's drive of `run_id`, if any, as if its lease were lost (an
        operator terminated or restarted the run; drives elsewhere stop at their heartbeat)."""
        self._kept.forget(run_id)
        active = self._active.get(run_id)
        if active is not None:
            watch, task = active
            watch.lost = True
            task.cancel()

    async def _drive_leased(
        self,
        lease: Lease,
        bindings: Bindings,
        begun: _Begun,
        wrote: bool,
        *,
        keep: bool,
        mark: bytes | None,
    ) -> RunRecord:
        task = asyncio.current_task()
        watch = _LeaseWatch(unwritten=lease.take is not None)
        # The heartbeat's task is made when its first take or renewal is due: a short drive
        # (most are) makes none, and does not wait for one to end.
        loop = asyncio.get_running_loop()
        beating: list[asyncio.Task[None]] = []
        first_beat = loop.call_later(
            self.take_after_s if watch.unwritten else self.config.lease_ttl_s / 3,
            lambda: beating.append(loop.create_task(self._heartbeat(lease, watch, task))),
        )
        if task is not None:
            self._active[lease.run_id] = (watch, task)
        try:
            return await self._drive_loop(
                lease, watch, bindings, begun, wrote, keep=keep, mark=mark
            )
        except asyncio.CancelledError:
            if not watch.lost:
                raise
            # The heartbeat cancelled this (possibly the caller's) task: undo that request,
            # so that the caller's own timeouts and task groups are not confused by it.
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            raise LeaseLost(lease) from None
        finally:
            self._active.pop(lease.run_id, None)
            first_beat.cancel()
            for heartbeat in beating:
                heartbeat.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await heartbeat

    async def _heartbeat(
        self,
        lease: Lease,
        watch: _LeaseWatch,
        drive: asyncio.Task[object] | None,
    ) -> None:
        """Take the lease (if no write has) or renew it, then every third of its TTL."""
        while True:
            if watch.end_takes:  # the drive's end writes the lease itself: none to renew yet
                await asyncio.sleep(self.config.lease_ttl_s / 3)
                continue
            try:
                if watch.unwritten:  # a transaction fenced by the lease takes it
                    watch.unwritten = False
                    renewed = await self.store.transact(_nothing, lease, durable=False)
                else:
                    renewed = await self.store.renew_lease(lease, self.now_ms(), self._ttl_ms)
            except (JournalUnavailable, LeaseLost):
                renewed = False  # stop writing: another driver may take the run over
            if not renewed:
                watch.lost = True
                if drive is not None:
                    drive.cancel()  # stops the executor; nothing more is written
                return
            await asyncio.sleep(self.config.lease_ttl_s / 3)

    async def _drive_loop(
        self,
        lease: Lease,
        watch: _LeaseWatch,
        bindings: Bindings,
        first: _Begun,
        wrote: bool,
        *,
        keep: bool,
        mark: bytes | None,
    ) -> RunRecord:
        """Drive until the run suspends on something not yet due or ends; the last transaction
        also releases the lease and returns the run as it was left. `first` is the drive's
        beginning, made with the lease (`wrote`: and with a change the caller asked for).
        With `keep`, a drive that leaves the run as it found it keeps its beginning."""
        crashes = 0
        begun: _Begun | RunRecord = first
        unsynced = wrote  # the caller's change, until a commit is fsynced
        for drives in range(_MAX_DRIVES_PER_CALL):
            if drives:
                now = self.now_ms()
                begun = await self.store.transact(
                    partial(_begin_drive, lease=lease, now=now,
                            budgets=self.config.scope_budgets),
                    lease, durable=False,
                )  # fmt: skip
            if isinstance(begun, RunRecord):
                return begun  # finished, or cancelled just now
            run, journal, unsettled, used = begun
            began = time.monotonic()
            attributes = partial(_span_attributes, run, lease, journal)
            with tracing.drive_span(run.traceparent, attributes) as span:
                outcome, host = await self._drive_once(
                    run, journal, unsettled, lease, bindings, used=used, traced=span is not None
                )
                _observe(span, run.run_id, outcome, time.monotonic() - began)
            if isinstance(outcome, Failed) and outcome.retryable:
                # The executor process died: the OOM killer, an operator, or the run's own
                # code. Try again at once a few times, then park the run and come back later;
                # only a run whose executors keep dying is failed (executor_deaths_per_run).
                crashes += 1
                if crashes <= _CRASH_RETRIES:
                    now = self.now_ms()
                    await self.store.transact(
                        partial(_charge, lease=lease, outcome=outcome, host=host,
                                charges=self._charges(outcome, host, now), now=now),
                        lease,
                    )  # fmt: skip
                    continue
                now = self.now_ms()
                return await self.store.transact(
                    partial(
                        _park, lease=lease, outcome=outcome, host=host, now=now,
                        limit=self.config.executor_deaths_per_run,
                        charges=self._charges(outcome, host, now),
                    ),
                    lease,
                )  # fmt: skip
            now = self.now_ms()
            # A lease no write has taken yet is taken by the end itself, in its last update
            # (an op the host serviced may have taken it: the end's fence then finds it held).
            watch.end_takes = watch.unwritten and not host.ops_seen
            watch.unwritten = False
            as_found = _left_as_found(outcome, host)
            if watch.end_takes and as_found and not unsynced:
                # Nothing written yet, nothing to write: if the run is still as it was read,
                # the end only reads, and its records are written behind the answer.
                certified = mark if drives == 0 else None
                left = await self._end_if_unchanged(run, lease, outcome, host, now=now,
                                                    mark=certified)  # fmt: skip
                if left is not None:
                    watch.end_takes = False
                    return await self._ended(
                        left, lease.epoch - 1, host, (journal, unsettled), keep=keep
                    )
            charges = self._charges(outcome, host, now)
            finish = partial(_finish, lease=lease, outcome=outcome, host=host, now=now,
                             charges=charges, taking=watch.end_takes,
                             ttl_ms=self._ttl_ms)  # fmt: skip
            fence = None if watch.end_takes else lease  # (`_finish` checks it then)
            durable = unsynced or not as_found
            # A lone drive's durable end commits on this thread at once
            # (`JournalStore.commit_here`): the executor prepares its next context meanwhile,
            # on the other core, while the commit waits for its fsync. Otherwise (the journal's
            # thread must first wake for it, or there is no fsync to wait for) the executor
            # prepares once the end is recorded and the caller has its answer.
            prepare_first = durable and self.alone()
            if prepare_first:
                self.pool.prepare_idle()
            try:
                # Queued behind the drive's last writes, in the same commit where it can be.
                ended = await self.store.transact(finish, fence, durable=durable)
            except _NotAllWritten:
                await host.flush()  # raises what failed, or waits for a write made again
                ended = await self.store.transact(finish, fence, durable=durable)
            watch.end_takes = False  # the lease is written: released, or kept to drive again
            unsynced = False  # this end was fsynced if the caller's change was not yet
            if ended is not None:
                beginning = (journal, unsettled)
                return await self._ended(
                    ended, lease.epoch, host, beginning, keep=keep and as_found,
                    prepared=prepare_first,
                )  # fmt: skip
            await host.flush()
            if not prepare_first:
                asyncio.get_running_loop().call_soon(self.pool.prepare_idle)
        # Still due after this many drives: leave the rest to the next call or a worker.
        return await self.store.transact(partial(_release, lease=lease), lease, durable=False)

    async def _end_if_unchanged(
        self,
        found: RunRecord,
        lease: Lease,
        outcome: DriveOutcome,
        host: DriveHost,
        *,
        now: int,
        mark: bytes | None,
    ) -> RunRecord | None:
        """The end of a drive that took no lease and left its run as it `found` it, if the
        run is still so (`_end_unchanged`): its records written behind the answer, and the run
        as it is once they are. None: the end is to be written in full. A run kept from a
        drive whose records certified it at the journal's `mark` is not read while the
        journal's mark is still that one: nothing was committed since."""
        epoch = lease.epoch - 1
        events = _waits(outcome)
        if not events:
            return None
        if mark is not None and self.store.journal_mark() == mark:
            as_certified = Unleased(found, epoch, woken=False, arrived=False, due=found.wake_at)
            unchanged = _as_found(as_certified, found, epoch, events, now)
        else:
            unchanged = await self.store.read(
                partial(_end_unchanged, found=found, epoch=epoch, events=events, now=now),
                here=True,
            )  # fmt: skip
        if unchanged is None:
            return None
        # As its compute is added behind the answer.
        left = with_compute(unchanged, outcome.cpu_s) if outcome.cpu_s else unchanged
        certify = self.store.marks_commits  # (a server journal has no mark to certify at)
        self.store.write_behind(
            partial(_record_unchanged_end, run=left, epoch=epoch, worker_id=lease.worker_id,
                    cpu_s=outcome.cpu_s, events=events, certify=certify,
                    charges=self._charges(outcome, host, now), now=now),
            then=partial(self._certified, left, epoch) if certify else None,
        )  # fmt: skip
        return left

    def _certified(
        self, run: RunRecord, epoch: int, found_as_kept: bool, mark: bytes | None
    ) -> None:
        """A quiet end's records are written: if they found the run as kept, in a commit
        that `mark`s the journal, what is kept of it is certified at that mark."""
        if found_as_kept and mark is not None:
            self._kept.certify(run, epoch, mark)

    async def _ended(
        self,
        run: RunRecord,
        epoch: int,
        host: DriveHost,
        beginning: tuple[tuple[JournalEntry, ...], OpenSteps],
        *,
        keep: bool,
        prepared: bool = False,
    ) -> RunRecord:
        """A drive's last steps once its end is recorded (the run left as `run`, at `epoch`):
        the host's writes are in, idle executors prepare (unless they were told `prepared`),
        and, with `keep`, the run's beginning is kept for its next drive (runner/engine/kept.py)."""
        await host.flush()
        if not prepared:
            asyncio.get_running_loop().call_soon(self.pool.prepare_idle)
        if keep:
            journal, unsettled = beginning
            self._kept.keep(Kept(run, epoch, journal, unsettled, host.journal_bytes))
        return run

    async def _drive_once(
        self,
        run: RunRecord,
        journal: tuple[JournalEntry, ...],
        unsettled: OpenSteps,
        lease: Lease,
        bindings: Bindings,
        *,
        used: dict[str, float],
        traced: bool,
    ) -> tuple[DriveOutcome, DriveHost]:
        recorded = sum(len(e.value or "") for e in journal)
        try:
            bundle: BundleRecord | None = await self.bundle_of(run)
            damaged = None
        except StoredCodeDamaged as error:  # never run code that is not what was published
            bundle, damaged = None, error
        host = DriveHost(
            self.store, lease, bindings, self.config.limits, self.now_ms, scopes=self.scopes,
            journal_bytes=recorded, monotonic=self.config.monotonic,
            environment=self.config.environments.get(run.scope), run_env=run.persisted_bindings,
            generation=run.generation,
            budgets=self.config.scope_budgets.get(run.scope), used=used, traced=traced,
            locate=self._locator(bundle) if bundle is not None else _nowhere,
            reach=Reach(None if bundle is None else bundle.capabilities,
                        self.config.scope_policies.get(run.scope)),
        )  # fmt: skip
        if bundle is None:
            return Failed(False, str(damaged), 0.0), host
        request = run_request(run, bundle, journal, self.config.limits, open_steps=unsettled)
        try:
            outcome = await self.pool.drive(request, host)
        except BaseException:
            # What the host answered ahead is committed first (a failure there, such as a
            # lost lease, ends the drive as it would have then).
            await host.flush()
            raise
        if isinstance(outcome, Failed) and outcome.retryable:
            await host.flush()  # the executor died: its charge is recorded after those
        # Otherwise the drive's end is queued behind them (`_finish` checks they were written).
        if isinstance(outcome, Failed) and outcome.stack is not None:
            outcome = dataclasses.replace(outcome, stack=host.locate(outcome.stack))
        return outcome, host

    def _charges(self, outcome: DriveOutcome, host: DriveHost, now: int) -> Charges:
        """What a drive used, taken from its host once (the transaction charging it may run
        again after a transient fault): the drive itself, its compute, and what the host
        counted; and, the first time this process charges the scope in a new minute, the
        windows its usage may forget (not a statement on every drive)."""
        used, host.usage = host.usage, DriveUsage()
        used.add("drives", 1)
        used.add("compute_s", outcome.cpu_s)
        rows = used.charges(now)
        for measure, _, amount in rows:
            METRICS.scope_usage.labels(scope=host.scope, measure=measure).inc(amount)
        minute = now - now % MINUTE_MS
        if self._swept.get(host.scope) == minute:
            return Charges(rows, None)
        self._swept[host.scope] = minute
        return Charges(rows, forget_before(now))

    def locate(self, bundle: BundleRecord, stack: str | None) -> str | None:
        """The author's frames (file:line:column) of the engine's `stack` in `bundle`."""
        return self._locator(bundle)(stack)

    def _locator(self, bundle: BundleRecord) -> Locator:
        """Maps the engine's frames in `bundle` to the author's; its source map is read on
        the first error and kept with the bundle."""

        def locate(stack: str | None) -> str | None:
            if not stack or not bundle.source_map:
                return None
            source_map = self._maps.get(bundle)
            if source_map is None:
                source_map = self._maps[bundle] = SourceMap(bundle.source_map)
            return author_frames(stack, source_map)

        return locate

    async def bundle_of(self, run: RunRecord) -> BundleRecord:
        """Bundles never change once published: keep the latest few in memory."""
        key = (run.scope, run.snapshot_id, run.workflow)
        bundle = self._bundles.pop(key, None)
        if bundle is None:
            bundle = await self.store.load_bundle(*key)
            if bundle is None:  # snapshots are never deleted; this is a broken journal
                raise RuntimeError(f"run {run.run_id} names a bundle that is not stored")
        self._bundles[key] = bundle
        while len(self._bundles) > _BUNDLES_KEPT:  # a map goes with its bundle
            self._maps.pop(self._bundles.pop(next(iter(self._bundles))), None)
        return bundle


@dataclasses.dataclass(slots=True)
class _LeaseWatch:
    """A drive's lease: read with none held (`Lease.take`), `unwritten` while no write has
    been asked to take it (the heartbeat asks after `RunDriver.take_after_s`); `end_takes`
    while the drive's end is taking it in its own last update (none to renew meanwhile);
    `lost` once the drive is stopped for it (its heartbeat failed, or `RunDriver.stop`)."""

    unwritten: bool
    end_takes: bool = False
    lost: bool = False


# The run, its journal, its unsettled steps, and what its scope had used of its budgets when
# the drive began (empty for a scope without budgets).
_Begun = tuple[RunRecord, tuple[JournalEntry, ...], OpenSteps, dict[str, float]]
# A drive's lease, its beginning (or the run, released: nothing to drive), and whether the
# caller's change was written with it.
_Taken = tuple[Lease, _Begun | RunRecord, bool]


def _set_budgets(budgets: Mapping[str, Budgets], scope: str) -> Budgets | None:
    """The scope's budgets, if it has any set (None: the scope is not budgeted)."""
    scope_budgets = budgets.get(scope)
    return scope_budgets if scope_budgets is not None and scope_budgets.any else None


def _take_and_begin(
    tx: JournalTransaction,
    *,
    run_id: str,
    worker_id: str,
    now: int,
    ttl_ms: int,
    budgets: Mapping[str, Budgets],
    first: BeforeLease | None = None,
) -> tuple[Lease, _Begun | RunRecord, bool] | None:
    """The run's lease, if no live driver holds it, the drive's beginning under it, and
    whether `first` wrote anything."""
    wrote = first is not None and first(tx, now=now)
    # A scope with budgets looks at them before its run is marked running (a spent one parks
    # it as it was); otherwise the lease's statement marks it, and `_begin_drive` finds it so.
    begin = _set_budgets(budgets, split_run_key(run_id)[0]) is None
    lease = tx.acquire_lease(run_id, worker_id, now, ttl_ms, begin=begin, wake_ups=_WAKE_UPS)
    if lease is None:
        return None
    tx.adopt(lease)  # the beginning's events carry the new epoch
    return lease, _begin_drive(tx, lease, now, budgets), wrote


def _read_begin(
    tx: JournalTransaction, *, run_id: str, worker_id: str, now: int, take: partial[None]
) -> tuple[Lease, _Begun, bool] | None:
    """A drive's beginning read without taking the lease (`writes=False`): the run, its
    journal, and a lease to take later (`_take_read`) at the epoch after the one read. None
    when the beginning must be written now (`_take_and_begin`): there is no such run, it has
    ended or is paused, a cancel or a pause is asked, or a driver holds (or held) its lease."""
    found = tx.unleased_run(run_id, _WAKE_UPS)
    if found is None:
        return None
    run, epoch, woken = found.run, found.epoch, found.woken
    if run.status in TERMINAL or run.status == "paused":
        return None
    if run.cancel_requested or run.pause_requested:
        return None
    later = partial(take, run_id=run_id, epoch=epoch, snapshot_id=run.snapshot_id, woken=woken)
    lease = Lease(run_id, worker_id, epoch + 1, take=later)
    journal, unsettled = _journal_and_open(tx, run_id, now, budgeted=False)
    return lease, (run, journal, unsettled, {}), False


def _take_read(
    tx: JournalTransaction,
    written: bool,
    *,
    run_id: str,
    worker_id: str,
    epoch: int,
    snapshot_id: str,
    ttl_ms: int,
    clock: Callable[[], int],
    woken: bool,
    kept: RunRecord | None = None,
) -> None:
    """The drive's beginning, for a run read at `epoch` with no lease held (`_read_begin`),
    and, when `written`, its lease (`LeaseLost` if another driver took the run since; without
    it, the drive's end writes the lease: `JournalTransaction.check_fence`). The wake-up
    timers it serves are those the read found (`woken`): one set since is left to wake the
    run again, as it would be under a lease taken first. A drive begun from what was `kept`
    (runner/engine/kept.py) also needs the run's row as that was kept: anything written to it since
    (a pause or a cancel asked, a migration) may change how the drive should begin."""
    now = clock()
    if kept is not None and tx.get_run(run_id) != kept:  # (before the lease marks it running)
        raise LeaseLost(Lease(run_id, worker_id, epoch + 1))
    if written:
        lease = tx.acquire_lease(run_id, worker_id, now, ttl_ms, begin=True, free_at=epoch)
        if lease is None:
            raise LeaseLost(Lease(run_id, worker_id, epoch + 1))
    _mark_begun(tx, run_id, worker_id, snapshot_id, now, woken=woken)


def _nothing(tx: JournalTransaction) -> bool:
    """A transaction fenced by a lease not taken yet takes it (`Lease.take`)."""
    return True


def _mark_begun(
    tx: JournalTransaction,
    run_id: str,
    worker_id: str,
    snapshot_id: str,
    now: int,
    *,
    woken: bool = True,
) -> None:
    """A drive's beginning under its lease: the wake-ups it serves go (none, unless `woken`),
    and the event."""
    if woken:
        tx.delete_timers(run_id, _WAKE_UPS)
    driven = {"worker": worker_id, "snapshot": snapshot_id}
    tx.append_event(run_id, "drive_started", now, dumps_text(driven))


def _journal_and_open(
    tx: JournalTransaction, run_id: str, now: int, *, budgeted: bool
) -> tuple[tuple[JournalEntry, ...], OpenSteps]:
    """The run's journal and its unsettled steps, as a drive begins."""
    journal = tuple(
        JournalEntry(
            row.key,
            row.output,
            None if row.error is None else failure_from_json(row.error),
            row.completed_at,
            row.args_digest,
        )
        for row in tx.load_journal(run_id)
    )
    open_rows = tx.unsettled_steps(run_id)
    # A scope with budgets has every wait asked of the host, which parks the run when one is
    # spent (runner/tenancy/budgets.py); otherwise a wait with nothing to take is answered
    # in the drive.
    waits = () if budgeted else still_waiting(tx, open_rows, now)
    waiting = tuple((key, event_type) for key, event_type, _ in waits)
    until = min((deadline for _, _, deadline in waits), default=None)
    return journal, OpenSteps(tuple(row.key for row in open_rows), waiting, until)


def _begin_drive(
    tx: JournalTransaction, lease: Lease, now: int, budgets: Mapping[str, Budgets]
) -> _Begun | RunRecord:
    """Mark the run running and load its journal: one transaction, one query for the journal.
    A run that is over (or cancelled now), paused, or whose scope has spent a budget is
    released and returned instead. A run this transaction created (`start`) has no journal,
    timer or open step yet: none is looked for; nor a journal or open step for a run that had
    no step as its lease was taken (a run never driven, as most a worker claims)."""
    created = tx.created(lease.run_id)
    run = tx.get_run(lease.run_id)
    assert run is not None
    if run.status in TERMINAL or run.cancel_requested:
        if run.status not in TERMINAL:
            _cancel(tx, run.run_id, now, {"updated_at": now})
        return _release(tx, lease)
    if run.pause_requested:
        park_paused(tx, run, now)
        return _release(tx, lease)
    used: dict[str, float] = {}
    scope_budgets = _set_budgets(budgets, run.scope)
    if scope_budgets is not None:
        used = tx.scope_usage(run.scope, current_windows(now))
        spent = exhausted(scope_budgets, used, now, AT_DRIVE)
        if spent is not None:
            park_throttled(tx, run, now, spent)
            return _release(tx, lease)
    tx.update_run(run.run_id, status="running", error=None, updated_at=now)
    if created:  # no timer yet
        driven = {"worker": lease.worker_id, "snapshot": run.snapshot_id}
        tx.append_event(run.run_id, "drive_started", now, dumps_text(driven))
        return run, (), OpenSteps((), ()), used
    looks = tx.lease_looks(run.run_id)
    _mark_begun(tx, run.run_id, lease.worker_id, run.snapshot_id, now, woken=looks.woken)
    if not looks.stepped:  # a run never driven, say: its journal and open steps are empty
        return run, (), OpenSteps((), ()), used
    journal, unsettled = _journal_and_open(tx, run.run_id, now, budgeted=scope_budgets is not None)
    return run, journal, unsettled, used


def _ledger(
    tx: JournalTransaction,
    current: RunRecord,
    outcome: DriveOutcome,
    host: DriveHost,
    *,
    charges: Charges,
    now: int,
) -> dict[str, object]:
    """What every drive adds, however it ended: to its scope's usage
    (runner/tenancy/budgets.py) and, returned, to its run: compute, and console lines."""
    tx.charge_usage(current.scope, charges.rows, charges.forget)
    return {
        "cpu_used_s": current.cpu_used_s + outcome.cpu_s,
        "logs_count": max(current.logs_count, host.logs_count),
    }


def _charge(
    tx: JournalTransaction,
    lease: Lease,
    outcome: DriveOutcome,
    host: DriveHost,
    *,
    charges: Charges,
    now: int,
) -> None:
    current = tx.get_run(lease.run_id)
    assert current is not None
    tx.update_run(lease.run_id, **_ledger(tx, current, outcome, host, charges=charges, now=now))


EXECUTOR_TIMER = "executor"  # the timer that wakes a run parked after its executor died
# The timers that only wake a run (no step waits on them): a drive's beginning serves them.
_WAKE_UPS = (SIGNAL_TIMER, EXECUTOR_TIMER, THROTTLE_TIMER)
_PARK_FIRST_MS = 30_000
_PARK_LAST_MS = 3_600_000


def _park(
    tx: JournalTransaction,
    *,
    lease: Lease,
    outcome: Failed,
    host: DriveHost,
    now: int,
    limit: int,
    charges: Charges,
) -> RunRecord:
    """Count an executor death against the run; park the run for a later drive, or fail it
    once its executors have died `limit` times."""
    run_id = lease.run_id
    current = tx.get_run(run_id)
    assert current is not None
    deaths = current.executor_deaths + 1
    common = {
        **_ledger(tx, current, outcome, host, charges=charges, now=now), "updated_at": now,
        "executor_deaths": deaths,
    }  # fmt: skip
    if deaths >= limit:
        message = (
            f"the run's executor process died {deaths} times, its limit (killed from outside,"
            " or crashed by the run's own code)"
        )
        return _fail(tx, lease, message, now, common)
    wake_at = now + min(_PARK_LAST_MS, _PARK_FIRST_MS * 2 ** (deaths - 1))
    reason = (
        f"parked: the executor process died ({outcome.message}); driven again at"
        f" {wake_at} ms, death {deaths} of at most {limit}"
    )
    tx.set_timer(run_id, EXECUTOR_TIMER, "retry", wake_at)
    tx.update_run(run_id, status="sleeping", error=reason, wake_at=wake_at, **common)
    tx.append_event(run_id, "run_parked", now, dumps_text({"reason": reason}))
    return _release(tx, lease)


def _fail(
    tx: JournalTransaction, lease: Lease, message: str, now: int, common: dict[str, object]
) -> RunRecord:
    tx.delete_timers(lease.run_id)
    tx.update_run(
        lease.run_id, status="failed", error=message, wake_at=None, waiting_for=None, **common
    )
    tx.append_event(lease.run_id, "run_failed", now, dumps_text({"reason": message}))
    return _release(tx, lease)


def _release(tx: JournalTransaction, lease: Lease, **fields: Any) -> RunRecord:
    """The lease given up, with the run's last `fields` in the same statement, and the run."""
    tx.release_lease(lease, **fields)
    run = tx.get_run(lease.run_id)
    assert run is not None
    return run


def _finish(
    tx: JournalTransaction,
    lease: Lease,
    outcome: DriveOutcome,
    host: DriveHost,
    *,
    now: int,
    charges: Charges,
    taking: bool = False,
    ttl_ms: int = 0,
) -> RunRecord | None:
    """Record how the drive ended. None when the run should be driven again now; otherwise the
    lease is released in the same transaction and the run returned as it was left. Written
    after the drive's writes answered ahead, which must all be in (`_NotAllWritten`).
    `taking`: the lease was never taken (`_read_begin`); it is taken here, and written with
    the run's last update (kept for `ttl_ms` when the run is driven again at once)."""
    if not host.all_written():
        raise _NotAllWritten
    if taking:
        tx.check_fence(lease, ending=True)
    if host.diverged:  # (a drive whose executor died is charged, not finished: `_charge`)
        # What the sandbox did past a result the journal did not take as it assumed is void
        # (none of it was serviced): the run is driven again from its journal.
        outcome = Suspended((), outcome.cpu_s)
    run_id = lease.run_id
    current = tx.get_run(run_id)
    assert current is not None
    common = {**_ledger(tx, current, outcome, host, charges=charges, now=now), "updated_at": now}
    match outcome:
        case Completed(output=output):
            tx.delete_timers(run_id)
            tx.append_event(run_id, "run_completed", now, None)
            return _release(tx, lease, status="completed", output=output, wake_at=None,
                            waiting_for=None, **common)  # fmt: skip
        case Failed(message=message, stack=stack):
            message = with_run_hint(message)
            return _fail(tx, lease, message, now, {**common, "error_stack": stack})
        case Suspended(markers=markers):
            if current.cancel_requested:
                _cancel(tx, run_id, now, common)
                return _release(tx, lease)
            if current.pause_requested:
                tx.update_run(run_id, **common)
                park_paused(tx, current, now)
                return _release(tx, lease)
            if host.throttle is not None:
                for key in sorted(host.set_aside):
                    set_aside(tx, run_id, key, now)
                tx.update_run(run_id, **common)
                park_throttled(tx, current, now, host.throttle)
                return _release(tx, lease)
            if host.diverged:
                _drive_again(tx, lease, now, ttl_ms, common)
                return None
            events = sorted({m.event for m in markers if m.kind == "event" and m.event})
            wake_at = _next_wake(tx, run_id, events, now)
            status = "waiting" if events else "sleeping"
            waiting_for = ",".join(events) or None
            if host.blocked_on is not None:  # until a process that has the tool drives it
                status, waiting_for = "blocked", host.blocked_on
            left = {"status": status, "wake_at": wake_at, "waiting_for": waiting_for, **common}
            tx.append_event(run_id, "run_suspended", now, None)
            if wake_at is not None and wake_at <= now:
                _drive_again(tx, lease, now, ttl_ms, left)
                return None
            return _release(tx, lease, **left)
    raise AssertionError("unreachable")


def _waits(outcome: DriveOutcome) -> tuple[str, ...]:
    """The event types a suspended drive waits on, in order (none for any other outcome)."""
    if not isinstance(outcome, Suspended):
        return ()
    return tuple(sorted({m.event for m in outcome.markers if m.kind == "event" and m.event}))


def _end_unchanged(
    tx: JournalTransaction, *, found: RunRecord, epoch: int, events: tuple[str, ...], now: int
) -> RunRecord | None:
    """The end of a drive that took no lease and left its run as it found it
    (`_left_as_found`: it sent nothing, so wrote no console line, met no budget and no
    missing tool), read only: the run, when its end would change nothing of it but its
    compute (added behind the answer: `_record_unchanged_end`). None: the end is written in
    full (`_finish`), as it may have to drive the run again."""
    return _as_found(tx.unleased_run(found.run_id, _WAKE_UPS, waits=events), found, epoch,
                     events, now)  # fmt: skip


def _as_found(
    now_at: Unleased | None, found: RunRecord, epoch: int, events: tuple[str, ...], now: int
) -> RunRecord | None:
    """The run, if the journal holds it (`now_at`) as `found` at `epoch`: no lease held and
    no wake-up to serve, still waiting on `events`, none of which arrived, and no timer due.
    """
    if now_at is None or now_at.run != found or now_at.epoch != epoch or now_at.woken:
        return None
    current = now_at.run
    if current.status != "waiting" or current.waiting_for != ",".join(events):
        return None
    due = now_at.due
    if now_at.arrived or due != current.wake_at or (due is not None and due <= now):
        return None
    return current


def _record_unchanged_end(
    tx: JournalTransaction,
    *,
    run: RunRecord,
    epoch: int,
    worker_id: str,
    cpu_s: float,
    events: tuple[str, ...],
    certify: bool,
    charges: Charges,
    now: int,
) -> bool:
    """What a drive that changed nothing of its run records (`_end_unchanged`), fenced by the
    `epoch` it read: its compute added to the run's, its two events (with no lease's epoch:
    it took none), and what its scope used. Nothing, if a driver has taken the run since
    (as for a drive whose lease was taken over). With `certify`, True if the journal then
    holds the run as `run` (its compute added), waiting as it did: what the driver keeps of
    it is certified by this commit (`RunDriver._certified`)."""
    if not tx.still_unleased(run.run_id, epoch):
        return False
    if cpu_s:
        tx.add_compute(run.run_id, cpu_s)
    _mark_begun(tx, run.run_id, worker_id, run.snapshot_id, now, woken=False)
    tx.append_event(run.run_id, "run_suspended", now, None)
    tx.charge_usage(run.scope, charges.rows, charges.forget)
    return (
        certify and _end_unchanged(tx, found=run, epoch=epoch, events=events, now=now) is not None
    )


def _drive_again(
    tx: JournalTransaction, lease: Lease, now: int, ttl_ms: int, fields: dict[str, object]
) -> None:
    """The drive's end, for a run driven again at once: the run's `fields` written, and the
    lease kept (written now, if the end took it: `JournalTransaction.hold_lease`)."""
    tx.update_run(lease.run_id, **fields)
    tx.hold_lease(lease, now, ttl_ms)


def _next_wake(tx: JournalTransaction, run_id: str, events: list[str], now: int) -> int | None:
    """When the run suspending on `events` (none: a sleep) is next due. An event of one of them
    that arrived while the drive ran, after its wait looked, wakes it now (a signal timer)
    rather than leave it parked until the wait times out."""
    if not events:
        return tx.next_timer(run_id)
    arrived, due, due_but_signal = tx.waits_and_timers(run_id, events, SIGNAL_TIMER)
    if not arrived:
        return due
    tx.set_timer(run_id, SIGNAL_TIMER, "signal", now)
    return now if due_but_signal is None else min(due_but_signal, now)


def _left_as_found(outcome: DriveOutcome, host: DriveHost) -> bool:
    """Whether a drive sent nothing and suspended again, on waits the journal answered only
    with a suspension as the drive began (`steps.still_waiting`): its end need not be fsynced.
    A power loss that undoes it leaves the run as the drive found it, or leased until the
    lease lapses; either way the next drive replays it to the same place. Anything the
    sandbox sent (a result, a line, a call) makes the end durable."""
    return isinstance(outcome, Suspended) and host.ops_seen == 0 and not host.diverged


class _NotAllWritten(Exception):
    """A drive's end met a batch answered ahead that was not written (it failed, or waits to
    be written again): nothing is recorded; the driver waits for it, then records the end."""


def park_paused(tx: JournalTransaction, run: RunRecord, now: int) -> None:
    """A run whose pause was asked, with no step under way: it waits for `resume`; its timers
    keep their due times and events sent meanwhile stay in its inbox."""
    if run.status == "paused":
        return
    tx.update_run(run.run_id, status="paused", updated_at=now, wake_at=tx.next_timer(run.run_id))
    tx.append_event(run.run_id, "run_paused", now, None)


def park_throttled(tx: JournalTransaction, run: RunRecord, now: int, spent: Throttle) -> None:
    """A run whose scope spent a budget: it waits, with its timers and inbox kept, until the
    budget's window ends; only then may a worker claim it (and look at the budget again)."""
    tx.set_timer(run.run_id, THROTTLE_TIMER, "throttle", spent.until_ms)
    budget = spent.measure.budget
    tx.update_run(
        run.run_id, status="throttled", updated_at=now, wake_at=spent.until_ms,
        waiting_for=budget, error=spent.reason,
    )  # fmt: skip
    if run.status != "throttled" or run.waiting_for != budget:
        detail = {"budget": budget, "until": spent.until_ms, "reason": spent.reason}
        tx.append_event(run.run_id, "run_throttled", now, dumps_text(detail))
        METRICS.throttled.labels(scope=run.scope, budget=budget).inc()


def _cancel(tx: JournalTransaction, run_id: str, now: int, common: dict[str, object]) -> None:
    tx.delete_timers(run_id)
    tx.update_run(run_id, status="cancelled", wake_at=None, waiting_for=None, **common)
    tx.append_event(run_id, "run_cancelled", now, None)


def _span_attributes(
    run: RunRecord, lease: Lease, journal: tuple[JournalEntry, ...]
) -> dict[str, object]:
    return {
        "qjsflow.run_id": split_run_key(run.run_id)[1], "qjsflow.scope": run.scope,
        "qjsflow.workflow": run.workflow, "qjsflow.snapshot": run.snapshot_id,
        "qjsflow.worker": lease.worker_id, "qjsflow.replayed_steps": len(journal),
    }  # fmt: skip


def _observe(span: Any, run_id: str, outcome: DriveOutcome, seconds: float) -> None:
    """A drive in the metrics and its trace span (how it ended, how long it took), and a
    warning for a limit it hit."""
    name = type(outcome).__name__.lower()
    if isinstance(outcome, Failed) and outcome.retryable:
        name = "executor_died"
    METRICS.drives.labels(outcome=name).inc()
    METRICS.drive_seconds.observe(seconds)
    if span is not None:
        span.set_attribute("qjsflow.outcome", type(outcome).__name__.lower())
        if isinstance(outcome, Suspended):
            markers = [marker.kind for marker in outcome.markers]
            span.add_event("suspended", {"qjsflow.on": markers})
    if isinstance(outcome, Failed):
        tracing.failed(span, outcome.message)
        kind = METRICS.limit_kind(outcome.message)
        if kind is not None:
            METRICS.limits_hit.labels(kind=kind).inc()
            _log.warning("run %s hit its %s limit: %s", run_id, kind,
                         printable(outcome.message[:200]))  # fmt: skip


def _nowhere(stack: str | None) -> str | None:
    """No bundle, no source map: frames are not located."""
    return None
