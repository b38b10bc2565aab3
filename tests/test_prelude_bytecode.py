"""The prelude loaded from bytecode compiled once per executor behaves as its source does."""

from __future__ import annotations

import pytest
import quickjs

from qjsflow.sandbox import bytecode
from qjsflow.sandbox.bytecode import PreludeLoader
from qjsflow.sandbox.executor import PRELUDE

PROBE = """
JSON.stringify([
  typeof globalThis.__qjsflowPrelude,
  Object.isFrozen(Object.prototype),
  Object.isFrozen(Array.prototype),
  typeof fetch, typeof crypto.getRandomValues, typeof setTimeout, typeof URL,
  Object.getOwnPropertyNames(globalThis).sort().join(","),
])
"""


def _prepared(loader: PreludeLoader) -> tuple[str, str]:
    context = quickjs.Context()
    dispatch = loader.evaluate(context)
    prepared = dispatch("prepare", "")
    return prepared, context.eval(PROBE)


def test_this_binding_takes_the_bytecode_path() -> None:
    # Fails loudly when a new binding version (or a layout change) turns the fast path off:
    # check the new layout and add the version to bytecode.CHECKED_VERSIONS.
    assert PreludeLoader(PRELUDE).fast


def test_bytecode_and_source_prepare_the_same_context() -> None:
    fast, slow = PreludeLoader(PRELUDE), PreludeLoader(PRELUDE, fast=False)
    assert (fast.fast, slow.fast) == (True, False)
    from_bytecode = _prepared(fast)
    assert from_bytecode == _prepared(slow)
    assert from_bytecode[0].startswith('{"plan":[[0,')  # the first context walks
    assert from_bytecode[1].startswith('["undefined",true,true,"function","function","function",')


def test_an_unchecked_binding_version_falls_back_to_the_source(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bytecode, "CHECKED_VERSIONS", frozenset())
    loader = PreludeLoader(PRELUDE)
    assert not loader.fast
    assert _prepared(loader)[0].startswith('{"plan":')


def test_the_prelude_is_loaded_without_its_source_text() -> None:
    # A third of the bytecode to read into every context; and author code calling toString on
    # the runtime's functions sees no source of the sandbox.
    loader = PreludeLoader(PRELUDE)
    context = quickjs.Context()
    loader.evaluate(context)("prepare", "")
    shown = context.eval("fetch.toString() + Headers.toString()")
    assert "[native code]" in shown
    assert "return" not in shown
