"""An executor is sent a bundle's text once: later drives of it name it by its digest, the pool
tells the executor which texts to forget (their bytecode goes with them), and a mirror gone
wrong fails one drive clearly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import quickjs

from qjsflow.bridge.digest import bundle_digest
from qjsflow.bridge.types import Completed, Failed
from qjsflow.runner import Runner, StartRunInput
from qjsflow.sandbox import ExecutorPool, PoolConfig
from qjsflow.sandbox import pool as pool_module
from qjsflow.sandbox.bytecode import BundleCode, PreludeLoader
from qjsflow.sandbox.executor import PRELUDE, BundleTexts
from qjsflow.sandbox.messages import read_message
from tests.conftest import bundle_of
from tests.memory_host import MemoryHost


def _answering(n: int) -> str:
    return f"export default async () => {n};"


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every drive message the pool sends an executor, decoded."""
    messages: list[dict[str, Any]] = []
    original = pool_module.ExecutorProcess.send

    async def send(self: Any, payload: bytes) -> None:
        head, request = read_message(payload)
        if head.get("type") == "drive":
            messages.append({**head, "request": orjson.loads(request)})
        await original(self, payload)

    monkeypatch.setattr(pool_module.ExecutorProcess, "send", send)
    return messages


async def test_the_second_drive_of_a_bundle_names_it_only(sent: list[dict[str, Any]]) -> None:
    code = await bundle_of(_answering(7))
    async with ExecutorPool(PoolConfig(size=1)) as pool:
        for _ in range(3):
            host = MemoryHost()
            outcome = await pool.drive(host.request(code), host)
            assert isinstance(outcome, Completed), outcome
            assert outcome.output == "7"
    assert [m.get("bundle") for m in sent] == [code, None, None]
    assert {m["bundleKey"] for m in sent} == {bundle_digest(code)}


async def test_past_the_texts_kept_the_oldest_is_forgotten_and_sent_again(
    sent: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pool_module, "TEXTS_KEPT", 2)
    codes = [await bundle_of(_answering(n)) for n in range(3)]
    async with ExecutorPool(PoolConfig(size=1)) as pool:
        for n in [0, 1, 2, 0, 2]:
            host = MemoryHost()
            outcome = await pool.drive(host.request(codes[n]), host)
            assert isinstance(outcome, Completed), outcome
            assert outcome.output == str(n)
        assert pool.replaced == 0
    keys = [bundle_digest(code) for code in codes]
    assert [m.get("forget") for m in sent] == [None, None, [keys[0]], [keys[1]], None]
    # 0 was forgotten when 2 came, so it came with its text again; 2 was still held.
    assert [m.get("bundle") is not None for m in sent] == [True, True, True, True, False]


async def test_the_texts_kept_are_bounded_by_size_too(
    sent: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    codes = [await bundle_of(_answering(n)) for n in range(2)]
    monkeypatch.setattr(pool_module, "TEXT_CHARS_KEPT", len(codes[0]) + 1)
    async with ExecutorPool(PoolConfig(size=1)) as pool:
        for n in [0, 1, 1]:
            host = MemoryHost()
            outcome = await pool.drive(host.request(codes[n]), host)
            assert isinstance(outcome, Completed), outcome
    # The one sent is kept even alone past the bound; the one before it is forgotten.
    assert [m.get("forget") for m in sent] == [None, [bundle_digest(codes[0])], None]
    assert [m.get("bundle") is not None for m in sent] == [True, True, False]


async def test_a_new_executor_is_sent_the_text_again(sent: list[dict[str, Any]]) -> None:
    code = await bundle_of(_answering(3))
    async with ExecutorPool(PoolConfig(size=1, recycle_after=1)) as pool:
        for _ in range(2):
            host = MemoryHost()
            outcome = await pool.drive(host.request(code), host)
            assert isinstance(outcome, Completed), outcome
    assert [m.get("bundle") is not None for m in sent] == [True, True]


async def test_an_executor_not_holding_the_text_named_fails_that_drive_only() -> None:
    """The pool's mirror of an executor's texts wrong (a bug, not an author's doing): the
    drive fails naming it, the executor is replaced, the next drive runs."""
    code = await bundle_of(_answering(5))
    async with ExecutorPool(PoolConfig(size=1)) as pool:
        host = MemoryHost()
        assert isinstance(await pool.drive(host.request(code), host), Completed)
        (executor,) = pool.idle
        executor.bundles[bundle_digest(code + "\n")] = 1  # claims a text it was never sent
        host = MemoryHost()
        outcome = await pool.drive(host.request(code + "\n"), host)
        assert isinstance(outcome, Failed), outcome
        assert "was not sent the workflow's code" in outcome.message
        assert pool.replaced == 1
        host = MemoryHost()
        outcome = await pool.drive(host.request(code + "\n"), host)
        assert isinstance(outcome, Completed), outcome
        assert outcome.output == "5"


async def test_a_runner_names_a_stored_bundle_by_its_checksum(
    tmp_path: Path, sent: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Drives name the bundle by the checksum stored with it: the pool hashes no text."""
    async with Runner.open(tmp_path / "journal.db") as runner:
        snapshot = (await runner.publish("s", {"workflows/w.ts": _answering(9)})).snapshot_id
        stored = await runner.store.load_bundle("s", snapshot, "w")
        assert stored is not None
        hashed: list[int] = []
        original = bundle_digest

        def counting(code: str) -> str:
            hashed.append(len(code))
            return original(code)

        monkeypatch.setattr(pool_module, "bundle_digest", counting)
        for n in range(2):
            run = await runner.start(StartRunInput("s", "w", snapshot, {}, f"r{n}"))
            assert run.status == "completed", run.error
    assert hashed == []
    drives = [m for m in sent if not m["request"]["inspect"]]
    assert [m["bundleKey"] for m in drives] == [stored.digest] * 2
    assert stored.digest == bundle_digest(stored.code)


def test_a_text_forgotten_takes_its_bytecode_with_it() -> None:
    """The pool alone decides which bundles' code an executor keeps: what it is told to
    forget goes with its bytecode, and is not found again until sent again."""
    bundles = BundleCode(PreludeLoader(PRELUDE))
    texts = BundleTexts(bundles)
    code = "var __qjsflow_module = 1;"
    assert texts.take({"bundleKey": "a", "bundle": code}) == ("a", code)
    assert bundles.define(quickjs.Context(), code, 2**26, key="a")
    assert "a" in bundles.kept
    other = texts.take({"bundleKey": "b", "bundle": "var x;", "forget": ["a"]})
    assert other == ("b", "var x;")
    assert "a" not in bundles.kept
    assert texts.take({"bundleKey": "a"}) is None
