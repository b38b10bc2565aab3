"""What names a bundle's text everywhere: its SHA-256. A module of its own, so that the journal
(which checks it) loads nothing of the wire's types for a command that only reads."""

from __future__ import annotations

import hashlib

__all__ = ["bundle_digest"]


def bundle_digest(code: str) -> str:
    """A bundle text's SHA-256: stored with it when published, checked when read, and the key
    an executor keeps it under (`sandbox/pool.py`, `_Executor.bundles`)."""
    return hashlib.sha256(code.encode("utf-8")).hexdigest()
