"""db.sql: hostile SQL confined to the scope's own database, exactly once (docs/ARCHITECTURE.md, Scope databases)."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import apsw
import pytest

from qjsflow.runner import InvalidScope, Runner, RunnerConfig, StartRunInput
from qjsflow.runner.engine.worker import worker_command
from qjsflow.runner.scopedb import MIN_SQLITE_VERSION, ScopeDatabases, SqlLimits
from qjsflow.sandbox import PoolConfig
from tests.conftest import PROJECT_ROOT, FakeClock, start_source
from tests.crash_points import CRASH_AFTER_SQL
from tests.leases import seconds_until_lease_lapses

PROBE = """
import { db } from "qjsflow";
export default async (event) => {
  const outcomes = [];
  for (const sql of event.payload.statements) {
    try {
      const result = await db.sql(sql);
      outcomes.push({ ok: result.rows.length });
    } catch (error) {
      outcomes.push({ name: error.name, code: error.code, message: error.message });
    }
  }
  return outcomes;
};
"""


@pytest.fixture(params=["local", "replicated"])
async def sql_runner(
    tmp_path: Path, clock: FakeClock, request: pytest.FixtureRequest
) -> AsyncIterator[Runner]:
    """Each hardening holds whether the scope's database is a local file or a replica of
    the journal's (tests/test_scope_replicas.py)."""
    config = RunnerConfig(clock=clock, pool=PoolConfig(size=1), sql_limits=SqlLimits(max_pages=64),
                          scope_databases=request.param)  # fmt: skip
    async with Runner.open(tmp_path / "journal.db", config) as runner:
        yield runner


async def _probe(runner: Runner, scope: str, statements: list[str]) -> list[dict[str, object]]:
    run = await start_source(runner, PROBE, {"statements": statements}, scope=scope)
    assert run.status == "completed", run.error
    assert isinstance(run.output, list)
    return run.output


def test_the_bundled_sqlite_is_current() -> None:
    version = tuple(int(part) for part in apsw.sqlite_lib_version().split("."))
    assert version[:3] >= MIN_SQLITE_VERSION


async def test_hostile_statements_are_refused(sql_runner: Runner, tmp_path: Path) -> None:
    await _probe(
        sql_runner, "other", ["CREATE TABLE secrets (v TEXT)", "INSERT INTO secrets VALUES ('s')"]
    )
    other_file = sql_runner.scopes.path_of("other")
    outside = tmp_path / "x.db"
    hostile = [
        f"ATTACH DATABASE '{other_file}' AS b",
        f"VACUUM INTO '{outside}'",
        "SELECT load_extension('x')",
        "PRAGMA writable_schema=ON",
        "SELECT * FROM pragma_table_info('t')",
        "BEGIN IMMEDIATE",
        "CREATE TEMP TRIGGER tr AFTER INSERT ON t BEGIN SELECT 1; END",
        "UPDATE sqlite_schema SET sql = 'CREATE TABLE t (x)' WHERE name = 't'",
        "CREATE TABLE u (x); DROP TABLE t",
        "SELECT * FROM _qjsflow_applied",
        "SAVEPOINT s",
    ]
    outcomes = await _probe(sql_runner, "acme", ["CREATE TABLE t (x)", *hostile])
    assert outcomes[0] == {"ok": 0}
    for statement, outcome in zip(hostile, outcomes[1:], strict=True):
        assert outcome["name"] == "SqlError", statement
        assert outcome["code"] in {"not_authorized", "multiple_statements"}, (statement, outcome)
        assert str(tmp_path) not in str(outcome["message"])
    assert not outside.exists()
    after = await _probe(sql_runner, "acme", ["SELECT * FROM u", "SELECT * FROM t"])
    assert after[0]["code"] == "syntax"  # the first of two statements was rolled back
    assert "no such table" in str(after[0]["message"])
    assert after[1] == {"ok": 0}
    files = sorted(p.name for p in sql_runner.scopes.root.iterdir())
    assert all(name.startswith(("acme.sqlite", "other.sqlite")) for name in files), files
    with sqlite3.connect(other_file) as connection:
        assert connection.execute("SELECT v FROM secrets").fetchall() == [("s",)]


@pytest.mark.slow  # in `make test`; heavy for the fast tier
async def test_runaway_statements_stop_and_the_process_stays_responsive(sql_runner: Runner) -> None:
    outcomes = await _probe(
        sql_runner,
        "acme",
        [
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
            "SELECT randomblob(2e9)",
            "CREATE TABLE n (x)",
            "INSERT INTO n WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 100) SELECT x FROM c",
            "SELECT a.x FROM n a, n b",
            "SELECT count(*) AS rows FROM n",
        ],
    )
    assert outcomes[0]["code"] == "interrupted"
    assert outcomes[1]["code"] == "too_big"
    assert "longer than 65536 bytes, the limit of a value" in str(outcomes[1]["message"])
    assert "SqlLimits.max_length" in str(outcomes[1]["message"])
    assert outcomes[4]["code"] == "too_big"
    assert "more than 1000 rows" in str(outcomes[4]["message"])
    assert outcomes[5] == {"ok": 1}


async def test_a_full_scope_gets_a_quota_error_and_others_carry_on(sql_runner: Runner) -> None:
    fill = ["CREATE TABLE big (b BLOB)"] + ["INSERT INTO big VALUES (randomblob(60000))"] * 8
    outcomes = await _probe(sql_runner, "acme", fill)
    assert {"code": "quota"}.items() <= outcomes[-1].items(), outcomes
    assert "page quota" in str(outcomes[-1]["message"])
    fine = await _probe(
        sql_runner, "other", ["CREATE TABLE t (x)", "INSERT INTO t VALUES (1)", "SELECT * FROM t"]
    )
    assert fine == [{"ok": 0}, {"ok": 0}, {"ok": 1}]


@pytest.mark.parametrize("scope", ["../b", "a/../../j", "A", "x" * 65, "", "a b"])
async def test_bad_scope_ids_touch_no_file(tmp_path: Path, scope: str) -> None:
    root = tmp_path / "scopes"
    databases = ScopeDatabases(root)
    with pytest.raises(InvalidScope):
        await databases.execute(
            scope, run_id="run", call_key="sql:1:", sql="SELECT 1", params="[]", deadline_s=1.0
        )
    assert not root.exists()
    await databases.aclose()


MEMO = """
import { db } from "qjsflow";
export default async (event, step) => {
  await db.sql("CREATE TABLE IF NOT EXISTS hits (n INTEGER)");
  const inserted = await db.sql("INSERT INTO hits VALUES (?)", [event.payload.n]);
  await step.sleep("pause", "1 minute");
  const rows = await db.sql("SELECT n FROM hits");
  return { changes: inserted.changes, rows: rows.rows };
};
"""


async def test_results_replay_from_the_journal(sql_runner: Runner, clock: FakeClock) -> None:
    run = await start_source(sql_runner, MEMO, {"n": 7})
    assert run.status == "sleeping"
    await sql_runner.resume(run.run_id, scope="acme")
    clock.advance(61)
    done = await sql_runner.resume(run.run_id, scope="acme")
    assert done.output == {"changes": 1, "rows": [{"n": 7}]}
    sql_steps = [
        s for s in await sql_runner.list_steps(run.run_id, scope="acme") if s.kind == "sql"
    ]
    assert [(s.count, s.status) for s in sql_steps] == [
        (1, "completed"),
        (2, "completed"),
        (3, "completed"),
    ]


CRASHING_INSERT = """
import { db } from "qjsflow";
export default async (event, step) => {
  await step.do("make table", async () =>
    (await db.sql("CREATE TABLE IF NOT EXISTS orders (id TEXT)")).changes);
  const inserted = await db.sql("INSERT INTO orders VALUES (?)", ["order-1"]);
  return inserted.changes;
};
"""


@pytest.mark.timeout(120)
@pytest.mark.slow
async def test_an_insert_applied_before_a_crash_is_not_applied_twice(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    async with Runner.open(db, RunnerConfig(pool=PoolConfig(size=1))) as runner:
        published = await runner.publish("acme", {"workflows/orders.ts": CRASHING_INSERT})
        request = StartRunInput("acme", "orders", published.snapshot_id, run_id="once")
        await runner.start(request, drive=False)
        scope_file = runner.scopes.path_of("acme")

    def worker(crash_on: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            worker_command(
                str(db), tools="tests.crash_points:TOOLS", lease_ttl_s=1, until_idle=True
            ),
            cwd=PROJECT_ROOT, env={**os.environ, CRASH_AFTER_SQL: crash_on},
            capture_output=True, timeout=100, check=False,
        )  # fmt: skip

    crashed = worker(crash_on="INSERT INTO orders")
    assert crashed.returncode == -signal.SIGKILL
    with sqlite3.connect(scope_file) as connection:
        assert connection.execute("SELECT count(*) FROM orders").fetchone() == (1,)
    async with Runner.open(db) as runner:
        sql_steps = [s for s in await runner.list_steps("once", scope="acme") if s.kind == "sql"]
        # The CREATE ran inside the step "make table", so it is named after it; the INSERT is
        # the body's own first call, applied in the scope database but not yet journaled.
        assert [(s.name, s.count, s.status) for s in sql_steps] == [
            ("do:1:make table/", 1, "completed"),
            ("", 1, "running"),
        ]
    await asyncio.sleep(seconds_until_lease_lapses(db, "acme/once"))
    recovered = worker(crash_on="")
    assert recovered.returncode == 0, recovered.stderr
    async with Runner.open(db) as runner:
        run = await runner.get("once", scope="acme")
        assert (run.status, run.output) == ("completed", 1)
    with sqlite3.connect(scope_file) as connection:
        assert connection.execute("SELECT count(*) FROM orders").fetchone() == (1,)


HOSTILE_PARAMS = """
import { db } from "qjsflow";
export default async () => {
  const outcomes = [];
  const calls: Array<[string, unknown[]]> = [
    ["SELECT ?", [new Date(8.64e15)]],
    ["SELECT ?", [2n ** 70n]],
    ["SELECT ?", ["x\\ud800"]],
    ["SELECT CAST(x'ff80' AS TEXT)", []],
    ["SELECT instr(replace(hex(zeroblob(500000)), '0', 'aa'), replace(hex(zeroblob(250000)), '0', 'aa') || 'b')", []],
    ["SELECT 42 AS answer", []],
  ];
  for (const [sql, params] of calls) {
    try {
      outcomes.push({ ok: (await db.sql(sql, params)).rows });
    } catch (error) {
      outcomes.push({ code: error.code, message: error.message });
    }
  }
  return outcomes;
};
"""


async def test_hostile_parameters_and_results_are_coded_errors(
    sql_runner: Runner, capfd: pytest.CaptureFixture[str]
) -> None:
    run = await start_source(sql_runner, HOSTILE_PARAMS)
    assert run.status == "completed", run.error
    codes = [outcome.get("code") for outcome in run.output]
    assert codes == ["bad_params", "bad_params", "bad_params", "bad_text", "too_big", None]
    assert run.output[-1] == {"ok": [{"answer": 42}]}
    assert "Date" in run.output[0]["message"]
    captured = capfd.readouterr()
    assert "Traceback" not in captured.err + captured.out


SLOW = """
import { db } from "qjsflow";
export default async () => {
  try {
    await db.sql("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c");
  } catch (error) {
    return error.code;
  }
  return "finished";
};
"""
QUICK = """
import { db } from "qjsflow";
export default async () => (await db.sql("SELECT 42 AS answer")).rows[0].answer;
"""


@pytest.mark.slow
async def test_one_scopes_statement_never_blocks_another_scope(
    tmp_path: Path, clock: FakeClock
) -> None:
    # The slow statement runs for its whole 5 s deadline: the quick scope must not wait for it.
    sql_limits = SqlLimits(deadline_s=5.0, run_budget_s=20.0)
    config = RunnerConfig(clock=clock, pool=PoolConfig(size=2), sql_limits=sql_limits)
    async with Runner.open(tmp_path / "journal.db", config) as runner:
        await _probe(runner, "quick", ["SELECT 1"])  # both scopes' processes are warm
        await _probe(runner, "slow", ["SELECT 1"])
        finished: list[str] = []

        async def run(scope: str, source: str) -> object:
            view = await start_source(runner, source, scope=scope)
            finished.append(scope)
            return view.output

        slow = asyncio.create_task(run("slow", SLOW))
        await asyncio.sleep(0.3)  # the slow statement is running in its scope's process
        assert await run("quick", QUICK) == 42
        assert await slow == "interrupted"
        assert finished == ["quick", "slow"]
