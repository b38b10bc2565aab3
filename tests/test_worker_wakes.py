"""A worker claims the next runs as soon as its drives end, however the journal's reads and the
drives' ends interleave: it never sleeps out its poll interval while runs wait for a slot."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest

from qjsflow.runner import Bindings, Runner, RunnerConfig, StartRunInput
from qjsflow.runner.engine.worker import Worker
from tests.conftest import statements

QUICK = "export default async (event, step) => step.do('one', async () => 1);\n"
POLL_S = 60.0  # long enough that one sleep through it fails the test's own deadline
SLOW_READ_S = 0.5  # a journal far away: the drives under way end while it answers


async def test_drives_that_end_during_a_slow_read_wake_the_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with Runner.open(tmp_path / "journal.db") as runner:
        published = await runner.publish("acme", {"workflows/flow.ts": QUICK})
        await runner.start(StartRunInput("acme", "flow", published.snapshot_id, None, "warm"))
        for n in range(6):
            request = StartRunInput("acme", "flow", published.snapshot_id, None, f"r{n}")
            await runner.start(request, drive=False)
        reads = 0
        next_due = runner.store.next_due

        async def slow_next_due() -> int | None:
            nonlocal reads
            reads += 1
            await asyncio.sleep(SLOW_READ_S)
            return await next_due()

        # The read a pause makes before it waits: the two drives just claimed end meanwhile.
        monkeypatch.setattr(runner.store, "next_due", slow_next_due)
        worker = Worker(
            runner.store, runner.driver, Bindings(), concurrency=2, poll_interval_s=POLL_S
        )
        began = time.monotonic()
        await asyncio.wait_for(worker.serve(until_idle=True), POLL_S / 2)
        took = time.monotonic() - began
        for n in range(6):
            assert (await runner.get(f"r{n}", scope="acme")).status == "completed"
        assert worker.drives == 6
        # Three claims of two, each followed by one slow read, and the last look for timers.
        assert reads >= 3
        assert took < reads * SLOW_READ_S + 10, took


HOLD_OR_NAP = """export default async (event, step) => {
  if (event.payload === "hold") return await step.tool("h", "hold", {});
  await step.sleep("nap", 300);
  return 1;
};
"""


async def test_a_due_run_its_scope_holds_back_does_not_spin_the_worker(tmp_path: Path) -> None:
    """A run comes due while its scope drives all it may: the worker waits for a drive to end
    (or its poll interval), rather than look for runs again and again while it cannot take
    that one."""

    async def hold(args: object) -> str:
        await asyncio.sleep(1.0)
        return "held"

    bindings = Bindings(tools={"hold": hold})
    config = RunnerConfig(scope_concurrency={"acme": 1})
    async with Runner.open(tmp_path / "journal.db", config) as runner:
        published = await runner.publish("acme", {"workflows/flow.ts": HOLD_OR_NAP})
        napping = StartRunInput("acme", "flow", published.snapshot_id, "nap", "napping")
        assert (await runner.start(napping, bindings)).status == "sleeping"
        holding = StartRunInput("acme", "flow", published.snapshot_id, "hold", "holding")
        await runner.start(holding, bindings, drive=False)
        with statements(runner) as seen:
            await asyncio.wait_for(runner.serve(until_idle=True, bindings=bindings), 30)
        for run_id in ("napping", "holding"):
            assert (await runner.get(run_id, scope="acme")).status == "completed"
    claims = [sql for _, sql in seen if "row_number()" in sql]
    # ~1 s of the holding run's tool, 0.7 s of it with the napping run due: a look per poll
    # interval and per drive's end, not thousands.
    assert 1 <= len(claims) <= 20, len(claims)


async def test_a_drive_that_fails_on_the_host_is_tried_again_after_a_growing_delay(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A run whose drive fails in the host (here: its bundle is gone from a damaged journal)
    stays claimable and is tried again after a delay that doubles (from the poll interval),
    not in a tight loop; the worker drives other runs meanwhile."""
    journal = tmp_path / "journal.db"
    async with Runner.open(journal) as runner:
        broken = await runner.publish("acme", {"workflows/flow.ts": QUICK})
        sound = await runner.publish("other", {"workflows/flow.ts": QUICK})
        await runner.start(
            StartRunInput("acme", "flow", broken.snapshot_id, None, "b"), drive=False
        )
    with sqlite3.connect(journal) as damage:
        damage.execute("DELETE FROM bundles WHERE scope = 'acme'")
    async with Runner.open(journal) as runner:
        worker = Worker(runner.store, runner.driver, Bindings(), poll_interval_s=0.2)
        stop = asyncio.Event()
        serving = asyncio.create_task(worker.serve(stop=stop))
        await asyncio.sleep(0.3)
        request = StartRunInput("other", "flow", sound.snapshot_id, None, "fine")
        await runner.start(request, drive=False)
        await asyncio.sleep(1.0)
        stop.set()
        await serving
        assert (await runner.get("fine", scope="other")).status == "completed"
        assert (await runner.get("b", scope="acme")).status == "running"  # left claimable
    failures = [r.getMessage() for r in caplog.records if r.name == "qjsflow.worker"]
    failures = [m for m in failures if m.startswith("driving run acme/b failed")]
    # At 0, then 0.2 and 0.6 s after it (then 1.4): three in 1.3 s, not hundreds.
    assert 2 <= len(failures) <= 4, failures
    assert [m.rsplit("again in ", 1)[1] for m in failures[:3]] == ["0.2 s", "0.4 s", "0.8 s"]
