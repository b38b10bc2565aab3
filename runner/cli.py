"""The `qjsflow` command line (DESIGN §9).

Exit codes: 0 ok, 1 the operation failed, 2 bad usage or input. `--json` prints exactly one
JSON document on stdout; errors go to stderr as one line (a traceback only with `--debug`).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import signal
import sys
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from bridge import InvalidInput, QjsflowError, dumps_text
from runner.bindings import Bindings, ToolFn
from runner.config import RunnerConfig
from runner.runner import PublishResult, Runner

__all__ = ["main"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qjsflow", description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="./qjsflow.db", help="journal database (./qjsflow.db)")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of failures")
    parser.add_argument(
        "--lease-ttl",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long a driver's lease on a run lasts without a heartbeat (30)",
    )
    parser.add_argument(
        "--tools",
        metavar="MODULE:ATTRIBUTE",
        help="a mapping of tool address to async function, for step.tool",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    publish = commands.add_parser("publish", help="publish a source folder as a snapshot")
    publish.add_argument("dir", help="the folder holding workflows/ and the code it imports")
    publish.add_argument("--scope", required=True, help="the tenant the snapshot belongs to")
    worker = commands.add_parser("worker", help="wake due runs and recover crashed ones")
    worker.add_argument(
        "--until-idle",
        action="store_true",
        help="exit once nothing is running and no timer is due within 1 s",
    )
    worker.add_argument("--concurrency", type=int, default=8, help="drives at once (8)")
    return parser  # fmt: skip


def _config(args: argparse.Namespace) -> RunnerConfig:
    bindings = Bindings(tools=load_tools(args.tools)) if args.tools else Bindings()
    return RunnerConfig(lease_ttl_s=args.lease_ttl, bindings=bindings)


def load_tools(spec: str) -> Mapping[str, ToolFn]:
    """`module:attribute` naming a mapping of tool address -> async function."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise InvalidInput(f"--tools wants MODULE:ATTRIBUTE, not {spec!r}")
    try:
        tools = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise InvalidInput(f"cannot load tools from {spec!r}: {error}") from None
    if not isinstance(tools, Mapping):
        raise InvalidInput(f"{spec!r} is not a mapping of tool address to function")
    return tools


async def _worker(args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with Runner.open(args.db, _config(args)) as runner:
        mode = "until idle" if args.until_idle else "until SIGTERM"
        print(f"qjsflow worker: serving {args.db} ({mode})", file=sys.stderr, flush=True)
        return await runner.serve(
            until_idle=args.until_idle, concurrency=args.concurrency, stop=stop
        )


async def _publish(args: argparse.Namespace) -> PublishResult:
    async with Runner.open(args.db, _config(args)) as runner:
        return await runner.publish(args.scope, args.dir)


def _show_publish(result: PublishResult, as_json: bool) -> str:
    if as_json:
        document: dict[str, Any] = {
            "snapshot_id": result.snapshot_id,
            "workflows": [asdict(workflow) for workflow in result.workflows],
            "created": result.created,
        }
        return dumps_text(document)
    state = "new" if result.created else "already published"
    rows = [("WORKFLOW", "ENTRY")] + [(w.workflow, w.entry_path) for w in result.workflows]
    return "\n".join(
        [f"snapshot {result.snapshot_id} in scope {result.scope} ({state})", *_table(rows)]
    )


def _table(rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            for row in rows]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "publish":
            print(_show_publish(asyncio.run(_publish(args)), args.json))
        elif args.command == "worker":
            drives = asyncio.run(_worker(args))
            print(
                dumps_text({"drives": drives})
                if args.json
                else f"worker stopped after {drives} drives"
            )
        return EXIT_OK
    except InvalidInput as error:
        return _fail(error, EXIT_USAGE, args.debug)
    except QjsflowError as error:
        return _fail(error, EXIT_FAILED, args.debug)
    except Exception as error:  # a host bug: still one line unless --debug
        return _fail(error, EXIT_FAILED, args.debug)


def _fail(error: BaseException, code: int, debug: bool) -> int:
    if debug:
        traceback.print_exception(error)
    message = " | ".join(line.strip() for line in str(error).splitlines() if line.strip())
    print(f"qjsflow: error: {message or type(error).__name__}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
