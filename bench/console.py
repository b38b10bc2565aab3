"""The console over a large journal: 100,000 runs, the first page of the runs list (with the
counts per status) and a filtered page, wall time of the HTTP request on loopback.

Baseline, measured in the same run: the same page's reads straight from the Runner (what the
console adds is rendering and HTTP). Target: under 200 ms. Run with `python -m bench.console`;
prints a markdown table and writes bench/results/console.json.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import threading
import time
from functools import partial
from pathlib import Path

import httpx
import orjson
import uvicorn

from bench.common import TEN_STEPS, publish
from qjsflow.runner import Runner, RunnerConfig
from qjsflow.runner.console import create_app
from qjsflow.runner.store import JournalTransaction, RunRecord, RunStatus

RUNS = 100_000
STATUSES = ("completed", "failed", "waiting", "sleeping")


async def _fill(db: Path) -> None:
    async with Runner.open(db, RunnerConfig()) as runner:
        snapshot = await publish(runner, TEN_STEPS)
        base = int(time.time() * 1000) - RUNS
        for start in range(0, RUNS, 5000):
            records = [_record(snapshot, n, base) for n in range(start, start + 5000)]
            await runner.store.transact(partial(_insert, records=records))


def _record(snapshot: str, n: int, base: int) -> RunRecord:
    return RunRecord(
        run_id=f"bench/r{n}", scope="bench", workflow="flow", snapshot_id=snapshot,
        entry_path="workflows/flow.ts", status=RunStatus(STATUSES[n % 4]), input="null",
        persisted_bindings="{}", output=None, error=None, created_at=base + n,
        updated_at=base + n, wake_at=None, waiting_for=None, cpu_used_s=0.0, logs_count=0,
        cancel_requested=False,
    )  # fmt: skip


def _insert(tx: JournalTransaction, records: list[RunRecord]) -> None:
    for record in records:
        tx.insert_run(record)


async def _direct(db: Path) -> float:
    async with Runner.open(db, RunnerConfig(), create=False) as runner:
        samples = []
        for _ in range(10):
            began = time.perf_counter()
            await runner.list(scope="bench", limit=51, newest_first=True)
            await runner.store.count_runs_by_status("bench")
            samples.append(time.perf_counter() - began)
    return statistics.median(samples)


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        db = Path(folder) / "journal.db"
        asyncio.run(_fill(db))
        direct = asyncio.run(_direct(db))

        async def factory() -> Runner:
            return await Runner.connect(db, RunnerConfig(), create=False)

        server = uvicorn.Server(uvicorn.Config(create_app(factory, None), host="127.0.0.1",
                                               port=8479, log_level="warning"))  # fmt: skip
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.05)
        timings: dict[str, float] = {}
        with httpx.Client(base_url="http://127.0.0.1:8479") as client:
            for name, path in (("runs page", "/runs"), ("runs page, status=failed",
                                                         "/runs?status=failed")):  # fmt: skip
                samples = []
                for _ in range(10):
                    began = time.perf_counter()
                    assert client.get(path).status_code == 200
                    samples.append(time.perf_counter() - began)
                timings[name] = statistics.median(samples)
        server.should_exit = True
        thread.join(10)
    print("| measure (100,000 runs) | median | note |")
    print("|---|---:|---|")
    print(f"| the page's reads, from the Runner | {direct * 1e3:.1f} ms | baseline |")
    for name, seconds in timings.items():
        print(f"| {name}, over HTTP | {seconds * 1e3:.1f} ms | target 200 ms |")
    results = Path(__file__).with_name("results")
    results.mkdir(exist_ok=True)
    out = {"runner_reads_ms": direct * 1e3, **{k: v * 1e3 for k, v in timings.items()}}
    (results / "console.json").write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
