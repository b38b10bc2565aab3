"""`Runner`: the Python API of qjsflow (README: the authoring guide and the command line)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial

from qjsflow.bridge import InvalidInput, dumps_text
from qjsflow.bridge.rules import RULES, is_event_type
from qjsflow.bridge.values import from_python
from qjsflow.bundles import build_snapshot, name_workflows
from qjsflow.runner.bindings import Bindings
from qjsflow.runner.config import Retention, RunnerConfig
from qjsflow.runner.engine.drive import SIGNAL_TIMER, BeforeLease, Presuming, RunDriver
from qjsflow.runner.engine.worker import IDLE_HORIZON_MS, Worker
from qjsflow.runner.errors import (
    InvalidEvent,
    RunClosed,
    RunConflict,
    UnknownWorkflow,
)
from qjsflow.runner.operations.control import (
    FRESH_ATTEMPT,
    Checked,
    ExistingRun,
    StepRef,
    check_same_start,
    checked_reason,
    fork_run,
    lift_pause,
    request_pause,
    request_rollback,
    restart_run,
    terminate_run,
)
from qjsflow.runner.operations.fork_check import check_fork
from qjsflow.runner.operations.inspect import describe_exports
from qjsflow.runner.operations.migrate import MigrationReport, migrate_runs
from qjsflow.runner.operations.retention import Pruned, prune
from qjsflow.runner.operations.schedules import Schedules, declared_schedules
from qjsflow.runner.operations.scope_configs import (
    ScopeConfigs,
    move_to_config,
)
from qjsflow.runner.operations.start_reads import StartReads
from qjsflow.runner.operations.starts import (
    BatchItem,
    GatedStart,
    batch_of,
    creation,
    new_run_id,
)
from qjsflow.runner.operations.workflow_bindings import serve_call
from qjsflow.runner.reads import (
    RUN_ID,
    RunReads,
    caller_key,
    found_run,
)
from qjsflow.runner.scopedb import ScopeDatabases, default_root
from qjsflow.runner.store import (
    JournalStore,
    JournalTransaction,
    RunRecord,
    RunStatus,
)
from qjsflow.runner.telemetry.tracing import new_traceparent
from qjsflow.runner.tenancy.budgets import current_windows
from qjsflow.runner.tenancy.capabilities import check_publish
from qjsflow.runner.tenancy.scope_config import ConfigCache
from qjsflow.runner.tenancy.scopes import (
    ALL_SCOPES,
    AllScopes,
    run_key,
    split_run_key,
    validate_scope,
)
from qjsflow.runner.tenancy.usage import ScopeUsage, admit, scope_usage
from qjsflow.runner.views import (
    TERMINAL,
    PublishedWorkflow,
    PublishResult,
    RunView,
    StartRunInput,
    published_result,
    run_view,
)
from qjsflow.sandbox import ExecutorPool

__all__ = ["PublishResult", "PublishedWorkflow", "Runner", "Source"]

Source = str | os.PathLike[str] | Mapping[str, str | bytes]


_MIGRATE_AT_MOST = 100_000  # runs one `migrate` command checks


class Runner(Schedules, ScopeConfigs, RunReads):
    """Publishes snapshots and (with later parts of the plan) drives runs against one journal."""

    def __init__(self, store: JournalStore, config: RunnerConfig) -> None:
        super().__init__(store)
        self.config = config
        pool = ExecutorPool(config.pool)
        scope_root = config.scope_root or default_root(store.path)
        replicated = config.scope_database_mode(store.path is None) == "replicated"
        self.scopes = ScopeDatabases(scope_root, config.sql_limits, store if replicated else None)
        # The engine under this runner: what a `Worker` serves with, and tests' seam into the
        # drive (its clock, its pool, `take_after_s`).
        self.configs = ConfigCache()  # scopes' configuration versions, parsed once
        self._start_reads = StartReads()  # what starts read, for the next to presume
        self.driver = RunDriver(store, pool, config, self.scopes, configs=self.configs)
        self.driver.children = partial(serve_call, self)  # workflow bindings' calls
        store.serve_runner(retry_s=config.journal_retry_s, commit_here=self.driver.alone)

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        db_path: str | os.PathLike[str],
        config: RunnerConfig | None = None,
        *,
        create: bool = True,
    ) -> AsyncIterator[Runner]:
        """`async with Runner.open(path) as runner:` — the journal is created if missing
        (with `create=False` it must exist, and opening it writes nothing)."""
        runner = await cls.connect(db_path, config, create=create)
        try:
            yield runner
        finally:
            await runner.aclose()

    @classmethod
    async def connect(
        cls,
        db_path: str | os.PathLike[str],
        config: RunnerConfig | None = None,
        *,
        create: bool = True,
    ) -> Runner:
        """Open a runner whose lifetime the caller ends with `aclose()`."""
        store = await JournalStore.open(os.fspath(db_path), create=create)
        return cls(store, config or RunnerConfig())

    async def aclose(self) -> None:
        await self.driver.pool.aclose()
        await self.scopes.aclose()
        await self._store.aclose()

    async def publish(
        self, scope: str, source: Source, entries: Sequence[str] | None = None
    ) -> PublishResult:
        """Publish a folder or a mapping path -> source as a snapshot of `scope`.

        A snapshot is the entries and the files they import (docs/ARCHITECTURE.md,
        Publishing); publishing the same files again returns the existing snapshot and stores
        nothing new.
        """
        validate_scope(scope)
        self.driver.pool.warm()  # asking what the bundles export needs one
        snapshot = await build_snapshot(
            source, entries, limits=self.config.build_limits,
            tree_limits=self.config.tree_limits, exclude=self._store.own_files(),
        )  # fmt: skip
        check_publish(scope, snapshot.capabilities, self.config.scope_policies.get(scope))
        existing = await self._store.find_snapshot(scope, snapshot.snapshot_id)
        if existing is not None:
            return published_result(existing, created=False, warnings=snapshot.warnings)
        now_ms = self.driver.now_ms()
        exports = {
            bundle.entry_path: await describe_exports(
                self.driver.pool, bundle, self.config.limits, now_ms
            )
            for bundle in snapshot.bundles
        }
        snapshot = name_workflows(snapshot, exports)
        # The project's schedules, checked before anything is stored, set once it is.
        schedules = declared_schedules(snapshot.declared, snapshot.settings)
        created = await self._store.insert_snapshot(scope, snapshot, self.config.clock())
        await self.register_schedules(scope, schedules)
        record = await self._store.find_snapshot(scope, snapshot.snapshot_id)
        assert record is not None, "a snapshot just stored must be found"
        return published_result(record, created=created, warnings=snapshot.warnings)

    # -- runs --------------------------------------------------------------------------------

    async def start(
        self, request: StartRunInput, bindings: Bindings | None = None, *, drive: bool = True
    ) -> RunView:
        """Create a run pinned to a snapshot and drive it to its first suspension or its end
        (with `drive=False`, leave it for a worker).

        With a caller-supplied `run_id` start is idempotent: the same arguments return the
        existing run; different ones raise `RunConflict`.
        """
        create = creation(request, config=self.config, configs=self.configs,
                          reads=self._start_reads)  # fmt: skip
        now = self.driver.now_ms()

        if not drive:
            wanted, existing = await self._store.transact(partial(create, now=now))
            if existing is not None:
                if existing.run_id == wanted.run_id:  # else a debounced start, merged into it
                    check_same_start(existing, wanted)
                return run_view(existing)
            return run_view(wanted)

        def create_to_drive(tx: JournalTransaction, *, now: int, presume: bool = False) -> bool:
            # The drive's time: its beginning changes nothing.
            wanted, existing = create(tx, now, inline=True, presume=presume)
            if existing is not None:  # nothing is written: the run is returned as it is
                raise ExistingRun(existing, wanted)
            return True

        # Created in the transaction that takes its lease and begins its first drive (not
        # fsynced by itself: the drive's first effect or its end makes it durable, and the
        # caller learns of the run only then). Presumed new: inserted without reading whether
        # the run is there, which, if it is, fails the insert and the careful transaction runs.
        first = Presuming(partial(create_to_drive, presume=True), create_to_drive)
        try:
            return await self._drive(create.run_key, bindings, first=first,
                                     foresee=create.foresee)  # fmt: skip
        except ExistingRun as already:
            check_same_start(already.run, already.wanted)
            return run_view(already.run)
        except GatedStart:  # written alone, as its gate says; driven here if admitted
            wanted, existing = await self._store.transact(partial(create, now=now))
            if existing is not None:
                if existing.run_id == wanted.run_id:
                    check_same_start(existing, wanted)
                return run_view(existing)
            if wanted.status != RunStatus.running:
                return run_view(wanted)
            return await self._drive(create.run_key, bindings)

    async def start_batch(self, requests: Sequence[StartRunInput]) -> list[BatchItem]:
        """Up to `MAX_BATCH` starts in one transaction, each answered on its own (created,
        existed, or refused and why), left for workers (runner/operations/starts.py)."""
        run_all = batch_of(requests, config=self.config, configs=self.configs)
        now = self.driver.now_ms()
        return await self._store.transact(lambda tx: run_all(tx, now))

    async def resume(
        self, run_id: str, bindings: Bindings | None = None, *, scope: str, drive: bool = True
    ) -> RunView:
        """Make a paused run runnable again, and drive it (after a crash, or once its timer is
        due, this drives any run; `drive=False` leaves it for a worker). A finished run is
        returned as it is."""
        key = caller_key(run_id, scope)
        if not drive:
            if (await self._run(run_id, scope)).pause_requested:  # else nothing to write
                await self._store.transact(partial(lift_pause, key=key, now=self.driver.now_ms()))
            return await self.get(run_id, scope=scope)
        # The pause lifted in the transaction that takes the run's lease: one journal hop.
        # (A run with no pause asked is read first: lifting writes nothing to it.)
        return await self._drive(key, bindings, first=partial(lift_pause, key=key), read_first=True)

    async def pause(self, run_id: str, *, scope: str) -> RunView:
        """Park the run once the steps under way have recorded their results: no worker drives
        it until `resume`; events sent meanwhile are kept, timers keep their due times."""
        key = caller_key(run_id, scope)
        await self._store.transact(partial(request_pause, key=key, now=self.driver.now_ms()))
        if self.driver.driving(key):  # this process's drive parks it after its steps
            return await self.get(run_id, scope=scope)
        # Parks it now unless a driver elsewhere holds it (that one parks it after its steps).
        return await self._drive(key, None)

    async def terminate(
        self, run_id: str, *, scope: str, reason: str | None = None, rollback: bool = False
    ) -> RunView:
        """End the run now (`terminated`), its executor stopped mid-step if need be; a tool
        call in flight may or may not have acted (its audit row keeps no result). With
        `rollback`, its next drive (a worker's) runs its rollbacks first, then ends it."""
        key = caller_key(run_id, scope)
        reason = checked_reason(reason)
        now = self.driver.now_ms()
        if rollback:
            await self._store.transact(partial(request_rollback, key=key, now=now, reason=reason))
            return await self.get(run_id, scope=scope)
        await self._store.transact(partial(terminate_run, key=key, now=now, reason=reason))
        self.driver.stop(key)
        return await self.get(run_id, scope=scope)

    async def restart(
        self,
        run_id: str,
        bindings: Bindings | None = None,
        *,
        scope: str,
        from_step: str | None = None,
        drive: bool = True,
        config: str | None = None,
    ) -> RunView:
        """Run it again under the same id: from the beginning, or from `from_step`
        (`KIND:NAME[:COUNT]`): the steps settled before it keep their recorded results (their
        tools are not called again); it and everything after run again. The history keeps the
        earlier attempts. `config` ("latest", or a version) moves it to that configuration."""
        key, now = caller_key(run_id, scope), self.driver.now_ms()
        start = None if from_step is None else StepRef.parse(from_step)
        move = None if config is None else partial(
            move_to_config, target=config, config=self.config, configs=self.configs)  # fmt: skip
        budgets = self.config.scope_budgets.get(validate_scope(scope))
        await self._store.transact(
            partial(restart_run, key=key, start=start, now=now, budgets=budgets, move=move)
        )
        self.driver.stop(key)
        if not drive:
            return await self.get(run_id, scope=scope)
        return await self._drive(key, bindings)

    async def fork(
        self,
        run_id: str,
        bindings: Bindings | None = None,
        *,
        scope: str,
        from_step: str | None = None,
        snapshot_id: str | None = None,
        new_run_id: str | None = None,
        drive: bool = True,
        config: str | None = None,
    ) -> RunView:
        """A new run of the same workflow and input, with the results of the steps settled
        before `from_step` copied (none without it); on `snapshot_id`, another snapshot of
        the scope, if its code reaches those steps in the same order (else `ForkMismatch`,
        naming the first difference). `config` ("latest", or a version) runs it under that
        version of its scope's configuration."""
        source = await self._run(run_id, scope)
        start = None if from_step is None else StepRef.parse(from_step)
        snapshot = await self.find_snapshot(snapshot_id or source.snapshot_id, scope=scope)
        entries = {w.workflow: w.entry_path for w in snapshot.workflows}
        if source.workflow not in entries:
            raise UnknownWorkflow(source.workflow, sorted(entries))
        key = run_key(validate_scope(scope), self._run_id(new_run_id))
        now = self.driver.now_ms()
        fork = dataclasses.replace(
            source, **FRESH_ATTEMPT, run_id=key, snapshot_id=snapshot.snapshot_id,  # type: ignore[arg-type]
            entry_path=entries[source.workflow], created_at=now, updated_at=now, generation=0,
            traceparent=new_traceparent(None),
        )  # fmt: skip
        checked = None
        if snapshot.snapshot_id != source.snapshot_id:
            keys = await check_fork(self.driver, source, fork, start)
            checked = Checked(source.generation, keys)
        created = await self._store.transact(partial(
            fork_run, source_key=source.run_id, fork=fork, start=start, now=now, checked=checked,
            budgets=self.config.scope_budgets.get(fork.scope), move=None if config is None else
            partial(move_to_config, target=config, config=self.config, configs=self.configs),
        ))  # fmt: skip
        if not created:
            raise RunConflict(split_run_key(key)[1], ["run_id (a run with this id exists)"])
        if not drive:
            return await self.get(split_run_key(key)[1], scope=scope)
        return await self._drive(key, bindings)

    async def migrate(
        self,
        *,
        scope: str,
        to_snapshot: str,
        run_id: str | None = None,
        workflow: str | None = None,
        from_snapshot: str | None = None,
        dry_run: bool = False,
        config: str | None = None,
    ) -> MigrationReport:
        """Move one run (`run_id`), or every run of `workflow` on `from_snapshot` that has not
        ended, to `to_snapshot` — each only if replaying its journal against the new code
        makes the same calls (runner/operations/migrate.py); the others are reported with where they
        diverge. `dry_run` checks and writes nothing."""
        scope = validate_scope(scope)
        target = await self.find_snapshot(to_snapshot, scope=scope)
        if run_id is not None and workflow is None and from_snapshot is None:
            runs = [await self._run(run_id, scope)]
        elif run_id is None and workflow is not None and from_snapshot is not None:
            old = await self.find_snapshot(from_snapshot, scope=scope)
            runs = await self._store.runs_on_snapshot(
                scope, workflow, old.snapshot_id, limit=_MIGRATE_AT_MOST
            )
        else:
            raise InvalidInput(
                "migrate one run, or a workflow's runs on a snapshot (--workflow and"
                " --from-snapshot): one of the two"
            )
        bundles = {}
        for name in sorted({run.workflow for run in runs}):
            bundle = await self._store.load_bundle(scope, target.snapshot_id, name)
            if bundle is None:
                known = sorted(w.workflow for w in target.workflows)
                raise UnknownWorkflow(name, known)
            bundles[name] = bundle
        move = None if config is None else partial(
            move_to_config, target=config, config=self.config, configs=self.configs)  # fmt: skip
        return await migrate_runs(self.driver, scope, runs, bundles, to_snapshot=target.snapshot_id,
                                  dry_run=dry_run, move=move)  # fmt: skip

    async def signal(
        self,
        run_id: str,
        event_type: str,
        payload: object = None,
        bindings: Bindings | None = None,
        *,
        scope: str,
        drive: bool = True,
        event_id: str | None = None,
    ) -> RunView:
        """Deliver an event for `step.waitForEvent`. Events that arrive before the wait are
        buffered; each is consumed once, in the order they arrived. A waiting run is driven
        inline (or, with `drive=False`, woken for a worker). With an `event_id`, delivering
        the same id again (a caller retrying after a timeout) adds no second event."""
        if event_id is None:
            # Made before the first attempt: a transaction run again after a fault finds the
            # event it delivered (the inbox keeps one event per id) and adds no second.
            event_id = f"e-{uuid.uuid4().hex}"
        if not isinstance(event_id, str) or not RUN_ID.fullmatch(event_id):
            raise InvalidEvent(
                f"invalid event id {str(event_id)[:80]!r}: use 1-128 characters of "
                "A-Z, a-z, 0-9, _ and -"
            )
        if not is_event_type(event_type):
            raise InvalidEvent(
                f"invalid event type {str(event_type)[:80]!r}: use {RULES.event_type_rule}"
            )
        encoded = from_python(
            payload, max_bytes=self.config.limits.value_bytes, what="the event payload"
        )
        key = caller_key(run_id, scope)
        now = self.driver.now_ms()
        budgets = self.config.scope_budgets.get(validate_scope(scope))

        def deliver(tx: JournalTransaction) -> RunRecord:
            run = found_run(tx.get_run(key), run_id)
            if run.status in TERMINAL or run.cancel_requested:
                raise RunClosed(run_id, "cancelled" if run.cancel_requested else run.status)
            seq = tx.insert_inbox(key, event_type, encoded, now, event_id)
            if seq is None:
                return run  # delivered before: the retry changes nothing
            cap = self.config.events_pending_per_run
            if tx.count_unconsumed(key) > cap:  # counting this one
                raise InvalidEvent(
                    f"run {run_id!r} holds {cap} events no wait has taken yet, the most a run "
                    "may hold (RunnerConfig.events_pending_per_run): nothing was delivered"
                )
            admit(tx, run.scope, budgets, stored_bytes=len(encoded))
            tx.append_event(
                key, "event_received", now,
                dumps_text({"type": event_type, "inbox": seq, "eventId": event_id}),
            )  # fmt: skip
            if run.status == RunStatus.waiting:
                # Wakes the run for whichever driver comes next, here or in a worker.
                tx.set_timer(key, SIGNAL_TIMER, "signal", now)
            return run

        current = await self._store.transact(deliver)
        self.driver.forget(key)  # a beginning kept of it knows nothing of this event
        if drive and current.status == RunStatus.waiting:
            return await self._drive(key, bindings, read_first=True)
        return run_view(current)

    async def cancel(self, run_id: str, *, scope: str) -> RunView:
        """Stop a run at its next suspension point (at once if it is suspended now). Later
        signals are refused."""
        key = caller_key(run_id, scope)
        now = self.driver.now_ms()

        def request_cancel(tx: JournalTransaction) -> None:
            run = found_run(tx.get_run(key), run_id)
            if run.status not in TERMINAL and not run.cancel_requested:
                tx.update_run(key, cancel_requested=1, updated_at=now)
                tx.append_event(key, "cancel_requested", now, None)

        await self._store.transact(request_cancel)
        return await self._drive(key, None)

    async def prune(
        self,
        *,
        older_than_s: float,
        scope: str | AllScopes,
        statuses: Iterable[str] = TERMINAL,
        snapshots: bool = False,
        dry_run: bool = False,
    ) -> Pruned:
        """Delete runs that ended more than `older_than_s` ago, with everything recorded of
        them; with `snapshots`, also snapshots published as long ago that no run is pinned
        to. `dry_run` only counts. Runs that have not ended are never pruned."""
        if not isinstance(older_than_s, int | float) or not older_than_s >= 0:
            raise InvalidInput("the age of runs to prune must be 0 seconds or more")
        chosen = frozenset(statuses)
        if not chosen or not chosen <= TERMINAL:
            raise InvalidInput(f"only ended runs are pruned: statuses among {sorted(TERMINAL)}")
        return await prune(
            self._store, self.scopes, before_ms=self.driver.now_ms() - int(older_than_s * 1000),
            statuses=chosen, snapshots=snapshots, dry_run=dry_run,
            scope=None if scope is ALL_SCOPES else validate_scope(scope),
        )  # fmt: skip

    async def serve(
        self,
        *,
        until_idle: bool = False,
        concurrency: int = 8,
        stop: asyncio.Event | None = None,
        bindings: Bindings | None = None,
        idle_horizon_s: float = IDLE_HORIZON_MS / 1000,
        ready: Callable[[], None] | None = None,
        poll_interval_s: float = 0.2,
    ) -> int:
        """The worker loops (timers, recovery, signals) until `stop` is set, or until idle:
        nothing in progress and no timer due within `idle_horizon_s`. Returns how many drives
        this call made."""
        worker = Worker(
            self._store,
            self.driver,
            bindings or self.config.bindings,
            concurrency=concurrency,
            poll_interval_s=poll_interval_s,
            idle_horizon_ms=int(idle_horizon_s * 1000),
            prune=self._prune_retained,
            fire=self.fire_schedules,
            ready=ready,
            secret_providers=self.config.secret_providers(),
        )
        await worker.serve(until_idle=until_idle, stop=stop)
        return worker.drives

    async def _prune_retained(self, before_ms: int, retention: Retention) -> tuple[int, int]:
        """A worker's pruning under the retention setting: (runs, snapshots) pruned."""
        done = await prune(
            self._store, self.scopes, before_ms=before_ms, statuses=retention.statuses,
            snapshots=retention.snapshots,
        )  # fmt: skip
        return done.runs, done.snapshots

    async def usage(self, *, scope: str | AllScopes) -> dict[str, ScopeUsage]:
        """Per scope: its runs by status, and what it used of each measure in the current
        window, with its budgets (runner/tenancy/budgets.py)."""
        chosen = None if scope is ALL_SCOPES else validate_scope(scope)
        now = self.driver.now_ms()
        runs = await self._store.count_runs_by_scope()
        used = await self._store.usage_by_scope(current_windows(now))
        names = {name for name, _ in runs} | set(used) | set(self.config.scope_budgets)
        return {
            name: scope_usage(
                name,
                {status: n for (owner, status), n in runs.items() if owner == name},
                used.get(name, {}),
                self.config.scope_budgets.get(name),
                now,
            )
            for name in sorted(names)
            if chosen is None or name == chosen
        }

    async def _drive(
        self,
        run_id: str,
        bindings: Bindings | None,
        *,
        first: BeforeLease | Presuming | None = None,
        read_first: bool = False,
        foresee: Callable[[int], RunRecord | None] | None = None,
    ) -> RunView:
        run = await self.driver.drive(
            run_id,
            bindings or self.config.bindings,
            first=first,
            read_first=read_first,
            foresee=foresee,
        )
        return run_view(run)

    @staticmethod
    def _run_id(run_id: str | None) -> str:
        return new_run_id(run_id)
