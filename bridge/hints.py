"""Hints for people: for errors whose usual cause is known, what to do about it.

Publishing adds them under its error lines; a run's or a step's error gets one in brackets.
"""

from __future__ import annotations

import re

__all__ = ["publish_hint", "with_run_hint"]

_PUBLISH = (
    (
        re.compile(r"which is not installed"),
        "run `npm install` in the published folder, so the package lands in its node_modules",
    ),
    (
        re.compile(r"the Node built-in"),
        "workflows run without Node's modules: reach files, networks and processes through "
        "step.tool",
    ),
    (
        re.compile(r"outside the snapshot"),
        "a snapshot holds only the published folder: move the file into it",
    ),
    (
        re.compile(r'No matching export in "(qjsflow|cloudflare:workers|cloudflare:workflows)"'),
        "see the authoring guide (README) for what qjsflow provides",
    ),
)
_RUN = (
    (
        re.compile(r"^ReferenceError: '?(WebSocket|XMLHttpRequest|EventSource)"
                   r"'? is not defined"),
        "call HTTP APIs with fetch(url, init) (the scope's egress policy decides where) or "
        "through step.tool",
    ),
    (
        re.compile(r"^ReferenceError: '?(setImmediate|requestAnimationFrame)'? is not defined"),
        "use setTimeout(fn, 0) within a drive, or step.sleep to wait durably",
    ),
    (
        re.compile(r"^ReferenceError: '?(process|require|Buffer|__dirname|__filename)'? is not "
                   r"defined"),
        "workflows are not Node programs: read configuration from env, do I/O through step.tool",
    ),
)  # fmt: skip


def publish_hint(message: str) -> str | None:
    """The hint for one publish error line, if there is one."""
    return next((hint for pattern, hint in _PUBLISH if pattern.search(message)), None)


def with_run_hint(message: str, name: str | None = None) -> str:
    """A run's error (`Name: message`), or a step's error message with its `name`, with a hint
    in brackets where one helps."""
    text = message if name is None else f"{name}: {message}"
    hint = next((hint for pattern, hint in _RUN if pattern.search(text)), None)
    if hint is None or f"(hint: {hint})" in message:  # a step's error thrown again by the body
        return message
    return f"{message} (hint: {hint})"
