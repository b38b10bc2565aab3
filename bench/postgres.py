"""qjsflow on PostgreSQL beside DBOS Transact on the same server, the raw commit as the limit
(`python -m bench.postgres`; a durable server started for the run: fsync on). Each measure
alternates the two, round by round:

- sequential: 100 ten-step runs one after another, per step; two workloads — pure steps
  (`step.do`), and steps that each call a tool (`step.tool`: an effect recorded before and
  after; in DBOS a step is that already);
- 100 runs in flight: steps a second (qjsflow: one worker process's loop, in this process;
  DBOS: 100 workflows started at once on its executor);
- wake-up: an event delivered to a waiting run until the step after the wait begins (p50).
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from typing import Any

import psycopg

from bench.baselines import dbos
from bench.common import TEN_STEPS, median
from qjsflow.runner import Bindings, Runner, RunnerConfig, StartRunInput
from qjsflow.sandbox import PoolConfig
from tests.postgres import postgres_server

RUNS = 100
IN_FLIGHT = 100
WAKES = 20
TEN_TOOLS = """
export default async (event, step) => {
  let total = 0;
  for (let i = 0; i < 10; i++) total += (await step.tool("step " + i, "echo", { i })).i;
  return total;
};
"""
WAITER = """
export default async (event, step) => {
  const got = await step.waitForEvent("go", { type: "go" });
  return await step.do("after", async () => Date.now() - got.payload.sent);
};
"""


async def _echo(args: Any) -> Any:
    return args


def raw_commit_s(url: str, transactions: int = 1000) -> float:
    """Seconds per insert+commit on the server, durable (synchronous_commit on)."""
    with psycopg.connect(url) as connection:
        connection.execute("CREATE TABLE IF NOT EXISTS raw (k TEXT PRIMARY KEY, v TEXT)")
        connection.commit()
        started = time.perf_counter()
        for index in range(transactions):
            connection.execute("INSERT INTO raw VALUES (%s, %s)", (f"k{index}", '{"i":1}'))
            connection.commit()
        return (time.perf_counter() - started) / transactions


def _config() -> RunnerConfig:
    return RunnerConfig(pool=PoolConfig(size=2), bindings=Bindings(tools={"echo": _echo}),
                        scope_root=_scratch())  # fmt: skip


def _scratch() -> Any:
    from pathlib import Path  # noqa: PLC0415

    return Path(tempfile.mkdtemp(prefix="qjsflow-bench-scopes-"))


async def qjsflow_sequential(url: str, source: str) -> float:
    async with Runner.open(url, _config()) as runner:
        snapshot = (await runner.publish("bench", {"workflows/flow.ts": source})).snapshot_id
        await runner.start(StartRunInput("bench", "flow", snapshot, {}, "warm"))
        started = time.perf_counter()
        for n in range(RUNS):
            run = await runner.start(StartRunInput("bench", "flow", snapshot, {}, f"r{n}"))
            assert run.status == "completed", run.error
        return (time.perf_counter() - started) / (RUNS * 10)


async def qjsflow_in_flight(url: str) -> float:
    async with Runner.open(url, _config()) as runner:
        snapshot = (await runner.publish("bench", {"workflows/flow.ts": TEN_STEPS})).snapshot_id
        for n in range(IN_FLIGHT * 3):
            await runner.start(StartRunInput("bench", "flow", snapshot, {"n": n}, f"f{n}"),
                               drive=False)  # fmt: skip
        started = time.perf_counter()
        await runner.serve(until_idle=True, concurrency=IN_FLIGHT)
        return IN_FLIGHT * 3 * 10 / (time.perf_counter() - started)


async def qjsflow_wake_ms(url: str) -> float:
    """Events delivered (recorded by this process) to runs a worker waits with, until the
    step after each wait runs in that worker: the p50."""
    async with Runner.open(url, _config()) as runner:
        snapshot = (await runner.publish("bench", {"workflows/flow.ts": WAITER})).snapshot_id
        stop = asyncio.Event()
        serving = asyncio.create_task(runner.serve(stop=stop, poll_interval_s=10.0))
        latencies = []
        for n in range(WAKES):
            run = await runner.start(StartRunInput("bench", "flow", snapshot, {}, f"w{n}"),
                                     drive=False)  # fmt: skip
            await runner.wait_suspended(run.run_id, scope="bench", timeout_s=60)
            await runner.signal(run.run_id, "go", {"sent": int(time.time() * 1000)},
                                scope="bench", drive=False)  # fmt: skip
            done = await runner.wait(run.run_id, scope="bench", timeout_s=60, poll_s=0.01)
            latencies.append(float(done.output))
        stop.set()
        await serving
    return statistics.median(latencies)


def main(repeats: int = 3) -> dict[str, Any]:
    found: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        found.setdefault(name, []).append(value)

    with postgres_server(own=True, durable=True) as server:
        fresh = server.new_database
        for _ in range(repeats):  # each measure alternated with its baselines
            add("raw_commit_us", raw_commit_s(fresh()) * 1e6)
            add("qjsflow_step_us", asyncio.run(qjsflow_sequential(fresh(), TEN_STEPS)) * 1e6)
            add("dbos_step_us", dbos(fresh(), "sequential", RUNS) / (RUNS * 10) * 1e6)
            add("qjsflow_tool_step_us", asyncio.run(qjsflow_sequential(fresh(), TEN_TOOLS)) * 1e6)
            add("qjsflow_in_flight_steps_s", asyncio.run(qjsflow_in_flight(fresh())))
            add("dbos_in_flight_steps_s", IN_FLIGHT * 10 / dbos(fresh(), "flight", IN_FLIGHT))
            add("qjsflow_wake_ms", asyncio.run(qjsflow_wake_ms(fresh())))
            add("dbos_wake_ms", dbos(fresh(), "wake", WAKES))
    results: dict[str, Any] = {name: median(values) for name, values in found.items()}
    results["rounds"] = {name: [round(v, 1) for v in values] for name, values in found.items()}
    return results


def table(results: dict[str, Any]) -> str:
    raw, dbos_us = results["raw_commit_us"], results["dbos_step_us"]
    rows = [
        ("pure steps, sequential, per step", f"{results['qjsflow_step_us']:,.0f} µs",
         f"DBOS {dbos_us:,.0f} µs", results["qjsflow_step_us"] / dbos_us, "≤ 0.15"),
        ("the same", f"{results['qjsflow_step_us']:,.0f} µs", f"raw commit {raw:,.0f} µs",
         results["qjsflow_step_us"] / raw, "the limit"),
        ("tool steps, sequential, per step", f"{results['qjsflow_tool_step_us']:,.0f} µs",
         f"DBOS {dbos_us:,.0f} µs", results["qjsflow_tool_step_us"] / dbos_us, "≤ 0.5"),
        ("100 runs in flight, steps/s", f"{results['qjsflow_in_flight_steps_s']:,.0f}",
         f"DBOS {results['dbos_in_flight_steps_s']:,.0f}",
         results["qjsflow_in_flight_steps_s"] / results["dbos_in_flight_steps_s"], "≥ 2,500/s"),
        ("wake-up, event to the next step, p50", f"{results['qjsflow_wake_ms']:.1f} ms",
         f"DBOS {results['dbos_wake_ms']:.1f} ms",
         results["qjsflow_wake_ms"] / results["dbos_wake_ms"], "≤ 20 ms"),
    ]  # fmt: skip
    lines = ["| measure | qjsflow | baseline, same server | ratio | goal |",
             "|---|---:|---|---:|---|"]  # fmt: skip
    lines += [f"| {a} | {b} | {c} | {d:.2f} | {e} |" for a, b, c, d, e in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    measured = main()
    print(table(measured))
    print(measured["rounds"])
