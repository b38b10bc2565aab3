"""Aggregate throughput of 1, 2 and 4 worker processes sharing one journal, on SQLite and on
PostgreSQL (a durable server started for the run). `python -m bench.scaleout`.

The workers are started and serving first (an interpreter and its executors take a second or
two to start: on two cores, four of them starting at once would be most of what a short
round measures); then 1,000 ten-step runs are recorded in one batch, and the rate is the
steps over the span from that batch's commit to the last run's end, read from the journal.
Each figure is the median of `ROUNDS` rounds, the worker counts taking turns round by round
(one round of four workers on two cores moves by a tenth from one to the next).
"""

from __future__ import annotations

import asyncio
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import orjson

from bench.common import TEN_STEPS
from qjsflow.runner import Runner, RunnerConfig, StartRunInput
from qjsflow.runner.engine.worker import worker_command
from qjsflow.sandbox import PoolConfig
from tests.postgres import postgres_server

RUNS = 1000
WARM_RUNS = 100
ROUNDS = 3
PROJECT = Path(__file__).resolve().parent.parent


def _spawn(journal: str, folder: Path, n: int) -> tuple[subprocess.Popen[bytes], threading.Event]:
    process = subprocess.Popen(
        [*worker_command(journal, concurrency=8), "--scope-root", str(folder / f"w{n}")],
        cwd=PROJECT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    serving = threading.Event()

    def read() -> None:  # its lines as they come: the serving one, and the rest drained
        assert process.stderr is not None
        for line in process.stderr:
            if b"serving" in line:
                serving.set()

    threading.Thread(target=read, daemon=True).start()
    return process, serving


async def _all_completed(runner: Runner, runs: int) -> None:
    while (await runner.store.count_runs_by_status("bench")).get("completed", 0) < runs:
        await asyncio.sleep(0.2)  # a benchmark's look at the journal, not a test's wait


async def _round(journal: str, folder: Path, workers: int) -> float:
    config = RunnerConfig(pool=PoolConfig(size=1), scope_root=folder / "api")
    async with Runner.open(journal, config) as runner:
        snapshot = (await runner.publish("bench", {"workflows/ten.ts": TEN_STEPS})).snapshot_id
        spawned = [_spawn(journal, folder, n) for n in range(workers)]
        try:
            for _, serving in spawned:
                assert await asyncio.to_thread(serving.wait, 120), "a worker did not start"
            # Warm: each worker spawns its executors as its first drives need them (~0.12 s
            # of compute each, four a worker) — startup, not throughput, as a worker that
            # serves for hours pays it once.
            await runner.start_batch([StartRunInput("bench", "ten", snapshot, {"n": n}, f"w{n}")
                                      for n in range(WARM_RUNS)])  # fmt: skip
            await _all_completed(runner, WARM_RUNS)
            requests = [StartRunInput("bench", "ten", snapshot, {"n": n}, f"r{n}")
                        for n in range(RUNS)]  # fmt: skip
            began_ms = time.time() * 1000
            await runner.start_batch(requests)
            await _all_completed(runner, WARM_RUNS + RUNS)
            runs = await runner.list(scope="bench", limit=WARM_RUNS + RUNS)
        finally:
            for process, _ in spawned:
                process.send_signal(signal.SIGTERM)
            for process, _ in spawned:
                process.wait(timeout=60)
    ended_s = max(run.updated_at for run in runs)
    return RUNS * 10 / (ended_s - began_ms / 1000)


def main() -> None:
    rounds: dict[str, dict[int, list[float]]] = {
        "sqlite": {1: [], 2: [], 4: []}, "postgresql": {1: [], 2: [], 4: []},
    }  # fmt: skip
    with postgres_server(own=True, durable=True) as server:
        for _ in range(ROUNDS):
            for workers in (1, 2, 4):
                with tempfile.TemporaryDirectory() as folder:
                    root = Path(folder)
                    sqlite = str(root / "journal.db")
                    rate = asyncio.run(_round(sqlite, root / "s", workers))
                    rounds["sqlite"][workers].append(rate)
                    postgres = server.new_database()
                    rate = asyncio.run(_round(postgres, root / "p", workers))
                    rounds["postgresql"][workers].append(rate)
    results = {
        journal: {workers: statistics.median(rates) for workers, rates in by_count.items()}
        for journal, by_count in rounds.items()
    }
    print("| workers | SQLite steps/s | ÷ one worker | PostgreSQL steps/s | ÷ one worker |")
    print("|---:|---:|---:|---:|---:|")
    for workers in (1, 2, 4):
        on_sqlite, on_postgres = results["sqlite"][workers], results["postgresql"][workers]
        print(f"| {workers} | {on_sqlite:,.0f} | {on_sqlite / results['sqlite'][1]:.2f} |"
              f" {on_postgres:,.0f} | {on_postgres / results['postgresql'][1]:.2f} |")  # fmt: skip
    out = Path(__file__).with_name("results") / "scaleout.json"
    print("rounds:", {journal: {w: [round(r) for r in rates] for w, rates in by_count.items()}
                      for journal, by_count in rounds.items()})  # fmt: skip
    out.write_bytes(orjson.dumps({**results, "rounds": rounds},
                                 option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))  # fmt: skip


if __name__ == "__main__":
    main()
