"""A step's identity in the journal and on the wire."""

from __future__ import annotations

__all__ = ["step_key"]


def step_key(kind: str, count: int, name: str) -> str:
    """A step's identity in the journal and on the wire: `kind:count:name`, where `name` holds
    the enclosing steps' keys for a call made inside a body (the prelude builds the same)."""
    return f"{kind}:{count}:{name}"
