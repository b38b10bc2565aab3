"""What one scope may consume (docs/TENANCY.md, Budgets): the budgets an operator sets, the
windows they are counted in, and the decision to throttle.

Usage is kept in the journal per scope, measure and window (a UTC minute, a UTC day, or the
whole life of the journal for its bytes), charged by each drive in the transaction that ends
it, so every worker on the journal sees the same figures. A drive starts only with room left
in every budget; one that runs out while it runs parks its run at its next own call (the steps
under way finish and record), as `throttled`, until the window that ran out ends.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields

from qjsflow.bridge import InvalidInput

__all__ = [
    "AT_DRIVE",
    "BY_CALL",
    "DAY_MS",
    "MEASURES",
    "MINUTE_MS",
    "Budgets",
    "Charges",
    "DriveUsage",
    "Measure",
    "Throttle",
    "budgets_from_json",
    "current_windows",
    "exhausted",
    "forget_before",
    "window_start",
]

# The journal stores bounds and counts as 64-bit integers: a larger bound would fail there.
_MAX_BOUND = 2**62

MINUTE_MS = 60_000
DAY_MS = 86_400_000
# A budget with no window (journal bytes) is looked at again this often while runs wait on it:
# it frees only when an operator prunes runs or raises it.
RECHECK_MS = 60_000


@dataclass(frozen=True, slots=True)
class Measure:
    name: str  # as stored and shown: "steps", "compute_s", ...
    budget: str  # the Budgets field that bounds it
    window_ms: int | None  # None: never resets
    what: str  # the budget in words, for errors and the usage table


MEASURES: tuple[Measure, ...] = (
    Measure("steps", "steps_per_day", DAY_MS, "steps per day"),
    Measure("drives", "drives_per_minute", MINUTE_MS, "drives per minute"),
    Measure("compute_s", "compute_s_per_day", DAY_MS, "compute seconds per day"),
    Measure("tool_calls", "tool_calls_per_day", DAY_MS, "tool calls per day"),
    Measure("fetches", "fetches_per_day", DAY_MS, "fetches per day"),
    Measure("sql_s", "sql_s_per_day", DAY_MS, "db.sql seconds per day"),
    Measure("journal_bytes", "journal_bytes", None, "journal bytes"),
)
_BY_NAME = {measure.name: measure for measure in MEASURES}


@dataclass(frozen=True, slots=True)
class Budgets:
    """A scope's budgets; None is no bound. `live_runs` and `journal_bytes` also refuse a
    `start` (BudgetExceeded); every budget parks the scope's runs as `throttled` when spent."""

    live_runs: int | None = None
    steps_per_day: int | None = None
    drives_per_minute: int | None = None
    compute_s_per_day: float | None = None
    tool_calls_per_day: int | None = None
    fetches_per_day: int | None = None
    sql_s_per_day: float | None = None
    journal_bytes: int | None = None

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or not 0 <= value <= _MAX_BOUND
            ):
                raise InvalidInput(f"budget {item.name} must be a number from 0 to 2**62")

    def bound(self, measure: Measure) -> float | None:
        value: float | None = getattr(self, measure.budget)
        return value

    @property
    def any(self) -> bool:
        return any(getattr(self, item.name) is not None for item in fields(self))


def budgets_from_json(value: object, scope: str) -> Budgets:
    """A scope's budgets as written in the operator's env file."""
    names = {item.name for item in fields(Budgets)}
    if not isinstance(value, dict) or set(value) - names:
        raise InvalidInput(
            f"scope {scope!r} of the env file: budgets holds some of {', '.join(sorted(names))}"
        )
    try:
        return Budgets(**value)
    except InvalidInput as error:
        raise InvalidInput(f"scope {scope!r} of the env file: {error}") from None


def window_start(measure: Measure, now_ms: int) -> int:
    """The start of the window `now_ms` falls in (0 for a measure that never resets)."""
    if measure.window_ms is None:
        return 0
    return now_ms - now_ms % measure.window_ms


def current_windows(now_ms: int) -> dict[str, int]:
    return {measure.name: window_start(measure, now_ms) for measure in MEASURES}


def forget_before(now_ms: int) -> dict[str, int]:
    """Per measure with a window: usage from windows before the previous one is dropped."""
    return {
        measure.name: window_start(measure, now_ms) - measure.window_ms
        for measure in MEASURES
        if measure.window_ms is not None
    }


@dataclass(frozen=True, slots=True)
class Throttle:
    """A spent budget: which, and when its runs may be driven again."""

    measure: Measure
    used: float
    bound: float
    until_ms: int

    @property
    def reason(self) -> str:
        return (
            f"the scope's budget of {self.bound:g} {self.measure.what} is spent"
            f" ({self.used:g} used)"
        )


# What each kind of call uses, so a call is held back only by a budget it would use: a scope
# that has spent its tool calls may still run steps that call no tool. Drives and compute are
# looked at when a drive begins.
AT_DRIVE = ("drives", "compute_s")
BY_CALL = {
    "step": ("steps", "journal_bytes"),
    "tool": ("steps", "tool_calls", "journal_bytes"),
    "fetch": ("steps", "fetches", "journal_bytes"),
    "sql": ("steps", "sql_s", "journal_bytes"),
    "notify": ("steps",),
}


def exhausted(
    budgets: Budgets,
    used: Mapping[str, float],
    now_ms: int,
    measures: Iterable[str],
    drive: DriveUsage | None = None,
) -> Throttle | None:
    """Of `measures`, the budget that is spent (usage at or past it), counting what a drive
    has used since `used` was read; the one whose window ends last when several are."""
    spent = []
    for name in measures:
        measure = _BY_NAME[name]
        bound = budgets.bound(measure)
        if bound is None:
            continue
        total = used.get(measure.name, 0.0) + (0.0 if drive is None else drive.of(measure.name))
        if total >= bound:
            start = window_start(measure, now_ms)
            until = start + measure.window_ms if measure.window_ms else now_ms + RECHECK_MS
            spent.append(Throttle(measure, total, bound, until))
    return max(spent, key=lambda throttle: throttle.until_ms, default=None)


@dataclass(frozen=True, slots=True)
class Charges:
    """What one drive adds to its scope's usage: (measure, window start, amount) rows, and
    the windows to drop (each measure's before this one; None: not this time)."""

    rows: list[tuple[str, int, float]]
    forget: Mapping[str, int] | None


@dataclass(slots=True)
class DriveUsage:
    """What one drive consumed, charged to its scope when the drive ends."""

    amounts: dict[str, float] = field(default_factory=dict)

    def add(self, measure: str, amount: float) -> None:
        assert measure in _BY_NAME, measure
        if amount:
            self.amounts[measure] = self.amounts.get(measure, 0.0) + amount

    def of(self, measure: str) -> float:
        return self.amounts.get(measure, 0.0)

    def charges(self, now_ms: int) -> list[tuple[str, int, float]]:
        """(measure, window start, amount) rows to add to the scope's usage."""
        return [
            (name, window_start(_BY_NAME[name], now_ms), amount)
            for name, amount in sorted(self.amounts.items())
        ]
