"""A scope's usage against its budgets, as shown (`qjsflow usage`, `Runner.usage`, the
console), and the budgets that refuse a `start` (docs/TENANCY.md, Budgets)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from qjsflow.runner.budgets import MEASURES, Budgets, window_start
from qjsflow.runner.errors import BudgetExceeded
from qjsflow.runner.store import ENDED, JournalTransaction

__all__ = ["MeasureUsage", "ScopeUsage", "refuse_start", "scope_usage"]


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


def refuse_start(tx: JournalTransaction, scope: str, budgets: Budgets) -> None:
    """Raise BudgetExceeded when a new run of `scope` would pass its live-runs budget, or its
    journal is at its bytes budget (a run would only add to it)."""
    if budgets.live_runs is not None and tx.count_live_runs(scope) >= budgets.live_runs:
        raise BudgetExceeded(scope, "live runs", budgets.live_runs)
    if budgets.journal_bytes is not None:
        used = tx.scope_usage(scope, {"journal_bytes": 0}).get("journal_bytes", 0.0)
        if used >= budgets.journal_bytes:
            raise BudgetExceeded(scope, "journal bytes", budgets.journal_bytes)
