"""Rules the host and the prelude share (docs/SANDBOX.md, Limits): the longest text each field
of an op may carry, what an event type may be, and the retry policy an op's empty config
stands for.

Unlike `Limits` these are not set per deployment: they are part of the protocol. The executor
writes them into the prelude as `RULES`, so whatever the prelude lets an author send, or cuts
an author's text down to, is what the wire accepts, and a long error name is the author's
error, never "the sandbox broke the protocol".
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from qjsflow.bridge.codec import dumps_text

__all__ = ["RULES", "TextRules", "is_event_type"]


@dataclass(frozen=True, slots=True)
class TextRules:
    error_name_chars: int = 256
    error_message_chars: int = 4096  # a step's error, and a failed run's `name: message`
    tool_address_chars: int = 256
    notify_title_chars: int = 256
    notify_body_chars: int = 4096
    notify_link_chars: int = 2048
    sql_chars: int = 100_000
    log_line_chars: int = 16_384
    stack_chars: int = 2048  # an error's stack, as the engine wrote it
    # The bundle is evaluated with its first line numbered this (the prelude's are all lower),
    # so a stack frame says whose code it is in: the author's, or the sandbox's (dropped).
    bundle_first_line: int = 10_000
    # Event types: the same class of characters in Python and JavaScript regular expressions.
    event_type_pattern: str = "[A-Za-z0-9_.:-]{1,100}"
    event_type_rule: str = "1-100 characters of A-Z, a-z, 0-9, _ . : -"
    # A step's retry policy when its config sets none (Cloudflare Workflows' defaults): what the
    # prelude gives such a step, and what an op's empty config (`{}`) stands for on the wire.
    default_retry_limit: int = 5
    default_retry_delay_ms: int = 10_000
    default_retry_backoff: str = "exponential"
    default_timeout_ms: int = 600_000

    def prelude_source(self) -> str:
        """The declaration the prelude's parts read (`RULES.sql_chars`, ...)."""
        return f"const RULES = Object.freeze({dumps_text(asdict(self))});\n"


RULES = TextRules()
_EVENT_TYPE = re.compile(RULES.event_type_pattern)


def is_event_type(text: object) -> bool:
    return isinstance(text, str) and _EVENT_TYPE.fullmatch(text) is not None
