"""A transaction reads a run's row once and keeps it up to date with its own writes — only
while no other transaction can change that row — and a drive's writes queued one after
another check its fence once."""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
from typing import Any

import psycopg
import pytest

from qjsflow.runner import Runner, RunnerConfig, StartRunInput
from qjsflow.runner.store import JournalTransaction, LeaseLost, LeaseMode, RunRecord, RunStatus
from qjsflow.runner.store.connection import connect_sqlite
from qjsflow.runner.store.dialect import SQLITE
from qjsflow.runner.store.journal import BatchJob, run_batch
from qjsflow.runner.store.migrations import migrate
from qjsflow.runner.tenancy.scopes import run_key
from tests.conftest import WAITER, FakeClock, start_source, statements
from tests.postgres import PostgresServer
from tests.test_commit_here import TEN

SLEEPER = 'export default async (e, step) => { await step.sleep("nap", "1 minute"); return 1; };'
RUN_READ = "SELECT worker_id, run_id, scope, workflow"  # a run, with its holder
FENCE_READ = "SELECT epoch, worker_id, run_id, scope, workflow"  # the fence, with the run


def typed(run: RunRecord) -> list[tuple[type, Any]]:
    """Each field with its type: 0 and 0.0 are equal, but print differently."""
    return [(type(value), value) for value in dataclasses.astuple(run)]


async def test_a_run_kept_by_a_transaction_is_what_a_read_returns(clocked_runner: Runner) -> None:
    """Written with the types a caller may pass (an int for a REAL column, a whole float
    for an INTEGER one, 1 for a flag), kept as a read after the commit returns it."""
    run = await start_source(clocked_runner, SLEEPER)
    key = run_key("acme", run.run_id)

    def write(tx: JournalTransaction) -> tuple[RunRecord | None, RunRecord | None]:
        before = tx.get_run(key)
        tx.update_run(key, cpu_used_s=2, sql_used_s=1, wake_at=7.0, logs_count=3.0,
                      cancel_requested=1, pause_requested=0, executor_deaths=1,
                      status="sleeping", error="e", error_stack=None)  # fmt: skip
        return before, tx.get_run(key)

    before, kept = await clocked_runner.store.transact(write)
    fresh = await clocked_runner.store.get_run(key)
    assert before is not None
    assert kept is not None
    assert fresh is not None
    assert before.cpu_used_s != 2.0  # the write changed these
    assert not before.cancel_requested
    assert typed(kept) == typed(fresh)

    def lease(tx: JournalTransaction) -> RunRecord | None:
        assert tx.acquire_lease(key, "w", 1, 30_000) is not None
        return tx.get_run(key)

    leased = await clocked_runner.store.transact(lease)
    assert leased is not None
    assert typed(leased) == typed(fresh)


async def test_a_drive_reads_its_run_once_and_checks_its_fence_once(tmp_path: Any) -> None:
    """A started run's beginning takes its row from the insert and the lease's update; its
    end, queued behind the drive's results in one commit, trusts the fence those checked
    and takes the run from that same read; the run's last update gives the lease up."""
    async with Runner.open(tmp_path / "journal.db") as runner:
        snapshot = (await runner.publish("acme", {"workflows/flow.ts": TEN})).snapshot_id
        await runner.start(StartRunInput("acme", "flow", snapshot, {}, "first"))
        with statements(runner) as seen:
            run = await runner.start(StartRunInput("acme", "flow", snapshot, {}, "lone"))
        assert run.output == 45
        sql = [text for _, text in seen]
        assert sum(text.startswith(RUN_READ) for text in sql) == 0, sql
        assert sum(text.startswith(FENCE_READ) for text in sql) == 1, sql
        assert sum(text.startswith("BEGIN") for text in sql) == 2, sql  # results and end: one
        end = sql[sql.index("COMMIT") :]
        [update] = [text for text in end if text.startswith("UPDATE runs")]
        assert "status = 'completed'" in update, update
        assert "worker_id = NULL" in update, update
        # Created in the beginning's transaction, the run has no steps, timers or lease
        # holder to look at, and is written "running" already.
        beginning = sql[: sql.index("COMMIT")]
        for needless in ("SELECT kind, name", "SELECT run_id, kind", "DELETE FROM timers",
                         "UPDATE runs SET status", "SELECT worker_id"):  # fmt: skip
            assert not any(text.startswith(needless) for text in beginning), beginning


async def test_a_drives_beginning_marks_its_run_running_with_its_lease(tmp_path: Any) -> None:
    """Resuming a waiting run whose lease is taken before its drive (its scope's drives at
    once are counted by leases; otherwise it is read first: tests/test_leases_taken_late.py):
    the statement that takes the lease also marks the run running (one update of its row
    before the drive, not two), and the end looks at the inbox and the timers in one
    statement; a pause asked before it is left for the beginning to park, with one
    `run_paused` event however often it is asked."""
    config = RunnerConfig(scope_concurrency={"acme": 5})
    async with Runner.open(tmp_path / "journal.db", config) as runner:
        run = await start_source(runner, WAITER)
        assert run.status == "waiting"
        with statements(runner) as seen:
            again = await runner.resume(run.run_id, scope="acme")
        assert again.status == "waiting"
        sql = [text for _, text in seen]
        beginning = sql[: sql.index("COMMIT")]
        [update] = [text for text in beginning if text.startswith("UPDATE runs")]
        assert "epoch = epoch + 1" in update, update
        assert "THEN 'running'" in update, update
        # Its end looks for an event that arrived meanwhile and at the timers in one statement.
        end = sql[sql.index("COMMIT") + 1 :]
        looks = [text for text in end if "FROM inbox" in text or "FROM timers" in text]
        assert len(looks) == 1, looks
        assert "min(due_at)" in looks[0], looks
        for _ in range(2):
            paused = await runner.pause(run.run_id, scope="acme")
            assert paused.status == "paused"
        events = await runner.history(run.run_id, scope="acme")
        assert [e.type for e in events].count("run_paused") == 1, events
        resumed = await runner.resume(run.run_id, scope="acme")
        assert resumed.status == "waiting"
        assert resumed.error is None


async def test_a_write_of_what_a_run_holds_already_is_not_made(tmp_path: Any) -> None:
    async with Runner.open(tmp_path / "journal.db") as runner:
        run = await start_source(runner, SLEEPER)
        key = run_key("acme", run.run_id)

        def write(tx: JournalTransaction) -> None:
            held = tx.get_run(key)
            assert held is not None
            tx.update_run(key, status=held.status, logs_count=float(held.logs_count))
            tx.update_run(key, status="waiting")

        with statements(runner) as seen:
            await runner.store.transact(write)
        updates = [text for _, text in seen if text.startswith("UPDATE runs")]
        assert updates == [f"UPDATE runs SET status = 'waiting' WHERE run_id = '{key}'"]


def _another_writer(connection: Any) -> None:
    """Another connection marks the run as cancel-requested and commits."""
    connection.execute("UPDATE runs SET cancel_requested = 1")
    connection.commit()


async def test_a_row_another_transaction_may_change_is_read_again(
    postgres: PostgresServer,
) -> None:
    """PostgreSQL: a row read without a lock can change under the transaction (read
    committed), so a second read reads it again and sees the other's commit."""
    postgres_url = postgres.new_database()
    async with Runner.open(postgres_url) as runner:
        run = await start_source(runner, SLEEPER)
        key = run_key("acme", run.run_id)

        def reads(tx: JournalTransaction) -> tuple[bool, bool]:
            first = tx.get_run(key)
            with psycopg.connect(postgres_url) as other:
                _another_writer(other)
            second = tx.get_run(key)
            assert first is not None
            assert second is not None
            return first.cancel_requested, second.cancel_requested

        assert await runner.store.transact(reads) == (False, True)


async def test_reads_outside_a_transaction_keep_nothing(tmp_path: Any) -> None:
    """SQLite: outside a write transaction each statement sees the journal as it is then."""
    path = tmp_path / "journal.db"
    async with Runner.open(path) as runner:
        run = await start_source(runner, SLEEPER)
        key = run_key("acme", run.run_id)

        def reads(tx: JournalTransaction) -> tuple[bool, bool]:
            first = tx.get_run(key)
            other = sqlite3.connect(path)
            try:
                _another_writer(other)
            finally:
                other.close()
            second = tx.get_run(key)
            assert first is not None
            assert second is not None
            return first.cancel_requested, second.cancel_requested

        assert await runner.store.read(reads) == (False, True)


def _journal_with_a_run(tmp_path: Any, status: str) -> tuple[sqlite3.Connection, RunRecord]:
    """A SQLite journal holding one run (`acme/r`) of that status, and its connection."""
    raw = connect_sqlite(tmp_path / "j.db")
    migrate(raw, location="j.db", dialect=SQLITE)
    JournalTransaction(raw).insert_snapshot("acme", "s", 0.0, (0, 0, "[]", None, None), [])
    run = RunRecord(run_id="acme/r", scope="acme", workflow="flow", snapshot_id="s",
                    entry_path="e.ts", status=RunStatus(status), input="null", persisted_bindings="{}",
                    output=None, error=None, created_at=0, updated_at=0, wake_at=None,
                    waiting_for=None, cpu_used_s=0.0, logs_count=0,
                    cancel_requested=False)  # fmt: skip
    JournalTransaction(raw).insert_run(run)
    return raw, run


def test_a_fence_is_trusted_only_while_no_job_wrote_a_run(tmp_path: Any) -> None:
    """Jobs of one drive queued one after another check its fence once; after a job that
    wrote a run's row (released the lease, asked a pause) the next checks it again."""
    raw, run = _journal_with_a_run(tmp_path, "sleeping")
    lease = JournalTransaction(raw).acquire_lease(run.run_id, "w", 0, 60_000)
    assert lease is not None
    fence_reads: list[str] = []
    run_reads: list[str] = []

    class Logged:
        in_transaction = property(lambda self: raw.in_transaction)

        def execute(self, sql: str, args: object = ()) -> object:
            if sql.startswith(FENCE_READ):
                fence_reads.append(sql)
            if sql.startswith(RUN_READ):
                run_reads.append(sql)
            return raw.execute(sql, args)  # type: ignore[arg-type]

        def executemany(self, sql: str, rows: object) -> object:
            return raw.executemany(sql, rows)  # type: ignore[arg-type]

    class Backend:
        dialect = SQLITE
        marks_commits = False

        def begin(self, connection: Any, full: bool, write: bool = True) -> None:
            connection.execute("BEGIN IMMEDIATE")

    def batch(*works: Any) -> list[tuple[bool, Any]]:
        loop = asyncio.new_event_loop()
        try:
            jobs = [BatchJob(work, lease, False, loop.create_future()) for work in works]
            return run_batch(Logged(), jobs, Backend())[0]  # type: ignore[arg-type]
        finally:
            loop.close()

    def event(tx: JournalTransaction) -> bool:
        tx.append_event(run.run_id, "e", 1, None)
        return tx.pause_requested

    assert batch(event, event, event) == [(True, False)] * 3
    assert len(fence_reads) == 1
    fence_reads.clear()
    asked = batch(lambda tx: tx.update_run(run.run_id, pause_requested=1), event)
    assert asked == [(True, None), (True, True)]  # the pause read again with the fence
    assert len(fence_reads) == 2
    released = batch(lambda tx: tx.release_lease(lease), event)
    assert released[0] == (True, None)
    assert not released[1][0]
    assert isinstance(released[1][1], LeaseLost)

    # A job after the one that checked the fence takes the run from that read (no statement),
    # as a read returns it, and current with the job's own writes.
    fresh = JournalTransaction(raw).get_run(run.run_id)
    assert fresh is not None
    lease = JournalTransaction(raw).acquire_lease(run.run_id, "w", 0, 60_000)
    assert lease is not None

    def kept(tx: JournalTransaction) -> tuple[RunRecord | None, RunRecord | None]:
        before = tx.get_run(run.run_id)
        tx.update_run(run.run_id, cancel_requested=1)
        return before, tx.get_run(run.run_id)

    fence_reads.clear()
    run_reads.clear()
    [_, (ok, (before, after))] = batch(event, kept)
    assert ok
    assert run_reads == []
    assert before is not None
    assert after is not None
    assert typed(before) == typed(fresh)
    assert after.cancel_requested
    assert not before.cancel_requested
    assert len(fence_reads) == 1


def test_a_release_that_writes_the_run_needs_the_lease(tmp_path: Any) -> None:
    """The run's last fields go with the lease's release in one statement: when the lease is
    no longer the holder's, the release raises and nothing is written."""
    raw, run = _journal_with_a_run(tmp_path, "running")
    lost = JournalTransaction(raw).acquire_lease(run.run_id, "w", 0, 60_000)
    assert lost is not None
    assert JournalTransaction(raw).acquire_lease(run.run_id, "v", 0, 60_000, mode=LeaseMode.FORCED)
    with pytest.raises(LeaseLost):
        JournalTransaction(raw).release_lease(lost, status="completed", output="1")
    after = JournalTransaction(raw).get_run(run.run_id)
    assert after is not None
    assert (after.status, after.output) == ("running", None)
    held = raw.execute("SELECT worker_id FROM runs WHERE run_id = ?", (run.run_id,)).fetchone()
    assert held == ("v",)


def test_taking_a_lease_asks_for_its_holder_only_when_the_transaction_does_not_know(
    tmp_path: Any,
) -> None:
    """The holder read with a kept run (or written by this transaction) says whether a lease
    is taken over: a lapsed one is still reported as taken from its holder. A run nobody
    holds is taken without asking."""
    raw, run = _journal_with_a_run(tmp_path, "sleeping")
    assert JournalTransaction(raw).acquire_lease(run.run_id, "old", 0, 1_000) is not None
    seen: list[str] = []
    raw.set_trace_callback(seen.append)

    tx = JournalTransaction(raw)
    assert tx.get_run(run.run_id) is not None
    taken = tx.acquire_lease(run.run_id, "new", 5_000, 1_000)  # "old" lapsed at 1,000
    assert taken is not None
    assert taken.taken_from == "old"
    assert not any(text.startswith("SELECT worker_id FROM") for text in seen), seen
    tx.release_lease(taken)
    again = tx.acquire_lease(run.run_id, "next", 5_000, 1_000)  # released: nobody's
    assert again is not None
    assert again.taken_from is None

    seen.clear()
    unknown = JournalTransaction(raw).acquire_lease(run.run_id, "last", 9_000, 1_000)
    assert unknown is not None
    assert unknown.taken_from == "next"
    assert any(text.startswith("SELECT worker_id FROM") for text in seen), seen

    # A run nobody holds (released) is taken with one statement, asking no one.
    tx = JournalTransaction(raw)
    tx.release_lease(unknown)
    seen.clear()
    free = JournalTransaction(raw).acquire_lease(run.run_id, "free", 9_500, 1_000)
    assert free is not None
    assert free.taken_from is None
    assert [text.split(" ", 2)[:2] for text in seen] == [["UPDATE", "runs"]], seen
    # A live lease is not taken, and its holder is not reported as taken over.
    assert JournalTransaction(raw).acquire_lease(run.run_id, "late", 9_600, 1_000) is None


RETRIED = """
export default async (event, step) => {
  const a = await step.do("a", async () => 1);
  const b = await step.do("b", { retries: { limit: 2, delay: 60000 } }, async (ctx) => {
    if (ctx.attempt === 1) throw new Error("not yet");
    return 2;
  });
  return [a, b];
};
"""


async def test_a_drive_gets_its_journal_and_its_open_steps_apart(
    clocked_runner: Runner, clock: FakeClock
) -> None:
    """A drive's beginning reads the run's settled steps as its journal (in the order reached)
    and the others as its open steps: a step waiting for its next attempt asks the host, on
    either journal."""
    run = await start_source(clocked_runner, RETRIED, run_id="retried")
    assert run.status == "sleeping", run.error
    clock.advance(61)
    done = await clocked_runner.resume("retried", scope="acme")
    assert (done.status, done.output) == ("completed", [1, 2]), done.error
    attempts = {s.name: s.attempt for s in await clocked_runner.list_steps("retried", scope="acme")}
    assert attempts == {"a": 1, "b": 2}  # a from the journal, b's second attempt asked for
