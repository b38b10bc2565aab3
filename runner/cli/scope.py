"""`qjsflow scope apply|show|history|diff`: a scope's configuration in the journal
(runner/operations/scope_configs.py). Every process reads it from there: no command needs the
file again once it is applied."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qjsflow.bridge import InvalidInput
from qjsflow.bridge.printable import printable
from qjsflow.runner.cli.output import age, render_json, table
from qjsflow.runner.tenancy.scope_config import MAX_CONFIG_BYTES

__all__ = ["scope_command"]


def scope_command(args: argparse.Namespace) -> str:
    """Run `qjsflow scope ACTION`; what to print."""
    from qjsflow.runner.cli import host as cli_host  # noqa: PLC0415  (loads the Runner)

    if not args.scope:
        raise InvalidInput("say which scope with --scope (or QJSFLOW_SCOPE)")
    action = args.scope_action
    if action == "apply":
        if (args.file is None) == (args.version is None):
            raise InvalidInput("scope apply takes a FILE, or --version N to roll back to it")
        text = None if args.file is None else _read(args.file)
        shown = asyncio.run(cli_host.with_runner(
            args, lambda a, runner: (
                runner.rollback_scope_config(a.scope, a.version) if text is None else
                runner.apply_scope_config(a.scope, text, toml=a.file.endswith(".toml"))
            ), create=True,
        ))  # fmt: skip
        if args.json:
            return render_json(shown)
        said = "applied" if shown.created else "unchanged: it already holds these settings"
        return printable(f"scope {shown.scope}: version {shown.version} {said}")
    found: Any = asyncio.run(cli_host.with_runner(args, _reads[action], create=False))
    if args.json or action == "show":
        if action == "show" and not args.json:
            return _lines(json.dumps(found.config, indent=2, sort_keys=True))
        return render_json(found)
    if action == "history":
        rows = [("VERSION", "APPLIED")]
        rows += [(str(v.version), age(v.applied_at)) for v in found]
        return "\n".join(table(rows))
    return _lines(found) if found else "no difference"


def _lines(text: str) -> str:
    return "\n".join(printable(line) for line in text.splitlines())


_reads: dict[str, Callable[[argparse.Namespace, Any], Any]] = {
    "show": lambda a, runner: runner.scope_config(a.scope, a.version),
    "history": lambda a, runner: runner.scope_config_history(a.scope),
    "diff": lambda a, runner: runner.scope_config_diff(a.scope, a.before, a.after),
}


def _read(file: str) -> str:
    path = Path(file)
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise InvalidInput(f"{printable(file[:200])}: over {MAX_CONFIG_BYTES // 1024} KiB")
        return path.read_text(encoding="utf-8")
    except OSError as error:
        raise InvalidInput(f"cannot read {printable(file[:200])!r}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise InvalidInput(f"{printable(file[:200])!r} is not UTF-8 text") from None
