"""Clocks (hardening, class I): a wall-clock jump does not time an attempt out, and a worker
whose clock runs ahead cannot take over a live lease on a shared PostgreSQL journal."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from qjsflow.runner import Bindings, Runner, RunnerConfig, StartRunInput
from qjsflow.runner.tenancy.scopes import run_key
from qjsflow.sandbox import PoolConfig
from tests.conftest import FakeClock, start_source
from tests.postgres import PostgresServer

TIMED = """
export default async (event, step) =>
  step.do("call", { retries: { limit: 0 }, timeout: "1 second" }, async () => {
    await step.tool("jump", "jump", {});
    return "in time";
  });
"""


async def test_a_wall_clock_jump_does_not_time_an_attempt_out(tmp_path: Path) -> None:
    wall, steady = FakeClock(), FakeClock()

    async def jump(args: Any) -> None:
        del args
        wall.advance(3600)  # NTP, an operator, a VM resumed: the wall clock leaps an hour

    config = RunnerConfig(clock=wall, monotonic=steady, pool=PoolConfig(size=1))
    async with Runner.open(tmp_path / "journal.db", config) as runner:
        run = await start_source(runner, TIMED, bindings=Bindings(tools={"jump": jump}))
        assert (run.status, run.output) == ("completed", "in time")


SLOW = 'export default async (e, step) => step.tool("t", "slow", {});'


async def test_a_fast_clock_cannot_take_over_a_live_postgresql_lease(
    postgres: PostgresServer,
) -> None:
    url = postgres.new_database()
    calls: list[str] = []

    async def slow(args: Any) -> str:
        calls.append("called")
        return "done"

    async with Runner.open(url, RunnerConfig(pool=PoolConfig(size=1))) as owner:
        published = await owner.publish("acme", {"workflows/flow.ts": SLOW})
        await owner.start(StartRunInput("acme", "flow", published.snapshot_id, None, "r"),
                          drive=False)  # fmt: skip
        key = run_key("acme", "r")
        lease = await owner.store.acquire_lease(key, "owner", int(time.time() * 1000), 30_000)
        assert lease is not None  # a live driver holds the run for 30 s
        ahead = RunnerConfig(clock=lambda: time.time() + 45, pool=PoolConfig(size=1))
        async with Runner.open(url, ahead) as skewed:
            assert await skewed.store.claimable_runs(int((time.time() + 45) * 1000), 10) == []
            run = await skewed.resume("r", Bindings(tools={"slow": slow}), scope="acme")
            assert run.status == "running"
        assert calls == []  # the skewed worker drove nothing
