"""A step's failure: the error a body threw or a step rejected with, and its one JSON shape,
the same on the wire and in the journal.

Its own module, apart from the ops (`bridge/types.py`): reading a run's recorded failure
(`qjsflow status`) needs this shape and none of the ops'.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from qjsflow.bridge.codec import dumps_text, loads
from qjsflow.bridge.rules import RULES

__all__ = [
    "StepFailure",
    "failure_from_json",
    "failure_to_json",
    "failure_to_wire",
    "well_formed",
]


@dataclass(frozen=True, slots=True)
class StepFailure:
    """An error thrown by a step body, or the final error a step rejects with."""

    name: str
    message: str
    retryable: bool = True
    retry_after_ms: int | None = None
    code: str | None = None  # a machine-readable reason, e.g. db.sql's "not_authorized"
    # Where it was thrown: the engine's frames from the sandbox; in the journal, the author's
    # `file:line:column` frames (runner/engine/locations.py).
    stack: str | None = None

    def __post_init__(self) -> None:
        # Tools and the host make failures from any text: made well-formed and bounded here,
        # as the prelude does the author's, so every stored failure fits the wire on its way
        # back into a replay (a lone surrogate cannot be encoded as JSON at all).
        object.__setattr__(self, "name", well_formed(self.name)[: RULES.error_name_chars])
        object.__setattr__(self, "message", well_formed(self.message)[: RULES.error_message_chars])
        if self.stack is not None:
            object.__setattr__(self, "stack", well_formed(self.stack)[: RULES.stack_chars])


def well_formed(text: str) -> str:
    """`text` with each lone surrogate as U+FFFD (and a pair given as two code points joined)."""
    if text.isascii():
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def failure_to_wire(failure: StepFailure) -> dict[str, Any]:
    """A failure as JSON data: the one shape of it, on the wire and in the journal."""
    return {
        "name": failure.name,
        "message": failure.message,
        "retryable": failure.retryable,
        "retryAfterMs": failure.retry_after_ms,
        "code": failure.code,
        "stack": failure.stack,
    }


def failure_to_json(failure: StepFailure) -> str:
    return dumps_text(failure_to_wire(failure))


def failure_from_json(text: str) -> StepFailure:
    data = loads(text)
    return StepFailure(
        data["name"], data["message"], data["retryable"], data.get("retryAfterMs"),
        data.get("code"), data.get("stack"),
    )  # fmt: skip
