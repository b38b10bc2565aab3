"""When an executor prepares each drive's context, and when it frees it: never while the host
records the drive before, never while its outcome is still to be sent, never mid-drive."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from qjsflow.bridge.digest import bundle_digest
from qjsflow.bridge.types import Answer, Completed, OpEnvelope, Suspended
from qjsflow.bridge.wire import request_to_wire
from qjsflow.runner import Runner, StartRunInput
from qjsflow.runner.engine.drive import RunDriver
from qjsflow.runner.engine.drive import session as session_module
from qjsflow.runner.engine.drive.ending import finish as end_of_drive
from qjsflow.sandbox import ExecutorPool, PoolConfig
from qjsflow.sandbox import executor as executor_module
from qjsflow.sandbox import pool as pool_module
from qjsflow.sandbox.bytecode import BundleCode, PreludeLoader
from qjsflow.sandbox.executor import PRELUDE, Drive, Prepared, serve
from tests.conftest import bundle_of, executor_payload
from tests.memory_host import MemoryHost

ANSWER = "export default async () => 42;"
ONE_STEP = """
export default async (event, step) => {
  const first = await step.do("first", async () => 1);
  await step.sleep("nap", "1 second");
  return first;
};
"""


def _served(messages: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What the executor's loop does, in order, given `messages` from its parent."""
    events: list[str] = []

    class Logged(Prepared):
        def __init__(self, prelude: PreludeLoader, *more: Any) -> None:
            super().__init__(prelude, *more)
            events.append("prepared")

    class Freed(Drive):
        def __del__(self) -> None:
            events.append("freed")

    def write(fd: int, data: bytes) -> None:
        events.append("outcome")

    monkeypatch.setattr(executor_module, "Prepared", Logged)
    monkeypatch.setattr(executor_module, "Drive", Freed)
    monkeypatch.setattr(executor_module, "write_all", write)
    frames: Iterator[dict[str, Any]] = iter(messages)

    def read() -> bytes | None:
        message = next(frames, None)
        events.append(f"read {message['type'] if message else 'end'}")
        return None if message is None else executor_payload(message)

    prelude = PreludeLoader(PRELUDE)
    serve(read, -1, prelude, BundleCode(prelude))
    return events


async def _drive_message() -> dict[str, Any]:
    code = await bundle_of(ANSWER)
    request = request_to_wire(MemoryHost().request(code))
    return {"type": "drive", "request": request, "bundle": code, "bundleKey": bundle_digest(code)}


async def test_the_next_context_waits_for_the_parent(monkeypatch: pytest.MonkeyPatch) -> None:
    drive = await _drive_message()
    events = _served([drive, {"type": "prepare"}, drive], monkeypatch)
    # The outcome goes before the drive's context is freed; the next context is prepared only
    # once the parent says so, not as soon as the outcome is out.
    assert events == [
        "prepared", "read drive", "outcome", "freed",
        "read prepare", "prepared", "read drive", "outcome", "freed", "read end",
    ]  # fmt: skip


async def test_a_drive_never_told_to_prepare_prepares_as_it_arrives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    drive = await _drive_message()
    events = _served([drive, drive], monkeypatch)
    assert events == [
        "prepared", "read drive", "outcome", "freed",
        "read drive", "prepared", "outcome", "freed", "read end",
    ]  # fmt: skip


class SlowHost(MemoryHost):
    """Answers each batch of ops only after `delay_s`, having asked the pool to prepare."""

    def __init__(self, pool: ExecutorPool, delay_s: float) -> None:
        super().__init__()
        self.pool = pool
        self.delay_s = delay_s

    async def __call__(self, ops: Sequence[OpEnvelope]) -> list[Answer]:
        self.pool.prepare_idle()
        await asyncio.sleep(self.delay_s)
        return await super().__call__(ops)


async def test_no_prepare_reaches_an_executor_mid_drive() -> None:
    """An executor asked to prepare (by the pool's timer after its last drive, or by a drive
    recorded meanwhile) while it drives again would read that as its answers."""
    code = await bundle_of(ONE_STEP)
    async with ExecutorPool(PoolConfig(size=1)) as pool:
        first = MemoryHost()
        await pool.drive(first.request(code), first)
        # At once, the same executor again: the last drive's timer falls due mid-drive.
        host = SlowHost(pool, delay_s=pool_module.PREPARE_LATEST_S * 4)
        outcome = await pool.drive(host.request(code), host)
        assert isinstance(outcome, Suspended), outcome
        assert [marker.kind for marker in outcome.markers] == ["sleep"]
        assert pool.replaced == 0, "the executor broke the protocol"


async def test_an_idle_executor_prepares_once_told_or_soon_after() -> None:
    code = await bundle_of(ANSWER)
    async with ExecutorPool(PoolConfig(size=1)) as pool:
        host = MemoryHost()
        assert isinstance(await pool.drive(host.request(code), host), Completed)
        [executor] = pool.idle
        assert not executor.prepared
        pool.prepare_idle()
        assert executor.prepared
        assert isinstance(await pool.drive(host.request(code), host), Completed)
        assert not executor.prepared
        await asyncio.sleep(pool_module.PREPARE_LATEST_S * 4)
        assert executor.prepared  # nobody said the drive was recorded: the pool's own timer


async def test_the_driver_lets_executors_prepare_once_the_drive_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pool_module, "PREPARE_LATEST_S", 60.0)  # the driver's word, not time
    async with Runner.open(tmp_path / "journal.db") as runner:
        published = await runner.publish("acme", {"workflows/flow.ts": ANSWER})
        for n in range(3):
            request = StartRunInput("acme", "flow", published.snapshot_id, {}, f"r{n}")
            assert (await runner.start(request)).status == "completed"
            idle = runner.driver.pool.idle
            assert idle
            assert all(executor.prepared for executor in idle)


@pytest.mark.parametrize(("alone", "order"), [
    (True, ["prepare", "end committed"]),
    (False, ["end committed", "prepare"]),
])  # fmt: skip
async def test_an_executor_prepares_during_a_lone_drives_end_and_after_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, alone: bool, order: list[str]
) -> None:
    """A lone drive's end commits on the event loop's thread at once: the executor prepares
    meanwhile. With drives in flight the end commits on the journal's thread, which has to
    wake first: the executor prepares after it."""
    events: list[str] = []
    prepare = pool_module.ExecutorProcess.prepare
    finish = end_of_drive

    def preparing(executor: Any) -> None:
        if not executor.prepared:
            events.append("prepare")
        prepare(executor)

    def finishing(*args: Any, **kwargs: Any) -> Any:
        events.append("end committed")
        return finish(*args, **kwargs)

    monkeypatch.setattr(pool_module, "PREPARE_LATEST_S", 60.0)
    monkeypatch.setattr(pool_module.ExecutorProcess, "prepare", preparing)
    monkeypatch.setattr(session_module, "finish", finishing)
    monkeypatch.setattr(RunDriver, "alone", lambda self: alone)
    async with Runner.open(tmp_path / "journal.db") as runner:
        published = await runner.publish("acme", {"workflows/flow.ts": ANSWER})
        request = StartRunInput("acme", "flow", published.snapshot_id, {}, "r")
        assert (await runner.start(request)).status == "completed"
    assert events == order
