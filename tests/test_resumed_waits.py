"""A recorded wait with nothing to take is answered in the drive, and a drive that finds its
run as it was ends without an fsync (docs/ARCHITECTURE.md, "Waits the drive answers itself")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from qjsflow.bridge.types import DriveOutcome, DriveRequest, OpEnvelope
from qjsflow.runner import Runner, RunnerConfig
from qjsflow.runner.engine.drive.ending import finish, record_unchanged_end
from qjsflow.runner.store import JournalStore
from qjsflow.runner.tenancy.budgets import Budgets
from qjsflow.sandbox import ExecutorPool
from tests.conftest import FakeClock, start_source

WAITER = """
export default async (event, step) => {
  const got = await step.waitForEvent("approval", { type: "go", timeout: "1 hour" });
  return got.payload;
};
"""


@pytest.fixture
def ends(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each drive's end was committed durably (fsynced), in order (the records of an
    end that changed nothing are written behind it, never fsynced: tests/test_quiet_end.py)."""
    seen: list[bool] = []
    original = JournalStore.transact
    behind = JournalStore.write_behind

    async def watching(self: JournalStore, work: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(work, "func", None) is finish:
            seen.append(kwargs.get("durable", True))
        return await original(self, work, *args, **kwargs)

    def written_behind(self: JournalStore, work: Any, then: Any = None) -> None:
        if work.func is record_unchanged_end:
            seen.append(False)
        behind(self, work, then)

    monkeypatch.setattr(JournalStore, "transact", watching)
    monkeypatch.setattr(JournalStore, "write_behind", written_behind)
    return seen


async def test_a_resumed_wait_with_nothing_to_take_suspends_without_asking_the_host(
    clocked_runner: Runner, frames: list[list[OpEnvelope]]
) -> None:
    runner = clocked_runner
    run = await start_source(runner, WAITER, run_id="w")
    assert (run.status, run.waiting_for) == ("waiting", "go")
    asked = len(frames)
    again = await runner.resume("w", scope="acme")
    assert (again.status, again.waiting_for, again.wake_at) == ("waiting", "go", run.wake_at)
    assert len(frames) == asked  # the drive sent the host nothing
    done = await runner.signal("w", "go", {"ok": 1}, scope="acme")
    assert (done.status, done.output) == ("completed", {"ok": 1})


async def test_an_event_that_arrives_after_the_drive_looked_still_wakes_the_run(
    clocked_runner: Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The drive's beginning saw no event, so the sandbox suspends on the wait unasked; the
    event delivered meanwhile is seen as the drive ends, and the run is driven again."""
    runner = clocked_runner
    await start_source(runner, WAITER, run_id="late")
    original = ExecutorPool.drive
    delivered: list[str] = []

    async def deliver_first(self: ExecutorPool, request: DriveRequest, host: Any) -> DriveOutcome:
        if not delivered:
            delivered.append(request.run_id)
            assert request.waiting == (("waitForEvent:1:approval", "go"),)
            await runner.signal("late", "go", "meanwhile", scope="acme", drive=False)
        return await original(self, request, host)

    monkeypatch.setattr(ExecutorPool, "drive", deliver_first)
    done = await runner.resume("late", scope="acme")
    assert delivered == ["late"]
    assert (done.status, done.output) == ("completed", "meanwhile")


async def test_a_wait_with_an_event_or_past_its_deadline_is_asked_of_the_host(
    clocked_runner: Runner, clock: FakeClock, frames: list[list[OpEnvelope]]
) -> None:
    runner = clocked_runner
    await start_source(runner, WAITER, run_id="ready")
    await runner.signal("ready", "go", "first", scope="acme", drive=False)
    asked = len(frames)
    done = await runner.resume("ready", scope="acme")
    assert (done.status, done.output) == ("completed", "first")
    assert len(frames) > asked
    await start_source(runner, WAITER, run_id="late")
    clock.advance(3600)  # the wait's deadline: the host times it out
    asked = len(frames)
    timed_out = await runner.resume("late", scope="acme")
    assert timed_out.status == "failed"
    assert "timed out after 3600000 ms" in (timed_out.error or "")
    assert len(frames) > asked


async def test_a_scope_with_budgets_asks_the_host_for_every_wait(
    tmp_path: Path, frames: list[list[OpEnvelope]]
) -> None:
    """A spent budget parks the run at its next call, a wait included (runner/tenancy/budgets.py):
    such a scope's waits are never answered in the drive."""
    config = RunnerConfig(scope_budgets={"acme": Budgets(steps_per_day=1000)})
    async with Runner.open(tmp_path / "j.db", config) as runner:
        await start_source(runner, WAITER, run_id="capped")
        asked = len(frames)
        again = await runner.resume("capped", scope="acme")
        assert again.status == "waiting"
        assert len(frames) == asked + 1


async def test_only_a_drive_that_finds_its_run_as_it_was_ends_without_an_fsync(
    clocked_runner: Runner, ends: list[bool]
) -> None:
    runner = clocked_runner
    await start_source(runner, WAITER, run_id="w")
    assert ends == [True]  # the run was created: its first drive's end is durable
    await runner.resume("w", scope="acme")
    assert ends == [True, False]  # resumed to the same wait, with nothing written
    await runner.pause("w", scope="acme")
    await runner.resume("w", scope="acme")  # lifts the pause: the caller's change lasts
    assert ends[2:] == [True]
    done = await runner.signal("w", "go", 7, scope="acme")  # the event is consumed
    assert (done.status, done.output, ends[3:]) == ("completed", 7, [True])
