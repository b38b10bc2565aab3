"""A drive that took no lease, sent nothing and suspended where it began ends with a read: if
the run is still as the drive read it (row, epoch, no lease, no wake-up, nothing arrived or due
for its waits), nothing of the run is written and the caller has its answer at once; the
drive's two events and its scope's usage are written behind the answer. Anything that changed
while the drive ran gets the full end, as before. Reads of the store wait for what was written
behind."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from functools import partial
from pathlib import Path

import pytest

from qjsflow.runner import Runner, RunnerConfig
from qjsflow.runner.operations.control import request_pause
from qjsflow.runner.store import JournalTransaction
from tests.conftest import WAITER, never_leased_early, start_source, statements
from tests.journal_reads import execute, query
from tests.test_kept_beginnings import executor_drives, kept_run
from tests.test_leases_taken_late import event_types, held_at_the_executor

_WRITES = ("BEGIN IMMEDIATE", "INSERT", "UPDATE", "DELETE")


def _drives_used(journal: str) -> float:
    rows = query(journal, "SELECT sum(amount) FROM scope_usage WHERE measure = 'drives'", ())
    return float(rows[0][0] or 0)


async def test_a_drive_that_changed_nothing_writes_nothing_before_its_answer(
    tmp_path: Path,
) -> None:
    journal = str(tmp_path / "journal.db")
    async with Runner.open(journal) as runner:
        never_leased_early(runner)
        run = await start_source(runner, WAITER)
        await runner.resume(run.run_id, scope="acme")  # keeps its beginning
        await runner.store.caught_up()
        key = f"acme/{run.run_id}"
        row = query(journal, "SELECT * FROM runs WHERE run_id = ?", (key,))
        events, drives = event_types(journal, key), _drives_used(journal)
        with statements(runner) as seen:
            again = await runner.resume(run.run_id, scope="acme")
        assert again.status == "waiting"
        written = [sql for _, sql in seen if sql.lstrip().upper().startswith(_WRITES)]
        assert written == []  # the end only read the run
        assert query(journal, "SELECT * FROM runs WHERE run_id = ?", (key,)) == row
        await runner.store.caught_up()
        # Written behind: the drive's events, with no lease's epoch, and its usage.
        assert event_types(journal, key) == [*events, "drive_started", "run_suspended"]
        epochs = query(journal, "SELECT epoch FROM events WHERE run_id = ? ORDER BY seq", (key,))
        assert [epoch for (epoch,) in epochs[-2:]] == [None, None]
        assert _drives_used(journal) == drives + 1


BUSY_WAITER = """
export default async (event, step) => {
  let spin = 0;
  for (let i = 0; i < 4e6; i++) spin += i % 7;  // compute enough for the clock's ticks
  return (await step.waitForEvent("go", { type: "go" })).payload;
};
"""


def _epoch(journal: str, key: str) -> int:
    return int(query(journal, "SELECT epoch FROM runs WHERE run_id = ?", (key,))[0][0])


def _cpu_used(journal: str, key: str) -> float:
    return float(query(journal, "SELECT cpu_used_s FROM runs WHERE run_id = ?", (key,))[0][0])


async def test_a_drive_that_used_compute_adds_it_behind_its_answer_and_ends_quietly_again(
    journal: str, tmp_path: Path
) -> None:
    """Its compute is the one thing of the run such a drive changes: added to the run's row
    behind the answer, and to the row kept, so the next such drive finds the run as kept
    (the same sum, on either journal)."""
    config = RunnerConfig(scope_root=tmp_path / "scopes")
    async with Runner.open(journal, config) as runner:
        never_leased_early(runner)
        run = await start_source(runner, BUSY_WAITER)
        await runner.resume(run.run_id, scope="acme")  # keeps its beginning
        await runner.store.caught_up()
        key = f"acme/{run.run_id}"
        made = executor_drives(runner)
        sqlite = journal.endswith(".db")
        for drives in (1, 2):
            used, epoch = _cpu_used(journal, key), _epoch(journal, key)
            traced: contextlib.AbstractContextManager[list[tuple[bool, str]]] = (
                statements(runner) if sqlite else contextlib.nullcontext([])
            )
            with traced as seen:
                again = await runner.resume(run.run_id, scope="acme")
            assert again.status == "waiting"
            # Found as kept, compute and all: no lease taken, nothing written before the
            # answer (a server journal's statements are not traced: its epoch says it).
            assert _epoch(journal, key) == epoch
            assert [sql for _, sql in seen if sql.lstrip().upper().startswith(_WRITES)] == []
            assert made == [1] * drives  # one drive each
            await runner.store.caught_up()
            assert _cpu_used(journal, key) > used  # its compute, added behind the answer


async def test_records_written_behind_are_fenced_by_the_epoch_the_drive_read(
    journal: str, tmp_path: Path
) -> None:
    """A driver elsewhere takes the run (its epoch moves on) after the answer, before the
    drive's records are queued: they are written as a drive's writes are, fenced, so none."""
    async with kept_run(journal, tmp_path, WAITER) as kept:
        runner, key = never_leased_early(kept.first), kept.key
        events, used = event_types(journal, key), _cpu_used(journal, key)
        again = await runner.resume(kept.run_id, scope="acme")
        assert again.status == "waiting"
        # (no await since the answer: the records are not queued yet)
        assert execute(journal, "UPDATE runs SET epoch = epoch + 1 WHERE run_id = ?", (key,))
        await runner.store.caught_up()
        assert event_types(journal, key) == events
        assert _cpu_used(journal, key) == used


async def test_an_event_delivered_elsewhere_while_the_drive_ran_is_taken(
    journal: str, tmp_path: Path
) -> None:
    """The drive from what was kept replays to the wait before the event is there; its end,
    finding it arrived, is written in full and drives the run again to take it."""
    async with kept_run(journal, tmp_path, WAITER) as kept:
        first, second, run = never_leased_early(kept.first), kept.second, kept
        arrived, go_on = held_at_the_executor(first)
        resumed = asyncio.create_task(first.resume(run.run_id, scope="acme"))
        try:
            await asyncio.wait_for(arrived.wait(), 30)
            await second.signal(run.run_id, "go", "meanwhile", scope="acme", drive=False)
        finally:
            go_on.set()
        done = await resumed
        assert (done.status, done.output) == ("completed", "meanwhile")


async def test_a_pause_asked_elsewhere_while_the_drive_ran_is_lifted_by_the_resume(
    journal: str, tmp_path: Path
) -> None:
    """A pause asked mid-drive changes the run's row and no epoch: the end, finding the row
    changed, is written in full; the resume reads the run afresh and lifts the pause."""
    async with kept_run(journal, tmp_path, WAITER) as kept:
        first, second, run, key = never_leased_early(kept.first), kept.second, kept, kept.key
        arrived, go_on = held_at_the_executor(first)
        resumed = asyncio.create_task(first.resume(run.run_id, scope="acme"))
        try:
            await asyncio.wait_for(arrived.wait(), 30)
            await second.store.transact(partial(request_pause, key=key, now=second.driver.now_ms()))
        finally:
            go_on.set()
        assert (await resumed).status == "waiting"
        stored = await first.store.get_run(key)
        assert stored is not None
        assert not stored.pause_requested
        assert "run_resumed" in event_types(journal, key)


def _noted(run_id: str, tx: JournalTransaction) -> None:
    tx.append_event(run_id, "noted", 1, None)


async def test_what_is_written_behind_is_read_by_this_store_at_once(runner: Runner) -> None:
    run = await start_source(runner, WAITER)
    key = f"acme/{run.run_id}"
    before = len(await runner.store.list_events(key))
    runner.store.write_behind(partial(_noted, key))
    # Queued, not yet committed: the read waits for it.
    assert [e.type for e in await runner.store.list_events(key)][before:] == ["noted"]
    runner.store.write_behind(partial(_noted, key))
    assert await runner.store.get_run(key) is not None
    assert [e.type for e in await runner.store.list_events(key)][before:] == ["noted", "noted"]


def _refused(tx: JournalTransaction) -> None:
    raise ValueError("refused by the test")


async def test_a_record_written_behind_that_fails_is_logged_and_nothing_else_fails(
    runner: Runner, caplog: pytest.LogCaptureFixture
) -> None:
    run = await start_source(runner, WAITER)
    key = f"acme/{run.run_id}"
    with caplog.at_level(logging.WARNING, logger="qjsflow.journal"):
        runner.store.write_behind(_refused)
        runner.store.write_behind(partial(_noted, key))  # its own job: not rolled back with it
        events = await runner.store.list_events(key)
    assert events[-1].type == "noted"
    assert "a record written behind was lost: refused by the test" in caplog.text
    again = await runner.resume(run.run_id, scope="acme")
    assert again.status == "waiting"


def _failing_follow_up(written: object, mark: bytes | None) -> None:
    raise RuntimeError("follow-up refused by the test")


async def test_a_follow_up_that_fails_is_logged_and_the_batch_is_still_answered(
    runner: Runner, caplog: pytest.LogCaptureFixture
) -> None:
    """What is told a record's commit (a quiet end's certification: tests/test_certified_end
    .py) runs as the batch's answers are given; one that fails stops none of them."""
    run = await start_source(runner, WAITER)
    key = f"acme/{run.run_id}"
    with caplog.at_level(logging.ERROR, logger="qjsflow.journal"):
        runner.store.write_behind(partial(_noted, key), then=_failing_follow_up)
        runner.store.write_behind(partial(_noted, key))
        await asyncio.wait_for(runner.store.caught_up(), 30)
        await asyncio.wait_for(runner.store.transact(partial(_after, key)), 30)
    types = [e.type for e in await runner.store.list_events(key)]
    assert types[-3:] == ["noted", "noted", "after"]
    assert "a committed job's follow-up failed" in caplog.text


def _after(run_id: str, tx: JournalTransaction) -> None:
    tx.append_event(run_id, "after", 2, None)


async def test_a_transaction_asked_for_after_a_record_written_behind_commits_after_it(
    runner: Runner,
) -> None:
    """Written behind means queued once the caller has gone on, or as soon as anything else
    is asked of the journal: the journal's order is the order things were asked for."""
    run = await start_source(runner, WAITER)
    key = f"acme/{run.run_id}"
    runner.store.write_behind(partial(_noted, key))
    await runner.store.transact(partial(_after, key))  # nothing queued: it could commit here
    runner.store.write_behind(partial(_noted, key))
    await runner.store.transact_soon(partial(_after, key))
    types = [e.type for e in await runner.store.list_events(key)]
    assert types[-4:] == ["noted", "after", "noted", "after"]
