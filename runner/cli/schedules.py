"""`qjsflow schedules list|show|set|pause|unpause|trigger|delete`: a scope's schedules
(runner/operations/schedules.py). Workers fire them; these commands only record."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from qjsflow.bridge import InvalidInput
from qjsflow.bridge.printable import printable
from qjsflow.runner.cli.output import age, render_json, table

__all__ = ["schedules_command"]


def schedules_command(args: argparse.Namespace) -> str:
    """Run `qjsflow schedules ACTION`; what to print."""
    from qjsflow.runner.cli import host as cli_host  # noqa: PLC0415  (loads the Runner)

    action = args.schedules_action
    if action != "list" and not args.scope:
        raise InvalidInput("say which scope with --scope (or QJSFLOW_SCOPE)")
    found: Any = asyncio.run(cli_host.with_runner(
        args, _ACTIONS[action], create=action == "set",
    ))  # fmt: skip
    if args.json:
        return render_json(found)
    if action == "list":
        rows = [("SCOPE", "NAME", "WORKFLOW", "WHEN", "NEXT", "FIRED", "SKIPPED")]
        rows += [(s.scope, s.name, s.workflow, _when(s.spec, s.paused),
                  "-" if s.next_at is None else age(s.next_at), str(s.fired), str(s.skipped))
                 for s in found]  # fmt: skip
        return "\n".join(table([tuple(printable(cell) for cell in row) for row in rows]))
    if action == "delete":
        return printable(f"schedule {args.name}: deleted")
    if action == "trigger":
        return printable(f"schedule {args.name}: started run {found.run_id}")
    if action == "backfill":
        return printable(f"schedule {args.name}: {len(found)} firings, each started once")
    if action != "show":
        return _line(found)
    lines = [_line(found["schedule"]), *(f"  then {age(at)}" for at in found["schedule"].upcoming)]
    runs = [("RUN", "STATUS", "CREATED")]
    runs += [(r.run_id, str(r.status), age(r.created_at)) for r in found["runs"]]
    lines += ["last runs:" if found["runs"] else "no run yet"]
    if found["runs"]:
        lines += table([tuple(printable(cell) for cell in row) for row in runs])
    return "\n".join(lines)


def _line(found: Any) -> str:
    next_at = "-" if found.next_at is None else age(found.next_at)
    return printable(f"schedule {found.name} of scope {found.scope}: {found.workflow}, "
                     f"{_when(found.spec, found.paused)}, next {next_at}, fired {found.fired}, "
                     f"skipped {found.skipped}")  # fmt: skip


def _when(spec: dict[str, Any], paused: bool) -> str:
    when = (f"cron {spec['cron']} {spec['timezone']}" if spec.get("cron")
            else f"every {spec['every_s']:g} s")  # fmt: skip
    return when + (" (paused)" if paused else "")


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    from qjsflow.bridge import CodecError  # noqa: PLC0415
    from qjsflow.bridge.codec import loads  # noqa: PLC0415

    settings: dict[str, Any] = {"overlap": args.overlap, "timezone": args.timezone,
                                "snapshot": args.snapshot, "paused": args.paused}  # fmt: skip
    for key, value in (("cron", args.cron), ("every_s", args.every),
                       ("catchup_s", args.catchup), ("jitter_s", args.jitter)):  # fmt: skip
        if value is not None:
            settings[key] = value
    if args.input is not None:
        try:
            settings["input"] = loads(args.input)
        except CodecError as error:
            raise InvalidInput(f"--input is not valid JSON: {error}") from None
    return settings


async def _show(args: argparse.Namespace, runner: Any) -> dict[str, Any]:
    """The schedule, its next firings, and the last runs it started (newest first)."""
    schedule = await runner.schedule(args.scope, args.name)
    runs = await runner.list(scope=args.scope, tags={"schedule": args.name}, limit=_LAST_RUNS,
                             newest_first=True)  # fmt: skip
    return {"schedule": schedule, "runs": runs}


_LAST_RUNS = 10


async def _gone(args: argparse.Namespace, runner: Any) -> bool:
    if not await runner.delete_schedule(args.scope, args.name):
        raise InvalidInput(f"scope {args.scope!r} has no schedule {args.name[:80]!r}")
    return True


_ACTIONS: dict[str, Any] = {
    "list": lambda a, r: (
        r.schedules(scope=a.scope) if a.scope else r.schedules(scope=_all_scopes())
    ),
    "show": _show,
    "set": lambda a, r: r.set_schedule(a.scope, a.name, a.workflow, _settings(a)),
    "pause": lambda a, r: r.pause_schedule(a.scope, a.name),
    "unpause": lambda a, r: r.pause_schedule(a.scope, a.name, paused=False),
    "trigger": lambda a, r: r.trigger_schedule(a.scope, a.name),
    "delete": _gone,
    "backfill": lambda a, r: r.backfill_schedule(
        a.scope, a.name, since=_when_given(a.since), until=_when_given(a.until)
    ),
}


def _when_given(text: str) -> float:
    import time  # noqa: PLC0415

    from qjsflow.runner.cli.control import parse_since  # noqa: PLC0415

    return parse_since(text, time.time())


def _all_scopes() -> Any:
    from qjsflow.runner.tenancy.scopes import ALL_SCOPES  # noqa: PLC0415

    return ALL_SCOPES
