"""Author-controlled text made safe to show on a terminal or in a log line."""

from __future__ import annotations

import re

__all__ = ["printable"]


# What a terminal acts on or hides: C0 and C1 controls (ESC, BEL, CR, a newline that forges a
# line), DEL, bidirectional overrides and isolates, and lone surrogates (which cannot be
# written as UTF-8 at all).
_UNPRINTABLE = re.compile(
    r"[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)


def printable(text: str) -> str:
    """Author-controlled text made safe for a terminal: every character that a terminal would
    act on, or that would hide or reorder what follows, is shown as an escape (`\\x1b`)."""
    return _UNPRINTABLE.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
