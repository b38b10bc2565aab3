"""Scale-out on PostgreSQL: four worker processes share one journal of 1,000 runs."""

from __future__ import annotations

import os
import subprocess

import psycopg
import pytest

from qjsflow.runner import Runner, RunnerConfig, StartRunInput
from qjsflow.runner.engine.worker import worker_command
from qjsflow.sandbox import PoolConfig
from tests.conftest import PROJECT_ROOT
from tests.postgres import PostgresServer

pytestmark = pytest.mark.slow

TEN_STEPS = """
export default async (event, step) => {
  let total = 0;
  for (let i = 0; i < 10; i++) total += await step.do("step " + i, async () => i);
  return total + event.payload.n;
};
"""


@pytest.mark.timeout(900)
async def test_four_workers_drive_1000_runs_once_each(postgres: PostgresServer) -> None:
    url = postgres.new_database()
    async with Runner.open(url, RunnerConfig(pool=PoolConfig(size=1))) as runner:
        published = await runner.publish("acme", {"workflows/ten.ts": TEN_STEPS})
        for n in range(1000):
            request = StartRunInput("acme", "ten", published.snapshot_id, {"n": n}, f"r{n}")
            await runner.start(request, drive=False)
    workers = [
        subprocess.Popen(
            worker_command(url, until_idle=True, concurrency=4),
            cwd=PROJECT_ROOT,
            env=dict(os.environ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for _ in range(4)
    ]
    for worker in workers:
        _, errors = worker.communicate(timeout=800)
        assert worker.returncode == 0, errors
    with psycopg.connect(url) as connection:
        statuses = connection.execute(
            "SELECT status, count(*) FROM runs GROUP BY status"
        ).fetchall()
        assert statuses == [("completed", 1000)]
        wrong = connection.execute(
            "SELECT count(*) FROM runs WHERE output <> (45 + substr(run_id, 7)::int)::text"
        ).fetchone()
        assert wrong == (0,)
        completions = connection.execute(
            "SELECT max(c) FROM (SELECT count(*) AS c FROM events WHERE type = 'run_completed'"
            " GROUP BY run_id) per_run"
        ).fetchone()
        assert completions == (1,)
        doubles = connection.execute(
            "SELECT count(*) FROM (SELECT run_id, data FROM events WHERE type = 'step_completed'"
            " GROUP BY run_id, data HAVING count(*) > 1) twice"
        ).fetchone()
        assert doubles == (0,)
        drivers = connection.execute(
            "SELECT count(DISTINCT data) FROM events WHERE type = 'drive_started'"
        ).fetchone()
        assert drivers == (4,), "all four workers did work"
