"""The one JSON codec: strict, bounded."""

from __future__ import annotations

import pytest

from qjsflow.bridge import CodecError, dumps, loads


def test_round_trip() -> None:
    value = {"a": [1, 2.5, "é", None, True], "b": {"c": []}}
    assert loads(dumps(value)) == value


@pytest.mark.parametrize("text", ["NaN", "[Infinity]", "{'a': 1}", "[1,]", ""])
def test_non_standard_json_is_refused(text: str) -> None:
    with pytest.raises(CodecError, match="malformed JSON"):
        loads(text)


def test_size_limit() -> None:
    with pytest.raises(CodecError, match="exceeds the limit of 10 bytes"):
        loads("[" + "1," * 10 + "1]", max_bytes=10)


def test_depth_limit() -> None:
    assert loads("[" * 5 + "]" * 5, max_depth=5) == [[[[[]]]]]
    with pytest.raises(CodecError, match="deeper than the limit of 4"):
        loads("[" * 5 + "]" * 5, max_depth=4)
    with pytest.raises(CodecError, match="deeper"):
        loads('{"a":' * 200 + "1" + "}" * 200)


def test_unencodable_values_are_refused() -> None:
    with pytest.raises(CodecError, match="cannot encode"):
        dumps({"big": 2**70})
    with pytest.raises(CodecError, match="cannot encode"):
        dumps(object())


def test_without_a_depth_walk_orjson_still_bounds_nesting() -> None:
    assert loads("[" * 900 + "]" * 900, max_depth=None) is not None
    with pytest.raises(CodecError, match="depth limit exceeded"):
        loads("[" * 2000 + "]" * 2000, max_depth=None)


@pytest.mark.parametrize("depth", [1, 2, 3, 64])
def test_the_shortest_text_one_level_too_deep_is_refused(depth: int) -> None:
    """Text too short to nest deeper than the limit is not walked: the shortest text that
    does nest one level deeper still is."""
    assert loads("[" * depth + "]" * depth, max_depth=depth) is not None
    assert loads('{"a":' * depth + "1" + "}" * depth, max_depth=depth) is not None
    with pytest.raises(CodecError, match="deeper"):
        loads("[" * (depth + 1) + "]" * (depth + 1), max_depth=depth)
