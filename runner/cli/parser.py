"""The `qjsflow` command line's parser: every command, its options and their help.

Building it is the first thing every command does, so it imports only what its choices and
help text name (no runner, driver or pool).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from typing import Any

from qjsflow.bridge import InvalidInput
from qjsflow.bridge.printable import printable
from qjsflow.bundles.flow import PRIORITY_RANGE
from qjsflow.bundles.versions import ESBUILD_VERSION
from qjsflow.runner.cli.control import add_control_commands
from qjsflow.runner.cli.options import SECONDS, add_wait, number, old_spelling
from qjsflow.runner.views import RUN_STATUSES
from qjsflow.sandbox.confinement_modes import CONFINEMENT_MODES

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "GLOBAL_DEFAULTS",
    "build_parser",
    "confinement_of",
]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
_SCOPE_HELP = "the run's tenant (found if only one has the run id)"


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line on stderr and exit 2, and an option is given
    whole (`--scope` is never taken for a prefix of `--scope-root`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> Any:
        print(f"qjsflow: error: {printable(message)}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


_DAY_S = 86_400.0
_PORT = number(int, 1, 65_535)
_LEASE_S = number(float, 0.1, _DAY_S)
_LIMIT, _OFFSET = number(int, 1, 10_000), number(int, 0, 2**62)
_DRIVES = number(int, 1, 4096)
_PRIORITY = number(int, *PRIORITY_RANGE)


# Options every command takes, before or after its name (`qjsflow status RUN --json`). The
# environment gives defaults: QJSFLOW_DB, QJSFLOW_TOOLS, QJSFLOW_ENV (and QJSFLOW_SCOPE for
# --scope).
GLOBAL_DEFAULTS = {"db": "./qjsflow.db", "json": False, "debug": False, "lease_ttl": 30.0,
                    "env": None, "tools": None, "notify": None, "utc": False,
                    "scope_root": None, "scope_databases": None}  # fmt: skip


def _global_options(*, suppress: bool) -> _Parser:
    """The global options; under a command their defaults are suppressed, so an option given
    before the command's name is not overwritten by the command's parser."""
    options = _Parser(add_help=False)
    default = (lambda name: argparse.SUPPRESS) if suppress else GLOBAL_DEFAULTS.get
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
        "--lease-ttl", type=_LEASE_S, default=default("lease_ttl"), metavar="SECONDS",
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
    options.add_argument(
        "--scope-root", metavar="DIR", default=default("scope_root"),
        help="this machine's folder of scope databases (beside a SQLite journal, else "
        "./qjsflow.scopes; QJSFLOW_SCOPE_ROOT)",
    )  # fmt: skip
    options.add_argument(
        "--scope-databases", choices=("local", "replicated"), default=default("scope_databases"),
        help="where db.sql data lives: replicated through the journal (the default on "
        "PostgreSQL), or local files (the default on SQLite)",
    )  # fmt: skip
    return options


def build_parser() -> argparse.ArgumentParser:
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
    publish.add_argument(
        "dir",
        help="the project's folder: a Cloudflare project's root (its "
        "wrangler file names the workflows), or a folder holding workflows/",
    )
    publish.add_argument(
        "--entry", action="append", metavar="FILE[:CLASS]",
        help="an entry module in the folder, and which of its classes is a workflow (all it "
        "exports without :CLASS); repeatable; instead of the wrangler file or workflows/",
    )  # fmt: skip
    publish.add_argument("--scope", help="the tenant the snapshot belongs to (QJSFLOW_SCOPE)")
    _add_start(add)
    result = add("result", help="a run's output once it has ended")
    result.add_argument("run", help="the run id")
    result.add_argument("--scope", help=_SCOPE_HELP)
    result.add_argument(
        "--wait", action="store_true", help="wait for the run to end (a worker drives it)"
    )
    result.add_argument("--timeout", type=SECONDS, metavar="SECONDS", help="how long to wait")
    _add_run_views(add)
    add_control_commands(add)
    _add_signal(add)
    usage = add("usage", help="runs per scope by status, and what each used of its budgets")
    usage.add_argument("--scope", help="one tenant's (all without it)")
    snapshots = add("snapshots", help="list published snapshots, newest first")
    snapshots.add_argument("--scope", help="one tenant's (all without it)")
    listing = add("list", help="list runs")
    listing.add_argument("--scope", help="one tenant's runs (all without it)")
    listing.add_argument("--workflow", help="runs of this workflow")
    listing.add_argument("--status", choices=RUN_STATUSES, help="one of: %(choices)s")
    listing.add_argument("--limit", type=_LIMIT, default=50, help="runs per page (50)")
    listing.add_argument("--offset", type=_OFFSET, default=0, help="runs to skip (0)")
    listing.add_argument("--desc", action="store_true", help="newest first")
    listing.add_argument("--since", metavar="WHEN", help="created since: 2h, 7d, or an ISO time")
    listing.add_argument("--cursor", help="start after this (the next_cursor of a page)")
    listing.add_argument("--tag", action="append", metavar="KEY=VALUE",
                         help="runs with this tag (repeatable: with each)")  # fmt: skip
    listing.add_argument("--until", metavar="WHEN", help="created until: a duration ago or an "
                         "ISO time")  # fmt: skip
    listing.add_argument("--schedule", metavar="NAME", help="runs this schedule started")
    _add_worker(add)
    add("demo", help="the whole story on a fresh database, with a timeline")
    add("doctor", help="which sandbox layers and tools this machine gives qjsflow")
    _add_console(add)
    _add_author_commands(add)
    add(
        "setup-tools",
        help=f"fetch esbuild {ESBUILD_VERSION} (checksum-verified) into the per-user cache",
    )
    return parser  # fmt: skip


def _add_start(add: Callable[..., argparse.ArgumentParser]) -> None:
    start = add("start", help="start a run pinned to a snapshot")
    start.add_argument("workflow", nargs="?", help="the workflow's name in the snapshot")
    start.add_argument(
        "--batch", metavar="FILE",
        help="up to 1,000 starts in one transaction, one JSON object a line: {workflow, input, "
        "run_id, snapshot} (workflow and snapshot default to the command's); each answered",
    )  # fmt: skip
    start.add_argument("--scope", help="the run's tenant (QJSFLOW_SCOPE)")
    start.add_argument(
        "--snapshot",
        required=True,
        help="the snapshot: its id, a unique prefix of 8+ hex digits, or `latest`",
    )
    start.add_argument("--input", default="null", help="the event payload, as JSON")
    start.add_argument("--tag", action="append", metavar="KEY=VALUE",
                       help="a tag of the run (repeatable); list --tag finds it")  # fmt: skip
    start.add_argument("--run-id", help="makes start idempotent")
    start.add_argument("--priority", type=_PRIORITY, metavar="N",
                       help="-1000 to 1000, higher first: claimed first in the scope, and "
                       "first out of its workflow's queue")  # fmt: skip
    start.add_argument("--flow", metavar="JSON",
                       help="flow control for this start, in place of the workflow's own: "
                       '{"concurrency": {"limit": 2, "key": "event.payload.id"}, ...}')  # fmt: skip
    add_wait(start)


def _add_worker(add: Callable[..., argparse.ArgumentParser]) -> None:
    worker = add("worker", help="wake due runs and recover crashed ones")
    worker.add_argument(
        "--until-idle",
        action="store_true",
        help="exit once nothing is running and no timer is due within --idle-window",
    )
    worker.add_argument(
        "--idle-window", type=number(float, 0.0, 3600.0), default=1.0, metavar="SECONDS",
        help="with --until-idle, the timers it still waits for: those due within this (1)",
    )  # fmt: skip
    worker.add_argument("--concurrency", type=_DRIVES, default=8, help="drives at once (8)")
    worker.add_argument(
        "--poll", type=number(float, 0.01, 3600.0), default=0.2, metavar="SECONDS",
        help="how often it looks for work it was not told of (0.2); on PostgreSQL starts, "
        "events and admissions wake it at once, and the poll is a backstop",
    )  # fmt: skip
    worker.add_argument("-v", "--verbose", action="store_true",
                        help="print one line per drive on stderr")  # fmt: skip
    worker.add_argument(
        "--log-format", choices=("text", "json"), default="text",
        help="log lines as text or one JSON object each (json logs at info)",
    )  # fmt: skip
    worker.add_argument("--metrics-port", type=_PORT, metavar="PORT",
                        help="serve Prometheus metrics at /metrics on this port")  # fmt: skip
    worker.add_argument("--health-port", type=_PORT, metavar="PORT",
                        help="serve /healthz and /readyz on this port")  # fmt: skip
    worker.add_argument("--host", default="127.0.0.1",
                        help="where the metrics and health ports listen (127.0.0.1)")  # fmt: skip
    old_spelling(worker, "--listen-host", "--host")  # as the console's --host
    add("workers", help="the workers serving this journal: live, gone or stopped, what each binds")
    _add_scope(add)
    _add_secrets(add)
    _add_schedules(add)


def _add_signal(add: Callable[..., argparse.ArgumentParser]) -> None:
    signal_ = add("signal", help="deliver an event to a run")
    signal_.add_argument("run", help="the run id")
    signal_.add_argument("type", help="the event type its waitForEvent waits for")
    signal_.add_argument("--input", default="null", help="the event payload, as JSON (as start's)")
    old_spelling(signal_, "--payload", "--input")
    signal_.add_argument("--scope", help=_SCOPE_HELP)
    signal_.add_argument(
        "--event-id", help="an idempotency key: the same id delivered again adds nothing"
    )
    add_wait(signal_)


def _command_with_actions(
    add: Callable[..., argparse.ArgumentParser], name: str, text: str, actions: str
) -> Callable[[str, str], argparse.ArgumentParser]:
    """A command whose first argument is an action (`qjsflow scope apply`): how to add each
    action, which takes the global options and `--scope` as every command does."""
    parents = [_global_options(suppress=True)]
    command = add(name, help=text)
    chosen = command.add_subparsers(
        dest=f"{name}_action", required=True, metavar="ACTION", parser_class=type(command),
        help=actions,
    )  # fmt: skip

    def action(action_name: str, action_text: str) -> argparse.ArgumentParser:
        parser = chosen.add_parser(action_name, help=action_text, parents=parents)
        parser.add_argument("--scope", help="the scope (QJSFLOW_SCOPE)")
        return parser

    return action


def _add_scope(add: Callable[..., argparse.ArgumentParser]) -> None:
    """`qjsflow scope ACTION` (runner/cli/scope.py)."""
    action = _command_with_actions(
        add, "scope", "a scope's configuration in the journal: apply, show, history, diff",
        "apply, show, history or diff",
    )  # fmt: skip

    apply = action("apply", "store a configuration file (JSON or TOML) as the next version")
    apply.add_argument("file", nargs="?", help="the file (.json, or .toml)")
    apply.add_argument(
        "--version",
        type=_config_version,
        metavar="N",
        help="apply version N's settings again (a rollback), instead of a file",
    )
    show = action("show", "a version's settings (the latest without --version)")
    show.add_argument("--version", type=_config_version, metavar="N", help="this version")
    action("history", "every version, the newest first")
    diff = action("diff", "what changed between two versions (the latest and the one before)")
    diff.add_argument("before", nargs="?", type=_config_version, help="the older version")
    diff.add_argument(
        "after", nargs="?", type=_config_version, help="the newer version (the latest)"
    )


def _add_secrets(add: Callable[..., argparse.ArgumentParser]) -> None:
    """`qjsflow secrets ACTION` (runner/cli/scope.py): values sealed in the journal."""
    action = _command_with_actions(
        add, "secrets", "secret values sealed in the journal under their scope's key",
        "set, list, delete or keygen",
    )  # fmt: skip
    for name, text in (
        ("set", "seal a value read from stdin as the secret NAME (its source: @journal)"),
        ("delete", "forget the secret NAME"),
        ("list", "the scope's sealed secrets: names and when each was set, never a value"),
        ("keygen", "make the scope's key in --keys (or QJSFLOW_SECRET_KEYS); never replaced"),
    ):
        parser = action(name, text)
        parser.add_argument("--keys", metavar="DIR", help="the folder of scope keys")
        if name in ("set", "delete"):
            parser.add_argument("name", help="the secret's name, as the run's env has it")


def _add_schedules(add: Callable[..., argparse.ArgumentParser]) -> None:
    """`qjsflow schedules ACTION` (runner/cli/schedules.py)."""
    action = _command_with_actions(
        add, "schedules", "a scope's schedules: a workflow started at each cron or interval tick",
        "list, show, set, pause, unpause, trigger or delete",
    )  # fmt: skip
    action("list", "the schedules (of --scope, or of every scope)")
    for name, text in (
        ("show", "one schedule: when it fires next, what it fired and skipped"),
        ("pause", "fire nothing until unpause"), ("unpause", "fire again, from now on"),
        ("trigger", "fire it now, by hand"), ("delete", "forget the schedule"),
        ("set", "make a schedule, or replace its settings"),
        ("backfill", "start the firings between two times that have no run yet"),
    ):  # fmt: skip
        parser = action(name, text)
        parser.add_argument("name", help="the schedule's name (1-64 of A-Z, a-z, 0-9, _, -)")
        if name == "set":
            parser.add_argument("--workflow", required=True, help="the workflow it starts")
            parser.add_argument("--cron", help='five fields, as "0 9 * * 1-5"')
            parser.add_argument("--every", type=number(float, 1.0, 366 * _DAY_S),
                                metavar="SECONDS", help="or an interval")  # fmt: skip
            parser.add_argument("--timezone", default="UTC", help="the cron's zone (UTC)")
            parser.add_argument("--overlap", default="skip",
                                choices=("skip", "buffer_one", "allow_all", "cancel_other"),
                                help="while its last run goes on (skip)")  # fmt: skip
            parser.add_argument("--catchup", type=number(float, 0.0, 366 * _DAY_S),
                                metavar="SECONDS", help="missed firings younger than this "
                                "start after downtime (3600)")  # fmt: skip
            parser.add_argument("--input", help="its runs' payload, as JSON")
            parser.add_argument("--snapshot", default="latest", help="the code (latest)")
            parser.add_argument("--paused", action="store_true", help="made paused")
            parser.add_argument("--jitter", type=number(float, 0.0, _DAY_S), metavar="SECONDS",
                                help="each firing waits a fixed share of this (0)")  # fmt: skip
        if name == "backfill":
            parser.add_argument("--from", dest="since", required=True, metavar="WHEN",
                                help="a duration ago (2h) or an ISO time")  # fmt: skip
            parser.add_argument("--to", dest="until", required=True, metavar="WHEN",
                                help="a duration ago (0s: now) or an ISO time")  # fmt: skip


def _config_version(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 2**62:
        raise argparse.ArgumentTypeError(f"a version is a whole number from 1, not {text[:40]!r}")
    return int(text)


def _add_console(add: Callable[..., argparse.ArgumentParser]) -> None:
    console = add("console", help="serve the web console over this journal")
    console.add_argument("--host", default="127.0.0.1", help="where to listen (127.0.0.1)")
    console.add_argument("--port", type=_PORT, default=8470, help="the port (8470)")
    console.add_argument(
        "--token-file", metavar="FILE",
        help="tokens, one per line: `TOKEN` (an operator) or `TOKEN scope=NAME` (one tenant); "
        "required to listen beyond loopback",
    )  # fmt: skip
    console.add_argument(
        "--allow-host", action="append", default=[], metavar="NAME",
        help="a host name people reach the console by (repeatable); it answers only these, "
        "the loopback names and --host",
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


def _add_author_commands(add: Callable[..., argparse.ArgumentParser]) -> None:
    run = add("run", help="run a workflow to its end in a temporary journal, with mocks "
              "(exit 0 completed, 1 failed or stopped, 2 bad input)")  # fmt: skip
    run.add_argument("dir", help="the folder holding workflows/ and the code it imports")
    run.add_argument("workflow", help="the workflow's name")
    run.add_argument("--scope", help="with --env: the env file's scope to run as (its only one)")
    run.add_argument("--input", default="null", help="the event payload, as JSON")
    for option, metavar, text in (
        ("--event", "TYPE=JSON", "an event given when the run waits for TYPE (repeatable)"),
        ("--mock-tool", "ADDRESS=JSON|@FILE", "answer this tool with the JSON (or a file's)"),
        ("--mock-step", "NAME[:COUNT]=JSON", "step.do NAME's result; its body is not run"),
    ):
        run.add_argument(option, action="append", default=[], metavar=metavar, help=text)
    old_spelling(run, "--tool", "--mock-tool", append=True)  # beside the global --tools
    run.add_argument(
        "--let-waits-time-out", action="store_true",
        help="a wait nobody gave an event for times out (else the run stops there)",
    )  # fmt: skip
    run.add_argument(
        "--fast-forward", action="store_true",
        help="sleeps, retry delays and timeouts pass at once (virtual time)",
    )  # fmt: skip
    dev = add("dev", help="republish a folder on every change and serve the console on it")
    dev.add_argument("dir", help="the folder holding workflows/")
    dev.add_argument("--scope", default="dev", help="the scope it publishes into (dev)")
    dev.add_argument("--port", type=_PORT, default=8470, help="the console's port (8470)")


def confinement_of(environment: Mapping[str, str]) -> str:
    """The executors' confinement mode, from QJSFLOW_CONFINEMENT (best-effort by default)."""
    confinement = environment.get("QJSFLOW_CONFINEMENT", "best-effort")
    if confinement not in CONFINEMENT_MODES:
        raise InvalidInput(f"QJSFLOW_CONFINEMENT must be one of: {', '.join(CONFINEMENT_MODES)}")
    return confinement
