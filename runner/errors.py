"""Errors of the run lifecycle. Tree (under `bridge.errors.QjsflowError`):

    InvalidInput
    ├── RunNotFound         no such run in the caller's scope (a run of another scope too)
    ├── SnapshotNotFound    no such snapshot in the scope
    ├── UnknownWorkflow     the snapshot has no workflow of that name
    ├── RunConflict         a caller-supplied run id already names a different run
    ├── RunClosed           the run is finished or cancelled and accepts no events
    ├── RunChanged          the run changed between an operator command's check and its act
    ├── FlowRefused         a workflow's flow control refuses a start (rate limit, singleton)
    └── InvalidRunId / InvalidEvent   malformed ids, event types or payloads
    QjsflowError
    ├── JournalUnavailable  the journal is empty, damaged or of an unknown version
    └── StoredCodeDamaged   a bundle's bytes no longer match what was published

`FatalToolError` is for tool authors: raise it from a tool to fail the step without retries.
"""

from __future__ import annotations

from qjsflow.bridge import InvalidInput, QjsflowError

__all__ = [
    "BudgetExceeded",
    "CapabilityRefused",
    "FatalToolError",
    "FlowRefused",
    "InvalidEvent",
    "InvalidRunId",
    "JournalUnavailable",
    "RunChanged",
    "RunClosed",
    "RunConflict",
    "RunNotFound",
    "RunTimeout",
    "SnapshotNotFound",
    "StoredCodeDamaged",
    "UnknownWorkflow",
]


class RunNotFound(InvalidInput):
    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"no run {run_id!r} (check the run id and the scope)")


class SnapshotNotFound(InvalidInput):
    def __init__(self, scope: str, snapshot_id: str, why: str = "publish the source first") -> None:
        super().__init__(f"no snapshot {snapshot_id!r} in scope {scope!r}: {why}")


class UnknownWorkflow(InvalidInput):
    def __init__(self, workflow: str, known: list[str]) -> None:
        names = ", ".join(known) or "none"
        super().__init__(f"the snapshot has no workflow {workflow!r}; it has: {names}")


class RunConflict(InvalidInput):
    def __init__(self, run_id: str, differences: list[str]) -> None:
        super().__init__(
            f"run {run_id!r} already exists with a different {', '.join(differences)}; "
            "use a new run id or the same arguments"
        )


class BudgetExceeded(QjsflowError):
    """A scope's budget refuses what was asked (docs/TENANCY.md, Budgets)."""

    def __init__(self, scope: str, budget: str, limit: int) -> None:
        self.scope, self.budget, self.limit = scope, budget, limit
        super().__init__(f"scope {scope!r} is at its budget of {limit} {budget}: refused")


class CapabilityRefused(InvalidInput):
    """A snapshot's manifest asks for more than its scope's policy allows (docs/TENANCY.md)."""

    def __init__(self, scope: str, beyond: list[str]) -> None:
        self.beyond = beyond
        shown = ", ".join(beyond[:10]) + (
            f" and {len(beyond) - 10} more" if len(beyond) > 10 else ""
        )
        super().__init__(
            f"the snapshot's manifest asks for more than scope {scope!r} allows: {shown}"
        )


class RunClosed(InvalidInput):
    def __init__(self, run_id: str, status: str) -> None:
        super().__init__(f"run {run_id!r} is {status} and accepts no more events")


class RunChanged(InvalidInput):
    """What a command checked of a run outside the transaction that acts no longer holds in
    it: nothing was done (the command can be given again)."""

    def __init__(self, run_id: str, while_what: str) -> None:
        super().__init__(f"run {run_id!r} changed while {while_what}: nothing was done; "
                         "run the command again")  # fmt: skip
        self.run_id = run_id


class FlowRefused(InvalidInput):
    """A start its workflow's flow control refuses (docs/OPERATIONS.md, Flow control):
    nothing was written."""

    def __init__(self, workflow: str, why: str) -> None:
        super().__init__(f"a start of {workflow!r} is refused: {why}")


class InvalidRunId(InvalidInput):
    def __init__(self, run_id: object) -> None:
        super().__init__(
            f"invalid run id {str(run_id)[:80]!r}: use 1-128 characters of A-Z, a-z, 0-9, _ and -"
        )


class InvalidEvent(InvalidInput):
    pass


class FatalToolError(Exception):
    """Raised by a tool to fail its step at once, with no retries."""


class JournalUnavailable(QjsflowError):
    """The journal cannot be read as one: a read-only command never creates or repairs it."""

    def __init__(self, location: str, problem: str) -> None:
        super().__init__(f"the journal at {location} {problem}")


class StoredCodeDamaged(QjsflowError):
    """A stored bundle whose bytes changed at rest is never run."""

    def __init__(self, scope: str, snapshot_id: str, workflow: str) -> None:
        super().__init__(
            f"the stored code of workflow {workflow!r} in snapshot {snapshot_id} (scope "
            f"{scope}) does not match its checksum: it was changed after it was published. "
            "It will not run; publish the source again and start a new run"
        )


class RunTimeout(QjsflowError):
    """A wait for a run to end ran out of time; the run goes on."""

    def __init__(self, run_id: str, status: str, timeout_s: float) -> None:
        super().__init__(f"run {run_id!r} is still {status} after {timeout_s:g} s")
