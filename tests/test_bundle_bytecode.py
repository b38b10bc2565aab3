"""A workflow's bundle compiled to bytecode once per executor (sandbox/bytecode.py,
BundleCode): loaded into each drive's fresh context instead of compiled again from its source,
with the same behaviour — module code runs under the drive's limits, errors and frames read
as from the source."""

from __future__ import annotations

import pytest
import quickjs

from qjsflow.bridge.codec import dumps_text
from qjsflow.bridge.limits import Limits
from qjsflow.bridge.types import Completed, Failed
from qjsflow.bridge.wire import request_to_wire
from qjsflow.sandbox import ExecutorPool
from qjsflow.sandbox import bytecode as bytecode_module
from qjsflow.sandbox.bytecode import BundleCode, PreludeLoader
from qjsflow.sandbox.executor import PRELUDE, Prepared
from tests.conftest import bundle_of
from tests.memory_host import MemoryHost

TOP_LEVEL_LOOP = "for (;;) {}\nexport default async () => 1;\n"
TOP_LEVEL_THROW = 'const x = 1;\nthrow new RangeError("at load " + x);\nexport default () => 1;\n'
FLOW = 'export default async (event, step) => step.do("s", async () => "ok");\n'


async def test_module_code_run_from_bytecode_is_under_the_drives_compute_limit(
    pool: ExecutorPool,
) -> None:
    code = await bundle_of(TOP_LEVEL_LOOP)
    host = MemoryHost()
    limits = Limits(compute_per_drive_s=0.5)
    outcome = await pool.drive(host.request(code, limits=limits), host)
    assert isinstance(outcome, Failed)
    assert "compute limit per drive of 0.5 s" in outcome.message


async def test_a_bundle_drives_alike_from_bytecode_and_from_source(pool: ExecutorPool) -> None:
    code = await bundle_of(FLOW)
    for _ in range(3):  # the first drive compiles, the next ones read the bytecode
        host = MemoryHost()
        outcome = await pool.drive(host.request(code), host)
        assert isinstance(outcome, Completed)
        assert outcome.output == '"ok"'


def _load(prepared: Prepared, code: str, bundles: BundleCode | None) -> str:
    """What the prelude's load answers, by either path ('' from bytecode)."""
    dispatch = prepared.dispatch
    dispatch("boot", dumps_text(request_to_wire(MemoryHost().request(""))))
    if bundles is not None and bundles.define(prepared.context, code, 2**26):
        answer: str = dispatch("load", "")
    else:
        answer = dispatch("load", code)
    return answer


async def test_an_error_at_load_reads_the_same_from_bytecode() -> None:
    code = await bundle_of(TOP_LEVEL_THROW)
    loader = PreludeLoader(PRELUDE)
    bundles = BundleCode(loader)
    from_bytecode = _load(Prepared(loader), code, bundles)
    from_source = _load(Prepared(loader), code, None)
    assert "RangeError" in from_bytecode
    assert "at load 1" in from_bytecode
    # The same message and the same line of the bundle in its frames.
    assert from_bytecode.split('"stack"')[0] == from_source.split('"stack"')[0]
    line = f"<input>:{from_source.split('<input>:')[1].split(':')[0]}:"
    assert line in from_bytecode


async def test_each_bundle_is_compiled_once_and_a_syntax_error_falls_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code = await bundle_of(FLOW)
    loader = PreludeLoader(PRELUDE)
    bundles = BundleCode(loader)
    compiled: list[int] = []
    original = BundleCode.compile

    def counting(self: BundleCode, text: str, memory_bytes: int) -> object:
        compiled.append(len(text))
        return original(self, text, memory_bytes)

    monkeypatch.setattr(BundleCode, "compile", counting)
    for _ in range(3):
        assert bundles.define(quickjs.Context(), code, 2**26)
    assert len(compiled) == 1
    assert not bundles.define(quickjs.Context(), "let = ;", 2**26)


def test_no_more_than_a_few_bundles_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bytecode_module, "BUNDLES_KEPT", 2)
    bundles = BundleCode(PreludeLoader(PRELUDE))
    for n in range(5):
        assert bundles.define(quickjs.Context(), f"var __qjsflow_module = {n};", 2**26)
    assert len(bundles.kept) == 2


def test_text_that_would_close_its_wrapper_is_never_loaded_as_bytecode() -> None:
    """The bundle becomes one function's body, whose bytecode is loaded outside the drive's
    limits: text that is not a program by itself could close that function and run as it
    loads. Such text is left to the source path, which refuses it as a syntax error."""
    bundles = BundleCode(PreludeLoader(PRELUDE))
    context = quickjs.Context()
    escape = "}; globalThis.escaped = 1; function again() {"
    assert not bundles.define(context, escape, 2**26)
    assert context.eval("typeof globalThis.escaped") == "undefined"
