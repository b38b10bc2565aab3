"""What a run may reach outside the sandbox: tools, notifications (and later, its database).

Bindings are given per call (`start`, `resume`, `signal`) or once in `RunnerConfig`; they are
never persisted. Tools receive decoded arguments (bridge.values) and return a value that is
encoded the same way; they are called at most once per recorded attempt.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Bindings", "Notification", "ToolFn"]

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
