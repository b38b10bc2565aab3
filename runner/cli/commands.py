"""The `qjsflow` command line (README: The command line).

Exit codes: 0 ok, 1 the operation failed, 2 bad usage or input (nothing is written then).
`--json` prints exactly one JSON document on stdout; errors go to stderr as one line (with a
traceback only under `--debug`). A run that ends `failed` is a successful command: its status
says how it ended.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from qjsflow.bridge import CodecError, InvalidInput, QjsflowError
from qjsflow.bridge.codec import loads
from qjsflow.bundles import PublishError
from qjsflow.runner.cli import control as cli_control
from qjsflow.runner.cli import output as cli_output
from qjsflow.runner.cli.control import CONTROL_VERBS, Bulk
from qjsflow.runner.cli.output import (
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
    render_workers,
    table,
)
from qjsflow.runner.cli.parser import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    GLOBAL_DEFAULTS,
    build_parser,
    confinement_of,
)
from qjsflow.runner.cli.recorded import RECORDING, recorded
from qjsflow.runner.errors import RunNotFound
from qjsflow.runner.operations.timeline import timeline_rows
from qjsflow.runner.reads import RunReads, reading
from qjsflow.runner.store import ENDED, SnapshotRecord
from qjsflow.runner.store.backends import is_postgres_url
from qjsflow.runner.tenancy.scopes import ALL_SCOPES
from qjsflow.runner.views import TERMINAL, RunView, StartRunInput, StepView

if TYPE_CHECKING:
    from qjsflow.runner.runner import PublishResult, Runner

__all__ = ["main"]

# The reading commands get a `RunReads` (`_with_reads`); the others a `Runner`, whose module
# (the driver, pool and publish path) only they load (`_with_runner`).
_Read = Callable[[argparse.Namespace, RunReads], Awaitable[Any]]
_Command = Callable[[argparse.Namespace, "Runner"], Awaitable[Any]]
# Commands that are neither reads nor Runner calls (runner/cli/host.py carries them out).
_HOST_COMMANDS = frozenset({"demo", "console", "run", "dev", "doctor", "setup-tools"})


def _json_arg(text: str, option: str) -> Any:
    try:
        return loads(text)
    except CodecError as error:
        raise InvalidInput(f"{option} is not valid JSON: {error}") from None


def _check_options(args: argparse.Namespace) -> None:
    """A reading command uses none of the host's options, but checks them as every command
    does: bad input is refused (exit 2) whichever command carries it. Only when some is given
    does it load what checking them takes."""
    if args.env or args.tools or args.notify:
        from qjsflow.runner.cli import host as cli_host  # noqa: PLC0415  (loads what the options name)

        cli_host.config_of(args)
    else:
        confinement_of(os.environ)


def _journal_must_exist(args: argparse.Namespace) -> None:
    if not is_postgres_url(args.db):
        path = Path(str(args.db).removeprefix("sqlite:///"))
        if not path.is_file():
            raise InvalidInput(f"no journal database at {args.db}: publish something first")


async def _with_runner(args: argparse.Namespace, action: _Command, *, create: bool = False) -> Any:
    """`action` on a Runner: the commands that publish, start, drive or change runs."""
    if not create:
        _journal_must_exist(args)
    from qjsflow.runner.cli import host as cli_host  # noqa: PLC0415  (loads the driver, pool, publish path)

    return await cli_host.with_runner(args, action, create=create)


async def _with_reads(args: argparse.Namespace, action: _Read) -> Any:
    """`action` on the journal's reads alone: the commands that only look at runs."""
    _check_options(args)
    _journal_must_exist(args)
    async with reading(args.db) as reads:
        return await action(args, reads)


async def _serve(args: argparse.Namespace, runner: Runner) -> int:
    """`qjsflow worker`: the worker loops until SIGTERM (finishing or releasing what it holds)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    mode = "until idle" if args.until_idle else "until SIGTERM"
    serving = asyncio.Event()

    def ready() -> None:  # registered in the journal: said once, as the health check's ready
        print(f"qjsflow worker: serving {args.db} ({mode})", file=sys.stderr, flush=True)
        serving.set()

    if args.metrics_port is not None:
        _serve_metrics(args.host, args.metrics_port)
    health = None
    if args.health_port is not None:
        from qjsflow.runner.operations.health import serve_health  # noqa: PLC0415

        health = await serve_health(args.host, args.health_port, runner.store,
                                    serving.is_set)  # fmt: skip
    try:
        drove = await runner.serve(
            until_idle=args.until_idle, concurrency=args.concurrency, stop=stop,
            idle_horizon_s=args.idle_window, ready=ready, poll_interval_s=args.poll,
        )  # fmt: skip
        if args.until_idle:
            print(f"qjsflow worker: idle; {await _left(runner)}", file=sys.stderr, flush=True)
        return drove
    finally:
        if health is not None:
            health.close()


async def _left(runner: Runner) -> str:
    """What an idle worker leaves: runs that have not ended, and when the next timer is due."""
    counts = await runner.store.count_runs_by_status(None)
    left = ", ".join(f"{n} {status}" for status, n in sorted(counts.items())
                     if status not in ENDED and n)  # fmt: skip
    due = await runner.store.next_due()
    if due is None:
        return f"left {left or 'no run'}; no timer is due"
    after_s = max(0.0, due / 1000 - time.time())
    return f"left {left or 'no run'}; the next timer is due in {after_s:.0f} s"


def _serve_metrics(host: str, port: int) -> None:
    from qjsflow.runner.telemetry.metrics import METRICS  # noqa: PLC0415

    if not METRICS.enable():
        raise InvalidInput("--metrics-port needs prometheus-client: pip install 'qjsflow[otel]'")
    import prometheus_client  # noqa: PLC0415  (installed: enable() imported it)

    prometheus_client.start_http_server(port, addr=host)


def _batch(args: argparse.Namespace) -> list[StartRunInput]:
    """`start --batch FILE`: the starts it holds, a JSON object a line."""
    try:
        lines = Path(args.batch).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise InvalidInput(f"cannot read --batch {printable(args.batch[:200])}: {error}") from None
    requests = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        item = _json_arg(line, f"--batch line {number}")
        if not isinstance(item, dict):
            raise InvalidInput(f"--batch line {number} is not a JSON object")
        if "workflow" not in item and args.workflow is None:
            raise InvalidInput(f"--batch line {number} names no workflow (nor does the command)")
        requests.append(StartRunInput(
            args.scope, str(item.get("workflow", args.workflow)),
            str(item.get("snapshot", args.snapshot)), item.get("input"), item.get("run_id"),
            tags=item.get("tags"), flow=item.get("flow"), priority=item.get("priority"),
        ))  # fmt: skip
    return requests


async def _start(args: argparse.Namespace, runner: Runner) -> RunView:
    payload = _json_arg(args.input, "--input")
    flow = None if args.flow is None else _json_arg(args.flow, "--flow")
    request = StartRunInput(args.scope, args.workflow, args.snapshot, payload, args.run_id,
                            tags=_tags(args.tag), flow=flow, priority=args.priority)  # fmt: skip
    return await recorded(args, runner, lambda: runner.start(request, drive=False))


async def _result(args: argparse.Namespace, reads: RunReads) -> RunView:
    scope = await _scope_of(args, reads)
    if not args.wait:
        return await reads.get(args.run, scope=scope)
    return await reads.wait(args.run, scope=scope, timeout_s=args.timeout)


async def _scope_of(args: argparse.Namespace, reads: RunReads) -> str:
    """`--scope`, or for an operator who left it out, the one scope that has this run id."""
    if args.scope is not None:
        return str(args.scope)
    scopes = await reads.scopes_of(args.run)
    if not scopes:
        raise RunNotFound(args.run)
    if len(scopes) > 1:
        raise InvalidInput(
            f"run {args.run!r} exists in {len(scopes)} scopes ({', '.join(scopes[:10])}): "
            "say which with --scope"
        )
    return scopes[0]


async def _signal(args: argparse.Namespace, runner: Runner) -> RunView:
    payload = _json_arg(args.input, "--input")
    scope = await _scope_of(args, runner)
    waited = {
        str(event.data.get("type")) for event in await runner.history(args.run, scope=scope)
        if event.type == "waiting_for_event" and isinstance(event.data, dict)
    }  # fmt: skip
    done = await recorded(args, runner, lambda: runner.signal(
        args.run, args.type, payload, scope=scope, event_id=args.event_id, drive=False,
    ))  # fmt: skip
    if args.type not in waited:  # delivered all the same: a later wait may ask for it
        types = ", ".join(sorted(waited)) or "none yet"
        print(printable(f"qjsflow: note: run {args.run!r} has never waited for an event of type "
                        f"{args.type!r} (the types it waited for: {types}); the event is kept "
                        "for a wait that asks for it"), file=sys.stderr)  # fmt: skip
    return done


async def _list(args: argparse.Namespace, reads: RunReads) -> list[RunView]:
    """One page, and one run more to tell whether there are more."""
    scope = ALL_SCOPES if args.scope is None else args.scope
    now = time.time()
    since = None if args.since is None else cli_control.parse_since(args.since, now)
    until = None if args.until is None else cli_control.parse_since(args.until, now)
    tags = _tags(args.tag) or {}
    if args.schedule is not None:  # a schedule's runs carry its name as a tag
        tags["schedule"] = args.schedule
    return await reads.list(
        scope=scope, workflow=args.workflow, status=args.status, limit=args.limit + 1,
        offset=args.offset, newest_first=args.desc, since=since, cursor=args.cursor,
        tags=tags or None, until=until,
    )  # fmt: skip


def _tags(given: list[str] | None) -> dict[str, str] | None:
    """`--tag KEY=VALUE` options as tags."""
    if not given:
        return None
    tags: dict[str, str] = {}
    for text in given:
        key, equals, value = text.partition("=")
        if not equals or not key:
            raise InvalidInput(f"--tag wants KEY=VALUE, not {printable(text[:80])!r}")
        tags[key] = value
    return tags


async def _snapshots(args: argparse.Namespace, reads: RunReads) -> list[SnapshotRecord]:
    return await reads.snapshots(scope=ALL_SCOPES if args.scope is None else args.scope)


async def _timeline(args: argparse.Namespace, reads: RunReads) -> list[tuple[str, ...]]:
    run = await reads.get(args.run, scope=await _scope_of(args, reads))
    return await timeline_rows(reads, run)


def _on_run(method: str) -> _Read:
    """A read of one run: `RunReads.<method>(run, scope=…)`, the scope found if not given."""

    async def command(args: argparse.Namespace, reads: RunReads) -> Any:
        return await getattr(reads, method)(args.run, scope=await _scope_of(args, reads))

    return command


_RUN_COMMANDS: dict[str, _Command] = {
    "start": _start,
    "signal": _signal,
    "fork": lambda args, runner: cli_control.fork(args, runner, _scope_of),
}


# Read-only views of one run: the RunReads method and how a person reads it.
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
    if command == "start" and getattr(args, "batch", None):
        requests = _batch(args)
        items = asyncio.run(_with_runner(args, lambda a, r: r.start_batch(requests)))
        if args.json:
            return render_json(items)
        counts = {o: sum(i.outcome == o for i in items) for o in ("created", "existed", "refused")}
        lines = [", ".join(f"{n} {o}" for o, n in counts.items())]
        lines += [printable(f"  item {i.index + 1}: {i.error}") for i in items if i.error]
        return "\n".join(lines)
    if command == "start" and args.workflow is None:
        raise InvalidInput("start needs a WORKFLOW, or --batch FILE")
    if command in _HOST_COMMANDS:
        from qjsflow.runner.cli import host as cli_host  # noqa: PLC0415  (loads the driver, pool, publish path)

        return cli_host.run_command(args)
    if command == "publish":
        publish: _Command = lambda a, r: r.publish(a.scope, a.dir, a.entry)  # noqa: E731
        result: PublishResult = asyncio.run(_with_runner(args, publish, create=True))
        for warning in result.warnings:
            print(printable(f"qjsflow: warning: {warning}"), file=sys.stderr)
        if not args.json:
            return render_publish(result)
        workflows = list(result.workflows)
        return render_json({
            "snapshot_id": result.snapshot_id, "workflows": workflows, "created": result.created,
            "warnings": list(result.warnings),
        })  # fmt: skip
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
        if getattr(args, "wait", None) == "end":
            return _output(done)
        return render_json(done) if args.json else render_run(done, colour)
    if command == "migrate":
        report = asyncio.run(_with_runner(args, lambda a, r: cli_control.migrate(a, r, _scope_of)))
        shown = render_json(report) if args.json else cli_control.render_migration(report)
        return (shown, EXIT_FAILED) if report.incompatible or report.failed else shown
    if command == "prune":
        pruned = asyncio.run(_with_runner(args, cli_control.prune))
        return render_json(pruned) if args.json else cli_control.render_pruned(pruned)
    followed: str = asyncio.run(_with_reads(args, _follow_logs))
    return followed


def _show(args: argparse.Namespace, colour: bool) -> str:
    """The commands that read runs, and start and signal (which show the run they left)."""
    command = args.command
    if command == "steps":
        steps: list[StepView] = asyncio.run(_with_reads(args, _on_run("list_steps")))
        return render_json(steps) if args.json else render_steps(steps)
    if command == "result":
        return _output(asyncio.run(_with_reads(args, _result)))
    if command == "timeline":
        rows = asyncio.run(_with_reads(args, _timeline))
        if args.json:
            names = [name.lower() for name in rows[0]]
            return render_json([dict(zip(names, row, strict=True)) for row in rows[1:]])
        return "\n".join(table([tuple(printable(cell) for cell in row) for row in rows]))
    if command in _VIEWS:
        method, render = _VIEWS[command]
        rows = asyncio.run(_with_reads(args, _on_run(method)))
        return render_json(rows) if args.json else render(rows)
    if command == "usage":
        found = asyncio.run(_with_runner(
            args, lambda a, r: r.usage(scope=ALL_SCOPES if a.scope is None else a.scope)
        ))  # fmt: skip
        return render_json(found) if args.json else render_usage(found)
    if command in ("scope", "secrets"):
        from qjsflow.runner.cli.scope import scope_command, secrets_command  # noqa: PLC0415

        return scope_command(args) if command == "scope" else secrets_command(args)
    if command == "schedules":
        from qjsflow.runner.cli.schedules import schedules_command  # noqa: PLC0415

        return schedules_command(args)
    if command == "workers":
        workers = asyncio.run(_with_reads(args, lambda _, reads: reads.workers()))
        return render_json(workers) if args.json else render_workers(workers)
    if command == "snapshots":
        found = asyncio.run(_with_reads(args, _snapshots))
        return render_json(found) if args.json else render_snapshots(found)
    if command == "list":
        if not 1 <= args.limit <= 10_000 or args.offset < 0:
            raise InvalidInput("--limit must be 1 to 10000 and --offset 0 or more")
        page = asyncio.run(_with_reads(args, _list))
        runs, more = page[: args.limit], len(page) > args.limit
        cursor = RunReads.cursor_after(runs[-1]) if more else None
        if args.json:
            return render_json({"runs": runs, "more": more, "next_offset": args.offset + len(runs),
                                "next_cursor": cursor})  # fmt: skip
        shown = render_runs(runs, colour)
        return shown + (f"\n… more: --cursor {cursor}" if more else "")
    shown_run: tuple[RunView, list[StepView]] = asyncio.run(
        _with_reads(args, _and_retrying_steps(_on_run("get")))
        if command == "status"
        else _with_runner(args, _and_retrying_steps(_RUN_COMMANDS[command]))
    )
    view, retrying = shown_run
    if command in RECORDING and args.wait == "end":
        return _output(view)
    if args.json:
        return render_json(view)
    return render_run(view, colour, render_retries(retrying))


def _output(ended: RunView) -> str:
    """What `result` prints: an ended run's output (a run that did not complete, or has not
    ended, is a failure of the command, saying so)."""
    if ended.status not in TERMINAL:
        raise QjsflowError(f"run {ended.run_id!r} is {ended.status}: wait with --wait")
    if ended.status != "completed":
        raise QjsflowError(f"run {ended.run_id!r} {ended.status}: {ended.error or ''}")
    return render_json(ended.output)


_Reads = TypeVar("_Reads", bound=RunReads)


def _and_retrying_steps(
    action: Callable[[argparse.Namespace, _Reads], Awaitable[RunView]],
) -> Callable[[argparse.Namespace, _Reads], Awaitable[tuple[RunView, list[StepView]]]]:
    """`action`'s run, and, for a sleeping run shown to a person, its steps (to say which waits
    to be retried, why and when): read while the journal is open, not by opening it again."""

    async def both(args: argparse.Namespace, reads: _Reads) -> tuple[RunView, list[StepView]]:
        view = await action(args, reads)
        if view.status != "sleeping" or args.json:
            return view, []
        return view, await reads.list_steps(view.run_id, scope=view.scope)

    return both


async def _follow_logs(args: argparse.Namespace, reads: RunReads) -> str:
    """`logs --follow`: print lines as the journal gets them until the run ends (with
    `--json`, one JSON document per line)."""
    scope = await _scope_of(args, reads)
    shown = 0
    while True:
        run = await reads.get(args.run, scope=scope)  # read first: no line of the end is missed
        lines = await reads.list_logs(args.run, scope=scope)
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
        ("scope_root", "QJSFLOW_SCOPE_ROOT"),
    ):
        if getattr(args, option) == GLOBAL_DEFAULTS[option] and os.environ.get(variable):
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
    args = _with_environment(build_parser().parse_args(arguments))
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
    missing = _missing_extra(error)
    if missing is not None:
        print(f"qjsflow: error: {missing}", file=sys.stderr)
        return code
    first, *rest = [line for line in str(error).splitlines() if line.strip()] or [
        type(error).__name__
    ]
    print(f"qjsflow: error: {printable(first)}", file=sys.stderr)
    for line in rest:  # a line each, escaped each
        print(f"  {printable(line)}", file=sys.stderr)
    return code


# The optional dependencies' top-level modules, by the extra that installs them.
_EXTRA_OF = {
    "starlette": "console", "jinja2": "console", "uvicorn": "console",
    "opentelemetry": "otel", "prometheus_client": "otel", "psycopg": "postgres",
}  # fmt: skip


def _missing_extra(error: BaseException) -> str | None:
    """What to install when `error` is a missing optional dependency: its extra, not its
    module."""
    name = error.name if isinstance(error, ModuleNotFoundError) else None
    extra = _EXTRA_OF.get((name or "").split(".")[0])
    if extra is None:
        return None
    return f"this needs qjsflow's `{extra}` extra: pip install 'qjsflow[{extra}]'"


if __name__ == "__main__":
    sys.exit(main())
