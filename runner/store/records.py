"""Rows of the journal as frozen dataclasses: the only shape in which they leave the store.

Times are integer milliseconds since the epoch; values are encoded JSON text (bridge.values).
"""

from __future__ import annotations

import enum
import operator
from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

from qjsflow.bridge.keys import step_key

__all__ = [
    "ENDED",
    "ENDED_SQL",
    "RUN_COLUMNS",
    "RUN_FIELDS",
    "STEP_COLUMNS",
    "THROTTLE_TIMER",
    "WAKING_TIMER_SQL",
    "WORKER_BEAT_MS",
    "WORKER_GONE_MS",
    "EventRecord",
    "InboxRecord",
    "JournalRow",
    "LogRecord",
    "RunRecord",
    "RunStatus",
    "StepPlace",
    "StepRow",
    "StepStatus",
    "ToolCallRecord",
    "WorkerRecord",
    "run_record",
    "step_row",
    "with_compute",
]


# Each member's name is its value: the journal stores the text, psycopg dumps an enum by its
# name, and a member hashes as its name, so a member and the text read back are one key.
class RunStatus(enum.StrEnum):
    """Where a run is. "blocked": a tool it calls is bound in no process that drove it
    (`waiting_for` names it); "paused": an operator paused it, it waits for `resume`;
    "throttled": its scope spent a budget (`waiting_for` names it) until the window ends;
    "queued": its workflow's flow control holds it until a gate admits it (then "running")."""

    running = "running"
    sleeping = "sleeping"
    waiting = "waiting"
    blocked = "blocked"
    paused = "paused"
    throttled = "throttled"
    queued = "queued"
    completed = "completed"
    failed = "failed"
    cancelled = "cancelled"
    terminated = "terminated"


class StepStatus(enum.StrEnum):
    """Where one step of a run is."""

    running = "running"
    retrying = "retrying"
    waiting = "waiting"
    completed = "completed"
    failed = "failed"


# The statuses of a run that has ended: nothing drives it again (but an operator's restart).
ENDED: frozenset[str] = frozenset(
    {RunStatus.completed, RunStatus.failed, RunStatus.cancelled, RunStatus.terminated}
)
ENDED_SQL = "(" + ", ".join(f"'{status}'" for status in sorted(ENDED)) + ")"
# The timer of a `throttled` run (runner/tenancy/budgets.py): the only one that may wake it,
# when the budget its scope spent has room again.
THROTTLE_TIMER = "throttle"
# A timer that may wake a run of the given alias `r`, joined as `t`: not a paused run's, only
# its throttle timer for a throttled run, and none of a queued run's (its gate admits it).
WAKING_TIMER_SQL = (
    f"(r.status <> 'queued' AND (r.status <> 'throttled' OR t.step_key = '{THROTTLE_TIMER}'))"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunRecord:
    run_id: str
    scope: str
    workflow: str
    snapshot_id: str
    entry_path: str
    status: RunStatus
    input: str
    persisted_bindings: str
    output: str | None
    error: str | None
    created_at: int
    updated_at: int
    wake_at: int | None
    waiting_for: str | None
    cpu_used_s: float
    logs_count: int
    cancel_requested: bool
    sql_used_s: float = 0.0
    executor_deaths: int = 0  # drives whose executor process died (see RunDriver)
    error_stack: str | None = None  # where it failed: the author's frames, one per line
    pause_requested: bool = False  # parked after the step in progress, until resumed
    generation: int = 0  # how many times an operator restarted it
    traceparent: str | None = None  # the W3C trace context its drives are traced under
    # Its scope's configuration version as it started (None: the starting process's own
    # settings, as before scopes were configured in the journal).
    config_version: int | None = None
    # `terminate --rollback` asked (the operator's message): its next drive runs the run's
    # rollbacks, then ends it `terminated` (sandbox/prelude/52-rollbacks.js).
    rollback_requested: str | None = None
    # Higher is claimed first within its scope, and leaves its workflow's queue first.
    priority: int = 0


# The run's columns, in the order of its fields: the journal's `runs` table and this record
# have one shape, and a row is turned into a record by name (`run_record`).
RUN_FIELDS: tuple[str, ...] = tuple(field.name for field in fields(RunRecord))
RUN_COLUMNS = ", ".join(RUN_FIELDS)
_RUN_VALUES = operator.attrgetter(*RUN_FIELDS)
_FLAGS = ("cancel_requested", "pause_requested")  # stored as integers


def with_compute(run: RunRecord, cpu_s: float) -> RunRecord:
    """`run` with `cpu_s` more compute used, as a journal's relative update adds it
    (`dataclasses.replace` walks the fields' definitions: twice as slow, on a drive's path)."""
    values = dict(zip(RUN_FIELDS, _RUN_VALUES(run), strict=True))
    values["cpu_used_s"] += cpu_s
    return RunRecord(**values)


def run_record(row: Iterable[Any]) -> RunRecord:
    """A `runs` row, read as `RUN_COLUMNS`, as a record built by name."""
    values = dict(zip(RUN_FIELDS, row, strict=True))
    for flag in _FLAGS:
        values[flag] = bool(values[flag])
    values["status"] = RunStatus(values["status"])
    return RunRecord(**values)


def step_row(row: Iterable[Any]) -> StepRow:
    """A `steps` row, read as `STEP_COLUMNS`, as a record built by name."""
    values = dict(zip(STEP_FIELDS, row, strict=True))
    values["status"] = StepStatus(values["status"])
    return StepRow(**values)


@dataclass(frozen=True, slots=True)
class StepPlace:
    """Where a step's row is: its run, kind, name and count (the row's key)."""

    run_id: str
    kind: str
    name: str
    count: int

    @property
    def key(self) -> str:
        return step_key(self.kind, self.count, self.name)


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRow:
    run_id: str
    kind: str
    name: str
    count: int
    status: StepStatus
    attempt: int
    config: str | None  # RetryPolicy as JSON
    detail: str | None  # kind-specific JSON: a sleep's due time, a wait's type and deadline
    output: str | None
    error: str | None  # StepFailure as JSON
    started_at: int
    completed_at: int | None
    settled_seq: int | None
    args_digest: str | None = None  # a tool, fetch or db.sql call's, as the sandbox made it
    # The run's clock when the sandbox settled the step itself (a pure step's result, which it
    # did not wait for): what a replay reaches, where `completed_at` is when it was written.
    replay_at: int | None = None

    @property
    def key(self) -> str:
        return step_key(self.kind, self.count, self.name)

    @property
    def clock_at(self) -> int | None:
        """The time a replay reaches at this step, once settled."""
        return self.completed_at if self.replay_at is None else self.replay_at


@dataclass(frozen=True, slots=True)
class JournalRow:
    """A settled step, in the order the run reached it."""

    key: str
    output: str | None
    error: str | None
    completed_at: int
    args_digest: str | None = None


@dataclass(frozen=True, slots=True)
class InboxRecord:
    seq: int
    run_id: str
    type: str
    payload: str
    received_at: int
    consumed_by: str | None


@dataclass(frozen=True, slots=True)
class EventRecord:
    seq: int
    run_id: str
    type: str
    at: int
    data: str | None


# A worker whose last heartbeat is older than this is shown as gone (it heart-beats every
# `WORKER_BEAT_MS`; three beats missed).
WORKER_BEAT_MS = 5_000
WORKER_GONE_MS = 3 * WORKER_BEAT_MS


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerRecord:
    """A worker serving the journal, as it registered (runner/engine/worker.py)."""

    worker_id: str
    host: str
    pid: int
    version: str
    tools: tuple[str, ...]  # the tool addresses it binds
    scopes: tuple[str, ...]  # the scopes it serves (empty: all)
    secret_providers: tuple[str, ...]  # where its secret values come from
    started_at: int
    heartbeat_at: int
    stopped_at: int | None

    def state(self, now: int) -> str:
        """ "live", "gone" (it stopped heart-beating: killed, or cut off) or "stopped"."""
        if self.stopped_at is not None:
            return "stopped"
        return "live" if now - self.heartbeat_at <= WORKER_GONE_MS else "gone"


@dataclass(frozen=True, slots=True)
class ToolCallRecord:
    seq: int
    run_id: str
    step_key: str
    attempt: int
    address: str
    args: str
    result: str | None
    error: str | None
    started_at: int
    duration_ms: int | None


@dataclass(frozen=True, slots=True)
class LogRecord:
    run_id: str
    count: int
    level: str
    text: str
    at: int


# A step's columns, in the order of its fields (as `RUN_COLUMNS` for a run).
STEP_FIELDS: tuple[str, ...] = tuple(field.name for field in fields(StepRow))
STEP_COLUMNS = ", ".join(STEP_FIELDS)
