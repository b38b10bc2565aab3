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
written behind the answer (`end_unchanged`; docs/ARCHITECTURE.md, "An end that changed
nothing"). Those records also certify what is kept of the run, at the journal's mark: the
next such end, while nothing has been committed since, reads nothing at all
(`_end_if_unchanged`; docs/ARCHITECTURE.md, "An end already certified").
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from qjsflow.bridge.types import DriveOutcome
from qjsflow.bundles.manifest import Capabilities
from qjsflow.runner.bindings import Bindings, ToolFn
from qjsflow.runner.config import RunnerConfig
from qjsflow.runner.engine.drive.ahead import StartAhead, foreseen_start
from qjsflow.runner.engine.drive.beginning import (
    BeforeLease,
    Begun,
    Presuming,
    Taken,
    read_begin,
    set_budgets,
    take_and_begin,
    take_read,
)
from qjsflow.runner.engine.drive.kept import Kept, KeptBeginnings
from qjsflow.runner.engine.drive.lease import LeaseWatch
from qjsflow.runner.engine.drive.session import DriveSession
from qjsflow.runner.engine.host import DriveHost
from qjsflow.runner.engine.locations import Locator, SourceMap, author_frames
from qjsflow.runner.engine.locks import KeyedLocks
from qjsflow.runner.errors import RunNotFound
from qjsflow.runner.scopedb import ScopeDatabases
from qjsflow.runner.store import BundleRecord, JournalStore, Lease, LeaseLost, RunRecord
from qjsflow.runner.telemetry.metrics import METRICS
from qjsflow.runner.tenancy.budgets import MINUTE_MS, Budgets, Charges, forget_before
from qjsflow.runner.tenancy.environment import ScopeEnvironment
from qjsflow.runner.tenancy.scope_config import ConfigCache, ScopeConfig
from qjsflow.runner.tenancy.scope_limits import ScopeLimits
from qjsflow.runner.tenancy.scopes import split_run_key
from qjsflow.runner.tenancy.sealed_secrets import Sealed, SecretKeys, open_sealed
from qjsflow.runner.tenancy.secret_sources import SecretSource
from qjsflow.sandbox import ExecutorPool

__all__ = ["RunDriver"]

_log = logging.getLogger("qjsflow.driver")

_BUNDLES_KEPT = 64


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
        *,
        configs: ConfigCache | None = None,
    ) -> None:
        self.scopes = scopes
        self.configs = configs or ConfigCache()  # scopes' configuration versions runs recorded
        # Each scope's weight and concurrency limit: a worker refreshes them from the journal.
        self.limits = ScopeLimits(config.scope_weights, config.scope_concurrency)
        self.secret_source = SecretSource()  # where this process finds secrets' values
        self.secret_keys = SecretKeys()  # and the scope keys it opens sealed ones with
        self.store = store
        self.pool = pool
        self.config = config
        self.worker_id = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
        self._locks = KeyedLocks()
        self._bundles: dict[tuple[str, str, str], BundleRecord] = {}
        self._swept: dict[str, int] = {}  # scope -> the minute its old usage was last dropped
        self._maps: dict[BundleRecord, SourceMap] = {}  # read on a bundle's first error
        # Drives in progress in this process, to stop one at once when its run is taken away.
        self.active: dict[str, tuple[LeaseWatch, asyncio.Task[object]]] = {}
        self.kept = KeptBeginnings()  # waiting runs' beginnings, from their last drive here
        # Serves workflow bindings' calls (parent run, its snapshot, the call's args): the
        # runner hands it in (runner/operations/workflow_bindings.py); the engine knows none.
        self.children: Callable[[str, str, Any], Awaitable[Any]] | None = None

    def now_ms(self) -> int:
        return int(self.config.clock() * 1000)

    @property
    def ttl_ms(self) -> int:
        return int(self.config.lease_ttl_s * 1000)

    async def drive(
        self,
        run_id: str,
        bindings: Bindings,
        *,
        first: BeforeLease | Presuming | None = None,
        read_first: bool = False,
        foresee: Callable[[int], RunRecord | None] | None = None,
    ) -> RunRecord:
        """Drive `run_id` until it suspends on something not yet due, or ends. A run whose
        lease another live driver holds is returned as it is. `first` is written in the
        transaction that takes the lease, before it (an operator's resume lifting a pause).
        With `read_first` (a caller waiting for this drive: a resume, a signal), the run may be
        read before its lease is taken (`read_begin`), and `first` must write nothing to a
        run that is not paused and has no cancel or pause asked. A worker's claim takes the
        lease first: claims skip leased runs (a run in flight is not claimed again, here or by
        another worker) and number each scope's turns without them. A resume may begin from
        what the run's last drive here left kept (runner/engine/kept.py). `foresee`: the run a
        start's `first` writes, if that can be told now (the drive then begins ahead of it:
        runner/engine/drive/ahead.py)."""
        run = await self.claim(run_id, bindings, first=first, read_first=read_first,
                               foresee=foresee)  # fmt: skip
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
        first: BeforeLease | Presuming | None = None,
        read_first: bool = False,
        foresee: Callable[[int], RunRecord | None] | None = None,
    ) -> RunRecord | None:
        """`drive`, or None when no lease was taken (another driver holds the run, or a lost
        one's session still locks its row): nothing was done, and nothing is read."""
        async with self._locks.hold(run_id):
            kept = self.kept.take(run_id, self.now_ms())  # dropped: the end keeps it again
            read_first = read_first and self._may_read_first(run_id)
            if kept is not None and self._budgeted(kept.run):
                kept = None  # its budgets are looked at as its drive begins, under the lease
            if kept is not None and read_first:
                begun = self._from_kept(kept)
                final = await self._drive_taken(begun, bindings, keep=True, mark=kept.mark)
                if final is not None:
                    return final
                # Taken since it was kept (by another driver, or an operator): read afresh.
            now = self.now_ms()
            taken: Taken | None = None
            if read_first:
                taken = await self.store.transact(
                    partial(read_begin, run_id=run_id, worker_id=self.worker_id, now=now,
                            take=self._late_take, configs=self.configs),
                    durable=False, writes=False,
                )  # fmt: skip
            if taken is None:
                # The lease and the drive's beginning in one transaction: one journal hop fewer.
                take = partial(take_and_begin, run_id=run_id, worker_id=self.worker_id, now=now,
                               ttl_ms=self.ttl_ms, budgets=self.config.scope_budgets,
                               configs=self.configs)  # fmt: skip
                if isinstance(first, Presuming):
                    start = partial(
                        self.store.transact,
                        partial(take, first=first.presumed),
                        durable=False,
                        careful=partial(take, first=first.careful),
                    )
                    run = self._foreseen(run_id, foresee, now)
                    if run is None:
                        taken = await start()
                    else:
                        ahead = StartAhead(asyncio.ensure_future(start()),
                                           foreseen_start(run, self.worker_id))  # fmt: skip
                        final = await self._drive_ahead(ahead, bindings)
                        if ahead.held:
                            return final or await self.store.get_run(run_id)
                        # Its start was not written as foreseen (what it raised is raised
                        # here): driven as the start left it.
                        taken = await ahead.start
                else:
                    taken = await self.store.transact(partial(take, first=first), durable=False)
            if taken is None:
                return None
            final = await self._drive_taken(taken, bindings, keep=read_first)
            return final or await self.store.get_run(run_id)

    def _foreseen(
        self, run_id: str, foresee: Callable[[int], RunRecord | None] | None, now: int
    ) -> RunRecord | None:
        """The run a start will write at `now`, where its drive may begin ahead of that: on a
        journal whose commit is a round trip to a server (SQLite's is over before the drive
        could be sent: ahead, a sequential run gained nothing), in a scope whose budgets and
        limits leave nothing to settle first (`_may_read_first`)."""
        if foresee is None or not self.store.pipelined or not self._may_read_first(run_id):
            return None
        return foresee(now)

    async def _drive_ahead(self, ahead: StartAhead, bindings: Bindings) -> RunRecord | None:
        """A start's drive begun while its transaction commits: the run as it left it, or None
        when that drive wrote nothing (its start was not written as foreseen, or its lease
        was lost since, and then given up here)."""
        lease, begun, wrote = ahead.foreseen
        assert not isinstance(begun, RunRecord)
        final: RunRecord | None = None
        try:
            session = DriveSession(self, lease, bindings, keep=False, mark=None, ahead=ahead)
            final = await session.run(begun, wrote)
        except LeaseLost:
            pass  # not the drive's lease, or another driver has the run now
        finally:
            if final is None:
                await ahead.settled()
                if ahead.held:  # the lease is the drive's, and was not given up with it
                    await self.store.release_lease(lease)
        return final

    @property
    def _late_take(self) -> partial[None]:
        """How a drive read before its lease takes it (`take_read`), less the run's facts."""
        return partial(take_read, worker_id=self.worker_id, ttl_ms=self.ttl_ms,
                       clock=self.now_ms)  # fmt: skip

    def _from_kept(self, kept: Kept) -> tuple[Lease, Begun, bool]:
        """A drive's beginning from what a drive before it left kept (runner/engine/kept.py): as
        `read_begin` would read it, with no wake-up timer to serve (one set since, by a
        signal elsewhere, wakes the run again); its lease is taken only if the run's epoch
        and row are still as kept."""
        run = kept.run
        later = partial(self._late_take, run_id=run.run_id, epoch=kept.epoch,
                        snapshot_id=run.snapshot_id, woken=False, kept=run)  # fmt: skip
        lease = Lease(run.run_id, self.worker_id, kept.epoch + 1, take=later)
        return lease, (run, kept.journal, kept.open, {}), False

    async def _drive_taken(
        self, taken: Taken, bindings: Bindings, *, keep: bool, mark: bytes | None = None
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
            session = DriveSession(self, lease, bindings, keep=keep, mark=mark)
            final = await session.run(begun, wrote)
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
        return set_budgets(config.scope_budgets, scope) is None and (
            scope not in self.limits.concurrency
        )

    def _budgeted(self, run: RunRecord) -> bool:
        """Whether the configuration version a run recorded sets budgets (a version not read
        in this process yet counts as setting them: the drive then reads it)."""
        if run.config_version is None:
            return False
        parsed = self.configs.cached(run.scope, run.config_version)
        return parsed is None or (parsed.budgets is not None and parsed.budgets.any)

    def children_of(self, run: RunRecord) -> ToolFn | None:
        """What serves `run`'s workflow bindings' calls, if anything here does."""
        serve = self.children
        return None if serve is None else partial(serve, run.run_id, run.snapshot_id)

    def alone(self) -> bool:
        """Whether at most one drive is in progress in this process: the event loop would
        only wait for its transactions (`JournalStore.commit_here`)."""
        return len(self.active) <= 1

    def driving(self, run_id: str) -> bool:
        """Whether this process drives `run_id` now."""
        return run_id in self.active

    def forget(self, run_id: str) -> None:
        """Drop what is kept of `run_id`'s beginning (runner/engine/kept.py): an event
        delivered to it here makes it stale (a drive from it would suspend, find the event at
        its end, and drive the run again)."""
        self.kept.forget(run_id)

    def stop(self, run_id: str) -> None:
        """Stop this process's drive of `run_id`, if any, as if its lease were lost (an
        operator terminated or restarted the run; drives elsewhere stop at their heartbeat)."""
        self.kept.forget(run_id)
        active = self.active.get(run_id)
        if active is not None:
            watch, task = active
            watch.lose()
            task.cancel()

    def certified(
        self, run: RunRecord, epoch: int, found_as_kept: bool, mark: bytes | None
    ) -> None:
        """A quiet end's records are written: if they found the run as kept, in a commit
        that `mark`s the journal, what is kept of it is certified at that mark."""
        if found_as_kept and mark is not None:
            self.kept.certify(run, epoch, mark)

    def charges(self, outcome: DriveOutcome, host: DriveHost, now: int) -> Charges:
        """What a drive used, taken from its host once (the transaction charging it may run
        again after a transient fault): the drive itself, its compute, and what the host
        counted; and, the first time this process charges the scope in a new minute, the
        windows its usage may forget (not a statement on every drive)."""
        used = host.take_usage()
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
        return self.locator(bundle)(stack)

    def locator(self, bundle: BundleRecord) -> Locator:
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

    async def settings_of(
        self, run: RunRecord
    ) -> tuple[ScopeEnvironment | None, Budgets | None, Capabilities | None]:
        """The environment, budgets and capability policy a drive of `run` uses: those of the
        scope's configuration version it started with (its secrets' values from this
        process's environment variables), or, for a run that recorded none, this process's
        own settings."""
        if run.config_version is None:
            config = self.config
            return (config.environments.get(run.scope), config.scope_budgets.get(run.scope),
                    config.scope_policies.get(run.scope))  # fmt: skip
        parsed = await self.configs.version(self.store, run.scope, run.config_version)
        return await self.environment_of(run.scope, parsed), parsed.budgets, parsed.capabilities

    async def environment_of(self, scope: str, parsed: ScopeConfig) -> ScopeEnvironment:
        """A configuration's environment in this process: secrets from its sources, those
        sealed in the journal opened with this process's key of the scope (if it holds one)."""
        opened: dict[str, str] = {}
        key = self.secret_keys.key(scope) if parsed.sealed_names else None
        if key is not None:
            rows = await self.store.sealed_secrets(scope)
            for name in parsed.sealed_names:
                if name in rows:
                    value = open_sealed(key, scope, name, Sealed(*rows[name][:3]))
                    if value is not None:
                        opened[name] = value
        return parsed.environment(self.secret_source, opened)

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
