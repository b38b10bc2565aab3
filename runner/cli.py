"""The `qjsflow` command line (README: The command line).

Exit codes: 0 ok, 1 the operation failed, 2 bad usage or input (nothing is written then).
`--json` prints exactly one JSON document on stdout; errors go to stderr as one line (with a
traceback only under `--debug`). A run that ends `failed` is a successful command: its status
says how it ended.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import logging
import math
import os
import signal
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from qjsflow.bridge import CodecError, InvalidInput, QjsflowError
from qjsflow.bridge.codec import loads
from qjsflow.bundles import (
    ESBUILD_VERSION,
    BuildLimits,
    PublishError,
    find_toolchain,
    setup_tools,
)
from qjsflow.runner import cli_control, cli_output
from qjsflow.runner.bindings import Bindings, Notification, ToolFn
from qjsflow.runner.cli_author import add_author_commands, develop, run_workflow
from qjsflow.runner.cli_control import CONTROL_VERBS, Bulk, add_control_commands
from qjsflow.runner.cli_output import (
    printable,
    render_history,
    render_json,
    render_logs,
    render_publish,
    render_retries,
    render_run,
    render_runs,
    render_snapshots,
    render_steps,
    render_tool_calls,
    render_usage,
    table,
)
from qjsflow.runner.config import RunnerConfig
from qjsflow.runner.demo import run_demo
from qjsflow.runner.environment import ScopeSettings, load_scope_settings
from qjsflow.runner.errors import RunNotFound
from qjsflow.runner.runner import PublishResult, Runner
from qjsflow.runner.scopes import ALL_SCOPES
from qjsflow.runner.store import SnapshotRecord
from qjsflow.runner.store.backends import is_postgres_url
from qjsflow.runner.timeline import timeline_rows
from qjsflow.runner.views import RUN_STATUSES, TERMINAL, RunView, StartRunInput, StepView
from qjsflow.sandbox import PoolConfig
from qjsflow.sandbox.confine import CONFINEMENT_MODES

__all__ = ["main"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
_SCOPE_HELP = "the run's tenant (found if only one has the run id)"
_Command = Callable[[argparse.Namespace, Runner], Awaitable[Any]]


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line on stderr and exit 2."""

    def error(self, message: str) -> Any:
        print(f"qjsflow: error: {printable(message)}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


# Options every command takes, before or after its name (`qjsflow status RUN --json`). The
# environment gives defaults: QJSFLOW_DB, QJSFLOW_TOOLS, QJSFLOW_ENV (and QJSFLOW_SCOPE for
# --scope).
_GLOBAL_DEFAULTS = {"db": "./qjsflow.db", "json": False, "debug": False, "lease_ttl": 30.0,
                    "env": None, "tools": None, "notify": None, "utc": False}  # fmt: skip


def _global_options(*, suppress: bool) -> _Parser:
    """The global options; under a command their defaults are suppressed, so an option given
    before the command's name is not overwritten by the command's parser."""
    options = _Parser(add_help=False)
    default = (lambda name: argparse.SUPPRESS) if suppress else _GLOBAL_DEFAULTS.get
    options.add_argument(
        "--db", default=default("db"),
        help="the journal: a SQLite path or sqlite:///path (./qjsflow.db), or postgresql://… "
        "(QJSFLOW_DB)",
    )  # fmt: skip
    options.add_argument("--json", action="store_true", default=default("json"),
                         help="print one JSON document on stdout")  # fmt: skip
    options.add_argument("--debug", action="store_true", default=default("debug"),
                         help="show tracebacks of failures")  # fmt: skip
    options.add_argument(
        "--lease-ttl", type=float, default=default("lease_ttl"), metavar="SECONDS",
        help="how long a driver's lease on a run lasts without a heartbeat (30)",
    )  # fmt: skip
    options.add_argument(
        "--env", metavar="FILE", default=default("env"),
        help="what runs find in env, per scope (JSON): vars, secrets (as the names of host "
        "environment variables holding their values), binding objects, egress; and each "
        "scope's budgets and capability policy (QJSFLOW_ENV)",
    )  # fmt: skip
    options.add_argument(
        "--tools", metavar="MODULE:ATTRIBUTE", default=default("tools"),
        help="a mapping of tool address to async function, for step.tool; the module may be "
        "in the current folder (QJSFLOW_TOOLS)",
    )  # fmt: skip
    options.add_argument(
        "--notify", metavar="MODULE:ATTRIBUTE", default=default("notify"),
        help="an async function given each step.notify message (QJSFLOW_NOTIFY)",
    )  # fmt: skip
    options.add_argument("--utc", action="store_true", default=default("utc"),
                         help="show times as UTC timestamps, not relative ones")  # fmt: skip
    return options


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="qjsflow", description="Durable, sandboxed JS/TS workflows.",
        parents=[_global_options(suppress=False)],
    )  # fmt: skip
    parser.add_argument("--version", action=_Version, nargs=0, help="show the version and exit")
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Parser
    )
    common = [_global_options(suppress=True)]

    def add(name: str, **kwargs: Any) -> argparse.ArgumentParser:
        """A command; it takes the global options after its name as well."""
        return commands.add_parser(name, parents=common, **kwargs)

    publish = add("publish", help="publish a source folder as a snapshot")
    publish.add_argument("dir", help="the folder holding workflows/ and the code it imports")
    publish.add_argument("--scope", help="the tenant the snapshot belongs to (QJSFLOW_SCOPE)")
    start = add("start", help="start a run pinned to a snapshot")
    start.add_argument("workflow", help="the workflow's name in the snapshot")
    start.add_argument("--scope", help="the run's tenant (QJSFLOW_SCOPE)")
    start.add_argument(
        "--snapshot",
        required=True,
        help="the snapshot: its id, a unique prefix of 8+ hex digits, or `latest`",
    )
    start.add_argument("--input", default="null", help="the event payload, as JSON")
    start.add_argument("--run-id", help="makes start idempotent")
    start.add_argument(
        "--no-wait", action="store_true", help="only record the run: a worker drives it"
    )
    start.add_argument(
        "--wait", action="store_true",
        help="block until the run ends (a worker drives what is left) and print its output",
    )  # fmt: skip
    start.add_argument("--timeout", type=float, metavar="SECONDS", help="how long to --wait")
    result = add("result", help="a run's output once it has ended")
    result.add_argument("run", help="the run id")
    result.add_argument("--scope", help=_SCOPE_HELP)
    result.add_argument(
        "--wait", action="store_true", help="wait for the run to end (a worker drives it)"
    )
    result.add_argument("--timeout", type=float, metavar="SECONDS", help="how long to wait")
    _add_run_views(add)
    add_control_commands(add)
    signal_ = add("signal", help="deliver an event to a run")
    signal_.add_argument("run", help="the run id")
    signal_.add_argument("type", help="the event type its waitForEvent waits for")
    signal_.add_argument("--payload", default="null", help="the event payload, as JSON")
    signal_.add_argument("--scope", help=_SCOPE_HELP)
    signal_.add_argument(
        "--event-id", help="an idempotency key: the same id delivered again adds nothing"
    )
    usage = add("usage", help="runs per scope by status, and what each used of its budgets")
    usage.add_argument("--scope", help="one tenant's (all without it)")
    snapshots = add("snapshots", help="list published snapshots, newest first")
    snapshots.add_argument("--scope", help="one tenant's (all without it)")
    listing = add("list", help="list runs")
    listing.add_argument("--scope", help="one tenant's runs (all without it)")
    listing.add_argument("--workflow", help="runs of this workflow")
    listing.add_argument("--status", choices=RUN_STATUSES, help="one of: %(choices)s")
    listing.add_argument("--limit", type=int, default=50, help="runs per page (50)")
    listing.add_argument("--offset", type=int, default=0, help="runs to skip (0)")
    listing.add_argument("--desc", action="store_true", help="newest first")
    listing.add_argument("--since", metavar="WHEN", help="created since: 2h, 7d, or an ISO time")
    listing.add_argument("--cursor", help="start after this (the next_cursor of a page)")
    _add_worker(add)
    add("demo", help="the whole story on a fresh database, with a timeline")
    add("doctor", help="which sandbox layers and tools this machine gives qjsflow")
    _add_console(add)
    add_author_commands(add)
    add(
        "setup-tools",
        help=f"fetch esbuild {ESBUILD_VERSION} (checksum-verified) into the per-user cache",
    )
    return parser  # fmt: skip


def _add_worker(add: Callable[..., argparse.ArgumentParser]) -> None:
    worker = add("worker", help="wake due runs and recover crashed ones")
    worker.add_argument(
        "--until-idle",
        action="store_true",
        help="exit once nothing is running and no timer is due within 1 s",
    )
    worker.add_argument("--concurrency", type=int, default=8, help="drives at once (8)")
    worker.add_argument("-v", "--verbose", action="store_true",
                        help="print one line per drive on stderr")  # fmt: skip
    worker.add_argument(
        "--log-format", choices=("text", "json"), default="text",
        help="log lines as text or one JSON object each (json logs at info)",
    )  # fmt: skip
    worker.add_argument("--metrics-port", type=int, metavar="PORT",
                        help="serve Prometheus metrics at /metrics on this port")  # fmt: skip
    worker.add_argument("--health-port", type=int, metavar="PORT",
                        help="serve /healthz and /readyz on this port")  # fmt: skip
    worker.add_argument("--listen-host", default="127.0.0.1",
                        help="where the metrics and health ports listen (127.0.0.1)")  # fmt: skip


def _add_console(add: Callable[..., argparse.ArgumentParser]) -> None:
    console = add("console", help="serve the web console over this journal")
    console.add_argument("--host", default="127.0.0.1", help="where to listen (127.0.0.1)")
    console.add_argument("--port", type=int, default=8470, help="the port (8470)")
    console.add_argument(
        "--token-file", metavar="FILE",
        help="tokens, one per line: `TOKEN` (an operator) or `TOKEN scope=NAME` (one tenant); "
        "required to listen beyond loopback",
    )  # fmt: skip


def _add_run_views(add: Callable[..., argparse.ArgumentParser]) -> None:
    """The commands that show one run."""
    for name, text in (
        ("status", "show a run"),
        ("steps", "list a run's steps"),
        ("logs", "show a run's console lines"),
        ("tools", "show a run's tool calls (the audit)"),
        ("history", "show every event of a run, in order"),
        ("timeline", "show a run's steps with the drives that executed and replayed them"),
    ):
        command = add(name, help=text)
        command.add_argument("run", help="the run id")
        command.add_argument("--scope", help=_SCOPE_HELP)
        if name == "logs":
            command.add_argument("--follow", "-f", action="store_true",
                                 help="keep printing new lines until the run ends")  # fmt: skip


class _Version(argparse.Action):
    """`--version`, read from the installed metadata only when asked (reading it for every
    command would slow them all)."""

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        print(f"qjsflow {_version()}")
        parser.exit()


def _version() -> str:
    import importlib.metadata  # noqa: PLC0415  (only --version reads it)

    try:
        return importlib.metadata.version("qjsflow")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


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


def load_notify(spec: str) -> Callable[[Notification], Awaitable[None]]:
    """`module:attribute` naming an async function given each `step.notify` message."""
    notify = _load_attribute(spec, "--notify")
    if not callable(notify):
        raise InvalidInput(f"{spec!r} is not a function")
    return notify  # type: ignore[no-any-return]


def _json_arg(text: str, option: str) -> Any:
    try:
        return loads(text)
    except CodecError as error:
        raise InvalidInput(f"{option} is not valid JSON: {error}") from None


def _config(args: argparse.Namespace) -> RunnerConfig:
    if not math.isfinite(args.lease_ttl) or args.lease_ttl <= 0:
        raise InvalidInput("--lease-ttl must be a finite number of seconds, more than 0")
    bindings = Bindings(tools=load_tools(args.tools) if args.tools else {})
    if args.notify:
        bindings = dataclasses.replace(bindings, notify=load_notify(args.notify))
    settings = load_scope_settings(args.env) if args.env else ScopeSettings({}, {}, {})
    confinement = os.environ.get("QJSFLOW_CONFINEMENT", "best-effort")
    if confinement not in CONFINEMENT_MODES:
        raise InvalidInput(f"QJSFLOW_CONFINEMENT must be one of: {', '.join(CONFINEMENT_MODES)}")
    return RunnerConfig(
        lease_ttl_s=args.lease_ttl, bindings=bindings, environments=settings.environments,
        scope_budgets=settings.budgets, scope_policies=settings.policies,
        pool=PoolConfig(confinement=confinement),
        build_limits=BuildLimits(confinement=confinement),
    )  # fmt: skip


async def _with_runner(args: argparse.Namespace, action: _Command, *, create: bool = False) -> Any:
    if not create and not is_postgres_url(args.db):
        path = Path(str(args.db).removeprefix("sqlite:///"))
        if not path.is_file():
            raise InvalidInput(f"no journal database at {args.db}: publish something first")
    async with Runner.open(args.db, _config(args), create=create) as runner:
        return await action(args, runner)


async def _serve(args: argparse.Namespace, runner: Runner) -> int:
    """`qjsflow worker`: the worker loops until SIGTERM (finishing or releasing what it holds)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    mode = "until idle" if args.until_idle else "until SIGTERM"
    print(f"qjsflow worker: serving {args.db} ({mode})", file=sys.stderr, flush=True)
    serving = asyncio.Event()
    if args.metrics_port is not None:
        _serve_metrics(args.listen_host, args.metrics_port)
    health = None
    if args.health_port is not None:
        from qjsflow.runner.health import serve_health  # noqa: PLC0415

        health = await serve_health(args.listen_host, args.health_port, runner.store,
                                    serving.is_set)  # fmt: skip
    loop.call_soon(serving.set)  # ready once the loop below runs
    try:
        return await runner.serve(
            until_idle=args.until_idle, concurrency=args.concurrency, stop=stop
        )
    finally:
        if health is not None:
            health.close()


def _serve_metrics(host: str, port: int) -> None:
    from qjsflow.runner.metrics import METRICS  # noqa: PLC0415

    if not METRICS.enable():
        raise InvalidInput("--metrics-port needs prometheus-client: pip install 'qjsflow[otel]'")
    import prometheus_client  # noqa: PLC0415  (installed: enable() imported it)

    prometheus_client.start_http_server(port, addr=host)


async def _start(args: argparse.Namespace, runner: Runner) -> RunView:
    payload = _json_arg(args.input, "--input")
    request = StartRunInput(args.scope, args.workflow, args.snapshot, payload, args.run_id)
    run = await runner.start(request, drive=not args.no_wait)
    if not args.wait:
        return run
    return await runner.wait(run.run_id, scope=run.scope, timeout_s=args.timeout)


async def _result(args: argparse.Namespace, runner: Runner) -> RunView:
    scope = await _scope_of(args, runner)
    if not args.wait:
        return await runner.get(args.run, scope=scope)
    return await runner.wait(args.run, scope=scope, timeout_s=args.timeout)


async def _scope_of(args: argparse.Namespace, runner: Runner) -> str:
    """`--scope`, or for an operator who left it out, the one scope that has this run id."""
    if args.scope is not None:
        return str(args.scope)
    scopes = await runner.scopes_of(args.run)
    if not scopes:
        raise RunNotFound(args.run)
    if len(scopes) > 1:
        raise InvalidInput(
            f"run {args.run!r} exists in {len(scopes)} scopes ({', '.join(scopes[:10])}): "
            "say which with --scope"
        )
    return scopes[0]


async def _signal(args: argparse.Namespace, runner: Runner) -> RunView:
    payload = _json_arg(args.payload, "--payload")
    scope = await _scope_of(args, runner)
    return await runner.signal(args.run, args.type, payload, scope=scope, event_id=args.event_id)


async def _list(args: argparse.Namespace, runner: Runner) -> list[RunView]:
    """One page, and one run more to tell whether there are more."""
    scope = ALL_SCOPES if args.scope is None else args.scope
    since = None if args.since is None else cli_control.parse_since(args.since, time.time())
    return await runner.list(
        scope=scope, workflow=args.workflow, status=args.status, limit=args.limit + 1,
        offset=args.offset, newest_first=args.desc, since=since, cursor=args.cursor,
    )  # fmt: skip


async def _snapshots(args: argparse.Namespace, runner: Runner) -> list[SnapshotRecord]:
    return await runner.snapshots(scope=ALL_SCOPES if args.scope is None else args.scope)


async def _timeline(args: argparse.Namespace, runner: Runner) -> list[tuple[str, ...]]:
    run = await runner.get(args.run, scope=await _scope_of(args, runner))
    return await timeline_rows(runner, run)


def _on_run(method: str) -> _Command:
    """A command on one run: `Runner.<method>(run, scope=…)`, the scope found if not given."""

    async def command(args: argparse.Namespace, runner: Runner) -> Any:
        return await getattr(runner, method)(args.run, scope=await _scope_of(args, runner))

    return command


_RUN_COMMANDS: dict[str, _Command] = {
    "start": _start,
    "signal": _signal,
    "status": _on_run("get"),
    "fork": lambda args, runner: cli_control.fork(args, runner, _scope_of),
}


# Read-only views of one run: the Runner method and how a person reads it.
_VIEWS: dict[str, tuple[str, Callable[[Any], str]]] = {
    "logs": ("list_logs", render_logs),
    "tools": ("list_tool_calls", render_tool_calls),
    "history": ("history", render_history),
}


def _run(args: argparse.Namespace) -> str | tuple[str, int]:
    """Carry out one command; returns what to print (and the exit code, when not 0)."""
    colour = sys.stdout.isatty() and not args.json and "NO_COLOR" not in os.environ
    cli_output.ABSOLUTE_TIMES = args.utc
    command = args.command
    if command in ("publish", "start") and not args.scope:
        raise InvalidInput(f"{command} needs --scope (or QJSFLOW_SCOPE)")
    if command == "demo":
        return run_demo(as_json=args.json)
    if command == "console":
        from qjsflow.runner.console.serve import serve_console  # noqa: PLC0415

        serve_console(args.db, _config(args), host=args.host, port=args.port,
                      token_file=args.token_file)  # fmt: skip
        return ""
    if command == "run":
        tools = load_tools(args.tools) if args.tools else {}
        return asyncio.run(run_workflow(args, tools))
    if command == "dev":
        asyncio.run(develop(args, args.db, _config(args)))
        return ""
    if command == "doctor":
        from qjsflow.runner import doctor  # noqa: PLC0415  (only this command needs it)

        report = asyncio.run(doctor.diagnose(_config(args).pool))
        return render_json(report) if args.json else doctor.render(report)
    if command == "setup-tools":
        where = setup_tools()
        toolchain = find_toolchain()
        if args.json:
            return render_json({"esbuild": ESBUILD_VERSION, "folder": str(where),
                                "node": toolchain.node})  # fmt: skip
        return f"esbuild {ESBUILD_VERSION} is ready in {where} (node: {toolchain.node})"
    if command == "publish":
        publish: _Command = lambda a, r: r.publish(a.scope, a.dir)  # noqa: E731
        result: PublishResult = asyncio.run(_with_runner(args, publish, create=True))
        if not args.json:
            return render_publish(result)
        workflows = list(result.workflows)
        return render_json(
            {"snapshot_id": result.snapshot_id, "workflows": workflows, "created": result.created}
        )
    if command in (*CONTROL_VERBS, "prune", "migrate") or (command == "logs" and args.follow):
        return _operate(args, colour)
    if command == "worker":
        _configure_logging(args.log_format, verbose=args.verbose)
        drives = asyncio.run(_with_runner(args, _serve))
        return (
            render_json({"drives": drives})
            if args.json
            else f"worker stopped after {drives} drives"
        )
    return _show(args, colour)


def _operate(args: argparse.Namespace, colour: bool) -> str | tuple[str, int]:
    """The commands that change runs (one, or those `--where` selects), and `logs --follow`."""
    command = args.command
    if command in CONTROL_VERBS:
        done = asyncio.run(_with_runner(args, lambda a, r: cli_control.control(a, r, _scope_of)))
        if isinstance(done, Bulk):
            shown = render_json(done) if args.json else cli_control.render_bulk(done)
            return (shown, EXIT_FAILED) if done.failed else shown
        return render_json(done) if args.json else render_run(done, colour)
    if command == "migrate":
        report = asyncio.run(_with_runner(args, lambda a, r: cli_control.migrate(a, r, _scope_of)))
        shown = render_json(report) if args.json else cli_control.render_migration(report)
        return (shown, EXIT_FAILED) if report.incompatible or report.failed else shown
    if command == "prune":
        pruned = asyncio.run(_with_runner(args, cli_control.prune))
        return render_json(pruned) if args.json else cli_control.render_pruned(pruned)
    followed: str = asyncio.run(_with_runner(args, _follow_logs))
    return followed


def _show(args: argparse.Namespace, colour: bool) -> str:
    """The commands that read runs, and start and signal (which show the run they left)."""
    command = args.command
    if command == "steps":
        steps: list[StepView] = asyncio.run(_with_runner(args, _on_run("list_steps")))
        return render_json(steps) if args.json else render_steps(steps)
    if command == "result" or (command == "start" and args.wait):
        ended: RunView = asyncio.run(_with_runner(args, _RUN_COMMANDS.get(command, _result)))
        if ended.status not in TERMINAL:
            raise QjsflowError(f"run {ended.run_id!r} is {ended.status}: wait with --wait")
        if ended.status != "completed":
            raise QjsflowError(f"run {ended.run_id!r} {ended.status}: {ended.error or ''}")
        return render_json(ended.output)
    if command == "timeline":
        rows = asyncio.run(_with_runner(args, _timeline))
        if args.json:
            names = [name.lower() for name in rows[0]]
            return render_json([dict(zip(names, row, strict=True)) for row in rows[1:]])
        return "\n".join(table([tuple(printable(cell) for cell in row) for row in rows]))
    if command in _VIEWS:
        method, render = _VIEWS[command]
        rows = asyncio.run(_with_runner(args, _on_run(method)))
        return render_json(rows) if args.json else render(rows)
    if command == "usage":
        found = asyncio.run(_with_runner(
            args, lambda a, r: r.usage(scope=ALL_SCOPES if a.scope is None else a.scope)
        ))  # fmt: skip
        return render_json(found) if args.json else render_usage(found)
    if command == "snapshots":
        found = asyncio.run(_with_runner(args, _snapshots))
        return render_json(found) if args.json else render_snapshots(found)
    if command == "list":
        if not 1 <= args.limit <= 10_000 or args.offset < 0:
            raise InvalidInput("--limit must be 1 to 10000 and --offset 0 or more")
        page = asyncio.run(_with_runner(args, _list))
        runs, more = page[: args.limit], len(page) > args.limit
        cursor = Runner.cursor_after(runs[-1]) if more else None
        if args.json:
            return render_json({"runs": runs, "more": more, "next_offset": args.offset + len(runs),
                                "next_cursor": cursor})  # fmt: skip
        shown = render_runs(runs, colour)
        return shown + (f"\n… more: --cursor {cursor}" if more else "")
    view: RunView = asyncio.run(_with_runner(args, _RUN_COMMANDS[command]))
    if args.json:
        return render_json(view)
    retries: list[tuple[str, str]] = []
    if view.status == "sleeping":  # say which step waits to be retried, why and when

        async def steps_of(_: argparse.Namespace, runner: Runner) -> list[StepView]:
            return await runner.list_steps(view.run_id, scope=view.scope)

        retries = render_retries(asyncio.run(_with_runner(args, steps_of)))
    return render_run(view, colour, retries)


async def _follow_logs(args: argparse.Namespace, runner: Runner) -> str:
    """`logs --follow`: print lines as the journal gets them until the run ends (with
    `--json`, one JSON document per line)."""
    scope = await _scope_of(args, runner)
    shown = 0
    while True:
        run = await runner.get(args.run, scope=scope)  # read first: no line of the end is missed
        lines = await runner.list_logs(args.run, scope=scope)
        for line in lines[shown:]:
            print(render_json(line) if args.json else render_logs([line]), flush=True)
        shown = len(lines)
        if run.status in TERMINAL:
            return ""
        await asyncio.sleep(0.5)


def _configure_logging(log_format: str, *, verbose: bool) -> None:
    """The worker's log lines on stderr: text (`-v` adds a line per drive) or JSON, one object
    per line, at info. No author payload is logged at info."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonLines() if log_format == "json" else logging.Formatter("qjsflow worker: %(message)s")
    )
    qjsflow_log = logging.getLogger("qjsflow")
    qjsflow_log.addHandler(handler)
    qjsflow_log.propagate = False
    qjsflow_log.setLevel(logging.INFO if verbose or log_format == "json" else logging.WARNING)


class JsonLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {"time": round(record.created, 3), "level": record.levelname.lower(),
                "logger": record.name, "message": record.getMessage()}  # fmt: skip
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info).splitlines()[-1]
        return render_json(line)


def _check_utf8(argv: Sequence[str]) -> None:
    """Python hands undecodable argument bytes over as lone surrogates: refuse them here, so
    that no name or value that cannot be stored or printed goes any further."""
    for position, argument in enumerate(argv, start=1):
        try:
            argument.encode("utf-8")
        except UnicodeEncodeError:
            shown = printable(argument)[:80]
            raise InvalidInput(f"argument {position} ({shown}) is not valid UTF-8") from None


def _with_environment(args: argparse.Namespace) -> argparse.Namespace:
    """Defaults from the environment for what the command line left out."""
    for option, variable in (
        ("db", "QJSFLOW_DB"),
        ("tools", "QJSFLOW_TOOLS"),
        ("notify", "QJSFLOW_NOTIFY"),
        ("env", "QJSFLOW_ENV"),
    ):
        if getattr(args, option) == _GLOBAL_DEFAULTS[option] and os.environ.get(variable):
            setattr(args, option, os.environ[variable])
    if getattr(args, "scope", "given") is None and os.environ.get("QJSFLOW_SCOPE"):
        args.scope = os.environ["QJSFLOW_SCOPE"]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        _check_utf8(arguments)
    except InvalidInput as error:
        return _fail(error, EXIT_USAGE, debug=False)
    args = _with_environment(_parser().parse_args(arguments))
    try:
        shown = _run(args)
        text, code = shown if isinstance(shown, tuple) else (shown, EXIT_OK)
        if text:
            print(text)
        return code
    except InvalidInput as error:
        return _fail(error, EXIT_USAGE, args.debug)
    except QjsflowError as error:
        return _fail(error, EXIT_FAILED, args.debug)
    except Exception as error:  # a host bug: still one line unless --debug
        return _fail(error, EXIT_FAILED, args.debug)


def _fail(error: BaseException, code: int, debug: bool) -> int:
    if debug:
        traceback.print_exception(error)
    if isinstance(error, PublishError):  # one line per problem, `file:line:column: message`
        for line in str(error).splitlines() or [type(error).__name__]:
            shown = line if line.startswith("  hint: ") else f"qjsflow: error: {line}"
            print(printable(shown), file=sys.stderr)
        return code
    message = " | ".join(line.strip() for line in str(error).splitlines() if line.strip())
    print(f"qjsflow: error: {printable(message or type(error).__name__)}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
