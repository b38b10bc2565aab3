"""Sandbox costs: drive cold start, warm drive start, a new pure step, a replayed one.

Baseline, measured in the same run: in-process QuickJS evaluating the same bundle (no process
boundary, no prelude, no lockdown). Run with `python -m bench.sandbox`; prints a markdown table
and writes bench/results/sandbox.json. Each figure is a median over repeats.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson
import quickjs

from qjsflow.bundles import build_snapshot
from qjsflow.sandbox import ExecutorPool, PoolConfig
from tests.memory_host import MemoryHost

STEPS = 200
TRIVIAL = "export default async (event) => ({ ok: event.payload.n });"
MANY_STEPS = f"""
export default async (event, step) => {{
  let total = 0;
  for (let i = 0; i < {STEPS}; i++) total += await step.do("s", async () => i);
  return total;
}};
"""


async def _bundle(source: str) -> str:
    snapshot = await build_snapshot({"workflows/w.js": source})
    return snapshot.bundles[0].code


async def _median(
    repeats: int, action: Callable[[], Awaitable[object]], pause_s: float = 0.0
) -> float:
    samples = []
    for _ in range(repeats):
        await asyncio.sleep(pause_s)  # lets an idle executor prepare its next context
        started = time.perf_counter()
        await action()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def _raw_eval(code: str) -> float:
    samples = []
    for _ in range(200):
        started = time.perf_counter()
        context = quickjs.Context()
        context.eval(code)
        context.eval("__qjsflow_module.default({payload: {n: 1}})")
        while context.execute_pending_job():
            pass
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


async def main() -> None:
    trivial, many = await _bundle(TRIVIAL), await _bundle(MANY_STEPS)

    async def cold() -> None:
        async with ExecutorPool(PoolConfig(size=1)) as pool:
            host = MemoryHost()
            await pool.drive(host.request(trivial, '{"n": 1}'), host)

    cold_s = await _median(10, cold)
    async with (
        ExecutorPool(PoolConfig(size=1)) as pool,
        ExecutorPool(PoolConfig(size=1, confinement="off")) as unconfined,
    ):

        def warm_on(executors: ExecutorPool) -> Callable[[], Awaitable[object]]:
            async def warm() -> None:
                host = MemoryHost()
                await executors.drive(host.request(trivial, '{"n": 1}'), host)

            return warm

        warm, warm_unconfined = warm_on(pool), warm_on(unconfined)
        await warm()
        await warm_unconfined()
        # Confined and not, in alternating rounds: this machine's speed changes between
        # minutes by more than confinement costs (measured one after the other, they differed
        # by a third either way).
        confined_rounds, unconfined_rounds = [], []
        for _ in range(5):
            confined_rounds.append(await _median(10, warm))
            unconfined_rounds.append(await _median(10, warm_unconfined))
        warm_s = statistics.median(confined_rounds)
        unconfined_s = statistics.median(unconfined_rounds)
        idle_s = await _median(50, warm, pause_s=0.02)

        async def steps() -> None:
            host = MemoryHost()
            await pool.drive(host.request(many), host)

        steps_s = await _median(10, steps)

        replay_host = MemoryHost()
        await pool.drive(replay_host.request(many), replay_host)

        async def replay() -> None:
            await pool.drive(replay_host.request(many), replay_host)

        replay_s = await _median(10, replay)
    raw_s = _raw_eval(trivial)
    # A new pure step settles in the drive; its result goes with the drive's outcome.
    per_step_s = (steps_s - warm_s) / STEPS
    rows = {
        "raw in-process eval (baseline)": raw_s,
        "drive, cold pool": cold_s,
        "drive, warm pool, back to back": warm_s,
        "the same, executors without seccomp and Landlock": unconfined_s,
        "drive, warm pool, idle executor": idle_s,
        "a new pure step (recorded with the drive's end)": per_step_s,
        f"replay of {STEPS} settled steps": replay_s,
    }
    print("| measure | median | ratio to baseline |")
    print("|---|---:|---:|")
    for name, seconds in rows.items():
        print(f"| {name} | {seconds * 1e3:.3f} ms | {seconds / raw_s:.1f} |")
    results = Path(__file__).with_name("results")
    results.mkdir(exist_ok=True)
    (results / "sandbox.json").write_bytes(
        orjson.dumps(
            {name: round(s * 1e6, 1) for name, s in rows.items()}, option=orjson.OPT_INDENT_2
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
