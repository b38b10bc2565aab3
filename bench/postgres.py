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
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg

from bench.baselines import dbos
from bench.common import TEN_STEPS, median
from qjsflow.runner import Bindings, Runner, RunnerConfig, StartRunInput
from qjsflow.runner.store.dialect import POSTGRES
from qjsflow.runner.store.journal import claim_query
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


@asynccontextmanager
async def _runner(url: str) -> AsyncIterator[Runner]:
    """A runner on the journal at `url` binding the `echo` tool, its scope folder removed
    after it."""
    with tempfile.TemporaryDirectory(prefix="qjsflow-bench-scopes-") as folder:
        config = RunnerConfig(pool=PoolConfig(size=2), bindings=Bindings(tools={"echo": _echo}),
                              scope_root=Path(folder))  # fmt: skip
        async with Runner.open(url, config) as runner:
            yield runner


async def qjsflow_sequential(url: str, source: str) -> float:
    async with _runner(url) as runner:
        snapshot = (await runner.publish("bench", {"workflows/flow.ts": source})).snapshot_id
        await runner.start(StartRunInput("bench", "flow", snapshot, {}, "warm"))
        started = time.perf_counter()
        for n in range(RUNS):
            run = await runner.start(StartRunInput("bench", "flow", snapshot, {}, f"r{n}"))
            assert run.status == "completed", run.error
        return (time.perf_counter() - started) / (RUNS * 10)


async def qjsflow_in_flight(url: str) -> float:
    async with _runner(url) as runner:
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
    async with _runner(url) as runner:
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


def claim_cost(
    url: str, sizes: tuple[int, ...] = (1_000, 10_000, 100_000, 1_000_000)
) -> dict[int, float]:
    """The claim query's time (ms, the median of 20) in a journal holding more and more runs,
    a few hundred of them due: it should not grow with the runs that are not."""
    asyncio.run(_seed_one(url))
    found: dict[int, float] = {}
    with psycopg.connect(url, autocommit=True) as connection:
        columns = [row[0] for row in connection.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'runs'"
            " ORDER BY ordinal_position").fetchall()]  # fmt: skip
        have = 1
        for size in sizes:
            copied = ", ".join(
                "'bench/c' || n" if c == "run_id" else
                "CASE WHEN n <= 200 THEN 'running' ELSE 'completed' END" if c == "status"
                else c for c in columns
            )  # fmt: skip
            connection.execute(
                f"INSERT INTO runs ({', '.join(columns)}) SELECT {copied} FROM runs,"
                f" generate_series({have}, {size - 1}) AS n WHERE run_id = 'bench/seed'"
            )
            have = size
            connection.execute("ANALYZE runs")
            sql = claim_query(POSTGRES.lease_clock or "").replace("?", "%s")
            now = int(time.time() * 1000)
            samples = []
            for _ in range(20):
                started = time.perf_counter()
                connection.execute(sql, (now, now, 100, 100)).fetchall()
                samples.append((time.perf_counter() - started) * 1000)
            found[size] = statistics.median(samples)
    return found


async def _seed_one(url: str) -> None:
    async with _runner(url) as runner:
        snapshot = (await runner.publish("bench", {"workflows/flow.ts": TEN_STEPS})).snapshot_id
        await runner.start(StartRunInput("bench", "flow", snapshot, {}, "seed"), drive=False)


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
        claims = claim_cost(fresh())
    results: dict[str, Any] = {name: median(values) for name, values in found.items()}
    results["rounds"] = {name: [round(v, 1) for v in values] for name, values in found.items()}
    results["claim_ms"] = claims
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
    lines += ["", "| runs in the journal | the claim query, ms |", "|---:|---:|"]
    lines += [f"| {size:,} | {ms:.2f} |" for size, ms in results["claim_ms"].items()]
    return "\n".join(lines)


if __name__ == "__main__":
    measured = main()
    print(table(measured))
    print(measured["rounds"])
