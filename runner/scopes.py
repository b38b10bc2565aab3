"""Scope ids: the tenancy key of snapshots, runs and scope databases (DESIGN §6, §8)."""

from __future__ import annotations

import re

from bridge import InvalidInput

__all__ = ["InvalidScope", "validate_scope"]

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
