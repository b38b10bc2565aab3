"""Which journal commits are fsynced: those that settle an effect, a suspension or the end;
never the result of a step whose body made no effect (docs/PERFORMANCE.md, Durable writes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from qjsflow.runner import (
    Bindings,
    Runner,
    SnapshotNotFound,
    StartRunInput,
    current_tool_call,
)
from qjsflow.runner.store import committer, connection
from tests.conftest import start_source

T = TypeVar("T")

PURE = """
export default async (event, step) => {
  let total = 0;
  for (let i = 0; i < 10; i++) total += await step.do("pure " + i, async () => i);
  return total;
};
"""
WITH_EFFECT = """
export default async (event, step) => {
  const a = await step.do("pure", async () => 1);
  const b = await step.do("outer", async () =>
    await step.do("inner", async () => await step.tool("t", "count", {})));
  return [a, b];
};
"""


def _recorded(monkeypatch: pytest.MonkeyPatch, what: Callable[[list[Any]], T]) -> list[T]:
    """`what` of each batch committed from now on, in order."""
    seen: list[T] = []
    original = committer.run_batch

    def recording(connection: Any, batch: list[Any], backend: Any) -> Any:
        seen.append(what(batch))
        return original(connection, batch, backend)

    monkeypatch.setattr(committer, "run_batch", recording)
    return seen


@pytest.fixture
def fsynced(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Each committed batch: whether it was fsynced."""
    return _recorded(monkeypatch, lambda batch: any(job.durable for job in batch))


@pytest.fixture
def jobs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each committed batch: how many jobs it held."""
    return _recorded(monkeypatch, len)


async def test_pure_step_results_ride_on_the_next_durable_commit(
    runner: Runner, fsynced: list[bool]
) -> None:
    await runner.publish("acme", {"workflows/flow.ts": PURE})
    fsynced.clear()
    run = await start_source(runner, PURE)
    assert run.output == 45
    # One: the run's end. Its creation (made with its first drive's beginning) and its ten
    # steps ride on it; the steps, written behind, are in the end's own commit.
    assert fsynced == [False, True]


async def test_a_drives_last_results_are_written_in_its_ends_own_job(
    runner: Runner, jobs: list[int]
) -> None:
    """The results that come with a drive's outcome await no answer: they are held and
    written first in the drive's end, one job of one commit (not a job of their own before
    it, each waiting for the server)."""
    await runner.publish("acme", {"workflows/flow.ts": PURE})
    jobs.clear()
    run = await start_source(runner, PURE)
    assert run.output == 45
    assert jobs == [1, 1]  # the start with the drive's beginning; the end with the results
    assert len(await runner.list_steps(run.run_id, scope="acme")) == 10


BIG_RESULTS = """
export default async (event, step) => {
  let total = 0;
  for (let i = 0; i < 3; i++) total += (await step.do("big " + i, async () => "x".repeat(100000))).length;
  return total + await step.do("small", async () => 1);
};
"""


async def test_results_a_sandbox_sends_to_free_its_memory_are_written_at_once(
    runner: Runner, jobs: list[int]
) -> None:
    """Results the sandbox sends past 256 kB to free its memory are written at once, as a
    job of their own, not held in the host's memory until the drive's end."""
    await runner.publish("acme", {"workflows/flow.ts": BIG_RESULTS})
    jobs.clear()
    run = await start_source(runner, BIG_RESULTS)
    assert run.output == 300001
    # The start; the big results sent early, as their own job; the end, the last held into it.
    assert jobs == [1, 1, 1]


async def test_a_step_whose_body_made_an_effect_is_fsynced(
    runner: Runner, fsynced: list[bool]
) -> None:
    calls = 0

    async def count(args: Any) -> int:
        nonlocal calls
        calls += 1
        return calls

    await runner.publish("acme", {"workflows/flow.ts": WITH_EFFECT})
    fsynced.clear()
    run = await start_source(runner, WITH_EFFECT, bindings=Bindings(tools={"count": count}))
    assert run.output == [1, 1]
    # Created with the drive's beginning; the tool's start (the run's creation and `pure`,
    # which awaited no answer, ride on it), `inner` (the tool's result, answered at once, is
    # written first in it), `outer` (each enclosing the tool), the end.
    assert fsynced == [False, True, True, True, True]


TEN_CALLS = """
export default async (event, step) => {
  const seen = [];
  for (let i = 0; i < 10; i++) seen.push(await step.tool("call " + i, "look", {}));
  return seen;
};
"""


async def test_a_tools_result_rides_on_the_next_calls_start(
    runner: Runner, fsynced: list[bool]
) -> None:
    """A call's value is answered at once and its result written first in the drive's next
    transaction: ten calls are ten fsynced starts and the end, not twenty and the end. Each
    call is made with every result before it in the journal."""

    async def look(args: Any) -> int:
        call = current_tool_call()
        assert call is not None
        made = await runner.list_tool_calls(call.run_id, scope=call.scope)
        return sum(1 for row in made if row.result is not None)

    await runner.publish("acme", {"workflows/flow.ts": TEN_CALLS})
    fsynced.clear()
    run = await start_source(runner, TEN_CALLS, bindings=Bindings(tools={"look": look}))
    assert (run.status, run.output) == ("completed", list(range(10)))
    assert fsynced.count(True) == 11
    calls = await runner.list_tool_calls(run.run_id, scope="acme")
    assert [(row.attempt, row.result) for row in calls] == [(1, n) for n in range(10)]


async def test_starting_a_run_is_one_trip_to_the_journal(
    runner: Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The snapshot a start names is found in the transaction that creates the run (and,
    driven, takes its lease): one journal job, not a read and then a write (on the journal's
    thread or, a lone one, on the event loop's: `SqliteBackend.transaction`)."""
    published = await runner.publish("acme", {"workflows/flow.ts": PURE})
    jobs: list[str] = []
    original_run = connection.JobThread.run
    original_batch = committer.run_batch

    async def on_thread(self: connection.JobThread, job: Any, *args: Any) -> Any:
        if getattr(job, "func", None) is not batch:
            jobs.append(getattr(job, "func", job).__name__)
        return await original_run(self, job, *args)

    def batch(connection: Any, batch: list[Any], backend: Any) -> Any:
        jobs.append("run_batch")
        return original_batch(connection, batch, backend)

    monkeypatch.setattr(connection.JobThread, "run", on_thread)
    monkeypatch.setattr(committer, "run_batch", batch)
    request = StartRunInput("acme", "flow", published.snapshot_id[:12], None, "r1")
    run = await runner.start(request, drive=False)
    assert run.status == "running"
    assert jobs == ["run_batch"]
    again = await runner.start(request, drive=False)  # the same start: the same run
    assert again.run_id == run.run_id
    with pytest.raises(SnapshotNotFound):
        await runner.start(StartRunInput("acme", "flow", "0" * 64, None, "r2"), drive=False)
    assert await runner.store.get_run("acme/r2") is None
