"""Errors of publishing: see the tree drawn in `bridge.errors`."""

from __future__ import annotations

from qjsflow.bridge.errors import InvalidInput

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
    """esbuild refused the tree; `messages` are `file:line:column: text` inside the tree."""

    def __init__(self, messages: list[str]) -> None:
        self.messages = tuple(messages)
        shown = "\n".join(f"  {message}" for message in messages)
        super().__init__(f"bundling failed with {len(messages)} error(s):\n{shown}")
