"""The `qjsflow` command line (DESIGN §9).

Exit codes: 0 ok, 1 the operation failed, 2 bad usage or input. `--json` prints exactly one
JSON document on stdout; errors go to stderr as one line (a traceback only with `--debug`).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import traceback
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from bridge import InvalidInput, QjsflowError, dumps_text
from runner.runner import PublishResult, Runner

__all__ = ["main"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qjsflow", description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="./qjsflow.db", help="journal database (./qjsflow.db)")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of failures")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    publish = commands.add_parser("publish", help="publish a source folder as a snapshot")
    publish.add_argument("dir", help="the folder holding workflows/ and the code it imports")
    publish.add_argument("--scope", required=True, help="the tenant the snapshot belongs to")
    return parser


async def _publish(args: argparse.Namespace) -> PublishResult:
    async with Runner.open(args.db) as runner:
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
