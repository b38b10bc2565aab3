"""An executor's next context has the bundle it drove last defined ahead (its bytecode read, none
of its code run): a drive of that bundle does not read it, a drive of another bundle runs its
own, and a bundle that does not compile, or whose module never ends loading, is not defined
ahead or does not hold up the preparation."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from qjsflow.bridge.digest import bundle_digest
from qjsflow.bridge.limits import Limits
from qjsflow.bridge.wire import request_to_wire
from qjsflow.sandbox import executor as executor_module
from qjsflow.sandbox.bytecode import BundleCode, PreludeLoader
from qjsflow.sandbox.executor import PRELUDE, Prepared, serve
from tests.conftest import bundle_of, executor_payload
from tests.memory_host import MemoryHost


def _drive(code: str, limits: Limits | None = None) -> dict[str, Any]:
    request = request_to_wire(MemoryHost().request(code, limits=limits))
    return {"type": "drive", "request": request, "bundle": code, "bundleKey": bundle_digest(code)}


class Served:
    """An executor's loop run here on `messages`: each outcome, and each bundle definition,
    in order, marked by whether a drive or a preparation made it."""

    def __init__(self, messages: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
        self.outcomes: list[dict[str, Any]] = []
        self.defined: list[tuple[str, str]] = []  # (by "drive" or "prepare", bundle key)
        in_drive = [False]
        original_define = BundleCode.define
        original_run = executor_module.Drive.run

        def define(self: BundleCode, context: Any, text: str, memory: int, **kw: Any) -> bool:
            served.defined.append(("drive" if in_drive[0] else "prepare", str(kw.get("key"))))
            return original_define(self, context, text, memory, **kw)

        def run(self: Any) -> bytes:
            in_drive[0] = True
            try:
                return original_run(self)
            finally:
                in_drive[0] = False

        def write(fd: int, data: bytes) -> None:
            served.outcomes.append(orjson.loads(data[4:])["outcome"])

        served = self
        monkeypatch.setattr(BundleCode, "define", define)
        monkeypatch.setattr(executor_module.Drive, "run", run)
        monkeypatch.setattr(executor_module, "write_all", write)
        frames: Iterator[dict[str, Any]] = iter(messages)
        prelude = PreludeLoader(PRELUDE)
        serve(
            lambda: next((executor_payload(m) for m in frames), None),
            -1,
            prelude,
            BundleCode(prelude),
        )


async def test_the_last_bundle_is_defined_ahead_and_not_read_by_its_next_drive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code = await bundle_of("export default async () => 'a';")
    key = bundle_digest(code)
    served = Served([_drive(code), {"type": "prepare"}, _drive(code)], monkeypatch)
    assert [o["output"] for o in served.outcomes] == ['"a"', '"a"']
    assert served.defined == [("drive", key), ("prepare", key)]


async def test_a_drive_of_another_bundle_runs_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    first = await bundle_of("export default async () => 'first';")
    other = await bundle_of("export default async () => 'other';")
    messages = [_drive(first), {"type": "prepare"}, _drive(other), _drive(first)]
    served = Served(messages, monkeypatch)
    assert [o["output"] for o in served.outcomes] == ['"first"', '"other"', '"first"']
    keys = bundle_digest(first), bundle_digest(other)
    # The second context had the first defined ahead, yet its drive defined the other; the
    # third (prepared as that drive came) had the other ahead, and its drive the first.
    assert served.defined == [
        ("drive", keys[0]), ("prepare", keys[0]), ("drive", keys[1]),
        ("prepare", keys[1]), ("drive", keys[0]),
    ]  # fmt: skip


async def test_a_bundle_that_does_not_compile_is_not_defined_ahead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broken = "export default async () => { return 1 }; }"  # not a program: no bytecode
    served = Served([_drive(broken), {"type": "prepare"}, _drive(broken)], monkeypatch)
    assert [o["status"] for o in served.outcomes] == ["failed", "failed"]
    assert [by for by, _ in served.defined] == ["drive", "drive"]


async def test_defining_ahead_runs_none_of_the_bundles_code() -> None:
    """A context prepared with a bundle defined ahead holds the bundle's function, and nothing
    its module does at load has happened: that runs in the drive, under its limits."""
    code = await bundle_of("globalThis.loaded = 1;\nexport default async () => 1;")
    loader = PreludeLoader(PRELUDE)
    bundles = BundleCode(loader)
    key = bundle_digest(code)
    prepared = Prepared(loader, bundles, (key, code, 2**26))
    assert prepared.defined == key
    assert prepared.context.eval("typeof globalThis.__qjsflowBundle") == "function"
    assert prepared.context.eval("typeof globalThis.loaded") == "undefined"


async def test_a_module_that_never_loads_stops_each_drive_and_no_preparation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its drives stop at their compute limit while loading it; the preparations between them,
    each defining it ahead, run none of it (they would never end)."""
    code = await bundle_of("while (true) {}\nexport default async () => 1;")
    limits = Limits(compute_per_drive_s=0.2)
    messages = [_drive(code, limits), {"type": "prepare"}, _drive(code, limits)]
    served = Served(messages, monkeypatch)
    assert [o["status"] for o in served.outcomes] == ["failed", "failed"]
    assert all("compute limit per drive" in o["message"] for o in served.outcomes)
    assert [by for by, _ in served.defined] == ["drive", "prepare"]


async def test_a_bundle_defined_ahead_is_out_of_reach_of_another_bundles_code(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The last bundle (another tenant's, say) defined ahead, then a drive of a bundle that
    runs from its source (its bytecode refused): that code finds no function of the other's
    (whose text `toString` would show)."""
    first = await bundle_of("export default async () => 'first';")
    probe = await bundle_of("export default async () => typeof globalThis.__qjsflowBundle;")
    original = BundleCode.define

    def bytecode_for_the_first_only(self: BundleCode, context: Any, text: str, *a: Any,
                                    **kw: Any) -> bool:  # fmt: skip
        return text == first and original(self, context, text, *a, **kw)

    monkeypatch.setattr(BundleCode, "define", bytecode_for_the_first_only)
    served = Served([_drive(first), {"type": "prepare"}, _drive(probe)], monkeypatch)
    assert [o["output"] for o in served.outcomes] == ['"first"', '"undefined"']
    keys = bundle_digest(first), bundle_digest(probe)
    assert served.defined == [("drive", keys[0]), ("prepare", keys[0]), ("drive", keys[1])]
