"""One drive of one run, from its beginning to its end: a `DriveSession` owns the lease's
states (runner/engine/drive/lease.py), its heartbeat, and every journal write of the drive.

A session is made by `RunDriver` (runner/engine/drive/driver.py) once a drive's beginning is
read or taken (runner/engine/drive/beginning.py). It drives the run in an executor until the
run suspends on something not yet due or ends, and records the end
(runner/engine/drive/ending.py). The fast paths a session may take are the lease's named
transitions: a lease taken by the heartbeat or by the end's own last update (READ), an end
that changed nothing written behind its answer, and one certified at the journal's mark
(docs/ARCHITECTURE.md, "A lease taken late", "An end that changed nothing", "An end already
certified").
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from functools import partial
from typing import TYPE_CHECKING, Any

from qjsflow.bridge.printable import printable
from qjsflow.bridge.types import DriveOutcome, Failed, JournalEntry, Suspended
from qjsflow.runner.bindings import Bindings
from qjsflow.runner.engine.drive.ahead import StartAhead
from qjsflow.runner.engine.drive.beginning import Begun, begin_drive, write_nothing
from qjsflow.runner.engine.drive.ending import (
    NotAllWritten,
    as_found,
    charge,
    end_unchanged,
    finish,
    left_as_found,
    park,
    record_unchanged_end,
    waits,
)
from qjsflow.runner.engine.drive.kept import Kept, OpenSteps
from qjsflow.runner.engine.drive.lease import LeaseState, LeaseWatch
from qjsflow.runner.engine.drive.runs import release
from qjsflow.runner.engine.host import DriveHost
from qjsflow.runner.engine.requests import run_request
from qjsflow.runner.errors import JournalUnavailable, StoredCodeDamaged
from qjsflow.runner.store import BundleRecord, Lease, LeaseLost, RunRecord, Unleased, with_compute
from qjsflow.runner.telemetry import tracing
from qjsflow.runner.telemetry.metrics import METRICS
from qjsflow.runner.tenancy.capabilities import Reach
from qjsflow.runner.tenancy.scopes import split_run_key

if TYPE_CHECKING:
    from qjsflow.runner.engine.drive.driver import RunDriver

__all__ = ["DriveSession"]

_log = logging.getLogger("qjsflow.driver")
_MAX_DRIVES_PER_CALL = 10_000
_CRASH_RETRIES = 2


class DriveSession:
    """One drive of `lease.run_id` under `lease`. With `keep`, a drive that leaves the run as
    it found it keeps its beginning (runner/engine/drive/kept.py); `mark`: the journal's mark
    what is kept was certified at (`_end_if_unchanged`)."""

    def __init__(
        self,
        driver: RunDriver,
        lease: Lease,
        bindings: Bindings,
        *,
        keep: bool,
        mark: bytes | None,
        ahead: StartAhead | None = None,
    ) -> None:
        self.driver = driver
        self.store = driver.store
        self.config = driver.config
        self.lease = lease
        self.bindings = bindings
        self.keep = keep
        self.mark = mark
        # A start's drive begun before its transaction is written (runner/engine/drive/
        # ahead.py): nothing of it is serviced or written before that is confirmed.
        self.ahead = ahead
        self.watch = LeaseWatch(read=lease.take is not None)

    async def run(self, begun: Begun, wrote: bool) -> RunRecord:
        """The run as the drive left it; `LeaseLost` when its lease was lost meanwhile.
        `wrote`: the caller's change was written with the drive's beginning."""
        task = asyncio.current_task()
        watch, lease = self.watch, self.lease
        # The heartbeat's task is made when its first take or renewal is due: a short drive
        # (most are) makes none, and does not wait for one to end.
        loop = asyncio.get_running_loop()
        beating: list[asyncio.Task[None]] = []
        first_beat = loop.call_later(
            self.driver.take_after_s if watch.state is LeaseState.READ else self._beat_s,
            lambda: beating.append(loop.create_task(self._heartbeat(task))),
        )
        if task is not None:
            self.driver.active[lease.run_id] = (watch, task)
        try:
            return await self._loop(begun, wrote)
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
            self.driver.active.pop(lease.run_id, None)
            first_beat.cancel()
            for heartbeat in beating:
                heartbeat.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await heartbeat

    @property
    def _beat_s(self) -> float:
        return self.config.lease_ttl_s / 3

    async def _heartbeat(self, drive: asyncio.Task[object] | None) -> None:
        """Take the lease (if no write has) or renew it, then every third of its TTL."""
        watch, lease = self.watch, self.lease
        while not watch.released:  # given up by the drive's end: nothing left to renew
            if watch.ending:  # the drive's end writes the lease itself: none to renew yet
                await asyncio.sleep(self._beat_s)
                continue
            try:
                if self.ahead is not None:
                    await self.ahead.confirmed()
                if watch.heartbeat_takes():  # a transaction fenced by the lease takes it
                    renewed = await self.store.transact(write_nothing, lease, durable=False)
                else:
                    now = self.driver.now_ms()
                    renewed = await self.store.renew_lease(lease, now, self.driver.ttl_ms)
            except (JournalUnavailable, LeaseLost):
                renewed = False  # stop writing: another driver may take the run over
            if not renewed:
                watch.lose()  # (a lease the end released meanwhile stays released)
                if watch.lost and drive is not None:
                    drive.cancel()  # stops the executor; nothing more is written
                return
            watch.renewed()
            await asyncio.sleep(self._beat_s)

    async def _loop(self, first: Begun, wrote: bool) -> RunRecord:
        """Drive until the run suspends on something not yet due or ends; the last transaction
        also releases the lease and returns the run as it was left. `first` is the drive's
        beginning, made with the lease (`wrote`: and with a change the caller asked for)."""
        lease, watch, driver = self.lease, self.watch, self.driver
        crashes = 0
        begun: Begun | RunRecord = first
        unsynced = wrote  # the caller's change, until a commit is fsynced
        for drives in range(_MAX_DRIVES_PER_CALL):
            if drives:
                now = driver.now_ms()
                begun = await self.store.transact(
                    partial(begin_drive, lease=lease, now=now, budgets=self.config.scope_budgets,
                            configs=driver.configs),
                    lease, durable=False,
                )  # fmt: skip
            if isinstance(begun, RunRecord):
                return begun  # finished, or cancelled just now
            run, journal, unsettled, used = begun
            began = time.monotonic()
            attributes = partial(_span_attributes, run, lease, journal)
            with tracing.drive_span(run.traceparent, attributes) as span:
                outcome, host = await self._drive_once(
                    run, journal, unsettled, used=used, traced=span is not None
                )
                _observe(span, run.run_id, outcome, time.monotonic() - began)
            if self.ahead is not None:
                await self.ahead.confirmed()  # before anything of the drive is written
            if isinstance(outcome, Failed) and outcome.retryable:
                # The executor process died: the OOM killer, an operator, or the run's own
                # code. Try again at once a few times, then park the run and come back later;
                # only a run whose executors keep dying is failed (executor_deaths_per_run).
                crashes += 1
                now = driver.now_ms()
                charges = driver.charges(outcome, host, now)
                if crashes <= _CRASH_RETRIES:
                    await self.store.transact(
                        partial(charge, lease=lease, outcome=outcome, host=host,
                                charges=charges, now=now),
                        lease,
                    )  # fmt: skip
                    continue
                return await self.store.transact(
                    partial(park, lease=lease, outcome=outcome, host=host, now=now,
                            limit=self.config.executor_deaths_per_run, charges=charges),
                    lease,
                )  # fmt: skip
            now = driver.now_ms()
            ending = watch.end_begins(ops_seen=host.ops_seen)
            untouched = left_as_found(outcome, host)
            if ending and untouched and not unsynced:
                # Nothing written yet, nothing to write: if the run is still as it was read,
                # the end only reads, and its records are written behind the answer.
                certified = self.mark if drives == 0 else None
                left = await self._end_if_unchanged(run, outcome, host, now=now, mark=certified)
                if left is not None:
                    watch.end_written(released=True)  # never taken: nothing to give up
                    return await self._ended(left, lease.epoch - 1, host, (journal, unsettled))
            durable = unsynced or not untouched
            ended, prepared = await self._end(outcome, host, now=now, taking=ending,
                                              durable=durable)  # fmt: skip
            unsynced = False  # this end was fsynced if the caller's change was not yet
            if ended is not None:
                return await self._ended(
                    ended, lease.epoch, host, (journal, unsettled), keep=untouched,
                    prepared=prepared,
                )  # fmt: skip
            await host.flush()
            if not prepared:
                asyncio.get_running_loop().call_soon(driver.pool.prepare_idle)
        # Still due after this many drives: leave the rest to the next call or a worker.
        left = await self.store.transact(partial(release, lease=lease), lease, durable=False)
        watch.end_written(released=True)
        return left

    async def _end(
        self, outcome: DriveOutcome, host: DriveHost, *, now: int, taking: bool, durable: bool
    ) -> tuple[RunRecord | None, bool]:
        """The drive's end written in full (`finish`): the run as left, or None when it is to
        be driven again at once (the lease held); and whether idle executors were told to
        prepare before it was committed. `taking`: the end's own last update takes
        the lease (its fence is checked in `finish`, not by the store)."""
        driver = self.driver
        end = partial(finish, lease=self.lease, outcome=outcome, host=host, now=now,
                      charges=driver.charges(outcome, host, now), taking=taking,
                      ttl_ms=driver.ttl_ms)  # fmt: skip
        # A lone drive's durable end commits on this thread at once
        # (`JournalStore.commit_here`): the executor prepares its next context meanwhile, on
        # the other core, while the commit waits for its fsync. Otherwise (the journal's
        # thread must first wake for it, or there is no fsync to wait for) the executor
        # prepares once the end is recorded and the caller has its answer.
        prepared = durable and driver.alone()
        if prepared:
            driver.pool.prepare_idle()
        try:
            # Queued behind the drive's last writes, in the same commit where it can be; what
            # the host holds (its last results) is written first in the same job, presumed
            # new (a step with a row already fails it, and it is written again carefully).
            ended = await host.transact(end, fenced=not taking, durable=durable, careful=end,
                                        reads_fence=True)  # fmt: skip
        except NotAllWritten:
            await host.flush()  # raises what failed, or waits for a write made again
            ended = await host.transact(end, fenced=not taking, durable=durable)
        self.watch.end_written(released=ended is not None)
        return ended, prepared

    async def _end_if_unchanged(
        self,
        found: RunRecord,
        outcome: DriveOutcome,
        host: DriveHost,
        *,
        now: int,
        mark: bytes | None,
    ) -> RunRecord | None:
        """The end of a drive that took no lease and left its run as it `found` it, if the
        run is still so (`end_unchanged`): its records written behind the answer, and the run
        as it is once they are. None: the end is to be written in full. A run kept from a
        drive whose records certified it at the journal's `mark` is not read while the
        journal's mark is still that one: nothing was committed since."""
        epoch = self.lease.epoch - 1
        events = waits(outcome)
        if not events:
            return None
        if mark is not None and self.store.journal_mark() == mark:
            as_certified = Unleased(found, epoch, woken=False, arrived=False, due=found.wake_at)
            unchanged = as_found(as_certified, found, epoch, events, now)
        else:
            unchanged = await self.store.read(
                partial(end_unchanged, found=found, epoch=epoch, events=events, now=now),
                here=True,
            )  # fmt: skip
        if unchanged is None:
            return None
        # As its compute is added behind the answer.
        left = with_compute(unchanged, outcome.cpu_s) if outcome.cpu_s else unchanged
        certify = self.store.marks_commits  # (a server journal has no mark to certify at)
        self.store.write_behind(
            partial(record_unchanged_end, run=left, epoch=epoch, worker_id=self.lease.worker_id,
                    cpu_s=outcome.cpu_s, events=events, certify=certify,
                    charges=self.driver.charges(outcome, host, now), now=now),
            then=partial(self.driver.certified, left, epoch) if certify else None,
        )  # fmt: skip
        return left

    async def _ended(
        self,
        run: RunRecord,
        epoch: int,
        host: DriveHost,
        beginning: tuple[tuple[JournalEntry, ...], OpenSteps],
        *,
        keep: bool = True,
        prepared: bool = False,
    ) -> RunRecord:
        """A drive's last steps once its end is recorded (the run left as `run`, at `epoch`):
        the host's writes are in, idle executors prepare (unless they were told `prepared`),
        and, if the session keeps and the drive allows it (`keep`), the run's beginning is kept
        for its next drive (runner/engine/drive/kept.py)."""
        await host.flush()
        if not prepared:
            asyncio.get_running_loop().call_soon(self.driver.pool.prepare_idle)
        if self.keep and keep:
            journal, unsettled = beginning
            self.driver.kept.keep(Kept(run, epoch, journal, unsettled, host.journal_bytes))
        return run

    async def _drive_once(
        self,
        run: RunRecord,
        journal: tuple[JournalEntry, ...],
        unsettled: OpenSteps,
        *,
        used: dict[str, float],
        traced: bool,
    ) -> tuple[DriveOutcome, DriveHost]:
        driver, config = self.driver, self.config
        recorded = sum(len(e.value or "") for e in journal)
        try:
            bundle: BundleRecord | None = await driver.bundle_of(run)
            damaged = None
        except StoredCodeDamaged as error:  # never run code that is not what was published
            bundle, damaged = None, error
        environment, budgets, policy = await driver.settings_of(run)
        host = DriveHost(
            self.store, self.lease, self.bindings, config.limits, driver.now_ms,
            scopes=driver.scopes, journal_bytes=recorded, monotonic=config.monotonic,
            environment=environment, run_env=run.persisted_bindings, generation=run.generation,
            budgets=budgets, used=used, traced=traced,
            locate=driver.locator(bundle) if bundle is not None else _nowhere,
            reach=Reach(None if bundle is None else bundle.capabilities, policy),
            children=driver.children_of(run),
        )  # fmt: skip
        if bundle is None:
            return Failed(False, str(damaged), 0.0), host
        request = run_request(run, bundle, journal, config.limits, open_steps=unsettled)
        try:
            ahead = self.ahead
            outcome = await driver.pool.drive(
                request, host if ahead is None else ahead.gating(host)
            )
        except BaseException:
            # What the host answered ahead is committed first (a failure there, such as a
            # lost lease, ends the drive as it would have then).
            await host.flush()
            raise
        if isinstance(outcome, Failed) and outcome.retryable:
            await host.flush()  # the executor died: its charge is recorded after those
        # Otherwise the drive's end is queued behind them (`finish` checks they were written).
        if isinstance(outcome, Failed) and outcome.stack is not None:
            outcome = dataclasses.replace(outcome, stack=host.locate(outcome.stack))
        return outcome, host


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
