"""What a run may reach outside the sandbox: tools, notifications (and later, its database).

Bindings are given per call (`start`, `resume`, `signal`) or once in `RunnerConfig`; they are
never persisted. Tools receive decoded arguments (bridge.values) and return a value that is
encoded the same way.

Tool calls are **at least once**: a tool whose result was recorded is never called again, but
a call whose worker died (or whose result could not be written) before the result was
recorded is called again, as the step's next attempt. Inside a call, `current_tool_call()`
says which call it is; its `idempotency_key` (run, step key, attempt) lets a tool deduplicate,
and `call_key` (without the attempt) names the logical call across its attempts.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Bindings", "Notification", "ToolCall", "ToolFn", "current_tool_call"]

ToolFn = Callable[[Any], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Notification:
    run_id: str
    title: str
    body: str | None
    link: str | None
    scope: str = ""


async def _no_notify(message: Notification) -> None:
    del message


@dataclass(frozen=True, slots=True)
class Bindings:
    tools: Mapping[str, ToolFn] = field(default_factory=dict)
    notify: Callable[[Notification], Awaitable[None]] = _no_notify

    def tool(self, address: str) -> ToolFn | None:
        return self.tools.get(address)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """The call a tool is serving: set while the tool runs (see `current_tool_call`)."""

    scope: str
    run_id: str
    step_key: str  # e.g. "tool:1:do:1:sync/push"
    attempt: int
    address: str

    @property
    def call_key(self) -> str:
        """The logical call, the same for every attempt of it."""
        return f"{self.scope}/{self.run_id}/{self.step_key}"

    @property
    def idempotency_key(self) -> str:
        """This attempt of the call: a tool that sees a key again is seeing a retry of a call
        whose result the journal could not record."""
        return f"{self.call_key}#{self.attempt}"


_CURRENT_CALL: contextvars.ContextVar[ToolCall | None] = contextvars.ContextVar(
    "qjsflow_tool_call", default=None
)


def current_tool_call() -> ToolCall | None:
    """The call the running tool serves, or None outside a tool call."""
    return _CURRENT_CALL.get()


def bind_tool_call(call: ToolCall) -> contextvars.Token[ToolCall | None]:
    return _CURRENT_CALL.set(call)


def unbind_tool_call(token: contextvars.Token[ToolCall | None]) -> None:
    _CURRENT_CALL.reset(token)
