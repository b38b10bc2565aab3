"""Scope ids: the tenancy key of snapshots, runs and scope databases (docs/ARCHITECTURE.md)."""

from __future__ import annotations

import enum
import re
from typing import Final

from qjsflow.bridge import InvalidInput

__all__ = ["ALL_SCOPES", "AllScopes", "InvalidScope", "run_key", "split_run_key", "validate_scope"]

_SCOPE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")


class InvalidScope(InvalidInput):
    def __init__(self, scope: object) -> None:
        shown = repr(scope)[:80]
        super().__init__(
            f"invalid scope {shown}: use 1-64 characters of a-z, 0-9, '_' and '-', "
            "starting with a letter or digit"
        )


def validate_scope(scope: object) -> str:
    if not isinstance(scope, str) or not _SCOPE.fullmatch(scope):
        raise InvalidScope(scope)
    return scope


class AllScopes(enum.Enum):
    """An operator's explicit request to look across every scope (`Runner.list`)."""

    ALL = "all"


ALL_SCOPES: Final = AllScopes.ALL


def run_key(scope: str, run_id: str) -> str:
    """The journal's key of a run: runs are keyed by (scope, run id), so two scopes may use
    the same run id and neither can see, block or guess the other's. Neither part can hold
    a '/', so the key is unambiguous."""
    return f"{scope}/{run_id}"


def split_run_key(key: str) -> tuple[str, str]:
    """(scope, run id) of a journal key."""
    scope, _, run_id = key.partition("/")
    return scope, run_id
