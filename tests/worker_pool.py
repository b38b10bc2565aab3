"""Worker subprocesses on one journal, with the crash tools bound, for the tests that kill
them (tests/test_durability.py, tests/test_cloudflare_crashes.py): the pool, its fixtures
(`workers`, and `api`: the test's own view of the journal, which drives nothing; conftest.py
offers them to every test)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import pytest

from qjsflow.runner import Runner, RunnerConfig
from qjsflow.runner.engine.worker import worker_command
from qjsflow.sandbox import PoolConfig

__all__ = ["PROJECT_ROOT", "Workers", "api", "workers"]

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class Workers:
    """Worker subprocesses on one journal file, with the crash tools bound. What a test
    waits for comes as an event, never by looking again after a pause: a worker's readiness
    is the line it prints once it is registered (read from its output as it comes), and each
    crash tool's call is a line written to a FIFO (`tool_call`)."""

    def __init__(self, tmp_path: Path, journal: str) -> None:
        self.db = journal
        self.tool_log = tmp_path / "tools.log"
        self.tool_log.touch()
        self.logs = tmp_path / "worker-logs"
        self.logs.mkdir()
        self.spawned: list[subprocess.Popen[bytes]] = []
        self._ready: dict[int, threading.Event] = {}
        self._copying: list[threading.Thread] = []
        # The tools' calls as they are made: the test holds a writing end too, so a read
        # waits for the next line instead of meeting the end of the file.
        self.tool_fifo = tmp_path / "tools.fifo"
        os.mkfifo(self.tool_fifo)
        reading = os.open(self.tool_fifo, os.O_RDONLY | os.O_NONBLOCK)
        self._held = os.open(self.tool_fifo, os.O_WRONLY)
        os.set_blocking(reading, True)
        self._calls = os.fdopen(reading, "r", encoding="utf-8")

    def spawn(
        self, *worker_args: str, lease_ttl: float = 2.0, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        log = (self.logs / f"worker-{len(self.spawned)}.log").open("wb")
        process = subprocess.Popen(
            [
                *worker_command(self.db, tools="tests.crash_tools:TOOLS", lease_ttl_s=lease_ttl),
                *worker_args,
            ],
            cwd=PROJECT_ROOT,
            env={**os.environ, "QJSFLOW_TOOL_LOG": str(self.tool_log),
                 "QJSFLOW_TOOL_FIFO": str(self.tool_fifo), **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        ready = self._ready[process.pid] = threading.Event()
        copying = threading.Thread(target=_copy, args=(process, log, ready), daemon=True)
        copying.start()
        self._copying.append(copying)
        self.spawned.append(process)
        return process

    async def serving(self, process: subprocess.Popen[bytes]) -> None:
        """Until the worker is registered in the journal and about to claim runs (the line
        it prints then)."""
        ready = self._ready[process.pid]
        assert await asyncio.to_thread(ready.wait, 60), "the worker did not get ready"

    async def tool_call(self, wanted: Callable[[str], bool], timeout_s: float = 60) -> str:
        """The next line a crash tool writes (`run step`) for which `wanted` is true."""

        async def next_wanted() -> str:
            while True:
                line = (await asyncio.to_thread(self._calls.readline)).strip()
                if wanted(line):
                    return line

        return await asyncio.wait_for(next_wanted(), timeout_s)

    def stop_all(self) -> None:
        for process in self.spawned:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=30)
        for copying in self._copying:  # each ends at its worker's end of output
            copying.join(timeout=30)
        os.close(self._held)
        self._calls.close()

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


def _copy(process: subprocess.Popen[bytes], log: BinaryIO, ready: threading.Event) -> None:
    """A worker's output into its log file, line by line, `ready` set at its serving line."""
    assert process.stdout is not None
    with log, process.stdout:
        for line in process.stdout:
            log.write(line)
            log.flush()
            if line.startswith(b"qjsflow worker: serving"):
                ready.set()
