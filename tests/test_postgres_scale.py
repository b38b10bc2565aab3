"""Scale-out on PostgreSQL: four worker processes share one journal of 1,000 runs."""

from __future__ import annotations

import os
import subprocess

import psycopg
import pytest

from qjsflow.runner import Runner, RunnerConfig, StartRunInput
from qjsflow.runner.engine.worker import worker_command
from qjsflow.runner.store.dialect import POSTGRES
from qjsflow.runner.store.journal import claim_query
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


async def test_the_claim_query_uses_its_indexes_at_100000_runs(postgres: PostgresServer) -> None:
    """A claim looks only at runs that can be due — through the timers' due index, the
    index of runs by status, and that of cancels asked — never at every run the journal
    holds: its plan at 100,000 runs (a few hundred of them due) has no scan of `runs`."""
    url = postgres.new_database()
    async with Runner.open(url, RunnerConfig(pool=PoolConfig(size=1))) as runner:
        published = await runner.publish("acme", {"workflows/ten.ts": TEN_STEPS})
        await runner.start(StartRunInput("acme", "ten", published.snapshot_id, {"n": 0}, "r0"),
                           drive=False)  # fmt: skip
    with psycopg.connect(url, autocommit=True) as connection:
        columns = [row[0] for row in connection.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'runs'"
            " ORDER BY ordinal_position").fetchall()]  # fmt: skip
        copied = ", ".join(
            "'acme/c' || n" if c == "run_id" else
            "CASE WHEN n % 500 = 0 THEN 'running' WHEN n % 7 = 0 THEN 'sleeping'"
            " ELSE 'completed' END" if c == "status" else c
            for c in columns
        )  # fmt: skip
        connection.execute(
            f"INSERT INTO runs ({', '.join(columns)}) SELECT {copied}"
            " FROM runs, generate_series(1, 100000) AS n WHERE run_id = 'acme/r0'"
        )
        connection.execute(
            "INSERT INTO timers (run_id, step_key, kind, due_at) SELECT run_id, 'sleep', 'sleep',"
            " 4000000000000 FROM runs WHERE status = 'sleeping'"
        )
        connection.execute("ANALYZE")
        now = 1_800_000_000_000
        plan = "\n".join(row[0] for row in connection.execute(
            "EXPLAIN " + claim_query(POSTGRES.lease_clock or "").replace("?", "%s"),
            (now, now, 100, 100)).fetchall())  # fmt: skip
    assert "Seq Scan on runs" not in plan, plan
    assert "runs_unleased" in plan, plan  # runs by status: the running ones
    assert "timers_by_due" in plan, plan
    assert "Seq Scan on timers" not in plan, plan
