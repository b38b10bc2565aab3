"""A scope's usage against its budgets, as shown (`qjsflow usage`, `Runner.usage`, the
console), and the one admission path for what creates runs or stores bytes (docs/TENANCY.md,
Budgets)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from qjsflow.runner.errors import BudgetExceeded
from qjsflow.runner.store import ENDED, JournalTransaction
from qjsflow.runner.tenancy.budgets import MEASURES, Budgets, window_start

__all__ = ["MeasureUsage", "ScopeUsage", "admit", "scope_usage"]


@dataclass(frozen=True, slots=True)
class MeasureUsage:
    measure: str  # steps, drives, compute_s, tool_calls, fetches, sql_s, journal_bytes
    budget_name: str  # the budget that bounds it (steps_per_day, ...)
    used: float  # in the current window
    budget: float | None  # None: not bounded
    resets_at: float | None  # when the window ends (seconds since the epoch); None: never


@dataclass(frozen=True, slots=True)
class ScopeUsage:
    scope: str
    runs: dict[str, int]  # by status
    live: int  # runs that have not ended
    live_budget: int | None
    measures: tuple[MeasureUsage, ...]


def scope_usage(
    scope: str,
    runs: Mapping[str, int],
    used: Mapping[str, float],
    budgets: Budgets | None,
    now_ms: int,
) -> ScopeUsage:
    measures = []
    for measure in MEASURES:
        resets = (
            None
            if measure.window_ms is None
            else (window_start(measure, now_ms) + measure.window_ms) / 1000
        )
        bound = None if budgets is None else budgets.bound(measure)
        measures.append(
            MeasureUsage(measure.name, measure.budget, used.get(measure.name, 0.0), bound, resets)
        )
    return ScopeUsage(
        scope=scope,
        runs=dict(sorted(runs.items())),
        live=sum(n for status, n in runs.items() if status not in ENDED),
        live_budget=None if budgets is None else budgets.live_runs,
        measures=tuple(measures),
    )


def admit(
    tx: JournalTransaction,
    scope: str,
    budgets: Budgets | None,
    *,
    new_live_run: bool = False,
    stored_bytes: int = 0,
) -> None:
    """The one admission path for whatever creates a run or stores bytes for `scope` (start,
    fork, restart of an ended run, signal), in the transaction that does it: BudgetExceeded
    when a run made live would pass the live-runs budget, or the bytes stored would pass the
    journal-bytes budget; else the bytes are charged to the scope's usage."""
    if budgets is not None:
        live = budgets.live_runs
        if new_live_run and live is not None and tx.count_live_runs(scope) >= live:
            raise BudgetExceeded(scope, "live runs", live)
        if budgets.journal_bytes is not None:
            used = tx.scope_usage(scope, {"journal_bytes": 0}).get("journal_bytes", 0.0)
            if used >= budgets.journal_bytes or used + stored_bytes > budgets.journal_bytes:
                raise BudgetExceeded(scope, "journal bytes", budgets.journal_bytes)
    if stored_bytes:
        tx.charge_usage(scope, [("journal_bytes", 0, float(stored_bytes))])
