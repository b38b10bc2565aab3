"""A worker claims the next runs as soon as its drives end, however the journal's reads and the
drives' ends interleave: it never sleeps out its poll interval while runs wait for a slot."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from qjsflow.runner import Bindings, Runner, StartRunInput
from qjsflow.runner.worker import Worker

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
            runner.store, runner._driver, Bindings(), concurrency=2, poll_interval_s=POLL_S
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
