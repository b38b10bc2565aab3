"""A drive of a run no driver holds reads it without a write transaction and takes its lease
later: at its first write, after `RunDriver.take_after_s`, or in its end's own update. Two
drivers that read the same run at once record one drive; a drive that goes on without
writing shows its run leased and running, so no other driver drives it meanwhile."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from qjsflow.runner import Runner, RunnerConfig, StartRunInput
from qjsflow.runner.store import JournalTransaction, Lease
from qjsflow.runner.tenancy.budgets import Budgets
from qjsflow.runner.tenancy.scopes import run_key
from qjsflow.sandbox import PoolConfig
from tests.conftest import WAITER, never_leased_early, start_source, statements
from tests.journal_reads import query, table_counts


@asynccontextmanager
async def two_runners(journal: str, tmp_path: Path) -> AsyncIterator[tuple[Runner, Runner]]:
    """Two runners on one journal, as two worker processes would be (each its own driver id,
    connection and executors)."""
    config = RunnerConfig(pool=PoolConfig(size=1), scope_root=tmp_path / "scopes")
    async with Runner.open(journal, config) as first, Runner.open(journal, config) as second:
        yield first, second


def held_at_the_executor(runner: Runner) -> tuple[asyncio.Event, asyncio.Event]:
    """Drives of `runner` stop just before their executor, until the second event is set;
    the first is set when one gets there (its run read, its request built)."""
    arrived, go_on = asyncio.Event(), asyncio.Event()
    pool = runner.driver.pool
    drive: Callable[..., Any] = pool.drive

    async def held(*args: Any) -> Any:
        arrived.set()
        await go_on.wait()
        return await drive(*args)

    pool.drive = held  # type: ignore[method-assign,assignment]
    return arrived, go_on


def run_row(journal: str, key: str) -> tuple[Any, ...]:
    return tuple(
        query(journal, "SELECT epoch, worker_id, status, cpu_used_s FROM runs WHERE run_id = ?",
              (key,))[0]
    )  # fmt: skip


def event_types(journal: str, key: str) -> list[str]:
    rows = query(journal, "SELECT type FROM events WHERE run_id = ? ORDER BY seq", (key,))
    return [str(row[0]) for row in rows]


@dataclass
class HeldResume:
    first: Runner  # its resume of `run_id` is held just before its executor (its run read)
    second: Runner
    run_id: str
    key: str
    resumed: asyncio.Task[Any]
    go_on: asyncio.Event


@asynccontextmanager
async def a_held_resume(
    journal: str, tmp_path: Path, take_after_s: float
) -> AsyncIterator[HeldResume]:
    """Two runners on one journal, a waiting run, and the first runner's resume of it held
    just before its executor; let go at the end whatever happens (the runner's close would
    wait for it)."""
    async with two_runners(journal, tmp_path) as (first, second):
        run = await start_source(first, WAITER)
        first.driver.take_after_s = take_after_s
        arrived, go_on = held_at_the_executor(first)
        try:
            resumed = asyncio.create_task(first.resume(run.run_id, scope="acme"))
            await asyncio.wait_for(arrived.wait(), 30)
            key = run_key("acme", run.run_id)
            yield HeldResume(first, second, run.run_id, key, resumed, go_on)
        finally:
            go_on.set()


async def test_two_drivers_that_read_a_run_at_once_record_one_drive(
    journal: str, tmp_path: Path
) -> None:
    # The first's lease is taken by its end, if at all.
    async with a_held_resume(journal, tmp_path, take_after_s=60.0) as held:
        epoch, holder, status, _ = run_row(journal, held.key)
        assert holder is None  # read, not leased: nothing written
        assert status == "waiting"
        ahead = await held.second.resume(held.run_id, scope="acme")  # drives it to its wait
        assert ahead.status == "waiting"
        recorded = run_row(journal, held.key)
        assert recorded[0] == epoch + 1  # its drive moved the epoch on, leased or not
        counts, events = table_counts(journal), event_types(journal, held.key)
        held.go_on.set()
        behind = await asyncio.wait_for(held.resumed, 30)
        # The first driver's drive ran, but its end found the run taken since it read it:
        # nothing of it was written, and it returns the run as the other driver left it.
        assert behind.status == "waiting"
        assert run_row(journal, held.key) == recorded
        assert table_counts(journal) == counts
        assert event_types(journal, held.key) == events
        assert events.count("drive_started") == 2  # the start's drive, and the second's


async def test_a_drive_that_goes_on_without_writing_takes_its_lease(
    journal: str, tmp_path: Path
) -> None:
    async with a_held_resume(journal, tmp_path, take_after_s=0.05) as held:
        started = event_types(journal, held.key).count("drive_started")
        for _ in range(300):  # taken after take_after_s, by a transaction of its own
            if run_row(journal, held.key)[1] is not None:
                break
            await asyncio.sleep(0.01)
        epoch, holder, status, _ = run_row(journal, held.key)
        assert holder == held.first.driver.worker_id
        assert status == "running"
        assert event_types(journal, held.key).count("drive_started") == started + 1
        # Another driver finds it leased: it does not drive it.
        other = await held.second.resume(held.run_id, scope="acme")
        assert other.status == "running"
        assert event_types(journal, held.key).count("drive_started") == started + 1
        held.go_on.set()
        done = await asyncio.wait_for(held.resumed, 30)
        assert done.status == "waiting"
        assert run_row(journal, held.key)[:3] == (epoch, None, "waiting")  # released, same epoch


async def test_a_resumed_waiting_run_is_read_not_written_before_its_drive(
    tmp_path: Path,
) -> None:
    """Nothing is written before the drive (the reads share one read transaction); its end,
    finding the run as it read it, only reads (tests/test_quiet_end.py): what is written
    behind it touches no timer, and no column of the run's row but its compute (when a clock
    tick landed in the drive): not its status, epoch or lease, nor the indexes on them."""
    async with Runner.open(tmp_path / "journal.db") as runner:
        never_leased_early(runner)
        run = await start_source(runner, WAITER)
        with statements(runner) as seen:
            again = await runner.resume(run.run_id, scope="acme")
            answered = len(seen)
            await runner.store.caught_up()
        assert again.status == "waiting"
        sql = [text for _, text in seen[:answered] if not text.startswith("PRAGMA")]
        beginning = sql[: sql.index("COMMIT")]
        assert beginning[0] == "BEGIN", beginning
        assert all(text.startswith(("BEGIN", "SELECT")) for text in beginning), beginning
        end = sql[sql.index("COMMIT") + 1 :]
        assert end
        assert all(text.startswith("SELECT") for text in end), end
        behind = [text for _, text in seen[answered:]]
        assert behind[0] == "BEGIN IMMEDIATE", behind
        assert any(text.startswith("INSERT INTO events") for text in behind), behind
        assert not [text for text in behind if text.startswith("DELETE")], behind
        updates = [text for text in behind if text.startswith("UPDATE runs")]
        assert all(text.startswith("UPDATE runs SET cpu_used_s = cpu_used_s +") for text in updates)


async def test_a_drive_serves_the_wake_up_its_run_had_when_read(tmp_path: Path) -> None:
    """A signal left for a worker sets a wake-up timer; the drive that reads the run with it
    removes it as it begins (else the run would be woken again and again)."""
    async with Runner.open(tmp_path / "journal.db") as runner:
        run = await start_source(runner, WAITER)
        key = run_key("acme", run.run_id)
        await runner.signal(run.run_id, "other", {}, scope="acme", drive=False)
        timers = "SELECT step_key FROM timers WHERE run_id = ? AND step_key = 'signal'"
        assert len(query(str(tmp_path / "journal.db"), timers, (key,))) == 1
        with statements(runner) as seen:
            again = await runner.resume(run.run_id, scope="acme")
        assert again.status == "waiting"
        deletes = [text for _, text in seen if text.startswith("DELETE FROM timers")]
        assert len(deletes) == 1, deletes
        assert query(str(tmp_path / "journal.db"), timers, (key,)) == []


@pytest.mark.parametrize("signalled", [True, False])
async def test_a_drive_that_leases_first_deletes_wake_ups_only_when_its_run_has_one(
    tmp_path: Path, signalled: bool
) -> None:
    """A drive that takes its lease first (here: a scope whose drives are counted by their
    leases) learns from the lease's own statement whether the run has a wake-up timer: it
    removes one it has, and makes no statement to remove none."""
    config = RunnerConfig(scope_concurrency={"acme": 5})
    async with Runner.open(tmp_path / "journal.db", config) as runner:
        run = await start_source(runner, WAITER)
        key = run_key("acme", run.run_id)
        if signalled:
            await runner.signal(run.run_id, "other", {}, scope="acme", drive=False)
        timers = "SELECT step_key FROM timers WHERE run_id = ? AND step_key = 'signal'"
        assert len(query(str(tmp_path / "journal.db"), timers, (key,))) == int(signalled)
        with statements(runner) as seen:
            again = await runner.resume(run.run_id, scope="acme")
        assert again.status == "waiting"
        sql = [text for _, text in seen if not text.startswith("PRAGMA")]
        beginning = sql[: sql.index("COMMIT")]
        assert [text for text in beginning if "epoch = epoch + 1" in text], beginning
        deletes = [text for text in beginning if text.startswith("DELETE FROM timers")]
        assert len(deletes) == int(signalled), deletes
        assert query(str(tmp_path / "journal.db"), timers, (key,)) == []


@pytest.mark.parametrize("why", ["budgets", "concurrency"])
async def test_a_scope_whose_drives_are_counted_takes_the_lease_first(
    tmp_path: Path, why: str
) -> None:
    """A scope with budgets (looked at as a drive begins) or a concurrency limit (counted by
    live leases) has its runs leased before they are driven."""
    config = RunnerConfig(
        scope_budgets={"acme": Budgets(drives_per_minute=1000)} if why == "budgets" else {},
        scope_concurrency={"acme": 5} if why == "concurrency" else {},
    )
    async with Runner.open(tmp_path / "journal.db", config) as runner:
        run = await start_source(runner, WAITER)
        with statements(runner) as seen:
            again = await runner.resume(run.run_id, scope="acme")
        assert again.status == "waiting"
        sql = [text for _, text in seen if not text.startswith("PRAGMA")]
        assert sql[0] == "BEGIN IMMEDIATE", sql
        beginning = sql[: sql.index("COMMIT")]
        leases = [text for text in beginning if "epoch = epoch + 1" in text]
        assert len(leases) == 1, beginning


async def test_a_lease_taken_at_a_drives_end_is_written_by_that_job(tmp_path: Path) -> None:
    """A job that takes a read lease as a drive's end must give it up or keep it: one that
    does neither is undone (its drive's beginning with it), and the run stays as it was."""
    journal = str(tmp_path / "journal.db")
    async with Runner.open(journal) as runner:
        run = await start_source(runner, WAITER)
        key = run_key("acme", run.run_id)
        epoch = run_row(journal, key)[0]
        taken: list[bool] = []

        def begin(tx: JournalTransaction, written: bool) -> None:
            taken.append(written)
            tx.append_event(key, "drive_started", 1, None)

        lease = Lease(key, "w", epoch + 1, take=begin)
        counts = table_counts(journal)
        with pytest.raises(RuntimeError, match="neither given up nor kept"):
            await runner.store.transact(lambda tx: tx.check_fence(lease, ending=True))
        assert taken == [False]  # the beginning only: the end's update was to write the lease
        assert table_counts(journal) == counts
        assert run_row(journal, key)[:2] == (epoch, None)

        def end(tx: JournalTransaction) -> None:
            tx.check_fence(lease, ending=True)
            tx.release_lease(lease)

        await runner.store.transact(end)
        assert run_row(journal, key)[:2] == (epoch + 1, None)  # given up: the epoch moved on


# A run's journal and its open steps, as a drive begins (`load_journal`, `unsettled_steps`).
_JOURNAL_READS = ("AND settled_seq IS NOT NULL ORDER BY settled_seq", "AND settled_seq IS NULL")


@pytest.mark.parametrize("stepped", [True, False])
async def test_a_lease_that_finds_no_step_spares_the_journal_reads(
    tmp_path: Path, stepped: bool
) -> None:
    """The lease's statement that begins a drive also tells whether the run has any step: a
    run with none (one never driven, as most a worker claims) is begun without reading its
    journal or its open steps, which are empty; a run with steps reads both, and replays."""
    source = (
        'export default async (e, step) => { const n = await step.do("one", async () => 41);'
        ' return n + (await step.waitForEvent("go", { type: "go" })).payload; };'
        if stepped
        else WAITER
    )
    async with Runner.open(tmp_path / "journal.db") as runner:
        published = await runner.publish("acme", {"workflows/flow.ts": source})
        request = StartRunInput("acme", "flow", published.snapshot_id, None, "r")
        if stepped:  # driven once to its wait: one step settled, one open
            assert (await runner.start(request)).status == "waiting"
            await runner.signal("r", "go", 1, scope="acme", drive=False)
        else:
            await runner.start(request, drive=False)
        with statements(runner) as seen:
            await runner.serve(until_idle=True)
        sql = [text for _, text in seen]
        lease = next(n for n, text in enumerate(sql) if "epoch = epoch + 1" in text)
        reads = [
            text for text in sql[lease:]
            if text.startswith("SELECT") and text.endswith(_JOURNAL_READS)
        ]  # fmt: skip
        assert len(reads) == (2 if stepped else 0), sql
        done = await runner.get("r", scope="acme")
        assert (done.status, done.output) == (("completed", 42) if stepped else ("waiting", None))
