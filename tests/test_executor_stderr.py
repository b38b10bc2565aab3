"""An executor's own stderr lines (an internal error, why it stopped) reach the worker's log,
escaped and bounded, whatever the worker's stderr is: a regular file refuses every write
under the executor's no-files rlimit, so an inherited one would lose them."""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from qjsflow.bridge.types import Completed
from qjsflow.sandbox import ExecutorPool, PoolConfig
from qjsflow.sandbox.confinement_probe import STDERR_LINES
from qjsflow.sandbox.pool import DIAGNOSTIC_CHARS, DIAGNOSTICS_LOGGED
from tests.conftest import bundle_of
from tests.memory_host import MemoryHost

EXECUTOR_LINE = re.compile(r"executor (\d+): ")
WELL_BEHAVED = 'export default async (e, step) => step.do("a", async () => 1);'


@contextlib.contextmanager
def stderr_to(path: Path) -> Iterator[None]:
    """This process's stderr a regular file, as for `qjsflow worker 2>>worker.log`."""
    saved = os.dup(2)
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.dup2(target, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(target)


async def test_an_executors_stderr_lines_are_logged_escaped_and_bounded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="qjsflow.sandbox")
    config = PoolConfig(size=1, entry="qjsflow.sandbox.confinement_probe", entry_args=("stderr",))
    code = await bundle_of(WELL_BEHAVED)
    with stderr_to(tmp_path / "worker.log"):
        async with ExecutorPool(config) as pool:
            host = MemoryHost()
            outcome = await pool.drive(host.request(code), host)
    assert isinstance(outcome, Completed)
    matched = [EXECUTOR_LINE.match(r.getMessage()) for r in caplog.records]
    lines = [found.string for found in matched if found is not None]
    pid = next(int(found.group(1)) for found in matched if found is not None)
    # The first lines, each cut and escaped: no escape, carriage return or bidi override left.
    assert len(lines) == DIAGNOSTICS_LOGGED + 1
    first = lines[0].removeprefix(f"executor {pid}: ")
    assert first.startswith("line 0: \\x1b[2J\\x0dforged \\u202ex")
    assert len(first) == DIAGNOSTIC_CHARS + len("\\x1b\\x0d\\u202e") - 3
    assert not any(c in line for line in lines for c in "\x1b\r\u202e")
    # The rest counted, not logged; nothing went to the worker's own stderr.
    assert lines[-1] == (
        f"executor {pid}: {STDERR_LINES - DIAGNOSTICS_LOGGED} more lines on its stderr, not logged"
    )
    assert (tmp_path / "worker.log").read_text() == ""
