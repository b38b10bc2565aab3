"""Who is asking: tokens from a file, sessions for browsers, CSRF tokens for their forms.

A token file holds one token per line: `TOKEN` alone is an operator's (every scope),
`TOKEN scope=NAME` is bound to one scope. API clients send `Authorization: Bearer TOKEN`;
a browser signs in once with a token and gets a session cookie (HttpOnly, SameSite=Strict),
with a CSRF token every form posts back.
"""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from qjsflow.bridge import InvalidInput
from qjsflow.runner.tenancy.scopes import validate_scope

__all__ = ["SESSION_COOKIE", "Principal", "Session", "Sessions", "Tokens"]

SESSION_COOKIE = "qjsflow_session"
_MIN_TOKEN_CHARS = 16
_SESSION_S = 12 * 3600


@dataclass(frozen=True, slots=True)
class Principal:
    """An operator (`scope` None: every scope) or a tenant bound to one scope."""

    scope: str | None

    def may_see(self, scope: str) -> bool:
        return self.scope is None or self.scope == scope


OPERATOR = Principal(None)


class Tokens:
    def __init__(self, entries: dict[str, Principal]) -> None:
        self._entries = entries

    @classmethod
    def load(cls, path: str | Path) -> Tokens:
        entries: dict[str, Principal] = {}
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise InvalidInput(f"cannot read the token file: {error}") from None
        for number, line in enumerate(text.splitlines(), start=1):
            parts = line.split()
            if not parts or parts[0].startswith("#"):
                continue
            token, rest = parts[0], parts[1:]
            if len(token) < _MIN_TOKEN_CHARS:
                raise InvalidInput(f"token file line {number}: a token needs 16 characters or more")
            if not rest:
                entries[token] = OPERATOR
            elif len(rest) == 1 and rest[0].startswith("scope="):
                entries[token] = Principal(validate_scope(rest[0].removeprefix("scope=")))
            else:
                raise InvalidInput(f"token file line {number}: use `TOKEN` or `TOKEN scope=NAME`")
        if not entries:
            raise InvalidInput("the token file holds no token")
        return cls(entries)

    def principal(self, token: str) -> Principal | None:
        """The token's principal; compared in constant time against every token."""
        found = None
        for known, principal in self._entries.items():
            if hmac.compare_digest(known.encode(), token.encode()):
                found = principal
        return found


@dataclass(frozen=True, slots=True)
class Session:
    principal: Principal
    csrf: str
    expires: float


class Sessions:
    """Browser sessions, in this process's memory (a restart signs everyone out)."""

    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}

    def open(self, principal: Principal) -> tuple[str, Session]:
        self._sweep()
        session_id = secrets.token_urlsafe(32)
        session = Session(principal, secrets.token_urlsafe(32), time.time() + _SESSION_S)
        self._sessions[session_id] = session
        return session_id, session

    def get(self, session_id: str | None) -> Session | None:
        session = self._sessions.get(session_id or "")
        if session is None or session.expires < time.time():
            return None
        return session

    def _sweep(self) -> None:
        now = time.time()
        for key in [k for k, s in self._sessions.items() if s.expires < now]:
            del self._sessions[key]
