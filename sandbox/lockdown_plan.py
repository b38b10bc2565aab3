"""The lockdown's plan, compiled into the prelude once per executor process.

Preparing a context freezes ~170 intrinsics (sandbox/prelude/60-lockdown.js, harden). Finding
them is a walk over every property of every object reached, but every fresh context of one
prelude and one engine has the same shape: the first context's walk returns its routes (from a
global value, through a prototype or a property, to each object it froze), and this module
writes them as a function — one line an object — added to the prelude as a part of its own
(`load_prelude`). The prelude compiled with it follows the routes in every later context: no
plan parsed, no descriptor made per object, no search (~9 % of a short drive's executor work,
measured in instructions: docs/performance-log.md). A route that does not lead to an object (a
context of another shape) stops the function, and that context walks.

The routes come from the prelude's own walk in a fresh context, before any author code; they
are still checked here, shape and type, and keys are written as JSON string literals.
"""

from __future__ import annotations

from typing import Any

from qjsflow.bridge.codec import dumps_text, loads

__all__ = ["plan_part"]

# A route: [0, root] a root's value; [1, n] the prototype of the n-th object frozen;
# [2, n, key] its own property `key`, [2, n, name, 1] its property keyed by Symbol[name];
# [3] none (a symbol the walk cannot name again: such a plan is not compiled).
_ROOT, _PROTOTYPE, _PROPERTY = 0, 1, 2


def plan_part(answer: str) -> str | None:
    """The prelude's part that follows the routes in `answer` (the first context's answer to
    `prepare`: `{"plan": routes}`), or None when it holds no plan that can be compiled."""
    try:
        routes = loads(answer, max_depth=None).get("plan")
    except (ValueError, AttributeError):
        return None
    if not isinstance(routes, list) or not routes:
        return None
    lines = []
    for at, route in enumerate(routes):
        reach = _reach(route, at)
        if reach is None:
            return None
        lines.append(f"  const o{at} = take({reach});")
    body = "\n".join(lines)
    return f"planned = function (roots, take) {{\n{body}\n}};\n"


def _reach(route: Any, at: int) -> str | None:
    """The expression that reaches the object of `route`, the `at`-th frozen."""
    if not isinstance(route, list) or not route or not _index(route[0], 3):
        return None
    kind = route[0]
    if kind == _ROOT and len(route) == 2 and _index(route[1], None):
        return f"roots[{route[1]}]"
    if len(route) < 2 or not _index(route[1], at):
        return None
    source = f"o{route[1]}"
    if kind == _PROTOTYPE and len(route) == 2:
        return f"getPrototypeOf({source})"
    if kind == _PROPERTY and len(route) == 3 and isinstance(route[2], str):
        return f"{source}[{dumps_text(route[2])}]"
    if kind == _PROPERTY and len(route) == 4 and isinstance(route[2], str) and route[3] == 1:
        return f"{source}[RealSymbol[{dumps_text(route[2])}]]"
    return None


def _index(value: Any, below: int | None) -> bool:
    """Whether `value` is a whole number, from 0 and under `below` when one is given."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        return False
    return below is None or value < below
