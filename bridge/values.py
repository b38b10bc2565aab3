"""The tagged value encoding, seen from Python: the one table of value kinds.

Author values are encoded by the prelude (sandbox/prelude/20-values.js) and stored verbatim.
Python reads them with `to_python` (views, tools), writes host-made values (run input, event
payloads, tool results) with `from_python`, and prints them with `to_json_form` (`--json`),
which uses the journal's own tags wherever plain JSON cannot hold a value. Every value the
prelude's encoder accepts decodes here without error; tests/value_vectors.py holds the shared
vectors both sides are tested with.

| JavaScript | encoded | Python (`to_python`) | `--json` form |
|---|---|---|---|
| string | "…" | str | "…" |
| string with lone surrogates | {"$t":"utf16","v":hex} | str (with surrogates) | the tag |
| number | 1.5 | int or float | 1.5 |
| undefined | {"$t":"undefined"} | None | null |
| NaN, ±Infinity, -0 | {"$t":"NaN"} … | float | the tag |
| BigInt | {"$t":"bigint","v":hex} | int | a number within ±2**53, else the tag |
| Date | {"$t":"Date","v":ms} | datetime (UTC); `JsValue` past years 1-9999 | the tag |
| Map | {"$t":"Map","v":[[k,v]…]} | dict (pairs: see below) | object, or the tag |
| Set | {"$t":"Set","v":[…]} | list | a list |
| Uint8Array, ArrayBuffer | {"$t":"Uint8Array","v":hex} | bytes | the tag |
| other typed arrays | {"$t":"Float64Array","v":hex} | list of numbers | a list |
| RegExp, Error | {"$t":"RegExp"…}, {"$t":"Error",…} | dict of source/flags, name/message | object |
| object with its own "$t" key | {"$t":"object","v":{…}} | dict | the tag |
| secret handle (`env.KEY`) | {"$t":"secret","v":name} | `SecretRef` (no value) | the tag |
| binding object (`env.KV`) | {"$t":"binding","kind":k,"v":name} | `BindingRef` | the tag |

A Map whose keys Python cannot hash (objects) or does not tell apart (1, 1n, true) becomes a
list of (key, value) pairs; an invalid Date is a `JsValue` too.
"""

from __future__ import annotations

import datetime as dt
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from qjsflow.bridge.codec import dumps_text, loads
from qjsflow.bridge.errors import InvalidInput

__all__ = [
    "BindingRef",
    "JsValue",
    "SecretRef",
    "from_python",
    "tagged_date",
    "to_json_form",
    "to_python",
]

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
_REVIVE_ERRORS = (KeyError, TypeError, ValueError, OverflowError, struct.error, AttributeError)


@dataclass(frozen=True, slots=True)
class SecretRef:
    """A secret binding by name: what the sandbox holds and the journal stores. Only the host,
    calling a tool, puts the value in its place (runner/tenancy/environment.py)."""

    name: str


@dataclass(frozen=True, slots=True)
class BindingRef:
    """A binding object of the run's env (a KV namespace, a queue) by kind and name: the
    sandbox makes the object; its methods are journaled host calls."""

    kind: str
    name: str


@dataclass(frozen=True, slots=True)
class JsValue:
    """A JavaScript value Python has no type for (a Date outside years 1-9999, an invalid
    Date, a tag this version does not know), kept in its encoded form: `encoded` is the
    journal's tagged JSON object, which `from_python` and `to_json_form` write back as is."""

    encoded: dict[str, Any]

    @property
    def tag(self) -> str:
        return str(self.encoded.get("$t"))


def tagged_date(ms: int) -> dict[str, Any]:
    """A JavaScript Date at `ms` since the epoch, as the journal encodes it."""
    return {"$t": "Date", "v": ms}


def to_python(text: str) -> Any:
    """Decode an encoded value for Python callers (views, tools)."""
    return _revive(loads(text, max_depth=None))  # stored values were bounded when written


def from_python(value: Any, *, max_bytes: int | None = None, what: str = "value") -> str:
    """Encode a Python value (JSON-like, plus datetime, bytes, set) for the journal."""
    text = dumps_text(_tag(value, what, 0, False))
    if max_bytes is not None and len(text.encode("utf-8")) > max_bytes:
        raise InvalidInput(f"{what} is larger than the limit of {max_bytes} bytes")
    return text


def to_json_form(value: Any) -> Any:
    """A decoded value (or a view holding some) as plain JSON data: what JSON holds natively
    as itself, the rest in the journal's tags (see the table above). Never fails on what
    `to_python` returns; orjson can always write the result."""
    return _tag(value, "value", 0, True)


def _tag(value: Any, what: str, depth: int, lenient: bool) -> Any:
    if depth > 64 and not lenient:  # views hold stored values, which were bounded when written
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
        delta = moment - _EPOCH
        return tagged_date(
            (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000
        )
    if isinstance(value, JsValue):
        return value.encoded
    if isinstance(value, SecretRef):
        return {"$t": "secret", "v": value.name}
    if isinstance(value, BindingRef):
        return {"$t": "binding", "kind": value.kind, "v": value.name}
    if isinstance(value, bytes | bytearray):
        return {"$t": "Uint8Array", "v": bytes(value).hex()}
    if isinstance(value, list | tuple):
        return [_tag(item, what, depth + 1, lenient) for item in value]
    if isinstance(value, set | frozenset):
        return {"$t": "Set", "v": [_tag(item, what, depth + 1, lenient) for item in value]}
    if isinstance(value, Mapping):
        if not all(isinstance(key, str) for key in value):  # a JS Map holds any key
            pairs = [
                [_tag(key, what, depth + 2, lenient), _tag(item, what, depth + 2, lenient)]
                for key, item in value.items()
            ]
            return {"$t": "Map", "v": pairs}
        out: dict[str, Any] = {}
        for key, item in value.items():
            out[_tagged_key(key) if lenient else key] = _tag(item, what, depth + 1, lenient)
        return {"$t": "object", "v": out} if "$t" in out else out
    if lenient:
        return {"$t": "unknown", "v": type(value).__name__}
    raise InvalidInput(f"{what} holds a {type(value).__name__}, which cannot be stored")


def _tagged_key(key: str) -> str:
    """An object key JSON can hold: lone surrogates (which the encoder refuses in keys, but
    a Python caller may hold) are written as `\\uXXXX` text."""
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return key.encode("utf-8", "backslashreplace").decode("ascii", "replace")
    return key


def _revive(value: Any) -> Any:
    try:
        return _revive_tagged(value)
    except _REVIVE_ERRORS:  # a malformed tag: kept as it is rather than failing a view
        return JsValue(value)


def _revive_tagged(value: Any) -> Any:
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
        case "secret":
            return SecretRef(str(value["v"]))
        case "binding":
            return BindingRef(str(value["kind"]), str(value["v"]))
        case "bigint":
            text = value["v"]
            return -int(text[1:], 16) if text.startswith("-") else int(text, 16)
        case "Date":
            ms = value["v"]
            if ms is None:
                return JsValue(value)
            try:
                return _EPOCH + dt.timedelta(milliseconds=ms)
            except OverflowError:  # JS dates reach ±271,821 years; Python's stop at 1-9999
                return JsValue(value)
        case "utf16":
            units = bytes.fromhex(value["v"])
            code_units = struct.unpack(f">{len(units) // 2}H", units)
            little = struct.pack(f"<{len(code_units)}H", *code_units)
            return little.decode("utf-16-le", "surrogatepass")
        case "Map":
            pairs = [(_revive(k), _revive(v)) for k, v in value["v"]]
            try:
                as_dict = dict(pairs)
            except TypeError:  # a key Python cannot hash (an object, a list)
                return pairs
            # Keys JS tells apart and Python does not (1, 1n, true) would be lost in a dict.
            return as_dict if len(as_dict) == len(pairs) else pairs
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
    return JsValue(value)
