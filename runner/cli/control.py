"""The run-control commands of the CLI: pause, resume, cancel, terminate, restart (one run, or
every run a `--where` selects, confirmed with `--yes`), fork and prune."""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from qjsflow.bridge import InvalidInput, QjsflowError
from qjsflow.runner.cli.options import add_wait
from qjsflow.runner.cli.output import printable
from qjsflow.runner.cli.recorded import recorded
from qjsflow.runner.reads import RunReads
from qjsflow.runner.tenancy.scopes import ALL_SCOPES
from qjsflow.runner.views import RUN_STATUSES, TERMINAL, RunView

if TYPE_CHECKING:  # the types of what the Runner returns: the module is loaded by then
    from qjsflow.runner.operations.migrate import MigrationReport
    from qjsflow.runner.operations.retention import Pruned
    from qjsflow.runner.runner import Runner

__all__ = [
    "CONTROL_VERBS",
    "Bulk",
    "add_control_commands",
    "control",
    "migrate",
    "parse_duration",
    "parse_since",
    "render_bulk",
    "render_migration",
    "render_pruned",
]

# verb -> what it does, for help and for the confirmation message
CONTROL_VERBS = {
    "pause": "park a run after the steps under way (no worker drives it until resume)",
    "resume": "make a paused run runnable again (a worker drives it)",
    "cancel": "stop a run at its next suspension",
    "terminate": "end a run now, stopping its executor mid-step if need be",
    "restart": "run a run again under its id, from the beginning or from a step (a worker "
    "drives it)",
}
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^([0-9]{1,9})([smhdw])$")
_PAGE = 1000


def parse_duration(text: str, option: str) -> float:
    """`90s`, `15m`, `12h`, `30d`, `2w` as seconds."""
    matched = _DURATION.match(text.strip())
    if matched is None:
        raise InvalidInput(f"{option} wants a duration such as 45s, 15m, 12h, 30d or 2w")
    return int(matched.group(1)) * _UNITS[matched.group(2)]


def parse_since(text: str, now: float) -> float:
    """A duration ago (`2h`), or an ISO 8601 time (UTC when it names no offset)."""
    if _DURATION.match(text.strip()):
        return now - parse_duration(text, "--since")
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidInput("--since wants a duration (2h, 7d) or an ISO time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.now().astimezone().tzinfo).astimezone()
    return moment.timestamp()


def add_control_commands(add: Callable[..., argparse.ArgumentParser]) -> None:
    for verb, text in CONTROL_VERBS.items():
        command = add(verb, help=text)
        command.add_argument("run", nargs="?", help="the run id (or select runs with --where)")
        command.add_argument("--scope", help="the run's tenant (found if only one has the id)")
        command.add_argument(
            "--where", metavar="KEY=VALUE[,…]",
            help="every run with these: status=…, workflow=… (several, comma-separated)",
        )  # fmt: skip
        command.add_argument("--workflow", help="with --where: runs of this workflow")
        command.add_argument("--since", metavar="WHEN", help="with --where: created since")
        command.add_argument("--yes", action="store_true", help="with --where: do it")
        command.add_argument(
            "--dry-run", action="store_true",
            help="with --where: show what it would change, change nothing",
        )  # fmt: skip
        if verb == "terminate":
            command.add_argument("--reason", help="why, kept in the run's error and history")
            command.add_argument(
                "--rollback", action="store_true",
                help="run the run's rollback handlers first (a worker drives them), then end it",
            )  # fmt: skip
        if verb == "restart":
            command.add_argument(
                "--from-step", metavar="KIND:NAME[:COUNT]",
                help="keep the results before this step; it and the rest run again",
            )  # fmt: skip
            command.add_argument(
                "--config", metavar="latest|N",
                help="run it under this version of its scope's configuration",
            )  # fmt: skip
        if verb in ("resume", "restart"):
            add_wait(command)
    fork = add("fork", help="start a new run with a run's input and its results before a step")
    fork.add_argument("run", help="the run id")
    fork.add_argument("--scope", help="the run's tenant (found if only one has the id)")
    fork.add_argument("--from-step", metavar="KIND:NAME[:COUNT]",
                      help="copy the results before this step (none without it)")  # fmt: skip
    fork.add_argument("--snapshot", help="run on this snapshot of the scope (id, prefix, latest)")
    fork.add_argument("--config", metavar="latest|N",
                      help="run it under this version of its scope's configuration")  # fmt: skip
    fork.add_argument("--run-id", help="the new run's id (random without it)")
    add_wait(fork)
    migrate = add("migrate", help="move runs that have not ended to new code, each only if a "
                  "replay of its journal proves the new code makes the same calls")  # fmt: skip
    migrate.add_argument("run", nargs="?", help="the run id (or --workflow and --from-snapshot)")
    migrate.add_argument("--scope", help="the runs' tenant (QJSFLOW_SCOPE)")
    migrate.add_argument("--workflow", help="every run of this workflow on --from-snapshot")
    migrate.add_argument("--from-snapshot", metavar="SNAPSHOT",
                         help="with --workflow: the snapshot its runs are on now")  # fmt: skip
    migrate.add_argument("--to-snapshot", metavar="SNAPSHOT", required=True,
                         help="the new code: id, prefix of 8+ hex digits, or latest")  # fmt: skip
    migrate.add_argument("--config", metavar="latest|N",
                         help="and under this version of the scope's configuration")  # fmt: skip
    migrate.add_argument("--dry-run", action="store_true",
                         help="check and report; move nothing")  # fmt: skip
    prune = add("prune", help="delete ended runs (and unused snapshots) older than a duration")
    prune.add_argument("--older-than", required=True, metavar="DURATION",
                       help="ended longer ago than this: 45s, 15m, 12h, 30d, 2w")  # fmt: skip
    prune.add_argument(
        "--status", default=",".join(sorted(TERMINAL)),
        help=f"which ended runs, comma-separated (all: {','.join(sorted(TERMINAL))})",
    )  # fmt: skip
    prune.add_argument("--snapshots", action="store_true",
                       help="also snapshots that old which no run is pinned to")  # fmt: skip
    prune.add_argument("--dry-run", action="store_true", help="only count what would go")
    prune.add_argument("--scope", help="one tenant's runs (all without it)")


@dataclass(frozen=True, slots=True)
class Bulk:
    """What a `--where` command did: the runs it changed, and those it could not."""

    verb: str
    matched: int
    done: list[str] = field(default_factory=list)
    failed: list[dict[str, str]] = field(default_factory=list)
    would: list[str] | None = None  # with --dry-run: the runs it would change (none changed)


def _where(text: str) -> dict[str, str]:
    chosen: dict[str, str] = {}
    for part in text.split(","):
        key, equals, value = part.strip().partition("=")
        if not equals or key not in ("status", "workflow") or not value:
            raise InvalidInput("--where wants status=…, workflow=… (comma-separated)")
        chosen[key] = value
    status = chosen.get("status")
    if status is not None and status not in RUN_STATUSES:
        raise InvalidInput(f"--where status must be one of: {', '.join(RUN_STATUSES)}")
    return chosen


async def _selected(args: argparse.Namespace, runner: Runner) -> list[RunView]:
    where = _where(args.where)
    workflow = args.workflow or where.get("workflow")
    since = None if args.since is None else parse_since(args.since, time.time())
    scope = ALL_SCOPES if args.scope is None else args.scope
    runs: list[RunView] = []
    cursor = None
    while True:
        page = await runner.list(
            scope=scope, workflow=workflow, status=where.get("status"), limit=_PAGE,
            since=since, cursor=cursor,
        )  # fmt: skip
        runs += page
        if len(page) < _PAGE:
            return runs
        cursor = RunReads.cursor_after(page[-1])


async def _act(verb: str, args: argparse.Namespace, runner: Runner, run: str, scope: str) -> Any:
    """One run's verb. Resume and restart only record (a worker drives the run): with
    `--wait`, the CLI waits for it as it does after `start`."""
    match verb:
        case "pause":
            return await runner.pause(run, scope=scope)
        case "resume":
            return await recorded(args, runner, lambda: runner.resume(run, scope=scope,
                                  drive=False))  # fmt: skip
        case "cancel":
            return await runner.cancel(run, scope=scope)
        case "terminate":
            return await runner.terminate(run, scope=scope, reason=args.reason,
                                          rollback=args.rollback)  # fmt: skip
        case "restart":
            return await recorded(args, runner, lambda: runner.restart(
                run, scope=scope, from_step=args.from_step, drive=False, config=args.config,
            ))  # fmt: skip
    raise AssertionError(verb)


async def control(
    args: argparse.Namespace, runner: Runner, scope_of: Callable[..., Any]
) -> RunView | Bulk:
    """One run's verb, or (with `--where`) every selected run's: counted, then done with
    `--yes` (a bulk resume or restart leaves the runs to workers)."""
    verb = args.command
    if args.where is None:
        if args.run is None:
            raise InvalidInput(f"{verb} needs a run id, or --where to select runs")
        if args.yes or args.dry_run or args.workflow or args.since:
            raise InvalidInput(
                "--workflow, --since, --yes and --dry-run select runs only with --where"
            )
        result: RunView = await _act(verb, args, runner, args.run, await scope_of(args, runner))
        return result
    if args.run is not None:
        raise InvalidInput(f"{verb} takes a run id or --where, not both")
    if getattr(args, "wait", None) is not None:
        raise InvalidInput(f"{verb} --where leaves the runs to workers: --wait takes one run")
    if args.yes and args.dry_run:
        raise InvalidInput("--yes does it and --dry-run only shows it: say one")
    runs = await _selected(args, runner)
    if args.dry_run:  # as migrate --dry-run and prune --dry-run: what it would change
        return Bulk(verb, len(runs), would=[f"{run.scope}/{run.run_id}" for run in runs])
    if not args.yes:
        raise InvalidInput(
            f"{len(runs)} runs match; nothing was done: add --yes to {verb} them "
            "(--dry-run lists them)"
        )
    bulk = Bulk(verb, len(runs))
    for run in runs:
        try:
            await _act(verb, args, runner, run.run_id, run.scope)
            bulk.done.append(f"{run.scope}/{run.run_id}")
        except QjsflowError as error:  # a run that changed meanwhile: say so, go on
            bulk.failed.append({"run": f"{run.scope}/{run.run_id}", "error": str(error)[:300]})
    return bulk


async def fork(args: argparse.Namespace, runner: Runner, scope_of: Callable[..., Any]) -> RunView:
    scope = await scope_of(args, runner)
    return await recorded(args, runner, lambda: runner.fork(
        args.run, scope=scope, from_step=args.from_step, snapshot_id=args.snapshot,
        new_run_id=args.run_id, drive=False, config=args.config,
    ))  # fmt: skip


async def migrate(
    args: argparse.Namespace, runner: Runner, scope_of: Callable[..., Any]
) -> MigrationReport:
    if args.run is not None:
        scope = await scope_of(args, runner)
    elif args.scope is None:
        raise InvalidInput("migrate --workflow needs --scope (the tenant whose runs move)")
    else:
        scope = args.scope
    return await runner.migrate(
        scope=scope, to_snapshot=args.to_snapshot, run_id=args.run, workflow=args.workflow,
        from_snapshot=args.from_snapshot, dry_run=args.dry_run, config=args.config,
    )  # fmt: skip


def render_migration(report: MigrationReport) -> str:
    """The counts, then each run: moved, compatible (a dry run), or why not, and where."""
    mode = " (dry run: nothing moved)" if report.dry_run else ""
    lines = [
        f"migrate to snapshot {report.to_snapshot[:16]} in scope {report.scope}{mode}:"
        f" {report.compatible} compatible ({report.migrated} moved), {report.incompatible}"
        f" incompatible, {report.failed} failed to replay, {report.skipped} skipped"
    ]
    for verdict in report.runs:
        state = "moved" if verdict.migrated else verdict.verdict
        lines.append(printable(f"  {verdict.run_id}: {state}"
                               + (f": {verdict.reason}" if verdict.reason else "")))  # fmt: skip
        lines += [printable(f"      {frame}") for frame in verdict.where[:5]]
    return "\n".join(lines)


async def prune(args: argparse.Namespace, runner: Runner) -> Pruned:
    statuses = {status.strip() for status in args.status.split(",") if status.strip()}
    return await runner.prune(
        older_than_s=parse_duration(args.older_than, "--older-than"),
        scope=ALL_SCOPES if args.scope is None else args.scope, statuses=statuses,
        snapshots=args.snapshots, dry_run=args.dry_run,
    )  # fmt: skip


def render_bulk(bulk: Bulk) -> str:
    if bulk.would is not None:
        lines = [f"{bulk.verb} would change {bulk.matched} runs (nothing was done)"]
        return "\n".join([*lines, *(printable(f"  {run}") for run in bulk.would)])
    lines = [f"{bulk.verb}: {len(bulk.done)} of {bulk.matched} runs"]
    lines += [printable(f"  failed: {f['run']}: {f['error']}") for f in bulk.failed]
    return "\n".join(lines)


def render_pruned(pruned: Pruned) -> str:
    verb = "would delete" if pruned.dry_run else "deleted"
    return f"{verb} {pruned.runs} runs and {pruned.snapshots} snapshots"
