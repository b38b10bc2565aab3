"""Wake-ups without polling on PostgreSQL: a worker whose poll is ten minutes still drives a
run as soon as it is started, as soon as an event is signalled to it, and as soon as its sleep
is due — told by the journal's NOTIFY (or, for a timer, by the next due time it looked up), so
each of these waits, bounded far below the poll, ends."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from qjsflow.runner import Runner, RunnerConfig, StartRunInput
from qjsflow.runner.store.dialect import WAKE_CHANNEL
from qjsflow.sandbox import PoolConfig
from tests.worker_pool import Workers

FLOW = """export default async (event, step) => {
  const first = await step.waitForEvent("first", { type: "go" });
  await step.sleep("nap", "1 second");
  return first.payload;
};"""
_POLL_S = 600.0  # ten minutes: a run driven in the test's time was woken, not polled for
_WAIT_S = 60.0


@pytest.mark.slow
async def test_a_start_an_event_and_a_timer_wake_a_worker_that_hardly_polls(
    postgres: Any, tmp_path: Any
) -> None:
    db = postgres.new_database()
    config = RunnerConfig(pool=PoolConfig(size=1), scope_root=tmp_path / "api")
    async with Runner.open(db, config) as api:
        await api.publish("acme", {"workflows/flow.ts": FLOW})
        pool = Workers(tmp_path, db)
        worker = pool.spawn("--poll", str(_POLL_S), "--scope-root", str(tmp_path / "w"))
        try:
            await pool.serving(worker)  # registered, about to claim
            for n in range(3):  # again and again: none of them found by a poll
                run = await api.start(StartRunInput("acme", "flow", "latest", n), drive=False)
                waiting = await api.wait_suspended(run.run_id, scope="acme", timeout_s=_WAIT_S)
                assert waiting.status == "waiting"  # driven: the start woke the worker
                await api.signal(run.run_id, "go", n * 10, scope="acme", drive=False)
                done = await api.wait(run.run_id, scope="acme", timeout_s=_WAIT_S)
                # The event woke it; the sleep's timer, due a second later, woke it again.
                assert (done.status, done.output) == ("completed", n * 10)
        finally:
            pool.stop_all()


@pytest.mark.slow
async def test_a_start_driven_where_it_is_made_wakes_no_worker(
    postgres: Any, tmp_path: Any
) -> None:
    """Its run is leased in the transaction that creates it: a worker woken would only find
    it taken. A start left to the workers wakes them. (Notifications come in the order their
    transactions committed: those before the test's own marker are the starts'.)"""
    db = postgres.new_database()
    config = RunnerConfig(pool=PoolConfig(size=1), scope_root=tmp_path / "api")
    async with Runner.open(db, config) as api:
        await api.publish("acme", {"workflows/flow.ts": "export default async () => 1;"})
        with psycopg.connect(db, autocommit=True) as listener:
            listener.execute(f"LISTEN {WAKE_CHANNEL}")
            driven = await api.start(StartRunInput("acme", "flow", "latest", None, "here"))
            assert driven.status == "completed"
            await api.start(StartRunInput("acme", "flow", "latest", None, "there"), drive=False)
            listener.execute(f"NOTIFY {WAKE_CHANNEL}, 'marker'")
            told = []
            for note in listener.notifies(timeout=_WAIT_S):
                if note.payload == "marker":
                    break
                told.append(note.payload)
    assert told == [""]  # the start left to the workers, alone
