"""Crash recovery with real worker subprocesses, real SIGKILL, SIGSTOP and one SQLite file."""

from __future__ import annotations

import asyncio
import random
import signal
import time
from collections.abc import Callable

import pytest

from qjsflow.runner import Runner, StartRunInput
from qjsflow.runner.tenancy.scopes import run_key
from tests.journal_reads import query
from tests.leases import seconds_until_lease_lapses
from tests.worker_pool import Workers

pytestmark = pytest.mark.slow

STEPS = 20
CRASHY = """
export default async (event, step) => {
  const fast = { retries: { limit: 20, delay: 0 } };
  const results = [];
  for (let i = 0; i < STEPS; i++) {
    if (i === STEPS / 2) {
      await step.sleep("rest", "1 second");
      const approval = await step.waitForEvent("approval", { type: "approve", timeout: "1 hour" });
      results.push(approval.payload);
    }
    results.push(await step.do(`step ${i}`, fast, async () =>
      step.tool(`append ${i}`, "append", { run: event.instanceId, step: i }, fast)));
  }
  return results;
};
""".replace("STEPS", str(STEPS))


async def _until(condition: Callable[[], object], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = condition()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


async def _all_done(api: Runner, run_ids: list[str]) -> bool:
    statuses = [(await api.get(run_id, scope="acme")).status for run_id in run_ids]
    return all(status in {"completed", "failed", "cancelled"} for status in statuses)


def _journal_checks(journal: str) -> None:
    if not journal.startswith("postgresql://"):
        assert query(journal, "PRAGMA integrity_check") == [("ok",)]
    settled = query(
        journal,
        "SELECT run_id, data, count(*) FROM events"
        " WHERE type IN ('step_completed', 'step_failed', 'sleep_completed',"
        " 'event_consumed', 'event_timed_out', 'notified')"
        " GROUP BY run_id, data HAVING count(*) > 1",
    )
    assert settled == [], "a step has two recorded results"


@pytest.mark.timeout(600)
async def test_sigkill_at_random_moments_loses_and_repeats_nothing(
    workers: Workers, api: Runner
) -> None:
    published = await api.publish("acme", {"workflows/crashy.ts": CRASHY})
    run_ids = []
    for index in range(10):
        request = StartRunInput("acme", "crashy", published.snapshot_id, run_id=f"crash-{index}")
        run_ids.append((await api.start(request, drive=False)).run_id)
    chaos = random.Random(20261130)
    for kill in range(30):
        worker = workers.spawn("--concurrency", "2")
        await workers.serving(worker)
        await asyncio.sleep(chaos.uniform(0.0, 0.6))
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
        if kill == 8:
            for run_id in run_ids:  # buffered if the run has not reached its wait yet
                await api.signal(run_id, "approve", "boss", drive=False, scope="acme")
    survivor = workers.spawn("--concurrency", "6")
    await workers.serving(survivor)
    await _until(lambda: _all_done(api, run_ids), 300, "every run to finish")
    survivor.send_signal(signal.SIGTERM)
    assert survivor.wait(timeout=60) == 0

    expected = [*range(STEPS // 2), "boss", *range(STEPS // 2, STEPS)]
    lines = workers.tool_lines()
    for run_id in run_ids:
        run = await api.get(run_id, scope="acme")
        assert (run.status, run.output) == ("completed", expected), run.error
        calls = await api.list_tool_calls(run_id, scope="acme")
        for step in range(STEPS):
            rows = [c for c in calls if c.step == f"do:1:step {step}/append {step}"]
            recorded = [i for i, c in enumerate(rows) if c.result is not None]
            # One recorded result, and it is the last call: nothing ran after it was recorded.
            assert recorded == [len(rows) - 1], (run_id, step, rows)
            # Every invocation was written ahead as a call row before it ran.
            assert 1 <= lines[(run_id, str(step))] <= len(rows)
    _journal_checks(workers.db)
    [(unfinished_calls,)] = query(
        workers.db, "SELECT count(*) FROM tool_calls WHERE result IS NULL"
    )
    [(interrupted,)] = query(
        workers.db,
        "SELECT count(*) FROM events WHERE type = 'step_retrying' AND data LIKE '%interrupted%'",
    )
    [(drives,)] = query(workers.db, "SELECT count(*) FROM events WHERE type = 'drive_started'")
    print(
        f"chaos: {unfinished_calls} tool calls cut short, {interrupted} attempts interrupted, {drives} drives"
    )
    # The kills landed inside work, not only between runs.
    assert unfinished_calls + interrupted > 0


@pytest.mark.timeout(300)
async def test_two_workers_share_200_runs(workers: Workers, api: Runner) -> None:
    # A durable sleep in each: every run is driven at least twice, its second drive due
    # seconds later, when both workers are sure to be taking work (a worker whose executors
    # were still warming up under load could otherwise find 200 quick runs all done).
    source = """
    export default async (event, step) => {
      const a = await step.do("a", async () => event.payload.n);
      await step.sleep("pause", "2 seconds");
      const b = await step.do("b", async () => a * 2);
      return b + (await step.do("c", async () => 1));
    };
    """
    published = await api.publish("acme", {"workflows/quick.ts": source})
    # Both workers serving (registered in the journal) before any run exists: a worker that
    # started late would otherwise find the quick runs all done by the other.
    first = workers.spawn("--concurrency", "4")
    second = workers.spawn("--concurrency", "4")
    for process in (first, second):
        await workers.serving(process)  # registered: the line it prints then
    run_ids = []
    for n in range(200):
        request = StartRunInput("acme", "quick", published.snapshot_id, {"n": n}, f"quick-{n}")
        run_ids.append((await api.start(request, drive=False)).run_id)
    for run_id in run_ids:  # each run's end, as the journal records it
        assert (await api.wait(run_id, scope="acme", timeout_s=240)).status == "completed"
    for process in (first, second):
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    for n, run_id in enumerate(run_ids):
        run = await api.get(run_id, scope="acme")
        assert (run.status, run.output) == ("completed", 2 * n + 1)
    drivers: set[str] = set()
    for run_id in run_ids:
        for event in await api.store.list_events(run_key("acme", run_id)):
            if event.type == "drive_started" and event.data:
                drivers.add(event.data)
        assert (
            sum(
                1
                for e in await api.store.list_events(run_key("acme", run_id))
                if e.type == "run_completed"
            )
            == 1
        )
    assert len(drivers) == 2, "both workers drove runs"
    _journal_checks(workers.db)


@pytest.mark.timeout(120)
async def test_a_paused_driver_whose_lease_was_taken_cannot_write(
    workers: Workers, api: Runner
) -> None:
    source = """
    export default async (event, step) => step.do("slow", { retries: { limit: 3, delay: 0 } },
      async (ctx) => ({ attempt: ctx.attempt,
                        got: await step.tool(`slow ${ctx.attempt}`, "slow", { run: event.instanceId, seconds: 3 }) }));
    """
    published = await api.publish("acme", {"workflows/slow.ts": source})
    request = StartRunInput("acme", "slow", published.snapshot_id, run_id="paused")
    await api.start(request, drive=False)
    paused = workers.spawn(lease_ttl=1.0)
    await _until(lambda: workers.tool_lines()[("paused", "slow")] == 1, 60, "the first tool call")
    paused.send_signal(signal.SIGSTOP)
    await asyncio.sleep(seconds_until_lease_lapses(workers.db, "acme/paused"))
    events_before = {e.seq for e in await api.store.list_events(run_key("acme", "paused"))}
    taker = workers.spawn("--until-idle", lease_ttl=1.0)
    assert taker.wait(timeout=60) == 0
    run = await api.get("paused", scope="acme")
    assert run.status == "completed"
    paused.send_signal(signal.SIGCONT)
    await asyncio.sleep(4.0)  # the paused tool call returns and its driver tries to write
    epochs = query(
        workers.db, "SELECT seq, type, epoch FROM events WHERE run_id = 'acme/paused' ORDER BY seq"
    )
    calls = query(
        workers.db,
        "SELECT attempt, result FROM tool_calls WHERE run_id = 'acme/paused' ORDER BY seq",
    )
    first_epoch = next(epoch for seq, kind, epoch in epochs if kind == "drive_started")
    late = [
        (seq, kind)
        for seq, kind, epoch in epochs
        if epoch == first_epoch and seq not in events_before
    ]
    assert late == [], "the paused driver wrote after its lease was taken over"
    assert calls[0][1] is None  # the paused driver never recorded its tool's result
    assert run.output["attempt"] == 2
    assert (await api.get("paused", scope="acme")).updated_at == run.updated_at
    paused.kill()
    _journal_checks(workers.db)


@pytest.mark.timeout(120)
async def test_due_sleep_completes_when_a_worker_starts_and_signals_wake_fast(
    workers: Workers, api: Runner
) -> None:
    source = """
    export default async (event, step) => {
      await step.sleep("nap", "1 second");
      const got = await step.waitForEvent("go", { type: "go", timeout: "1 hour" });
      return got.payload;
    };
    """
    published = await api.publish("acme", {"workflows/napper.ts": source})
    run = await api.start(StartRunInput("acme", "napper", published.snapshot_id, run_id="napper"))
    assert run.status == "sleeping"
    await asyncio.sleep(1.5)  # the wake time passes with no worker running
    worker = workers.spawn()
    await workers.serving(worker)
    await _until(lambda: _status(api, "napper", "waiting"), 30, "the sleep to be woken")
    await api.signal("napper", "go", "now", drive=False, scope="acme")
    sent = time.monotonic()
    await _until(lambda: _status(api, "napper", "completed"), 5, "the signal to wake the run")
    assert time.monotonic() - sent < 1.0
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    assert (await api.get("napper", scope="acme")).output == "now"


async def _status(api: Runner, run_id: str, status: str) -> bool:
    return (await api.get(run_id, scope="acme")).status == status
