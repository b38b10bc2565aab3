"""Aggregate throughput of 1, 2 and 4 worker processes sharing one journal, on SQLite and on
PostgreSQL (a server started for the run, as the tests do). `python -m bench.scaleout`."""

from __future__ import annotations

import asyncio
import subprocess
import tempfile
import time
from pathlib import Path

import orjson

from bench.common import TEN_STEPS
from qjsflow.runner import Runner, RunnerConfig, StartRunInput
from qjsflow.runner.engine.worker import worker_command
from qjsflow.sandbox import PoolConfig
from tests.postgres import postgres_server

RUNS = 400
PROJECT = Path(__file__).resolve().parent.parent


async def _prepare(journal: str) -> None:
    async with Runner.open(journal, RunnerConfig(pool=PoolConfig(size=1))) as runner:
        published = await runner.publish("bench", {"workflows/ten.ts": TEN_STEPS})
        for n in range(RUNS):
            request = StartRunInput("bench", "ten", published.snapshot_id, {"n": n}, f"r{n}")
            await runner.start(request, drive=False)


def _drive_with(journal: str, workers: int) -> float:
    command = worker_command(journal, until_idle=True, concurrency=8)
    started = time.perf_counter()
    processes = [
        subprocess.Popen(
            command,
            cwd=PROJECT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(workers)
    ]
    for process in processes:
        if process.wait(timeout=900) != 0:
            raise RuntimeError("a worker failed")
    return RUNS * 10 / (time.perf_counter() - started)


def main() -> None:
    results: dict[str, dict[int, float]] = {"sqlite": {}, "postgresql": {}}
    with postgres_server() as server, tempfile.TemporaryDirectory() as folder:
        for workers in (1, 2, 4):
            sqlite = str(Path(folder) / f"journal-{workers}.db")
            postgres = server.new_database()
            for name, journal in (("sqlite", sqlite), ("postgresql", postgres)):
                asyncio.run(_prepare(journal))
                results[name][workers] = _drive_with(journal, workers)
    print("| workers | SQLite steps/s | PostgreSQL steps/s |")
    print("|---:|---:|---:|")
    for workers in (1, 2, 4):
        on_sqlite, on_postgres = results["sqlite"][workers], results["postgresql"][workers]
        print(f"| {workers} | {on_sqlite:,.0f} | {on_postgres:,.0f} |")
    out = Path(__file__).with_name("results") / "scaleout.json"
    out.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))


if __name__ == "__main__":
    main()
