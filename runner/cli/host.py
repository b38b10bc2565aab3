"""The command line's host: a `Runner` built from the options, tools and environment given.

Only the commands that publish, start, drive or change runs import this module (and with it
the driver, the publish path and the executor pool); the reading commands open the journal's
`RunReads` alone, so `qjsflow status` starts in a fraction of the time.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import os
import sys
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from qjsflow.bridge import InvalidInput
from qjsflow.bundles import ESBUILD_VERSION, BuildLimits, find_toolchain, setup_tools
from qjsflow.runner.bindings import Bindings, Notification, ToolFn
from qjsflow.runner.cli.author import develop, run_workflow
from qjsflow.runner.cli.output import render_json
from qjsflow.runner.cli.parser import confinement_of
from qjsflow.runner.config import RunnerConfig
from qjsflow.runner.demo import run_demo
from qjsflow.runner.runner import Runner
from qjsflow.runner.store.backends import is_postgres_url
from qjsflow.runner.tenancy.environment import ScopeSettings, load_scope_settings
from qjsflow.sandbox import PoolConfig

__all__ = ["config_of", "load_tools", "run_command", "with_runner"]


def load_tools(spec: str) -> Mapping[str, ToolFn]:
    """`module:attribute` naming a mapping of tool address -> async function."""
    tools = _load_attribute(spec, "--tools")
    if not isinstance(tools, Mapping):
        raise InvalidInput(f"{spec!r} is not a mapping of tool address to function")
    return tools


def _load_attribute(spec: str, option: str) -> Any:
    """`module:attribute`, the module found on the path or in the current folder (as
    `python -m` would; an installed `qjsflow` script has no current folder on its path)."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise InvalidInput(f"{option} wants MODULE:ATTRIBUTE, not {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise InvalidInput(f"cannot load {option} {spec!r}: {error}") from None


def _load_notify(spec: str) -> Callable[[Notification], Awaitable[None]]:
    """`module:attribute` naming an async function given each `step.notify` message."""
    notify = _load_attribute(spec, "--notify")
    if not callable(notify):
        raise InvalidInput(f"{spec!r} is not a function")
    return notify  # type: ignore[no-any-return]


def config_of(args: argparse.Namespace) -> RunnerConfig:
    """The runner's configuration from the global options and QJSFLOW_CONFINEMENT."""
    bindings = Bindings(tools=load_tools(args.tools) if args.tools else {})
    if args.notify:
        bindings = dataclasses.replace(bindings, notify=_load_notify(args.notify))
    settings = load_scope_settings(args.env) if args.env else ScopeSettings({}, {}, {})
    confinement = confinement_of(os.environ)
    return RunnerConfig(
        lease_ttl_s=args.lease_ttl, bindings=bindings, environments=settings.environments,
        scope_budgets=settings.budgets, scope_policies=settings.policies,
        pool=PoolConfig(confinement=confinement),
        build_limits=BuildLimits(confinement=confinement),
        scope_root=None if args.scope_root is None else Path(args.scope_root).resolve(),
        scope_databases=args.scope_databases,
    )  # fmt: skip


async def with_runner(
    args: argparse.Namespace,
    action: Callable[[argparse.Namespace, Runner], Awaitable[Any]],
    *,
    create: bool,
) -> Any:
    """`action(args, runner)` on a Runner of the journal `--db`, closed afterwards."""
    async with Runner.open(args.db, config_of(args), create=create) as runner:
        return await action(args, runner)


def run_command(args: argparse.Namespace) -> str | tuple[str, int]:
    """The commands that are neither reads nor Runner calls: demo, console, run, dev, doctor,
    setup-tools; returns what to print (and the exit code, when not 0)."""
    command = args.command
    if command == "demo":
        return run_demo(as_json=args.json)
    if command == "console":
        from qjsflow.runner.console.serve import serve_console  # noqa: PLC0415

        serve_console(args.db, config_of(args), host=args.host, port=args.port,
                      token_file=args.token_file, allow_hosts=args.allow_host)  # fmt: skip
        return ""
    if command == "run":
        tools = load_tools(args.tools) if args.tools else {}
        return asyncio.run(run_workflow(args, tools))
    if command == "dev":
        asyncio.run(develop(args, args.db, config_of(args)))
        return ""
    if command == "doctor":
        from qjsflow.runner.operations import doctor  # noqa: PLC0415  (only this command needs it)

        config = config_of(args)
        server = is_postgres_url(args.db)
        mode = config.scope_database_mode(server)
        report = asyncio.run(doctor.diagnose(config.pool, mode, server_journal=server))
        return render_json(report) if args.json else doctor.render(report)
    if command == "setup-tools":
        where = setup_tools()
        toolchain = find_toolchain()
        if args.json:
            return render_json({"esbuild": ESBUILD_VERSION, "folder": str(where),
                                "node": toolchain.node})  # fmt: skip
        return f"esbuild {ESBUILD_VERSION} is ready in {where} (node: {toolchain.node})"
    raise AssertionError(f"not a host command: {command}")
