"""The shared vectors of the value encoding: one row per kind of value (bridge/values.py).

Each row says what the prelude's encoder writes for a JavaScript expression, what Python reads
from that (`to_python`, compared by `repr` so that NaN and -0 count), and how `--json` shows it
(`to_json_form`). `from_python` marks rows where encoding the Python value gives back exactly
the encoded text. tests/test_values.py runs every row through real QuickJS and the journal.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Any

from qjsflow.bridge.values import JsValue

__all__ = ["VECTORS", "Vector"]


@dataclass(frozen=True, slots=True)
class Vector:
    kind: str
    js: str
    encoded: str
    python: Any
    json: Any
    from_python: bool = True


def _date(ms: int | None) -> dict[str, Any]:
    return {"$t": "Date", "v": ms}


VECTORS: tuple[Vector, ...] = (
    Vector("string", '"h\\u00e9llo"', '"h\\u00e9llo"', "héllo", "héllo"),
    Vector(
        "string with a lone surrogate", '"x\\ud800y"', '{"$t":"utf16","v":"0078d8000079"}',
        "x\ud800y", {"$t": "utf16", "v": "0078d8000079"},
    ),
    Vector("number", "1.5", "1.5", 1.5, 1.5),
    Vector("integer", "42", "42", 42, 42),
    Vector("NaN", "NaN", '{"$t":"NaN"}', math.nan, {"$t": "NaN"}),
    Vector("negative zero", "-0", '{"$t":"-0"}', -0.0, {"$t": "-0"}),
    Vector("infinity", "-Infinity", '{"$t":"-Infinity"}', -math.inf, {"$t": "-Infinity"}),
    Vector("undefined", "undefined", '{"$t":"undefined"}', None, None, from_python=False),
    Vector("null", "null", "null", None, None),
    Vector(
        "BigInt past 64 bits", "2n ** 64n", '{"$t":"bigint","v":"10000000000000000"}',
        2**64, {"$t": "bigint", "v": "10000000000000000"},
    ),
    Vector("negative BigInt", "-(2n ** 70n)", '{"$t":"bigint","v":"-400000000000000000"}',
           -(2**70), {"$t": "bigint", "v": "-400000000000000000"}),
    Vector("small BigInt", "5n", '{"$t":"bigint","v":"5"}', 5, 5, from_python=False),
    Vector(
        "Date", "new Date(86400000)", '{"$t":"Date","v":86400000}',
        dt.datetime(1970, 1, 2, tzinfo=dt.UTC), _date(86400000),
    ),
    Vector(
        "Date at the end of JS time", "new Date(8.64e15)", '{"$t":"Date","v":8640000000000000}',
        JsValue(_date(8640000000000000)), _date(8640000000000000),
    ),
    Vector(
        "Date before year 1", "new Date(-62198755200001)", '{"$t":"Date","v":-62198755200001}',
        JsValue(_date(-62198755200001)), _date(-62198755200001),
    ),
    Vector("invalid Date", "new Date(NaN)", '{"$t":"Date","v":null}', JsValue(_date(None)),
           _date(None)),
    Vector(
        "Map with a number key", 'new Map([[1, "a"]])', '{"$t":"Map","v":[[1,"a"]]}',
        {1: "a"}, {"$t": "Map", "v": [[1, "a"]]},
    ),
    Vector("Map with string keys", 'new Map([["k", 1]])', '{"$t":"Map","v":[["k",1]]}',
           {"k": 1}, {"k": 1}, from_python=False),
    Vector(
        "Map with an object key", 'new Map([[{k: 1}, "b"]])', '{"$t":"Map","v":[[{"k":1},"b"]]}',
        [({"k": 1}, "b")], [[{"k": 1}, "b"]], from_python=False,
    ),
    Vector(
        "Map with keys Python merges", 'new Map([[1, "a"], [1n, "b"]])',
        '{"$t":"Map","v":[[1,"a"],[{"$t":"bigint","v":"1"},"b"]]}',
        [(1, "a"), (1, "b")], [[1, "a"], [1, "b"]], from_python=False,
    ),
    Vector("Set", 'new Set([1, "a"])', '{"$t":"Set","v":[1,"a"]}', [1, "a"], [1, "a"],
           from_python=False),
    Vector(
        "Uint8Array", "new Uint8Array([1, 255])", '{"$t":"Uint8Array","v":"01ff"}',
        b"\x01\xff", {"$t": "Uint8Array", "v": "01ff"},
    ),
    Vector("Float64Array", "new Float64Array([1.5])",
           '{"$t":"Float64Array","v":"000000000000f83f"}', [1.5], [1.5], from_python=False),
    Vector("RegExp", "/a+/gi", '{"$t":"RegExp","v":"a+","flags":"gi"}',
           {"source": "a+", "flags": "gi"}, {"source": "a+", "flags": "gi"}, from_python=False),
    Vector(
        "Error", 'new TypeError("boom")', '{"$t":"Error","name":"TypeError","message":"boom"}',
        {"name": "TypeError", "message": "boom"}, {"name": "TypeError", "message": "boom"},
        from_python=False,
    ),
    Vector(
        "object with its own $t", '({$t: "x"})', '{"$t":"object","v":{"$t":"x"}}',
        {"$t": "x"}, {"$t": "object", "v": {"$t": "x"}},
    ),
    Vector(  # names the prototype has: own properties, not the prototype or its methods
        "object with __proto__ and toString", """JSON.parse('{"__proto__": 1, "toString": 2}')""",
        '{"__proto__":1,"toString":2}', {"__proto__": 1, "toString": 2},
        {"__proto__": 1, "toString": 2},
    ),
    Vector(  # a prototype of Object.prototype makes an object plain, whatever its slots
        "Date given Object.prototype", "Object.setPrototypeOf(new Date(5), Object.prototype)",
        "{}", {}, {},
    ),
    Vector(  # a Date of another prototype is still a Date
        "Date given a prototype of its own", "Object.setPrototypeOf(new Date(5), {})",
        '{"$t":"Date","v":5}', dt.datetime(1970, 1, 1, 0, 0, 0, 5000, tzinfo=dt.UTC), _date(5),
    ),
    Vector("nested", '({a: [1, {b: null}], "\\u00e9": true})', '{"a":[1,{"b":null}],"\\u00e9":true}',
           {"a": [1, {"b": None}], "é": True}, {"a": [1, {"b": None}], "é": True}),
)  # fmt: skip
