"""The driver's lock per run: one holder at a time, and no entry left once nobody holds or
waits for it (a runner with thousands of suspended runs keeps no per-run state)."""

from __future__ import annotations

import asyncio

import pytest

from qjsflow.runner.engine.locks import KeyedLocks


async def test_one_holder_at_a_time_and_nothing_kept_after() -> None:
    locks = KeyedLocks()
    order: list[str] = []

    async def hold(name: str, key: str) -> None:
        async with locks.hold(key):
            order.append(f"{name}+")
            await asyncio.sleep(0.01)
            order.append(f"{name}-")

    await asyncio.gather(hold("a", "run"), hold("b", "run"), hold("c", "other"))
    assert order.index("a-") < order.index("b+")  # the same key: one after the other
    assert order.index("c+") < order.index("a-")  # another key: at once
    assert locks.users() == {}


async def test_a_waiter_cancelled_or_a_holder_failing_leaves_nothing() -> None:
    locks = KeyedLocks()
    entered = asyncio.Event()

    async def holder() -> None:
        async with locks.hold("run"):
            entered.set()
            await asyncio.sleep(0.05)
            raise RuntimeError("the drive failed")

    async def waiter() -> None:
        async with locks.hold("run"):
            pass

    held = asyncio.create_task(holder())
    await entered.wait()
    waiting = asyncio.create_task(waiter())
    await asyncio.sleep(0)
    assert locks.users()["run"] == 2
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    with pytest.raises(RuntimeError):
        await held
    assert locks.users() == {}
