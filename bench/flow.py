"""Schedules, flow control and queries, each against a baseline measured in the same run:

- a scheduled run's start after its nominal time (p50, p99), against the worker's poll
  interval (a firing is looked for once a poll);
- flow control's cost per run: a start admitted at once through a gate against the same
  start ungated, and runs that queue one at a time (concurrency 1) against the same runs
  with no gate, both drained by one worker;
- `list` over 100,000 runs (by tag, by status, by workflow and time), against the target.
"""

from __future__ import annotations

import asyncio
import sqlite3
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import orjson

from bench.common import fresh_runner, median, timed
from qjsflow.runner import Runner, RunnerConfig, StartRunInput
from qjsflow.sandbox import PoolConfig

QUICK = "export default async (event) => event.payload;"
_TICKS = 12


async def schedule_lag() -> dict[str, Any]:
    """A schedule firing every second, a worker serving: each run's creation after its
    nominal time (its id holds it)."""
    async with fresh_runner() as runner:
        await runner.publish("bench", {"workflows/tick.ts": QUICK})
        await runner.set_schedule("bench", "tick", "tick", {"every_s": 1, "overlap": "allow_all"})
        stop = asyncio.Event()
        serving = asyncio.create_task(runner.serve(stop=stop))
        while len(await runner.list(scope="bench", workflow="tick")) < _TICKS:
            await asyncio.sleep(0.5)
        stop.set()
        await serving
        runs = await runner.list(scope="bench", workflow="tick")
    lags = sorted(run.created_at * 1000 - int(run.run_id.rsplit("-", 1)[1]) for run in runs)
    return {
        "firings": len(lags),
        "lag_p50_ms": statistics.median(lags),
        "lag_p99_ms": lags[min(len(lags) - 1, int(len(lags) * 0.99))],
        "poll_interval_ms": 200.0,
    }


_RUNS = 200


async def queue_overhead(repeats: int = 3) -> dict[str, Any]:
    """Per run: a start admitted at once through a gate (concurrency 1,000) against the same
    start ungated, both driven inline; and 200 runs recorded then drained by one worker,
    queued one at a time (concurrency 1) against ungated."""
    samples: dict[str, list[float]] = {
        "gated_start_ms": [], "ungated_start_ms": [], "queued_run_ms": [], "unqueued_run_ms": [],
    }  # fmt: skip
    cases = (("gated_start_ms", 1000, True), ("ungated_start_ms", None, True),
             ("queued_run_ms", 1, False), ("unqueued_run_ms", None, False))  # fmt: skip
    for _ in range(repeats):  # alternated, so a slow minute of the machine hits each alike
        for name, gate, inline in cases:
            async with fresh_runner() as runner:
                await _publish(runner, gate)
                if inline:
                    spent = await timed(partial(_starts, runner, drive=True))
                else:
                    await _starts(runner, drive=False)
                    spent = await timed(partial(_drain, runner))
                samples[name].append(spent / _RUNS * 1000)
    return {name: median(values) for name, values in samples.items()}


async def _publish(runner: Runner, limit: int | None) -> None:
    tree = {"workflows/job.ts": QUICK}
    if limit is not None:
        flow = {"workflows": {"job": {"flow_control": {"concurrency": {"limit": limit}}}}}
        tree["qjsflow.json"] = orjson.dumps(flow).decode()
    await runner.publish("bench", tree)


async def _starts(runner: Runner, *, drive: bool) -> None:
    for n in range(_RUNS):
        await runner.start(StartRunInput("bench", "job", "latest", n), drive=drive)


async def _drain(runner: Runner) -> None:
    await runner.serve(until_idle=True, concurrency=1)
    left = [r for r in await runner.list(scope="bench", limit=_RUNS) if r.status != "completed"]
    assert not left, left[:1]


_MANY = 100_000


async def list_queries() -> dict[str, Any]:
    """`list` on a SQLite journal of 100,000 runs: a page by tag, by status, by workflow and
    time; each the median of 20."""
    with tempfile.TemporaryDirectory(prefix="qjsflow-bench-") as folder:
        db = Path(folder) / "journal.db"
        async with Runner.open(db, RunnerConfig(pool=PoolConfig(size=1))) as runner:
            await runner.publish("bench", {"workflows/job.ts": QUICK})
            requests = [
                StartRunInput(
                    "bench", "job", "latest", n, f"seed-{n}", tags={"customer": f"c{n % 100}"}
                )
                for n in range(1000)
            ]
            await runner.start_batch(requests)
        _multiply(db, _MANY // 1000)
        async with Runner.open(db, RunnerConfig(pool=PoolConfig(size=1))) as runner:
            since = time.time() - 3600
            page = partial(runner.list, scope="bench", limit=50)
            asks = {
                "by_tag_ms": partial(page, tags={"customer": "c7"}),
                "by_status_ms": partial(page, status="running", newest_first=True),
                "by_workflow_and_time_ms": partial(page, workflow="job", since=since),
            }
            found = {}
            for name, ask in asks.items():
                found[name] = median([await timed(ask) for _ in range(20)]) * 1000
            total = len(await runner.list(scope="bench", tags={"customer": "c7"}, limit=10_000))
    return {"runs": _MANY, "tagged_found": total, **found, "target_ms": 200.0}


def _multiply(db: Path, times: int) -> None:
    """The seeded runs and their tags copied `times - 1` more times under new ids (the
    journal's own rows, so its indexes are as a real journal's)."""
    connection = sqlite3.connect(db)
    columns = [row[1] for row in connection.execute("PRAGMA table_info(runs)")]
    copied = ", ".join("run_id || '-' || ?" if c == "run_id" else c for c in columns)
    with connection:
        for n in range(1, times):
            connection.execute(
                f"INSERT INTO runs ({', '.join(columns)}) SELECT {copied} FROM runs"
                " WHERE run_id LIKE 'bench/seed-%' AND instr(run_id, '-x') = 0",
                (f"x{n}",),
            )
            connection.execute(
                "INSERT INTO run_tags (run_id, key, value) SELECT run_id || '-' || ?, key, value"
                " FROM run_tags WHERE run_id LIKE 'bench/seed-%' AND instr(run_id, '-x') = 0",
                (f"x{n}",),
            )
    connection.close()
