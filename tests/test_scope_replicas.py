"""db.sql across machines: each scope's database lives in the journal as numbered changes,
and every worker's file is a replica of it (runner/scopedb/replication.py). Workers that share
nothing but the journal (a scope folder each, as separate machines have) see one database:
a run's writes on one are read on another, concurrent writers serialize on the scope's
version, a wiped folder is rebuilt from an image and the changes after it, and a worker killed
in a catch-up or between the journal's commit and the replica's leaves every replica
consistent, no write applied twice."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

from qjsflow.runner import Runner, RunnerConfig, StartRunInput
from qjsflow.runner.engine.worker import worker_command
from qjsflow.sandbox import PoolConfig
from tests.conftest import PROJECT_ROOT
from tests.crash_points import CRASH_AT_REPLICA
from tests.leases import seconds_until_lease_lapses

MANIFEST = orjson.dumps({"capabilities": {"sql": "write"}}).decode()
ORDERS = """import { db } from "qjsflow";
export default async (event, step) => {
  await db.sql("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, item TEXT)");
  await db.sql("INSERT INTO orders (item) VALUES (?)", [event.payload.item]);
  if (event.payload.sleep) await step.sleep("between machines", "2 seconds");
  const seen = await db.sql("SELECT item FROM orders ORDER BY id");
  return seen.rows.map((row) => row.item);
};"""
COUNTER = """import { db } from "qjsflow";
export default async (event) => {
  await db.sql("CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY, n INTEGER)");
  await db.sql("INSERT OR IGNORE INTO counter (id, n) VALUES (1, 0)");
  for (let i = 0; i < event.payload.times; i++) {
    await db.sql("UPDATE counter SET n = n + 1 WHERE id = 1");
  }
  return (await db.sql("SELECT n FROM counter")).rows[0].n;
};"""


def _config(root: Path, **more: Any) -> RunnerConfig:
    return RunnerConfig(pool=PoolConfig(size=1), scope_root=root, scope_databases="replicated",
                        **more)  # fmt: skip


def digest(path: Path) -> str:
    """Every table's rows (the applied calls' records too), sorted: equal files, equal
    digests."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as connection:
        tables = sorted(
            name
            for (name,) in connection.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")
            if not name.startswith("sqlite_") and name != "_qjsflow_replica"
        )
        found = hashlib.sha256()
        for table in tables:
            rows = sorted(repr(row) for row in connection.execute(f'SELECT * FROM "{table}"'))
            found.update(f"{table}:{rows}".encode())
    return found.hexdigest()


async def test_a_run_writes_on_one_machine_and_reads_on_another(
    journal: str, tmp_path: Path
) -> None:
    """Two runners, a scope folder each (on SQLite, replicated mode asked)."""
    db = journal
    async with Runner.open(db, _config(tmp_path / "a")) as a:
        await a.publish("acme", {"workflows/orders.ts": ORDERS, "qjsflow.json": MANIFEST})
        first = await a.start(StartRunInput("acme", "orders", "latest", {"item": "tea"}))
        assert first.output == ["tea"]
        changes = await a.store.read(lambda tx: tx.scope_changes_after("acme", 0, 10))
        # The CREATE as its statement, the INSERT as a changeset; the SELECT wrote nothing.
        assert [sorted(orjson.loads(text)) for _, text in changes] == [
            ["applied", "ddl"], ["applied", "changeset"]]  # fmt: skip
    async with Runner.open(db, _config(tmp_path / "b")) as b:
        second = await b.start(StartRunInput("acme", "orders", "latest", {"item": "jam"}))
        assert second.output == ["tea", "jam"]  # A's row, caught up from the journal
    async with Runner.open(db, _config(tmp_path / "a")) as a:
        third = await a.start(StartRunInput("acme", "orders", "latest", {"item": "oil"}))
        assert third.output == ["tea", "jam", "oil"]
    async with Runner.open(db, _config(tmp_path / "b")) as b:  # B catches up as it reads
        assert await _read_count(b) == 3
    assert digest(tmp_path / "a" / "acme.sqlite") == digest(tmp_path / "b" / "acme.sqlite")


async def test_a_wiped_folder_is_rebuilt_from_an_image_and_the_changes_after_it(
    journal: str, tmp_path: Path
) -> None:
    db = journal
    async with Runner.open(db, _config(tmp_path / "a")) as a:
        assert a.scopes.replication is not None
        a.scopes.replication.image_every = 5
        await a.publish("acme", {"workflows/orders.ts": ORDERS, "qjsflow.json": MANIFEST})
        # 12 changes (the table, then a row a run): images at 5 and 10, the changes before
        # 10 pruned.
        for n in range(11):
            await a.start(StartRunInput("acme", "orders", "latest", {"item": f"i{n}"}))
        versions = [v for v, _ in await a.store.read(
            lambda tx: tx.scope_changes_after("acme", 0, 100))]  # fmt: skip
        assert versions == [10, 11, 12]
        assert a.scopes.replication.images == 2
        kept = await a.store.read(lambda tx: tx.scope_image("acme"))
        changes = await a.store.read(lambda tx: tx.scope_changes_after("acme", 0, 100))
        usage = (await a.usage(scope="acme"))["acme"]
        stored = {m.measure: m.used for m in usage.measures}["journal_bytes"]
        # The scope's stored bytes count what its database holds in the journal: its
        # image and the changes after it (and its runs' results and events besides).
        assert kept is not None
        assert stored >= len(kept[1]) + sum(len(text) for _, text in changes)
    async with Runner.open(db, _config(tmp_path / "b")) as b:  # a new machine
        rebuilt = await b.start(StartRunInput("acme", "orders", "latest", {"item": "last"}))
        assert rebuilt.output == [*(f"i{n}" for n in range(11)), "last"]
    async with Runner.open(db, _config(tmp_path / "a")) as a:  # A catches up too
        await a.start(StartRunInput("acme", "orders", "latest", {"item": "end"}))
    async with Runner.open(db, _config(tmp_path / "b")) as b:
        await b.start(StartRunInput("acme", "orders", "latest", {"item": "end2"}))
    async with Runner.open(db, _config(tmp_path / "a")) as a:
        await a.start(StartRunInput("acme", "orders", "latest", {"item": "end3"}))
    # Both at the journal's head now but for B's missing "end3": bring B there.
    async with Runner.open(db, _config(tmp_path / "b")) as b:
        await _read_count(b)
    assert digest(tmp_path / "a" / "acme.sqlite") == digest(tmp_path / "b" / "acme.sqlite")


READ = """import { db } from "qjsflow";
export default async () => (await db.sql("SELECT count(*) AS n FROM orders")).rows[0].n;"""


async def _read_count(runner: Runner) -> Any:
    published = await runner.publish("acme", {"workflows/read.ts": READ, "qjsflow.json": MANIFEST})
    run = await runner.start(StartRunInput("acme", "read", published.snapshot_id, None))
    assert run.status == "completed", run.error
    return run.output


async def test_a_read_only_scope_and_a_statement_no_replica_could_repeat_are_refused(
    tmp_path: Path,
) -> None:
    source = """import { db } from "qjsflow";
export default async () => {
  const tried = [];
  for (const sql of ["CREATE TABLE t (a)", "CREATE TABLE u AS SELECT 1 AS a"]) {
    try { await db.sql(sql); tried.push("ok"); } catch (error) { tried.push(error.code); }
  }
  return tried;
};"""
    async with Runner.open(tmp_path / "journal.db", _config(tmp_path / "a")) as runner:
        await runner.publish("acme", {"workflows/w.ts": source, "qjsflow.json": MANIFEST})
        run = await runner.start(StartRunInput("acme", "w", "latest", None))
        assert run.output == ["ok", "not_authorized"]
        reader = orjson.dumps({"capabilities": {"sql": "read"}}).decode()
        await runner.publish("other", {"workflows/w.ts": source, "qjsflow.json": reader})
        run = await runner.start(StartRunInput("other", "w", "latest", None))
        assert run.output == ["capability_denied", "capability_denied"]
        head = await runner.store.read(lambda tx: tx.scope_head("other"))
        assert head == 0  # nothing recorded for a refused write


# -- workers that share nothing but a PostgreSQL journal --------------------------------------


def _worker(db: str, root: Path, *extra: str, crash: str = "") -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*worker_command(db, tools="tests.crash_points:TOOLS", lease_ttl_s=1), "--scope-root",
         str(root), *extra],
        cwd=PROJECT_ROOT, env={**os.environ, CRASH_AT_REPLICA: crash},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


async def _ended(runner: Runner, run_id: str) -> Any:
    return await runner.wait(run_id, scope="acme", timeout_s=120)


def _stop(*processes: subprocess.Popen[bytes]) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)


@pytest.mark.slow
async def test_postgres_workers_share_one_database_and_increments_apply_once(
    postgres: Any, tmp_path: Path
) -> None:
    db = postgres.new_database()
    async with Runner.open(db, _config(tmp_path / "api")) as api:
        await api.publish("acme", {"workflows/orders.ts": ORDERS, "workflows/counter.ts": COUNTER,
                                   "qjsflow.json": MANIFEST})  # fmt: skip
        # A write on machine A, a sleep, and the read on machine B: A is stopped while the
        # run sleeps, and B, with a folder of its own, resumes it.
        a = _worker(db, tmp_path / "a", "--concurrency", "1")
        moved = await api.start(StartRunInput("acme", "orders", "latest",
                                              {"item": "tea", "sleep": True}), drive=False)  # fmt: skip
        asleep = await api.wait_suspended(moved.run_id, scope="acme", timeout_s=120)
        assert asleep.status == "sleeping"
        _stop(a)
        b = _worker(db, tmp_path / "b", "--concurrency", "1")
        try:
            resumed = await _ended(api, moved.run_id)
            assert resumed.output == ["tea"]  # B read the row A wrote, from the journal
            a = _worker(db, tmp_path / "a", "--concurrency", "1")
            counting = [
                await api.start(
                    StartRunInput("acme", "counter", "latest", {"times": 500}), drive=False
                )
                for _ in range(2)
            ]
            outputs = [(await _ended(api, run.run_id)).output for run in counting]
            assert max(outputs) == 1000  # the last to end counted every increment
        finally:
            _stop(a, b)
        head = await api.store.read(lambda tx: tx.scope_head("acme"))
    # Every write is one change of the scope's history with its call's applied record: the
    # order's table and row, the counter's table and seed row (one run found them made), and
    # the 1,000 increments — none lost, none applied twice.
    assert head == 2 + 2 + 1000
    await _catch_up_all(db, tmp_path)
    files = [tmp_path / name / "acme.sqlite" for name in ("a", "b")]
    assert digest(files[0]) == digest(files[1])
    with sqlite3.connect(files[0]) as connection:
        assert connection.execute("SELECT n FROM counter").fetchall() == [(1000,)]
        assert connection.execute("SELECT count(*) FROM _qjsflow_applied").fetchall() == [(head,)]


async def _catch_up_all(db: str, tmp_path: Path) -> None:
    """Each machine's replica brought to the journal's head (a statement on each)."""
    for name in ("a", "b"):
        async with Runner.open(db, _config(tmp_path / name)) as runner:
            await _read_count(runner)


@pytest.mark.slow
@pytest.mark.parametrize("crash", ["finish", "apply"])
async def test_a_worker_killed_mid_commit_or_mid_catch_up_leaves_replicas_consistent(
    postgres: Any, tmp_path: Path, crash: str
) -> None:
    """`finish`: killed once the journal has a change and its replica does not; `apply`:
    killed as a replica applied what it lacked, before the worker heard back."""
    db = postgres.new_database()
    async with Runner.open(db, _config(tmp_path / "api")) as api:
        await api.publish("acme", {"workflows/orders.ts": ORDERS, "qjsflow.json": MANIFEST})
        if crash == "apply":  # B will have something to catch up with
            seed = _worker(db, tmp_path / "a", "--until-idle")
            await api.start(StartRunInput("acme", "orders", "latest", {"item": "seed"}),
                            drive=False)  # fmt: skip
            assert seed.wait(timeout=120) == 0
        run = await api.start(StartRunInput("acme", "orders", "latest", {"item": "tea"},
                                            "once"), drive=False)  # fmt: skip
        doomed = _worker(db, tmp_path / "b", crash=crash)
        assert await asyncio.to_thread(doomed.wait, 120) == -signal.SIGKILL
        await asyncio.sleep(seconds_until_lease_lapses(db, f"acme/{run.run_id}"))
        survivor = _worker(db, tmp_path / "b", "--until-idle")  # the same machine, again
        assert await asyncio.to_thread(survivor.wait, 120) == 0
        done = await _ended(api, run.run_id)
        expected = ["seed", "tea"] if crash == "apply" else ["tea"]
        assert (done.status, done.output) == ("completed", expected)
        changes = await api.store.read(lambda tx: tx.scope_changes_after("acme", 0, 100))
    inserts = [text for _, text in changes if '"changeset"' in text]
    assert len(inserts) == len(expected)  # the order inserted once, whatever was killed
    await _catch_up_all(db, tmp_path)
    files = [tmp_path / name / "acme.sqlite" for name in ("a", "b")]
    assert digest(files[0]) == digest(files[1])
    with sqlite3.connect(files[1]) as connection:
        rows = [item for (item,) in connection.execute("SELECT item FROM orders ORDER BY id")]
    assert rows == expected
