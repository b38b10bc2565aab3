"""Errors of publishing: see the tree drawn in `bridge.errors`."""

from __future__ import annotations

from qjsflow.bridge.errors import InvalidInput
from qjsflow.bridge.hints import publish_hint

__all__ = ["BundleError", "PublishError", "SourceTreeError"]


class PublishError(InvalidInput):
    """A source tree could not become a snapshot; nothing was stored."""


class SourceTreeError(PublishError):
    """The tree breaks a rule before any bundling: a file kind, a size, a path, an entry."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        where = path if path else "the source tree"
        super().__init__(f"{where}: {problem}")


class BundleError(PublishError):
    """esbuild refused the tree; `messages` are `file:line:column: text` inside the tree, one
    line each, each followed by a `  hint: …` line where a hint helps."""

    def __init__(self, messages: list[str]) -> None:
        self.messages = tuple(messages)
        lines = []
        for message in messages:
            lines.append(message)
            hint = publish_hint(message)
            if hint is not None:
                lines.append(f"  hint: {hint}")
        super().__init__("\n".join(lines))
