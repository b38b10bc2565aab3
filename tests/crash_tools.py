"""Tools for the worker crash tests, loaded by worker subprocesses through `--tools`.

Each invocation appends one line to the file named by QJSFLOW_TOOL_LOG before it answers, so
the file is the ground truth of how often a tool really ran.

With QJSFLOW_TEST_CRASH_AFTER_TOOL=STEP, the worker kills itself (SIGKILL) once its host has
answered the call named STEP, before the answer reaches the sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Sequence
from typing import Any

from qjsflow.bridge.types import Answer, OpEnvelope, StepTool
from qjsflow.runner.engine.host import DriveHost


def _append(line: str) -> None:
    with open(os.environ["QJSFLOW_TOOL_LOG"], "a", encoding="utf-8") as handle:
        handle.write(line + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    fifo = os.environ.get("QJSFLOW_TOOL_FIFO")
    if fifo:  # the test waiting for this call hears of it (tests/worker_pool.py)
        with contextlib.suppress(OSError):
            writing = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            try:
                os.write(writing, (line + "\n").encode())  # one write, under PIPE_BUF: whole
            finally:
                os.close(writing)


async def append(args: Any) -> Any:
    _append(f"{args['run']} {args['step']}")
    await asyncio.sleep(0.03)  # a window for a kill to land inside the call
    return args["step"]


async def slow(args: Any) -> Any:
    _append(f"{args['run']} slow")
    await asyncio.sleep(float(args.get("seconds", 3)))
    return "slow done"


async def receive(args: Any) -> Any:
    """Logs what it was given (a secret's value, say) and returns nothing of it."""
    _append(f"{args['run']} {args['secret']}")
    return "received"


async def at_once(args: Any) -> Any:
    """Answers as soon as it has logged its call."""
    _append(f"{args['run']} {args['step']}")
    return args["step"]


TOOLS = {"append": append, "slow": slow, "receive": receive, "at_once": at_once}


CRASH_AFTER_TOOL = "QJSFLOW_TEST_CRASH_AFTER_TOOL"
_crash_after = os.environ.get(CRASH_AFTER_TOOL, "")
_serve = DriveHost.__call__


async def _serve_then_crash(self: DriveHost, ops: Sequence[OpEnvelope]) -> list[Answer]:
    answers = await _serve(self, ops)
    if any(isinstance(e.op, StepTool) and e.op.step == _crash_after for e in ops):
        os.kill(os.getpid(), signal.SIGKILL)
    return answers


if _crash_after:
    DriveHost.__call__ = _serve_then_crash  # type: ignore[method-assign]
