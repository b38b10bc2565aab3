"""Schedules (docs/OPERATIONS.md, Schedules): a scope's workflow started at each firing of a
cron expression or an interval, by whichever worker looks first.

Each firing starts the run `s-NAME-NOMINAL_MS` (`run_id_of`), through the one start path (so it
is admitted and charged like any start), and a start is idempotent by run id: two workers, a
worker restarted mid-firing or a clock jump start it once. The schedule row is then moved on
with a compare-and-set on what the worker read; a worker that lost the race has started
nothing new. Missed firings younger than `catchup_s` start once each after downtime, older
ones are counted as skipped.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from qjsflow.bridge import InvalidInput, loads
from qjsflow.bundles.manifest import WorkflowSettings
from qjsflow.bundles.wrangler import DeclaredWorkflow
from qjsflow.runner.config import RunnerConfig
from qjsflow.runner.errors import (
    BudgetExceeded,
    RunClosed,
    RunConflict,
    RunNotFound,
    UnknownWorkflow,
)
from qjsflow.runner.operations.schedule_spec import (
    SCHEDULE_NAME,
    ScheduleSpec,
    parse_schedule,
    run_id_of,
)
from qjsflow.runner.store import JournalStore, JournalTransaction, SnapshotRecord
from qjsflow.runner.telemetry.metrics import METRICS
from qjsflow.runner.tenancy.scopes import ALL_SCOPES, AllScopes, validate_scope
from qjsflow.runner.views import TERMINAL, RunView, StartRunInput

__all__ = [
    "ScheduleView",
    "Schedules",
    "declared_schedules",
]

_DUE_PER_LOOK = 100
_log = logging.getLogger("qjsflow.worker")


@dataclass(frozen=True, slots=True)
class ScheduleView:
    """A schedule as callers see it; times in seconds since the epoch."""

    scope: str
    name: str
    workflow: str
    spec: dict[str, Any]
    next_at: float | None  # the next nominal firing; None once it has ended
    last_run: str | None  # the run it started last
    buffered_at: float | None  # a firing kept for when that run ends (overlap: buffer_one)
    fired: int
    skipped: int
    paused: bool
    created_at: float
    updated_at: float
    # The firings after the next one (the next three in all, while it is not paused).
    upcoming: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class _Row:
    scope: str
    name: str
    workflow: str
    spec: ScheduleSpec
    next_at: int | None
    last_run: str | None
    buffered_at: int | None


def _row(row: Any) -> _Row:
    return _Row(str(row[0]), str(row[1]), str(row[2]), ScheduleSpec.from_text(str(row[3])),
                row[4], row[5], row[6])  # fmt: skip


def _seconds(ms: int | None) -> float | None:
    return None if ms is None else ms / 1000


def _view(row: Any) -> ScheduleView:
    upcoming: list[float] = []
    at = None if row[4] is None or row[9] else int(row[4])
    spec = ScheduleSpec.from_text(str(row[3])) if at is not None else None
    while spec is not None and at is not None and len(upcoming) < 2:
        at = spec.after(at)
        if at is not None:
            upcoming.append(at / 1000)
    return ScheduleView(
        scope=str(row[0]), name=str(row[1]), workflow=str(row[2]), spec=loads(str(row[3])),
        next_at=_seconds(row[4]), last_run=row[5], buffered_at=_seconds(row[6]),
        fired=int(row[7]), skipped=int(row[8]), paused=bool(row[9]),
        created_at=row[10] / 1000, updated_at=row[11] / 1000, upcoming=tuple(upcoming),
    )  # fmt: skip


class Schedules:
    """The schedule operations of a `Runner` (which provides the store, its configuration's
    clock and the run verbs)."""

    store: JournalStore
    config: RunnerConfig

    if TYPE_CHECKING:  # the Runner's

        async def start(self, request: StartRunInput, *, drive: bool = True) -> RunView: ...
        async def get(self, run_id: str, *, scope: str) -> RunView: ...
        async def cancel(self, run_id: str, *, scope: str) -> RunView: ...
        async def find_snapshot(self, reference: str, *, scope: str) -> SnapshotRecord: ...

    def _clock_ms(self) -> int:
        return int(self.config.clock() * 1000)

    async def set_schedule(
        self, scope: str, name: str, workflow: str, settings: Mapping[str, Any]
    ) -> ScheduleView:
        """Make a schedule, or replace its settings (`cron` or `every_s`, `timezone`,
        `overlap`, `catchup_s`, `start_at`, `end_at`, `input`, `snapshot`, `paused`): it fires
        from now on. `InvalidInput` names each problem."""
        scope = validate_scope(scope)
        if not isinstance(name, str) or not SCHEDULE_NAME.fullmatch(name):
            raise InvalidInput(f"invalid schedule name {str(name)[:80]!r}: use 1-64 of A-Z, "
                               "a-z, 0-9, _ and -")  # fmt: skip
        spec = parse_schedule(settings, f"schedule {name!r}")
        snapshot = await self.find_snapshot(spec.snapshot, scope=scope)
        workflows = sorted(w.workflow for w in snapshot.workflows)
        if workflow not in workflows:
            raise UnknownWorkflow(workflow, workflows)
        now = self._clock_ms()
        nominal = spec.after(now)
        await self.store.transact(lambda tx: tx.put_schedule(
            scope, name, workflow, spec.text(), next_at=nominal, paused=spec.paused, now=now,
        ))  # fmt: skip
        return await self.schedule(scope, name)

    async def register_schedules(
        self, scope: str, declared: Sequence[tuple[str, tuple[str, Mapping[str, Any]]]]
    ) -> None:
        """A published project's schedules (`declared_schedules`), on its latest snapshot."""
        for name, (workflow, settings) in declared:
            await self.set_schedule(scope, name, workflow, settings)

    async def schedules(self, *, scope: str | AllScopes) -> builtins.list[ScheduleView]:
        chosen = None if scope is ALL_SCOPES else validate_scope(scope)
        rows = await self.store.read(lambda tx: tx.schedule_rows(chosen))
        return [_view(row) for row in rows]

    async def schedule(self, scope: str, name: str) -> ScheduleView:
        scope = validate_scope(scope)
        rows = await self.store.read(lambda tx: tx.schedule_rows(scope, name))
        if not rows:
            raise InvalidInput(f"scope {scope!r} has no schedule {str(name)[:80]!r}")
        return _view(rows[0])

    async def pause_schedule(self, scope: str, name: str, *, paused: bool = True) -> ScheduleView:
        """Pause a schedule (it fires nothing), or with `paused=False` let it fire again from
        now on (what it missed while paused is not made up)."""
        current = await self.schedule(scope, name)
        spec = parse_schedule(current.spec, f"schedule {name!r}")
        now = self._clock_ms()
        nominal = None if paused else spec.after(now)
        await self.store.transact(lambda tx: tx.pause_schedule(
            current.scope, name, paused=paused, next_at=nominal, now=now))  # fmt: skip
        return await self.schedule(scope, name)

    async def delete_schedule(self, scope: str, name: str) -> bool:
        scope = validate_scope(scope)
        return bool(await self.store.transact(lambda tx: tx.delete_schedule(scope, name)))

    async def trigger_schedule(self, scope: str, name: str) -> RunView:
        """Fire a schedule now, by hand: a run of its workflow, as a firing at this moment."""
        current = await self.schedule(scope, name)
        spec = parse_schedule(current.spec, f"schedule {name!r}")
        run_id = await self._start_firing(current.scope, name, current.workflow, spec,
                                          self._clock_ms())  # fmt: skip
        if run_id is None:
            raise InvalidInput(f"schedule {name!r}: the firing was refused (see the log)")
        return await self.get(run_id, scope=current.scope)

    async def fire_schedules(self, now: int) -> int:
        """A worker's look at the schedules due at `now` (run clock, ms): the runs it started."""
        rows = await self.store.read(lambda tx: tx.due_schedules(now, _DUE_PER_LOOK))
        started = 0
        for row in rows:
            started += await self._fire(_row(row), now)
        return started

    async def _fire(self, row: _Row, now: int) -> int:
        spec, last, buffered = row.spec, row.last_run, row.buffered_at
        started = skipped = 0
        if buffered is not None and not await self._running(row.scope, last):
            made = await self._start_firing(row.scope, row.name, row.workflow, spec, buffered)
            started, skipped, buffered = int(made is not None), int(made is None), None
            last = made or last
        next_at = row.next_at
        if next_at is not None and next_at <= now:
            window = now - int(spec.catchup_s * 1000)
            waiting = None  # a firing whose jittered start has not come yet
            for nominal in spec.firings(next_at, now):
                if nominal < window:
                    skipped += 1  # older than the catch-up window
                    continue
                if spec.due_at(row.name, nominal) > now:
                    waiting = nominal
                    break
                if await self._running(row.scope, last):
                    if spec.overlap == "skip" or (spec.overlap == "buffer_one" and buffered):
                        skipped += 1
                        continue
                    if spec.overlap == "buffer_one":
                        buffered = nominal
                        continue
                    if spec.overlap == "cancel_other" and last is not None:
                        await self._cancel(row.scope, last)
                made = await self._start_firing(row.scope, row.name, row.workflow, spec, nominal)
                if made is None:
                    skipped += 1
                    continue
                last, started = made, started + 1
                _lag(row.scope, now - spec.due_at(row.name, nominal))
            next_at = spec.after(now) if waiting is None else waiting
        await self.store.transact(partial(
            _advance, row=row, next_at=next_at, last_run=last, buffered_at=buffered,
            fired=started, skipped=skipped, now=now,
        ))  # fmt: skip
        if METRICS.available:
            METRICS.schedule_firings.labels(scope=row.scope, outcome="started").inc(started)
            METRICS.schedule_firings.labels(scope=row.scope, outcome="skipped").inc(skipped)
        return started

    async def backfill_schedule(
        self, scope: str, name: str, *, since: float, until: float
    ) -> builtins.list[str]:
        """Start the firings between two times (seconds since the epoch, at most 1000 of
        them) that no run has yet, whatever its overlap policy: each once, by its id."""
        current = await self.schedule(scope, name)
        spec = parse_schedule(current.spec, f"schedule {name!r}")
        if until < since:
            raise InvalidInput("backfill: --to is before --from")
        first = spec.after(int(since * 1000) - 1)
        if first is None:
            return []
        started = [
            await self._start_firing(current.scope, name, current.workflow, spec, nominal)
            for nominal in spec.firings(first, int(until * 1000))
        ]
        return [run_id for run_id in started if run_id is not None]

    async def _start_firing(
        self, scope: str, name: str, workflow: str, spec: ScheduleSpec, nominal: int
    ) -> str | None:
        """The firing's run, started once whoever starts it (its id is the firing's); None
        when the start is refused (its scope's budgets, its workflow's flow control, its
        snapshot gone): the firing is skipped, said in the log, and the schedule goes on."""
        run_id = run_id_of(name, nominal)
        request = StartRunInput(
            scope, workflow, spec.snapshot, spec.input, run_id, tags={"schedule": name}
        )  # `list --schedule NAME` finds it
        try:
            await self.start(request, drive=False)
        except RunConflict:  # started by an earlier setting: it stands
            pass
        except (InvalidInput, BudgetExceeded) as refused:
            _log.warning("schedule %s of scope %s: the firing at %d was refused: %s", name,
                         scope, nominal, refused)  # fmt: skip
            return None
        return run_id

    async def _running(self, scope: str, run_id: str | None) -> bool:
        if run_id is None:
            return False
        try:
            return (await self.get(run_id, scope=scope)).status not in TERMINAL
        except RunNotFound:
            return False

    async def _cancel(self, scope: str, run_id: str) -> None:
        with contextlib.suppress(RunClosed, RunNotFound):
            await self.cancel(run_id, scope=scope)


def _lag(scope: str, lag_ms: int) -> None:
    if METRICS.available:
        METRICS.schedule_lag.observe(max(lag_ms, 0) / 1000)


def _advance(
    tx: JournalTransaction, *, row: _Row, next_at: int | None, last_run: str | None,
    buffered_at: int | None, fired: int, skipped: int, now: int,
) -> bool:  # fmt: skip
    return tx.advance_schedule(
        row.scope, row.name, seen=(row.next_at, row.buffered_at), next_at=next_at,
        last_run=last_run, buffered_at=buffered_at, fired=fired, skipped=skipped, now=now,
    )  # fmt: skip


def declared_schedules(
    declared: Mapping[str, Sequence[DeclaredWorkflow]], settings: Mapping[str, WorkflowSettings]
) -> list[tuple[str, tuple[str, Mapping[str, Any]]]]:
    """(schedule name, (workflow, settings)) a project declares, each checked (`InvalidInput`
    naming the first problem, before anything is published): wrangler's cron triggers
    (`workflows[].schedules`, UTC) as `WORKFLOW-1`, `WORKFLOW-2`, ...; `qjsflow.json`'s
    (`workflows.NAME.schedules`, each with its settings) by their `name`, else so."""
    found: list[tuple[str, tuple[str, Mapping[str, Any]]]] = []
    for workflows in declared.values():
        for workflow in workflows:
            for n, cron in enumerate(workflow.schedules, start=1):
                found.append((f"{workflow.name}-{n}", (workflow.name, {"cron": cron})))
    for workflow_name, declared_settings in settings.items():
        for n, document in enumerate(declared_settings.schedules, start=1):
            name = document.get("name", f"{workflow_name}-{n}")
            where = f"qjsflow.json: workflows.{workflow_name}.schedules[{n - 1}]"
            if not isinstance(name, str) or not SCHEDULE_NAME.fullmatch(name):
                raise InvalidInput(f"{where}: name is 1-64 of A-Z, a-z, 0-9, _ and -")
            rest = {key: value for key, value in document.items() if key != "name"}
            parse_schedule(rest, where)
            found.append((name, (workflow_name, rest)))
    names = [name for name, _ in found]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise InvalidInput(f"the project declares the schedule {twice[0]!r} twice")
    return found
