"""The one JSON codec of qjsflow: orjson, strict, with size and depth limits.

Everything that crosses a boundary (sandbox frames, journal values, CLI output) is encoded and
decoded here, so that a limit or a strictness rule holds everywhere at once.
"""

from __future__ import annotations

from typing import Any

import orjson

from qjsflow.bridge.errors import CodecError

__all__ = ["DEFAULT_MAX_DEPTH", "dumps", "dumps_text", "loads"]

DEFAULT_MAX_DEPTH = 64


def dumps(value: Any, *, sort_keys: bool = False) -> bytes:
    """Encode `value` as compact JSON bytes.

    Non-finite floats must be tagged before they get here (orjson would write them as null);
    integers beyond 64 bits are refused.
    """
    option = orjson.OPT_SORT_KEYS if sort_keys else 0
    try:
        return orjson.dumps(value, option=option)
    except (orjson.JSONEncodeError, TypeError) as error:
        raise CodecError(f"cannot encode value as JSON: {error}") from None


def dumps_text(value: Any, *, sort_keys: bool = False) -> str:
    """Like `dumps`, as `str`."""
    return dumps(value, sort_keys=sort_keys).decode("utf-8")


def loads(
    data: bytes | str, *, max_bytes: int | None = None, max_depth: int | None = DEFAULT_MAX_DEPTH
) -> Any:
    """Decode JSON text; refuse text over `max_bytes`, nesting over `max_depth`, and NaN.

    `max_depth=None` skips the walk that measures nesting: orjson itself refuses anything
    nested deeper than 1024, which is all a caller that validates parts later needs.
    """
    size = len(data)
    if max_bytes is not None and size > max_bytes:
        raise CodecError(f"JSON text of {size} bytes exceeds the limit of {max_bytes} bytes")
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as error:
        raise CodecError(f"malformed JSON: {error}") from None
    # Nesting `max_depth + 1` deep takes twice as many brackets: shorter text needs no walk.
    if max_depth is not None and size > 2 * max_depth + 1 and _depth(value, max_depth) > max_depth:
        raise CodecError(f"JSON nested deeper than the limit of {max_depth} levels")
    return value


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of a decoded value, stopping early once past `limit`."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        deepest = max(deepest, level)
        if deepest > limit:
            return deepest
        stack.extend((child, level + 1) for child in children)
    return deepest
