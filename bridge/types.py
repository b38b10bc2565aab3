"""Wire types of the bridge (docs/SANDBOX.md): ops out of the sandbox, answers into it, outcomes.

Journal values travel as `Encoded` text: the tagged JSON produced by the prelude's encoder (ASCII
only), stored and passed back verbatim. Python never re-encodes an author's value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from qjsflow.bridge.failure import StepFailure
from qjsflow.bridge.limits import Limits

__all__ = [
    "STEP_KINDS",
    "STEP_KIND_OF",
    "Answer",
    "Completed",
    "DbSql",
    "DriveOutcome",
    "DriveRequest",
    "Encoded",
    "Failed",
    "JournalEntry",
    "Log",
    "Op",
    "OpEnvelope",
    "Result",
    "RetryPolicy",
    "StepBegin",
    "StepCheck",
    "StepFailure",
    "StepNotify",
    "StepRecord",
    "StepSleep",
    "StepTool",
    "StepWaitForEvent",
    "Suspend",
    "SuspendKind",
    "Suspended",
    "Value",
    "needs_answer",
]

Encoded = str
SuspendKind = Literal["sleep", "event", "retry"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """A step's normalized config: total attempts are `limit + 1`."""

    limit: int
    delay_ms: int
    backoff: Literal["constant", "linear", "exponential"]
    timeout_ms: int

    def delay_after(self, attempt: int) -> int:
        """Backoff after failed attempt `attempt` (1-based)."""
        if self.backoff == "constant":
            return self.delay_ms
        if self.backoff == "linear":
            return self.delay_ms * attempt
        return self.delay_ms * (1 << (attempt - 1))


# -- ops (sandbox -> host) ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StepCheck:
    step: str
    kind: Literal["do"]
    count: int
    config: RetryPolicy


@dataclass(frozen=True, slots=True)
class StepBegin:
    """A step the journal has never seen starts its first attempt (no answer is awaited)."""

    step: str
    kind: Literal["do"]
    count: int
    config: RetryPolicy


@dataclass(frozen=True, slots=True)
class StepRecord:
    step: str
    count: int
    attempt: int
    value: Encoded | None
    error: StepFailure | None
    # Set when the sandbox settled the step itself and went on (a pure step's result): the
    # run's clock it settled at, which the journal keeps for replays. No answer is awaited.
    settled_at: int | None = None
    # The policy of its step.begin, when the step began in the same frame: the begin is not
    # sent on its own (the step is written once, settled).
    begun_with: RetryPolicy | None = None


@dataclass(frozen=True, slots=True)
class StepTool:
    step: str
    count: int
    address: str
    args: Encoded
    config: RetryPolicy
    digest: str | None = None  # the sandbox's digest of the call (runner/operations/migrate.py)


@dataclass(frozen=True, slots=True)
class StepSleep:
    step: str
    count: int
    ms: int | None
    until_ms: int | None


@dataclass(frozen=True, slots=True)
class StepWaitForEvent:
    step: str
    count: int
    type: str
    timeout_ms: int


@dataclass(frozen=True, slots=True)
class StepNotify:
    step: str  # "" at the top level, or the enclosing step's key and "/"
    count: int
    title: str
    body: str | None
    link: str | None


@dataclass(frozen=True, slots=True)
class DbSql:
    step: str  # "" at the top level, or the enclosing step's key and "/"
    count: int
    sql: str
    params: Encoded
    digest: str | None = None  # the sandbox's digest of sql and params


@dataclass(frozen=True, slots=True)
class Log:
    """Console output. `source` is the scope that printed it ("" for the workflow body, or a
    step's key and attempt) and `count` numbers it within that scope: the pair identifies
    the line, so a replay never stores it twice."""

    level: Literal["log", "info", "warn", "error"]
    text: str
    count: int
    source: str = ""


Op = (
    StepBegin | StepCheck | StepRecord | StepTool | StepSleep | StepWaitForEvent | StepNotify
    | DbSql | Log
)  # fmt: skip
# The one list of step kinds: the journal's kind of the step each op is about (a console line
# is none). Step keys, operators' `KIND:NAME[:COUNT]` and replays all take it from here.
STEP_KIND_OF: dict[type, str] = {
    StepBegin: "do", StepCheck: "do", StepRecord: "do", StepTool: "tool", StepSleep: "sleep",
    StepWaitForEvent: "waitForEvent", StepNotify: "notify", DbSql: "sql",
}  # fmt: skip
STEP_KINDS: tuple[str, ...] = tuple(dict.fromkeys(STEP_KIND_OF.values()))


def needs_answer(op: Op) -> bool:
    """Logs, step.begin and a result the sandbox settled itself are fire and forget; every
    other op gets exactly one answer."""
    if isinstance(op, StepRecord):
        return op.settled_at is None
    return not isinstance(op, Log | StepBegin)


@dataclass(frozen=True, slots=True)
class OpEnvelope:
    id: int
    op: Op


# -- answers (host -> sandbox) -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Value:
    """`value` is plain JSON; journal values inside it are `Encoded` strings."""

    value: object = None


@dataclass(frozen=True, slots=True)
class Suspend:
    kind: SuspendKind
    event: str | None = None  # the awaited event type, for kind "event"


Result = Value | Suspend | StepFailure


@dataclass(frozen=True, slots=True)
class Answer:
    """The answer to op `id`. `at_ms` is the time of the journal event it reflects; the sandbox's
    logical clock moves to it when the answer settles a step (docs/SANDBOX.md, The drive loop)."""

    id: int
    result: Result
    at_ms: int | None = None


# -- drives ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """A settled step as replay sees it: `key` is `kind:count:name`."""

    key: str
    value: Encoded | None
    error: StepFailure | None
    at_ms: int
    digest: str | None = None  # what the call was asked with: a replay asking otherwise diverges


@dataclass(frozen=True, slots=True)
class DriveRequest:
    run_id: str
    workflow: str
    bundle: str
    input: Encoded
    created_at_ms: int
    journal: tuple[JournalEntry, ...] = ()
    env: Encoded = "{}"
    limits: Limits = field(default_factory=Limits)
    cpu_used_s: float = 0.0  # the run's cumulative compute before this drive
    logs_seen: int = 0  # console lines of this run already stored
    unsettled: tuple[str, ...] = ()  # keys of step rows that exist but are not settled
    # Recorded waits the journal would answer only with a suspension: (key, event type).
    waiting: tuple[tuple[str, str], ...] = ()
    export: str = "default"  # which export of the bundle is the workflow
    # Publishing asks what a bundle exports (docs/ARCHITECTURE.md, Publishing): the module is
    # evaluated, no body runs, and the outcome's output describes each export.
    inspect: bool = False
    # A migration's check (runner/operations/migrate.py): every journal entry must be reached
    # before the drive ends, or the outcome is a divergence naming the first one missed.
    strict: bool = False
    # `bundle_digest(bundle)` (bridge/digest.py), when the caller has it (a stored bundle's
    # checksum): an executor is sent each text once, and the pool names it by this.
    bundle_key: str = ""
    # `terminate --rollback` (the operator's message): the body replays what the journal
    # holds, its first call past that fails with this, its rollbacks run, and the run fails.
    roll_back: str | None = None


@dataclass(frozen=True, slots=True)
class Completed:
    output: Encoded
    cpu_s: float
    replayed: int = 0  # journal entries the drive answered from the journal


@dataclass(frozen=True, slots=True)
class Suspended:
    markers: tuple[Suspend, ...]
    cpu_s: float
    replayed: int = 0


@dataclass(frozen=True, slots=True)
class Failed:
    retryable: bool
    message: str
    cpu_s: float
    retry_after_ms: int | None = None
    stack: str | None = None  # the engine's frames where it was thrown or stopped
    # A rollback that failed for good as the run's rollbacks ran (its error's message).
    rollback_failed: str | None = None


DriveOutcome = Completed | Suspended | Failed
