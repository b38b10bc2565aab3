"""Where a SQLite journal's transactions run: on the event loop's own thread while at most one
drive is in progress (two wake-ups fewer each), on the journal's thread otherwise — and never
with the loop waiting for another process's write lock."""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from qjsflow.runner import Runner, StartRunInput
from qjsflow.runner.store import JournalStore, JournalTransaction, RunRecord
from qjsflow.runner.store import committer as committer_module
from qjsflow.runner.store.connection import JobThread
from tests.conftest import WAITER, never_leased_early, start_source, statements

TEN = """
export default async (event, step) => {
  let total = 0;
  for (let i = 0; i < 10; i++) total += await step.do("s" + i, async () => i);
  return total;
};
"""


async def _published(runner: Runner) -> str:
    return (await runner.publish("acme", {"workflows/flow.ts": TEN})).snapshot_id


async def test_a_lone_drive_commits_on_the_loops_thread(tmp_path: Path) -> None:
    async with Runner.open(tmp_path / "journal.db") as runner:
        snapshot = await _published(runner)
        await runner.start(StartRunInput("acme", "flow", snapshot, {}, "first"))  # reads its bundle
        with statements(runner) as seen:
            run = await runner.start(StartRunInput("acme", "flow", snapshot, {}, "lone"))
        assert run.output == 45
        assert seen
        assert all(here for here, _ in seen)


async def test_a_lone_transaction_is_committed_by_the_task_that_asks(tmp_path: Path) -> None:
    """Nothing queued, nothing being committed, one drive: its transactions (a resumed
    waiting run's read, and its end's read) run in the drive's own task, on the loop's
    thread, before any committer task runs: the one made is for what is written behind the
    answer (tests/test_quiet_end.py)."""
    async with Runner.open(tmp_path / "journal.db") as runner:
        never_leased_early(runner)
        run = await start_source(runner, WAITER)
        loop = asyncio.get_running_loop()
        made: list[str] = []

        def counting(loop: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Task[Any]:
            made.append(coro.__qualname__)
            return asyncio.Task(coro, loop=loop, **kw)

        loop.set_task_factory(counting)
        try:
            with statements(runner) as seen:
                again = await runner.resume(run.run_id, scope="acme")
        finally:
            loop.set_task_factory(None)
        assert again.status == "waiting"
        assert all(here for here, _ in seen)
        assert sum(1 for _, sql in seen if sql == "COMMIT") == 1
        assert not [sql for _, sql in seen if sql.startswith(("INSERT", "UPDATE"))], seen
        # The only tasks made are the journal's own committer's (what is written behind).
        assert all(name.split(".")[0] == "JournalCore" for name in made), made


async def test_many_drives_commit_on_the_journals_thread(tmp_path: Path) -> None:
    """The loop commits a transaction itself only while at most one drive is in progress (as
    the first starts, or the last ends): with more, it would hold every other drive waiting.
    Each transaction begun on the loop's thread notes, as it begins, how many drives there
    were (the decision and the BEGIN are one synchronous stretch of the loop)."""
    async with Runner.open(tmp_path / "journal.db") as runner:
        snapshot = await _published(runner)
        for n in range(30):
            request = StartRunInput("acme", "flow", snapshot, {}, f"r{n}")
            await runner.start(request, drive=False)
        loop_thread = threading.get_ident()
        on_loop: list[bool] = []  # for each BEGIN on the loop's thread: were drives alone?
        on_thread: list[str] = []

        def note(sql: str) -> None:
            if not sql.startswith("BEGIN"):
                return
            if threading.get_ident() == loop_thread:
                on_loop.append(len(runner.driver.active) <= 1)
            else:
                on_thread.append(sql)

        runner.store.trace(note)
        try:
            await runner.serve(until_idle=True, concurrency=30)
        finally:
            runner.store.trace(None)
        assert on_thread, "thirty drives in flight, and none committed on the journal's thread"
        assert all(on_loop), f"{on_loop.count(False)} committed on the loop among many drives"
        for n in range(30):
            done = await runner.store.get_run(f"acme/r{n}")
            assert done is not None
            assert done.status == "completed"


async def test_the_loop_never_waits_for_another_process_lock(tmp_path: Path) -> None:
    """Another process holds the journal's write lock for 0.4 s: the lone drive's transaction
    goes to the journal's thread, which waits, while the event loop goes on."""
    async with Runner.open(tmp_path / "journal.db") as runner:
        snapshot = await _published(runner)
        other = sqlite3.connect(tmp_path / "journal.db", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        ticks: list[float] = []

        async def tick() -> None:
            while True:
                ticks.append(time.monotonic())
                await asyncio.sleep(0.01)

        ticking = asyncio.get_running_loop().create_task(tick())
        asyncio.get_running_loop().call_later(0.4, other.execute, "COMMIT")
        began = time.monotonic()
        try:
            run = await runner.start(StartRunInput("acme", "flow", snapshot, {}, "late"))
        finally:
            ticking.cancel()
            other.close()
        assert run.output == 45
        assert time.monotonic() - began >= 0.4  # it did wait for the lock
        gaps = [later - earlier for earlier, later in itertools.pairwise(ticks)]
        assert max(gaps) < 0.2, f"the event loop stalled for {max(gaps):.2f} s"


async def test_a_job_counts_until_it_is_done_even_if_its_waiter_left() -> None:
    """The thread's connection is free for the loop's thread only when no job is running on
    it: a job whose waiter was cancelled still runs to its end."""
    thread = JobThread("test-jobs")
    try:
        waiter = asyncio.get_running_loop().create_task(thread.run(time.sleep, 0.3))
        await asyncio.sleep(0.05)
        assert not thread.idle
        waiter.cancel()
        await asyncio.sleep(0.05)
        assert not thread.idle, "the job still runs on the thread"
        await asyncio.sleep(0.4)
        assert thread.idle
    finally:
        thread.stop()


async def test_a_read_on_the_loops_thread_that_finds_the_journal_locked_goes_to_the_journals_thread(
    tmp_path: Path,
) -> None:
    """A drive's end that only reads (tests/test_quiet_end.py) reads on the loop's thread with
    no busy timeout; a journal another process holds (in WAL mode, only while it recovers
    the journal; here the error is raised as SQLite would) sends the read to the journal's
    thread, which waits as usual (not the loop's again, after a retry's back-off)."""
    async with Runner.open(tmp_path / "journal.db") as runner:
        run = await start_source(runner, WAITER)
        key = f"acme/{run.run_id}"
        threads: list[int] = []

        def work(tx: JournalTransaction) -> RunRecord | None:
            threads.append(threading.get_ident())
            if len(threads) == 1:
                raise sqlite3.OperationalError("database is locked")
            return tx.get_run(key)

        found = await runner.store.read(work, here=True)
        assert found is not None
        assert found.run_id == key
        assert threads[0] == threading.get_ident()  # first on the loop's thread
        assert threads[1] != threading.get_ident()  # then on the journal's


async def test_a_batch_serving_several_drives_is_committed_on_the_journals_thread(
    tmp_path: Path,
) -> None:
    """With one drive in progress the loop may commit that drive's batch itself, but a batch
    of several drives' jobs (a burst of leases for the runs a worker claimed) goes to the
    journal's thread: on the loop it would hold it until the last was in, every drive it
    answers and everything else waiting."""
    async with Runner.open(tmp_path / "journal.db") as runner:
        snapshot = await _published(runner)
        for key in ("one", "two"):
            await runner.start(StartRunInput("acme", "flow", snapshot, {}, key), drive=False)
        store = runner.store

        def leasing(run_id: str) -> Any:
            return lambda tx: tx.acquire_lease(run_id, "w", 0, 60_000)

        one, two = [await store.transact(leasing(key)) for key in ("acme/one", "acme/two")]
        assert one is not None
        assert two is not None
        store.commit_here = lambda: True
        loop_thread = threading.get_ident()

        def noting(threads: list[int]) -> Any:
            def work(tx: JournalTransaction) -> None:
                threads.append(threading.get_ident())

            return work

        mine: list[int] = []
        await asyncio.gather(*(store.transact_soon(noting(mine), one) for _ in range(3)))
        assert mine == [loop_thread] * 3  # one drive's: on the loop, as before

        several: list[int] = []
        await asyncio.gather(*(store.transact_soon(noting(several), f) for f in (one, two, one)))
        assert len(several) == 3
        assert loop_thread not in several


async def test_jobs_needing_no_fsync_are_committed_sixteen_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Leases and writes behind an answer need no fsync: a burst of them is committed in
    batches of at most sixteen, so the first drives of a worker's claim start when theirs are
    in. A burst holding a job that must be durable is one batch (one fsync)."""
    sizes: list[int] = []
    batch_of = committer_module.run_batch

    def counted(connection: Any, batch: list[Any], backend: Any) -> Any:
        sizes.append(len(batch))
        return batch_of(connection, batch, backend)

    monkeypatch.setattr(committer_module, "run_batch", counted)
    store = await JournalStore.open(tmp_path / "journal.db")
    try:
        for durable in (False, True):
            await asyncio.gather(
                *(store.transact_soon(lambda tx: None, durable=durable) for _ in range(40))
            )
        assert sizes == [16, 16, 8, 40]
    finally:
        await store.aclose()
