"""A drive that leaves a waiting run as it found it keeps the run's beginning: the next resume
here begins from it without reading the journal. Anything that took the run since (another
driver's drive, an operator) voids that drive, which writes nothing, and the run is read
afresh and driven again; an event delivered elsewhere is still taken; a wait whose deadline
has come is read afresh."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from qjsflow.runner import Runner, StartRunInput
from qjsflow.runner.engine.drive import kept as kept_module
from qjsflow.runner.engine.drive.kept import Kept, KeptBeginnings, OpenSteps
from qjsflow.runner.operations.control import request_pause
from qjsflow.runner.tenancy.scopes import run_key
from tests.conftest import WAITER, FakeClock, never_leased_early, start_source
from tests.test_leases_taken_late import (
    event_types,
    held_at_the_executor,
    run_row,
    two_runners,
)

TWO_WAITS = """
export default async (event, step) => {
  const first = await step.waitForEvent("first", { type: "first" });
  const second = await step.waitForEvent("second", { type: "second" });
  return [first.payload, second.payload];
};
"""


def reads_before_the_executor(runner: Runner) -> list[list[str]]:
    """For each drive of `runner` from now on, the statements its journal ran before the drive
    reached its executor (a SQLite journal)."""
    seen: list[list[str]] = []
    pending: list[str] = []
    runner.store.trace(pending.append)
    pool = runner.driver.pool
    drive: Callable[..., Any] = pool.drive

    async def noted(*args: Any) -> Any:
        seen.append(list(pending))
        return await drive(*args)

    pool.drive = noted  # type: ignore[method-assign,assignment]
    original = runner.resume

    async def resume(*args: Any, **kwargs: Any) -> Any:
        pending.clear()
        return await original(*args, **kwargs)

    runner.resume = resume  # type: ignore[method-assign]
    return seen


@dataclass
class KeptRun:
    first: Runner  # its resume of the run kept the run's beginning
    second: Runner  # another runner on the same journal
    run_id: str
    key: str


@asynccontextmanager
async def kept_run(journal: str, tmp_path: Path, source: str) -> AsyncIterator[KeptRun]:
    """Two runners on one journal, and a run of `source` the first has resumed (so kept)."""
    async with two_runners(journal, tmp_path) as (first, second):
        run = await start_source(first, source)
        resumed = await first.resume(run.run_id, scope="acme")  # reads, then keeps
        assert resumed.status == "waiting"
        await first.store.caught_up()  # its end's records, written behind (test_quiet_end.py)
        yield KeptRun(first, second, run.run_id, run_key("acme", run.run_id))


def executor_drives(runner: Runner) -> list[int]:
    """Counts the drives `runner`'s executors make from now on (one item each)."""
    made: list[int] = []
    pool = runner.driver.pool
    drive: Callable[..., Any] = pool.drive

    async def counted(*args: Any) -> Any:
        made.append(1)
        return await drive(*args)

    pool.drive = counted  # type: ignore[method-assign,assignment]
    return made


async def test_a_resume_after_a_drive_that_found_nothing_new_begins_from_it(
    journal: str, tmp_path: Path
) -> None:
    async with kept_run(journal, tmp_path, WAITER) as kept:
        # (a drive past `take_after_s`, as on a loaded machine, would take its lease)
        runner, run, key = never_leased_early(kept.first), kept, kept.key
        before = event_types(journal, key)
        epoch = run_row(journal, key)[0]
        made = executor_drives(runner)
        again = await runner.resume(run.run_id, scope="acme")
        assert again.status == "waiting"
        assert made == [1]  # one drive, from what was kept
        # Its end changed nothing of the run (no lease taken, the epoch where it was); its
        # events are written behind the answer (tests/test_quiet_end.py).
        await runner.store.caught_up()
        assert event_types(journal, key) == [*before, "drive_started", "run_suspended"]
        assert run_row(journal, key)[:3] == (epoch, None, "waiting")


async def test_a_drive_begun_from_what_was_kept_reads_nothing_first(tmp_path: Path) -> None:
    async with Runner.open(tmp_path / "journal.db") as runner:
        run = await start_source(runner, WAITER)
        await runner.resume(run.run_id, scope="acme")  # reads, then keeps
        seen = reads_before_the_executor(runner)
        for _ in range(2):  # each such drive keeps the beginning again
            again = await runner.resume(run.run_id, scope="acme")
            assert again.status == "waiting"
        assert seen == [[], []]  # nothing read, nothing written before its executor ran


async def test_a_drive_from_what_was_kept_whose_heartbeat_takes_the_lease_is_driven_once(
    journal: str, tmp_path: Path
) -> None:
    """A drive that goes on takes its lease before its end (its heartbeat, here at once): the
    row is compared with the one kept before the lease marks it running."""
    async with kept_run(journal, tmp_path, WAITER) as kept:
        runner, run, key = kept.first, kept, kept.key
        runner.driver.take_after_s = 0.0
        arrived, go_on = held_at_the_executor(runner)
        made = executor_drives(runner)
        resumed = asyncio.create_task(runner.resume(run.run_id, scope="acme"))
        try:
            await asyncio.wait_for(arrived.wait(), 30)
            for _ in range(300):  # until the heartbeat has taken the lease
                if run_row(journal, key)[1] is not None:
                    break
                await asyncio.sleep(0.01)
            assert run_row(journal, key)[1:3] == (runner.driver.worker_id, "running")
        finally:
            go_on.set()
        done = await asyncio.wait_for(resumed, 30)
        assert done.status == "waiting"
        assert made == [1]
        # What that drive kept (its lease given up with the run's last update) is the row.
        await runner.resume(run.run_id, scope="acme")
        assert made == [1, 1]


async def test_a_pause_asked_elsewhere_since_is_lifted_by_the_resume(
    journal: str, tmp_path: Path
) -> None:
    """A pause asked (and not yet parked: its asker stopped) moves no epoch; the row kept is
    no longer the row, so the resume reads the run afresh and lifts the pause, as it would
    have without what was kept."""
    async with kept_run(journal, tmp_path, WAITER) as kept:
        first, second, run, key = kept.first, kept.second, kept, kept.key
        await second.store.transact(partial(request_pause, key=key, now=second.driver.now_ms()))
        resumed = await first.resume(run.run_id, scope="acme")
        assert resumed.status == "waiting"
        stored = await first.store.get_run(key)
        assert stored is not None
        assert not stored.pause_requested
        assert "run_paused" not in event_types(journal, key)
        assert event_types(journal, key)[-3:] == ["run_resumed", "drive_started", "run_suspended"]


async def test_a_run_driven_elsewhere_since_is_read_afresh_and_driven_again(
    journal: str, tmp_path: Path
) -> None:
    async with kept_run(journal, tmp_path, TWO_WAITS) as kept:  # kept at its first wait
        first, second, run, key = kept.first, kept.second, kept, kept.key
        moved = await second.signal(run.run_id, "first", "a", scope="acme")
        assert (moved.status, moved.waiting_for) == ("waiting", "second")
        drives = event_types(journal, key).count("drive_started")
        # The first begins from what it kept (the first wait, unanswered): that drive's end
        # finds the run taken since, writes nothing, and the run is read and driven again.
        resumed = await first.resume(run.run_id, scope="acme")
        assert (resumed.status, resumed.waiting_for) == ("waiting", "second")
        await first.store.caught_up()  # (the drive again changed nothing: written behind)
        assert event_types(journal, key).count("drive_started") == drives + 1
        done = await first.signal(run.run_id, "second", "b", scope="acme")
        assert done.status == "completed"
        assert done.output == ["a", "b"]


async def test_a_run_that_ended_elsewhere_since_is_returned_as_it_ended(
    journal: str, tmp_path: Path
) -> None:
    async with kept_run(journal, tmp_path, WAITER) as kept:
        first, second, run, key = kept.first, kept.second, kept, kept.key
        done = await second.signal(run.run_id, "go", {"n": 1}, scope="acme")
        assert done.status == "completed"
        events, row = event_types(journal, key), run_row(journal, key)
        resumed = await first.resume(run.run_id, scope="acme")
        assert resumed.status == "completed"
        assert resumed.output == {"n": 1}
        assert event_types(journal, key) == events  # its drive from what it kept left nothing
        assert run_row(journal, key) == row


async def test_an_event_delivered_elsewhere_is_taken_by_a_drive_begun_from_what_was_kept(
    journal: str, tmp_path: Path
) -> None:
    """An event moves no epoch: the drive from what was kept replays to the wait, and its end,
    looking at the inbox, drives the run again to take it."""
    async with kept_run(journal, tmp_path, WAITER) as kept:
        first, second, run = kept.first, kept.second, kept
        woken = await second.signal(run.run_id, "go", "late", scope="acme", drive=False)
        assert woken.status == "waiting"
        done = await first.resume(run.run_id, scope="acme")
        assert done.status == "completed"
        assert done.output == "late"


async def test_an_event_delivered_here_drops_what_was_kept(tmp_path: Path) -> None:
    async with Runner.open(tmp_path / "journal.db") as runner:
        run = await start_source(runner, WAITER)
        await runner.resume(run.run_id, scope="acme")
        assert len(runner.driver.kept) == 1
        await runner.signal(run.run_id, "go", 1, scope="acme", drive=False)
        assert len(runner.driver.kept) == 0
        seen = reads_before_the_executor(runner)
        done = await runner.resume(run.run_id, scope="acme")
        assert done.status == "completed"
        assert done.output == 1
        assert seen
        assert seen[0]  # read first: the event was in the inbox by then


async def test_a_wait_whose_deadline_has_come_is_read_afresh(
    clocked_runner: Runner, clock: FakeClock, journal: str
) -> None:
    source = """
    export default async (event, step) => {
      try { await step.waitForEvent("approval", { type: "approve", timeout: "1 minute" }); }
      catch (error) { return error.name; }
    };
    """
    run = await start_source(clocked_runner, source)
    await clocked_runner.resume(run.run_id, scope="acme")  # keeps it
    clock.advance(60)
    if journal.endswith(".db"):
        seen = reads_before_the_executor(clocked_runner)
    done = await clocked_runner.resume(run.run_id, scope="acme")
    assert done.status == "completed"
    assert done.output == "WaitForEventTimeoutError"
    if journal.endswith(".db"):
        assert len(seen) == 1  # one drive, which read the run first
        assert seen[0]


async def test_a_run_cancelled_since_is_cancelled_not_driven_on(
    journal: str, tmp_path: Path
) -> None:
    async with kept_run(journal, tmp_path, WAITER) as kept:
        first, second, run = kept.first, kept.second, kept
        cancelled = await second.cancel(run.run_id, scope="acme")
        assert cancelled.status == "cancelled"
        resumed = await first.resume(run.run_id, scope="acme")
        assert resumed.status == "cancelled"


def _kept(run_id: str, chars: int) -> Kept:
    record = SimpleNamespace(run_id=run_id)  # only its run_id is read when keeping
    return Kept(record, 1, (), OpenSteps((), ()), chars)  # type: ignore[arg-type]


def test_what_is_kept_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kept_module, "RUNS_KEPT", 3)
    monkeypatch.setattr(kept_module, "CHARS_KEPT", 100)
    beginnings = KeptBeginnings()
    for n in range(5):
        beginnings.keep(_kept(f"r{n}", 10))
    assert len(beginnings) == 3  # the least recently kept went first
    assert beginnings.forget("r1") is None
    assert beginnings.forget("r4") is not None
    beginnings.keep(_kept("big", 91))  # past the characters kept: the oldest go
    assert len(beginnings) == 1
    beginnings.keep(_kept("huge", 101))  # never kept alone past the bound
    assert beginnings.forget("huge") is None


async def test_a_run_started_anew_keeps_nothing(tmp_path: Path) -> None:
    """Only a drive that left the run as it found it keeps its beginning: not the start's."""
    async with Runner.open(tmp_path / "journal.db") as runner:
        published = await runner.publish("acme", {"workflows/flow.ts": WAITER})
        await runner.start(StartRunInput("acme", "flow", published.snapshot_id, None, "s1"))
        assert len(runner.driver.kept) == 0
