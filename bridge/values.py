"""The tagged value encoding, seen from Python.

Author values are encoded by the prelude (sandbox/prelude/20-values.js) and stored verbatim;
Python reads them with `to_python` for views and tools, and writes host-made values (run input,
event payloads, tool results) with `from_python`, producing exactly what the prelude decodes.

| JavaScript | encoded | Python |
|---|---|---|
| undefined | {"$t":"undefined"} | None |
| NaN, ±Infinity, -0 | {"$t":"NaN"} … | float |
| BigInt | {"$t":"bigint","v":hex} | int (ints beyond 2**53 are written as BigInt) |
| Date | {"$t":"Date","v":ms} | datetime (UTC) |
| Map / Set | {"$t":"Map","v":[[k,v]…]} / {"$t":"Set","v":[…]} | dict (or list of pairs) / list |
| Uint8Array, ArrayBuffer | {"$t":"Uint8Array","v":hex} | bytes |
| other typed arrays | {"$t":"Float64Array","v":hex} | list of numbers |
| RegExp, Error | {"$t":"RegExp"…}, {"$t":"Error","name","message"} | dict with those fields |
| string with lone surrogates | {"$t":"utf16","v":hex} | str |
| object with its own "$t" key | {"$t":"object","v":{…}} | dict |
"""

from __future__ import annotations

import datetime as dt
import math
import struct
from collections.abc import Mapping
from typing import Any

from bridge.codec import dumps_text, loads
from bridge.errors import InvalidInput

__all__ = ["from_python", "to_python"]

_TYPED = {
    "Int8Array": "b",
    "Uint8ClampedArray": "B",
    "Int16Array": "h",
    "Uint16Array": "H",
    "Int32Array": "i",
    "Uint32Array": "I",
    "Float16Array": "e",
    "Float32Array": "f",
    "Float64Array": "d",
    "BigInt64Array": "q",
    "BigUint64Array": "Q",
}
_SAFE_INT = 2**53
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def to_python(text: str) -> Any:
    """Decode an encoded value for Python callers (views, tools)."""
    return _revive(loads(text, max_depth=None))  # stored values were bounded when written


def from_python(value: Any, *, max_bytes: int | None = None, what: str = "value") -> str:
    """Encode a Python value (JSON-like, plus datetime, bytes, set) for the journal."""
    text = dumps_text(_tag(value, what, 0))
    if max_bytes is not None and len(text.encode("utf-8")) > max_bytes:
        raise InvalidInput(f"{what} is larger than the limit of {max_bytes} bytes")
    return text


def _tag(value: Any, what: str, depth: int) -> Any:
    if depth > 64:
        raise InvalidInput(f"{what} is nested deeper than 64 levels")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if -_SAFE_INT < value < _SAFE_INT:
            return value
        sign = "-" if value < 0 else ""
        return {"$t": "bigint", "v": f"{sign}{abs(value):x}"}
    if isinstance(value, float):
        if math.isnan(value):
            return {"$t": "NaN"}
        if math.isinf(value):
            return {"$t": "Infinity" if value > 0 else "-Infinity"}
        if value == 0 and math.copysign(1, value) < 0:
            return {"$t": "-0"}
        return value
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            units = value.encode("utf-16-le", "surrogatepass")
            return {
                "$t": "utf16",
                "v": "".join(f"{u:04x}" for (u,) in struct.iter_unpack("<H", units)),
            }
        return value
    if isinstance(value, dt.datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
        return {"$t": "Date", "v": round((moment - _EPOCH).total_seconds() * 1000)}
    if isinstance(value, bytes | bytearray):
        return {"$t": "Uint8Array", "v": bytes(value).hex()}
    if isinstance(value, list | tuple):
        return [_tag(item, what, depth + 1) for item in value]
    if isinstance(value, set | frozenset):
        return {"$t": "Set", "v": [_tag(item, what, depth + 1) for item in value]}
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidInput(f"{what} has a non-string key {key!r}")
            out[key] = _tag(item, what, depth + 1)
        return {"$t": "object", "v": out} if "$t" in out else out
    raise InvalidInput(f"{what} holds a {type(value).__name__}, which cannot be stored")


def _revive(value: Any) -> Any:
    if isinstance(value, list):
        return [_revive(item) for item in value]
    if not isinstance(value, dict):
        return value
    tag = value.get("$t")
    if tag is None:
        return {key: _revive(item) for key, item in value.items()}
    match tag:
        case "undefined":
            return None
        case "NaN":
            return math.nan
        case "Infinity":
            return math.inf
        case "-Infinity":
            return -math.inf
        case "-0":
            return -0.0
        case "bigint":
            text = value["v"]
            return -int(text[1:], 16) if text.startswith("-") else int(text, 16)
        case "Date":
            ms = value["v"]
            return None if ms is None else _EPOCH + dt.timedelta(milliseconds=ms)
        case "utf16":
            units = bytes.fromhex(value["v"])
            code_units = struct.unpack(f">{len(units) // 2}H", units)
            little = struct.pack(f"<{len(code_units)}H", *code_units)
            return little.decode("utf-16-le", "surrogatepass")
        case "Map":
            pairs = [(_revive(k), _revive(v)) for k, v in value["v"]]
            try:
                return dict(pairs)
            except TypeError:
                return pairs
        case "Set":
            return [_revive(item) for item in value["v"]]
        case "Uint8Array" | "ArrayBuffer":
            return bytes.fromhex(value["v"])
        case "RegExp":
            return {"source": value["v"], "flags": value.get("flags", "")}
        case "Error":
            return {"name": value.get("name"), "message": value.get("message")}
        case "object":
            return {key: _revive(item) for key, item in value["v"].items()}
    if tag in _TYPED:
        raw = bytes.fromhex(value["v"])
        code = _TYPED[tag]
        return list(struct.unpack(f"<{len(raw) // struct.calcsize(code)}{code}", raw))
    return value
