"""Worker subprocesses on one journal, with the crash tools bound, for the tests that kill
them (tests/test_durability.py, tests/test_cloudflare_crashes.py): the pool, its fixtures
(`workers`, and `api`: the test's own view of the journal, which drives nothing; conftest.py
offers them to every test), and a wait for a condition of the journal."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from qjsflow.runner import Runner, RunnerConfig
from qjsflow.runner.engine.worker import worker_command
from qjsflow.sandbox import PoolConfig

__all__ = ["PROJECT_ROOT", "Workers", "api", "until", "workers"]

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class Workers:
    """Worker subprocesses on one journal file, with the crash tools bound."""

    def __init__(self, tmp_path: Path, journal: str) -> None:
        self.db = journal
        self.tool_log = tmp_path / "tools.log"
        self.tool_log.touch()
        self.logs = tmp_path / "worker-logs"
        self.logs.mkdir()
        self.spawned: list[subprocess.Popen[bytes]] = []

    def spawn(self, *worker_args: str, lease_ttl: float = 2.0) -> subprocess.Popen[bytes]:
        log = (self.logs / f"worker-{len(self.spawned)}.log").open("wb")
        process = subprocess.Popen(
            [
                *worker_command(self.db, tools="tests.crash_tools:TOOLS", lease_ttl_s=lease_ttl),
                *worker_args,
            ],
            cwd=PROJECT_ROOT,
            env={**os.environ, "QJSFLOW_TOOL_LOG": str(self.tool_log)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()
        self.spawned.append(process)
        return process

    async def serving(self, process: subprocess.Popen[bytes]) -> None:
        """Wait until the worker has installed its signal handlers and opened the journal."""
        log = self.logs / f"worker-{self.spawned.index(process)}.log"
        await until(lambda: b"qjsflow worker: serving" in log.read_bytes(), 60, "a worker")

    def stop_all(self) -> None:
        for process in self.spawned:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=30)

    def tool_lines(self) -> Counter[tuple[str, str]]:
        lines = self.tool_log.read_text().split()
        return Counter(zip(lines[::2], lines[1::2], strict=True))


@pytest.fixture
def workers(tmp_path: Path, journal: str) -> Iterator[Workers]:
    pool = Workers(tmp_path, journal)
    yield pool
    pool.stop_all()


@pytest.fixture
async def api(workers: Workers) -> AsyncIterator[Runner]:
    """The test's own view of the journal: it starts runs and sends events without driving."""
    config = RunnerConfig(pool=PoolConfig(size=1))
    async with Runner.open(workers.db, config) as runner:
        yield runner


async def until(condition: Callable[[], object], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = condition()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
