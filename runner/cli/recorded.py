"""The operator commands that record a change and return (start, signal, resume, restart,
fork): they write to the journal and a worker drives the run, so none needs `--tools` or
`--env`. `--wait` waits for the run's end; `--wait suspended` until it is at rest: ended, or
suspended with nothing due (docs/OPERATIONS.md, Who drives a run).

`qjsflow run` and `qjsflow demo` drive inline: running a workflow there is the point."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from qjsflow.runner.cli.output import printable
from qjsflow.runner.views import TERMINAL, RunView

if TYPE_CHECKING:
    from qjsflow.runner.runner import Runner

__all__ = ["RECORDING", "recorded"]

RECORDING = ("start", "signal", "resume", "restart", "fork")


async def recorded(
    args: argparse.Namespace, runner: Runner, record: Callable[[], Awaitable[RunView]]
) -> RunView:
    """`record`'s run, or with `--wait` the run once it ended (or is at rest, suspended)."""
    run = await record()
    if run.status not in TERMINAL:
        await _say_who_drives(runner, run)
    match args.wait:
        case None:
            return run
        case "end":
            return await runner.wait(run.run_id, scope=run.scope, timeout_s=args.timeout)
        case _:
            return await runner.wait_suspended(run.run_id, scope=run.scope,
                                               timeout_s=args.timeout)  # fmt: skip


async def _say_who_drives(runner: Runner, run: RunView) -> None:
    """On stderr (the command still succeeds): that no live worker serves the journal, or
    that none binds a tool the run's snapshot declares; the run waits for one either way."""
    if not any(worker.state == "live" for worker in await runner.workers()):
        _note("no live worker serves this journal: the run is recorded and waits until one "
              "runs (qjsflow worker)")  # fmt: skip
        return
    snapshot = await runner.find_snapshot(run.snapshot_id, scope=run.scope)
    unbound = await runner.unbound_tools(snapshot)
    if unbound:
        _note(f"no live worker binds a tool the snapshot declares ({', '.join(unbound)}): a run "
              "that calls one waits, blocked, until a worker that binds it runs "
              "(qjsflow workers)")  # fmt: skip


def _note(text: str) -> None:
    print(printable(f"qjsflow: note: {text}"), file=sys.stderr)
