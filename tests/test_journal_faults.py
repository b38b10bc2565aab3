"""Transient journal faults and executor deaths are not the run's fault (hardening, class D):
a result that could not be written is kept and written later, never its effect repeated; a
worker backs off instead of spinning; a run whose executor is killed from outside is parked."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from qjsflow.runner import Bindings, Runner, RunnerConfig, StartRunInput, ToolFn
from qjsflow.runner.store import connection
from qjsflow.sandbox import PoolConfig
from tests.conftest import FakeClock, executor_pids, start_source
from tests.postgres import postgres_server

pytestmark = pytest.mark.slow


def _release(locker: sqlite3.Connection) -> None:
    locker.execute("ROLLBACK")
    locker.close()


PAY = """
export default async (event, step) =>
  step.tool("charge", "pay.charge", { amount: 5 }, { retries: { limit: 0 } });
"""


async def _pay_once(journal: str, charge: ToolFn, calls: list[Any]) -> None:
    """The tool ran once and its result was recorded once, whatever the journal went through."""
    async with Runner.open(journal, RunnerConfig(pool=PoolConfig(size=1))) as runner:
        run = await start_source(
            runner, PAY, run_id="pay", bindings=Bindings(tools={"pay.charge": charge})
        )
        assert (run.status, run.output) == ("completed", "charged")
        assert len(calls) == 1
        audit = await runner.list_tool_calls("pay", scope="acme")
        assert [(c.attempt, c.result) for c in audit] == [(1, "charged")]
        steps = await runner.list_steps("pay", scope="acme")
        assert [(s.status, s.attempt) for s in steps] == [("completed", 1)]


async def test_a_tool_result_is_written_once_the_journal_is_unlocked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connection, "BUSY_TIMEOUT_MS", 100)
    db = tmp_path / "journal.db"
    calls: list[Any] = []

    async def charge(args: Any) -> str:
        calls.append(args)
        # Another process takes the journal's write lock for a while, as the tool returns.
        locker = sqlite3.connect(db, isolation_level=None)
        locker.execute("BEGIN IMMEDIATE")
        asyncio.get_running_loop().call_later(1.5, _release, locker)
        return "charged"

    await _pay_once(str(db), charge, calls)


async def test_a_worker_backs_off_while_the_journal_cannot_be_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(connection, "BUSY_TIMEOUT_MS", 20)
    db = tmp_path / "journal.db"
    config = RunnerConfig(pool=PoolConfig(size=1), journal_retry_s=0.2)
    async with Runner.open(db, config) as runner:
        source = 'export default async (e, step) => step.do("a", async () => 7);'
        published = await runner.publish("acme", {"workflows/flow.ts": source})
        await runner.start(StartRunInput("acme", "flow", published.snapshot_id, None, "r"),
                           drive=False)  # fmt: skip
        locker = sqlite3.connect(db, isolation_level=None)
        locker.execute("BEGIN IMMEDIATE")
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(4.0, _release, locker)
        caplog.set_level(logging.WARNING, logger="qjsflow.worker")
        serving = asyncio.create_task(runner.serve(stop=stop))
        for _ in range(200):
            await asyncio.sleep(0.1)
            if (await runner.get("r", scope="acme")).status == "completed":
                break
        stop.set()
        await serving
        assert (await runner.get("r", scope="acme")).output == 7
    warnings = [r for r in caplog.records if "journal writes are failing" in r.getMessage()]
    # Backed off (0.5 s, 1 s, 2 s …) while locked, saying so once per wait: not per attempt.
    assert 1 <= len(warnings) <= 5


KILLER = """
export default async (event, step) => {
  const results = [];
  for (let i = 0; i < 12; i++) results.push(await step.tool("t" + i, "kill", {}));
  return results.length;
};
"""


async def test_a_run_whose_executor_is_killed_is_parked_not_failed(
    tmp_path: Path, clock: FakeClock
) -> None:
    kills = {"left": 3}

    async def kill(args: Any) -> str:
        del args
        if kills["left"] > 0:  # the OOM killer, say, takes the executor while it waits
            kills["left"] -= 1
            for pid in executor_pids():
                os.kill(pid, signal.SIGKILL)
        return "ok"

    bindings = Bindings(tools={"kill": kill})
    config = RunnerConfig(clock=clock, pool=PoolConfig(size=1), executor_deaths_per_run=2)
    async with Runner.open(tmp_path / "journal.db", config) as runner:
        run = await start_source(runner, KILLER, run_id="victim", bindings=bindings)
        assert run.status == "sleeping"
        assert run.error is not None
        assert run.error.startswith("parked: the executor process died")
        assert run.wake_at == pytest.approx(clock() + 30)
        clock.advance(31)
        done = await runner.resume("victim", bindings, scope="acme")
        assert (done.status, done.output, done.error) == ("completed", 12, None)

        kills["left"] = 1000  # now every drive loses its executor
        again = await start_source(runner, KILLER, run_id="doomed", bindings=bindings)
        assert again.status == "sleeping"
        clock.advance(31)
        failed = await runner.resume("doomed", bindings, scope="acme")
        assert failed.status == "failed"
        assert failed.error is not None
        assert "died 2 times" in failed.error


async def test_a_postgresql_restart_mid_drive_runs_the_tool_once() -> None:
    with postgres_server(own=True) as server:  # its own: the restart drops every connection
        url = server.new_database()
        calls: list[Any] = []

        async def charge(args: Any) -> str:
            calls.append(args)
            await asyncio.to_thread(server.restart)
            return "charged"

        await _pay_once(url, charge, calls)
