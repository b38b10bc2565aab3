"""The journal's contract, on both backends: fencing, claiming, timers, first writer wins."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest

from qjsflow.runner import Bindings, Runner, RunnerConfig, StartRunInput
from qjsflow.runner.operations.control import request_pause
from qjsflow.runner.store import JournalTransaction, LeaseLost, StepStatus
from qjsflow.runner.store.connection import connect_sqlite
from qjsflow.runner.store.dialect import SQLITE
from qjsflow.runner.store.journal import BatchJob, run_batch
from qjsflow.runner.store.migrations import migrate
from qjsflow.runner.store.records import StepPlace, StepRow
from qjsflow.runner.tenancy.scopes import run_key
from qjsflow.sandbox import PoolConfig
from tests.conftest import FakeClock, start_source
from tests.journal_reads import table_counts
from tests.postgres import PostgresServer, pgbouncer


@pytest.fixture(
    params=["sqlite", pytest.param("postgresql", marks=pytest.mark.slow),
            pytest.param("pgbouncer", marks=pytest.mark.slow)]
)  # fmt: skip
def journal(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The contract holds on SQLite, on PostgreSQL, and on PostgreSQL reached through
    PgBouncer's transaction pooling (docs/OPERATIONS.md)."""
    if request.param == "sqlite":
        yield str(tmp_path / "journal.db")
        return
    server: PostgresServer = request.getfixturevalue("postgres")
    url = server.new_database()
    if request.param == "postgresql":
        yield url
        return
    with pgbouncer(server) as bouncer:
        yield f"{bouncer}/{url.rsplit('/', 1)[1]}?qjsflow_pooling=transaction"


SLEEPER = 'export default async (e, step) => { await step.sleep("nap", "1 minute"); return 1; };'


async def test_a_taken_over_lease_writes_nothing(clocked_runner: Runner) -> None:
    run = await start_source(clocked_runner, SLEEPER)
    store = clocked_runner.store
    key = run_key("acme", run.run_id)

    def now() -> int:  # leases are judged by real clocks (the database's, on PostgreSQL)
        return int(time.time() * 1000)

    held_since = time.monotonic()
    first = await store.acquire_lease(key, "first", now(), 300)
    assert first is not None
    assert await store.acquire_lease(key, "second", now(), 300) is None  # still held
    second = None
    deadline = time.monotonic() + 10
    while second is None and time.monotonic() < deadline:  # until it lapses
        await asyncio.sleep(0.02)
        second = await store.acquire_lease(key, "second", now(), 1000)
    assert second is not None
    assert time.monotonic() - held_since >= 0.29  # not granted while the first still held it
    assert second.epoch == first.epoch + 1
    counts = table_counts(store)
    with pytest.raises(LeaseLost, match="was taken over"):
        await store.transact(lambda tx: tx.append_event(key, "late", now(), None), first)
    assert not await store.renew_lease(first, now(), 1000)
    assert table_counts(store) == counts
    await store.transact(lambda tx: tx.append_event(key, "fresh", now(), None), second)
    assert table_counts(store)["events"] == counts["events"] + 1


async def test_due_timers_make_a_run_claimable(clocked_runner: Runner, clock: FakeClock) -> None:
    run = await start_source(clocked_runner, SLEEPER)
    store = clocked_runner.store
    now = int(clock() * 1000)
    assert await store.claimable_runs(now, 10) == []
    assert await store.next_due() == now + 60_000
    assert await store.claimable_runs(now + 60_000, 10) == [run_key("acme", run.run_id)]
    clock.advance(60)
    assert (await clocked_runner.resume(run.run_id, scope="acme")).status == "completed"
    assert await store.next_due() is None


async def test_group_commit_keeps_each_failure_to_itself(clocked_runner: Runner) -> None:
    run = await start_source(clocked_runner, SLEEPER)
    store = clocked_runner.store
    counts = table_counts(store)

    def fails(tx: object) -> None:
        raise RuntimeError("this piece fails")

    def event(name: str) -> Callable[[JournalTransaction], str]:
        def write(tx: JournalTransaction) -> str:
            tx.append_event(run_key("acme", run.run_id), name, 1, None)
            return name

        return write

    results = await asyncio.gather(
        store.transact(event("a")), store.transact(fails), store.transact(event("b")),
        return_exceptions=True,
    )  # fmt: skip
    assert isinstance(results[1], RuntimeError)
    assert results[0] == "a"
    assert results[2] == "b"
    assert table_counts(store)["events"] == counts["events"] + 2


async def test_a_statement_that_fails_unread_fails_its_own_job(clocked_runner: Runner) -> None:
    """A statement whose answer nobody reads (on PostgreSQL, pipelined: its error comes
    later) fails the job that sent it, in its group commit and alone, and nothing else."""
    run = await start_source(clocked_runner, SLEEPER)
    store = clocked_runner.store
    counts = table_counts(store)
    key = run_key("acme", run.run_id)

    def event(name: str) -> Callable[[JournalTransaction], str]:
        def write(tx: JournalTransaction) -> str:
            tx.append_event(key, name, 1, None)
            return name

        return write

    def breaks(tx: JournalTransaction) -> str:
        tx.append_event(key, "lost with its job", 1, None)
        tx.append_event(key, cast(str, None), 1, None)  # NOT NULL: refused, unread
        return "written?"

    results = await asyncio.gather(
        store.transact(event("a")), store.transact(breaks), store.transact(event("b")),
        return_exceptions=True,
    )  # fmt: skip
    assert results[0] == "a"
    assert results[2] == "b"
    assert isinstance(results[1], Exception)
    assert "null" in str(results[1]).lower()
    with pytest.raises(Exception, match=r"(?i)null"):
        await store.transact(breaks)
    assert table_counts(store)["events"] == counts["events"] + 2


async def test_a_dropped_postgresql_connection_is_replaced(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = postgres.new_database()
    config = RunnerConfig(pool=PoolConfig(size=1), scope_root=tmp_path / "scopes")
    async with Runner.open(url, config) as runner:
        published = await runner.publish("acme", {"workflows/one.ts": SLEEPER})
        with psycopg.connect(postgres.admin_url, autocommit=True) as admin:
            database = url.rsplit("/", 1)[1]
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (database,),
            )
        # The read that meets the dropped connection is retried on a new one.
        assert await runner.store.find_snapshot("acme", published.snapshot_id) is not None


async def test_a_driver_whose_heartbeat_fails_stops_and_leaves_its_caller_alone(
    journal: str, tmp_path: Path
) -> None:
    config = RunnerConfig(pool=PoolConfig(size=1), lease_ttl_s=0.3, scope_root=tmp_path / "s")
    async with Runner.open(journal, config) as runner:
        stolen: list[int] = []

        async def slow(args: object) -> str:
            run = next(iter(await runner.list(scope="acme")))
            # Another driver takes the run over while this tool call is in flight.
            lease = await runner.store.force_lease(
                run_key("acme", run.run_id), "thief", int(time.time() * 1000), 10_000
            )
            assert lease is not None
            stolen.append(lease.epoch)
            await asyncio.sleep(1.0)
            return "too late"

        source = 'export default async (e, step) => step.tool("t", "slow", {});'
        run = await start_source(runner, source, bindings=Bindings(tools={"slow": slow}))
        task = asyncio.current_task()
        assert task is not None
        assert task.cancelling() == 0
        assert run.status == "running"  # left for the thief; nothing of the result was written
        calls = await runner.list_tool_calls(run.run_id, scope="acme")
        assert [c.result for c in calls] == [None]
        kinds = [e.type for e in await runner.store.list_events(run_key("acme", run.run_id))]
        assert "step_completed" not in kinds
        assert stolen


def test_a_batchs_usage_is_written_last_and_only_for_jobs_that_succeed(tmp_path: Path) -> None:
    """Every drive's end charges its scope's usage, and every such batch updates the same few
    rows: written at the batch's end, summed, in one order, a transaction holding them waits
    for nothing but its commit (on PostgreSQL, several workers' batches deadlocked on them
    when each job charged in its place). A job that fails charges nothing."""
    raw = connect_sqlite(tmp_path / "j.db")
    migrate(raw, location="j.db", dialect=SQLITE)
    statements: list[str] = []

    class Logged:
        in_transaction = property(lambda self: raw.in_transaction)

        def execute(self, sql: str, args: object = ()) -> object:
            statements.append(sql.split(maxsplit=1)[0] + (" usage" if "scope_usage" in sql else ""))
            return raw.execute(sql, args)  # type: ignore[arg-type]

        def executemany(self, sql: str, rows: object) -> object:
            statements.append("many" + (" usage" if "scope_usage" in sql else ""))
            return raw.executemany(sql, rows)  # type: ignore[arg-type]

    def charging(amount: float, fail: bool = False) -> Any:
        def work(tx: Any) -> None:
            tx.charge_usage("acme", [("steps", 0, amount)])
            tx.get_run("acme/none")  # more of the job after its charge
            if fail:
                raise ValueError("this job fails")

        return work

    loop = asyncio.new_event_loop()
    jobs = [
        BatchJob(charging(2), None, True, loop.create_future()),
        BatchJob(charging(5, fail=True), None, True, loop.create_future()),
        BatchJob(charging(3), None, True, loop.create_future()),
    ]

    class Backend:  # the SQLite backend's dialect and transaction, on the logged connection
        dialect = SQLITE
        marks_commits = False

        def begin(self, connection: Any, full: bool, write: bool = True) -> None:
            connection.execute("BEGIN IMMEDIATE")

    outcomes, _ = run_batch(Logged(), jobs, Backend())  # type: ignore[arg-type]
    loop.close()
    assert [ok for ok, _ in outcomes] == [True, False, True]
    assert statements[-2:] == ["INSERT usage", "COMMIT"]
    assert statements.count("INSERT usage") == 1
    amount = raw.execute("SELECT amount FROM scope_usage WHERE measure = 'steps'").fetchone()
    assert amount == (5.0,)  # 2 + 3: the failed job's 5 is not charged


@pytest.mark.slow
async def test_runners_sharing_a_bouncers_few_server_connections_all_get_through(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """Three runners through PgBouncer's transaction pooling with one server connection for
    all: each transaction may land on a session another runner used last, so nothing may
    rest on a session (a statement prepared on it, a LISTEN)."""
    url = postgres.new_database()
    source = "export default async (event, step) => await step.do('one', async () => 1);"
    with pgbouncer(postgres, pool_size=1) as bouncer:
        pooled = f"{bouncer}/{url.rsplit('/', 1)[1]}?qjsflow_pooling=transaction"
        config = RunnerConfig(pool=PoolConfig(size=1), scope_root=tmp_path / "scopes")
        async with Runner.open(pooled, config) as one:
            await one.publish("acme", {"workflows/w.ts": source})
        runners = [await Runner.connect(pooled, config) for _ in range(3)]
        try:

            async def many(runner: Runner, n: int) -> list[str]:
                done = []
                for k in range(15):
                    run = await runner.start(StartRunInput("acme", "w", "latest", None,
                                                           f"r{n}-{k}"))  # fmt: skip
                    done.append(str(run.status))
                return done

            outcomes = await asyncio.gather(*(many(r, n) for n, r in enumerate(runners)))
        finally:
            for runner in runners:
                await runner.aclose()
    assert [status for done in outcomes for status in done] == ["completed"] * 45


async def test_a_count_of_changed_rows_is_read_after_the_statements_answer(
    clocked_runner: Runner,
) -> None:
    """How many rows a statement changed is its answer's (a pipelined statement's cursor
    knows nothing before it): deleting what is not there says so, on every journal."""
    store = clocked_runner.store

    def delete(tx: JournalTransaction) -> bool:
        return tx.delete_sealed_secret("acme", "API_KEY")

    def put(tx: JournalTransaction) -> None:
        tx.put_sealed_secret("acme", "API_KEY", ("k1", "nonce", "sealed"), 1)

    assert await store.transact(delete) is False
    await store.transact(put)
    assert await store.transact(delete) is True
    assert await store.transact(lambda tx: tx.forget_workers(before=0)) == 0


async def test_a_step_read_sent_with_the_fence_answers_only_if_nothing_came_between(
    clocked_runner: Runner,
) -> None:
    """A job may name the step row it reads first: on PostgreSQL that read goes with the
    fence's, in one round trip. It answers the job's first read of that row only if the job
    sent nothing before it — a row written first is read as written."""
    run = await start_source(clocked_runner, SLEEPER)
    store = clocked_runner.store
    key = run_key("acme", run.run_id)
    lease = await store.acquire_lease(key, "me", int(time.time() * 1000), 60_000)
    assert lease is not None
    place = StepPlace(key, "tool", "t", 1)

    def read_first(tx: JournalTransaction) -> StepRow | None:
        return tx.get_step(key, "tool", "t", 1)

    def write_then_read(tx: JournalTransaction) -> str | None:
        tx.insert_step(key, "tool", "t", 1, status=StepStatus.running, attempt=1, started_at=1)
        row = tx.get_step(key, "tool", "t", 1)
        return None if row is None else row.status

    assert await store.transact(read_first, lease, step=place) is None
    assert await store.transact(write_then_read, lease, step=place) == "running"
    row = await store.transact(read_first, lease, step=place)
    assert row is not None
    assert row.attempt == 1

    def settle_then_read(tx: JournalTransaction) -> tuple[str, str | None] | None:
        # A result answered ahead and written first (runner/engine/host.py): a read of its
        # own row sent with the fence is stale, and must not answer.
        tx.settle_call_answered(place, 1, result="42", duration_ms=0, at=2)
        row = tx.get_step(key, "tool", "t", 1)
        return None if row is None else (row.status, row.output)

    assert await store.transact(settle_then_read, lease, step=place) == ("completed", "42")


async def test_a_presumed_transaction_runs_carefully_when_the_journal_says_otherwise(
    clocked_runner: Runner, journal: str
) -> None:
    """A transaction that presumes (its fence asserted, not read; a row inserted without
    reading it) commits as it is where the journal agrees; where a row is there already, a
    pause is asked or the lease is lost, nothing of it is written and the careful
    transaction runs instead. A SQLite journal, which waits for no server, is always careful."""
    run = await start_source(clocked_runner, SLEEPER)
    store = clocked_runner.store
    key = run_key("acme", run.run_id)
    lease = await store.acquire_lease(key, "me", int(time.time() * 1000), 60_000)
    assert lease is not None
    presumes = journal.startswith("postgresql://")

    def insert(name: str) -> Callable[[JournalTransaction], str]:
        def presumed(tx: JournalTransaction) -> str:
            assert not tx.pause_requested
            tx.insert_step(key, "tool", name, 1, status=StepStatus.running, attempt=1,
                           started_at=1)  # fmt: skip
            return "presumed"

        return presumed

    def careful(tx: JournalTransaction) -> str:
        return f"careful, paused: {tx.pause_requested}"

    first = await store.transact(insert("a"), lease, careful=careful)
    assert first == ("presumed" if presumes else "careful, paused: False")
    # Its row is there now: the insert fails, and nothing of it is kept.
    assert await store.transact(insert("a"), lease, careful=careful) == "careful, paused: False"
    await store.transact(lambda tx: request_pause(tx, key, 1))  # asked while the drive is on
    assert await store.transact(insert("b"), lease, careful=careful) == "careful, paused: True"
    lost = dataclasses.replace(lease, epoch=lease.epoch + 1)
    with pytest.raises(LeaseLost):
        await store.transact(insert("c"), lost, careful=careful)
    written = sorted((step.kind, step.name) for step in await store.list_steps(key))
    assert written == sorted([("sleep", "nap"), *([("tool", "a")] if presumes else [])])
