"""`qjsflow migrate` over 1,000 waiting runs in one command, on SQLite and on PostgreSQL (a
server started for the run, as the tests do): each run's journal (three settled steps) is
replayed against the new code in the sandbox, then re-pinned.

Baseline, measured in the same run: driving the same runs to their wait (one drive each, as
`start` does). Run with `python -m bench.migrate`; prints a markdown table and writes
bench/results/migrate.json.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import orjson

from qjsflow.runner import Runner, RunnerConfig, StartRunInput
from qjsflow.sandbox import PoolConfig
from tests.postgres import postgres_server

RUNS = 1000
V1 = """export default async (event, step) => {
  const a = await step.do("one", async () => event.payload);
  const b = await step.do("two", async () => a + 1);
  const c = await step.do("three", async () => b + 1);
  return (await step.waitForEvent("go", { type: "go" })).payload + c;
};"""
V2 = V1.replace("  return", '  await step.do("four", async () => 4);\n  return')


async def _measure(journal: str, scopes: Path) -> dict[str, float]:
    config = RunnerConfig(pool=PoolConfig(size=2), scope_root=scopes)
    async with Runner.open(journal, config) as runner:
        old = (await runner.publish("bench", {"workflows/flow.ts": V1})).snapshot_id
        new = (await runner.publish("bench", {"workflows/flow.ts": V2})).snapshot_id
        began = time.perf_counter()
        for n in range(RUNS):
            await runner.start(StartRunInput("bench", "flow", old, n, f"r{n}"))
        drive_s = time.perf_counter() - began
        began = time.perf_counter()
        report = await runner.migrate(
            scope="bench", workflow="flow", from_snapshot=old, to_snapshot=new
        )
        migrate_s = time.perf_counter() - began
        assert report.migrated == RUNS, report
    return {"drive_s": drive_s, "migrate_s": migrate_s}


async def main() -> None:
    results: dict[str, dict[str, float]] = {}
    with postgres_server() as server, tempfile.TemporaryDirectory() as folder:
        for name, journal in (
            ("sqlite", str(Path(folder) / "j.db")),
            ("postgresql", server.new_database()),
        ):
            results[name] = await _measure(journal, Path(folder) / f"scopes-{name}")
    print(f"## Migrating {RUNS:,} waiting runs (one command)\n")
    print("| journal | migrate | per run | baseline: one drive each | ratio |")
    print("|---|---:|---:|---:|---:|")
    for name, measured in results.items():
        per_run_ms = measured["migrate_s"] / RUNS * 1000
        ratio = measured["migrate_s"] / measured["drive_s"]
        print(f"| {name} | {measured['migrate_s']:.1f} s | {per_run_ms:.1f} ms |"
              f" {measured['drive_s']:.1f} s | {ratio:.2f} x |")  # fmt: skip
    out = Path(__file__).with_name("results") / "migrate.json"
    out.parent.mkdir(exist_ok=True)
    out.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    asyncio.run(main())
