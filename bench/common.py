"""Shared pieces of the benchmarks: timing, fresh runners, the workloads."""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from qjsflow.runner import Runner, RunnerConfig, StartRunInput
from qjsflow.sandbox import PoolConfig

TEN_STEPS = """
export default async (event, step) => {
  let total = 0;
  for (let i = 0; i < 10; i++) {
    const out = await step.do("step " + i, async () => ({ i, ok: true }));
    total += out.i;
  }
  return total;
};
"""


def many_steps(count: int) -> str:
    return f"""
export default async (event, step) => {{
  for (let i = 0; i < {count}; i++) await step.do("s", async () => ({{ i }}));
  return (await step.waitForEvent("go", {{ type: "go" }})).payload;
}};
"""


def fan_out_steps(count: int) -> str:
    return f"""
export default async (event, step) => {{
  const all = [];
  for (let i = 0; i < {count}; i++) all.push(step.do("s", async () => i));
  const values = await Promise.all(all);
  await step.waitForEvent("go", {{ type: "go" }});
  return values.length;
}};
"""


WAITER = """
export default async (event, step) => (await step.waitForEvent("go", { type: "go" })).payload;
"""


def big_waiter(table_rows: int = 10_000) -> str:
    """`WAITER` with a table its module builds as it loads: a bundle of ~400 kB, the size of a
    workflow that imports a few libraries."""
    rows = ",".join(f'"row {n} of a table the module carries"' for n in range(table_rows))
    return f"const TABLE = [{rows}];\nglobalThis.rows = TABLE.length;\n{WAITER}"


def cpu_times() -> list[int]:
    """The machine's CPU time so far, by kind (`/proc/stat`'s first line, in ticks): user,
    nice, system, idle, iowait, irq, softirq, steal."""
    with open("/proc/stat", encoding="ascii") as stat:
        return [int(ticks) for ticks in stat.readline().split()[1:9]]


def idle_percent(before: list[int], after: list[int]) -> float:
    """The share of the machine's CPU time between two `cpu_times` that was idle."""
    spent = [later - earlier for earlier, later in zip(before, after, strict=True)]
    return 100.0 * spent[3] / max(1, sum(spent))


def median(samples: list[float]) -> float:
    return statistics.median(samples)


async def timed(action: Callable[[], Awaitable[object]]) -> float:
    started = time.perf_counter()
    await action()
    return time.perf_counter() - started


@asynccontextmanager
async def fresh_runner(pool_size: int = 2) -> AsyncIterator[Runner]:
    with tempfile.TemporaryDirectory(prefix="qjsflow-bench-") as folder:
        config = RunnerConfig(pool=PoolConfig(size=pool_size))
        async with Runner.open(Path(folder) / "journal.db", config) as runner:
            yield runner


async def publish(runner: Runner, source: str, name: str = "flow") -> str:
    published = await runner.publish("bench", {f"workflows/{name}.ts": source})
    return published.snapshot_id


def request(snapshot: str, run_id: str, name: str = "flow") -> StartRunInput:
    return StartRunInput("bench", name, snapshot, {"n": 1}, run_id)
