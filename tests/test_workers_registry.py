"""Workers are visible (docs/OPERATIONS.md, "Workers"): each registers in the journal as it
starts and heart-beats while it runs; `qjsflow workers` shows them live, stopped or gone, with
the tools each binds; `start` says when no live worker binds a tool the snapshot declares."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from qjsflow.runner import Bindings, Runner
from qjsflow.runner.store import WORKER_GONE_MS, JournalStore
from tests.conftest import PROJECT_ROOT
from tests.postgres import PostgresServer
from tests.test_cli import Cli

pytestmark = pytest.mark.slow  # worker processes

FLOW = """
export default async (event, step) => step.tool("slow", "slow", { run: event.instanceId, seconds: 0 });
"""


class Journal(Cli):
    """The CLI over one journal (a SQLite file or a PostgreSQL database), with a workflow
    whose manifest declares the tool `slow` published in scope acme."""

    def __init__(self, tmp_path: Path, db: str) -> None:
        super().__init__(tmp_path)
        self.location = db
        tree = tmp_path / "src"
        (tree / "workflows").mkdir(parents=True)
        (tree / "workflows" / "flow.js").write_text(FLOW)
        (tree / "qjsflow.json").write_text(json.dumps({"capabilities": {"tools": ["slow"]}}))
        self.ok("publish", str(tree), "--scope", "acme")

    def argv(self, *args: str, tools: bool = True) -> list[str]:
        bound = ("--tools", "tests.crash_tools:TOOLS") if tools else ()
        return [sys.executable, "-m", "qjsflow.runner.cli", "--db", self.location, *bound,
                *args]  # fmt: skip

    def worker(self, *, tools: bool) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv("worker", tools=tools), cwd=PROJECT_ROOT, env=self.env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip

    def workers(self) -> list[dict[str, Any]]:
        shown: list[dict[str, Any]] = self.ok("workers")
        return shown

    def until(self, check: Any, what: str) -> list[dict[str, Any]]:
        """The workers once `check(workers)` holds (each look a real read of the journal)."""
        deadline = time.monotonic() + 60
        while True:
            shown = self.workers()
            if check(shown):
                return shown
            assert time.monotonic() < deadline, f"{what}: {shown}"
            time.sleep(0.05)


@pytest.fixture(params=["sqlite", pytest.param("postgresql")])
def journal(request: pytest.FixtureRequest, tmp_path: Path) -> Journal:
    if request.param == "sqlite":
        return Journal(tmp_path, str(tmp_path / "journal.db"))
    server: PostgresServer = request.getfixturevalue("postgres")
    return Journal(tmp_path, server.new_database())


def test_workers_register_beat_and_are_shown_live_stopped_or_gone(journal: Journal) -> None:
    assert journal.workers() == []
    human = journal.run("workers", json=False)
    assert "no workers have registered" in human.stdout
    binding = journal.worker(tools=True)
    bare = journal.worker(tools=False)
    try:
        shown = journal.until(lambda ws: len(ws) == 2, "two workers registered")
        by_pid = {w["pid"]: w for w in shown}
        assert by_pid[binding.pid]["state"] == by_pid[bare.pid]["state"] == "live"
        assert "slow" in by_pid[binding.pid]["tools"]
        assert by_pid[bare.pid]["tools"] == []
        assert by_pid[binding.pid]["version"]
        table = journal.run("workers", json=False).stdout
        assert "WORKER" in table
        assert table.count("live") == 2
        bare.send_signal(signal.SIGTERM)  # a clean stop says so
        assert bare.wait(timeout=60) == 0
        journal.until(lambda ws: {w["pid"]: w["state"] for w in ws}[bare.pid] == "stopped",
                      "the stopped worker shown stopped")  # fmt: skip
        binding.kill()  # SIGKILL: no last word; its heartbeat ages
        binding.wait(timeout=60)
    finally:
        for process in (binding, bare):
            if process.poll() is None:
                process.kill()
                process.wait(timeout=60)
    killed = next(w for w in journal.workers() if w["pid"] == binding.pid)
    assert killed["state"] == "live"  # heard of within three beats
    record = _record(journal.location, killed["worker_id"])
    heard = record.heartbeat_at
    assert record.state(heard + WORKER_GONE_MS) == "live"
    assert record.state(heard + WORKER_GONE_MS + 1) == "gone"


def _record(location: str, worker_id: str) -> Any:
    async def read() -> Any:
        store = await JournalStore.open(location, create=False)
        try:
            return next(w for w in await store.list_workers() if w.worker_id == worker_id)
        finally:
            await store.aclose()

    return asyncio.run(read())


def test_start_says_when_no_live_worker_binds_a_declared_tool(journal: Journal) -> None:
    def start(run_id: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            journal.argv("--json", "start", "flow", "--scope", "acme", "--snapshot", "latest",
                         "--run-id", run_id, tools=False),
            cwd=PROJECT_ROOT, env=journal.env, capture_output=True, text=True, timeout=120,
            check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done

    alone = start("r1")
    assert "no live worker serves this journal: the run is recorded" in alone.stderr
    assert orjson.loads(alone.stdout)["status"] == "running"  # recorded all the same
    bare = journal.worker(tools=False)  # live, but binds nothing the snapshot declares
    try:
        journal.until(lambda ws: any(w["state"] == "live" for w in ws), "a live worker")
        assert "no live worker binds a tool the snapshot declares (slow)" in start("r2").stderr
    finally:
        bare.kill()
        bare.wait(timeout=60)
    binding = journal.worker(tools=True)
    try:
        journal.until(lambda ws: any("slow" in w["tools"] and w["state"] == "live" for w in ws),
                      "a live worker binding slow")  # fmt: skip
        assert "no live worker binds" not in start("r3").stderr
    finally:
        binding.kill()
        binding.wait(timeout=60)


async def test_a_runners_worker_registers_what_it_binds_and_stops(tmp_path: Path) -> None:
    """In process (`Runner.serve`): the same record, then marked stopped as it returns."""

    async def tool(args: Any) -> Any:
        return args

    async with Runner.open(tmp_path / "journal.db") as runner:
        await runner.serve(until_idle=True, bindings=Bindings(tools={"crm.sync": tool}))
        (worker,) = await runner.workers()
        assert (worker.state, worker.tools, worker.worker_id) == (
            "stopped", ("crm.sync",), runner.driver.worker_id,
        )  # fmt: skip
        assert worker.stopped_at is not None
        assert worker.started_at <= worker.heartbeat_at
