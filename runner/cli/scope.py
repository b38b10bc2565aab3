"""`qjsflow scope apply|show|history|diff`: a scope's configuration in the journal
(runner/operations/scope_configs.py). Every process reads it from there: no command needs the
file again once it is applied."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qjsflow.bridge import InvalidInput
from qjsflow.bridge.printable import printable
from qjsflow.runner.cli.output import age, render_json, table
from qjsflow.runner.tenancy.scope_config import MAX_CONFIG_BYTES

__all__ = ["scope_command", "secrets_command"]


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


def secrets_command(args: argparse.Namespace) -> str:
    """Run `qjsflow secrets ACTION`; what to print (never a value)."""
    from qjsflow.runner.cli import host as cli_host  # noqa: PLC0415  (loads the Runner)
    from qjsflow.runner.tenancy.sealed_secrets import (  # noqa: PLC0415  (cryptography)
        KEYS_VARIABLE,
        SecretKeys,
        new_key,
    )

    if not args.scope:
        raise InvalidInput("say which scope with --scope (or QJSFLOW_SCOPE)")
    keys = SecretKeys(folder=args.keys)
    action = args.secrets_action
    if action == "keygen":
        if keys.folder is None:
            raise InvalidInput(f"say where the key goes with --keys DIR (or {KEYS_VARIABLE})")
        return printable(f"scope {args.scope}: key written to {new_key(keys.folder, args.scope)}")
    if action == "set":
        value = sys.stdin.read(MAX_CONFIG_BYTES + 1).removesuffix("\n")
        asyncio.run(cli_host.with_runner(
            args, lambda a, r: r.set_secret(a.scope, a.name, value, keys=keys), create=True
        ))  # fmt: skip
        return printable(f"scope {args.scope}: secret {args.name} sealed")
    if action == "delete":
        gone = asyncio.run(cli_host.with_runner(
            args, lambda a, r: r.delete_secret(a.scope, a.name), create=False
        ))  # fmt: skip
        if not gone:
            raise InvalidInput(f"scope {args.scope!r} has no sealed secret {args.name[:80]!r}")
        return printable(f"scope {args.scope}: secret {args.name} deleted")
    names = asyncio.run(cli_host.with_runner(
        args, lambda a, r: r.secret_names(a.scope), create=False
    ))  # fmt: skip
    if args.json:
        return render_json([{"name": name, "set_at": at} for name, at in names])
    if not names:
        return printable(f"scope {args.scope}: no secrets sealed in the journal")
    rows = [("SECRET", "SET")] + [(name, age(at)) for name, at in names]
    return "\n".join(table([tuple(printable(cell) for cell in row) for row in rows]))
