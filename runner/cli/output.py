"""How the CLI shows things: one JSON document with `--json`, aligned tables otherwise."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from qjsflow.bridge.codec import dumps_text
from qjsflow.bridge.printable import printable
from qjsflow.bridge.values import JsValue, to_json_form
from qjsflow.bundles.manifest import Capabilities
from qjsflow.runner.store import LogRecord, SnapshotRecord
from qjsflow.runner.views import TERMINAL, EventView, RunView, StepView, ToolCallView, WorkerView

if TYPE_CHECKING:  # rendered only by the commands that load the Runner
    from qjsflow.runner.runner import PublishResult
    from qjsflow.runner.tenancy.usage import ScopeUsage

__all__ = [
    "printable",
    "render_json",
    "render_publish",
    "render_run",
    "render_runs",
    "render_steps",
]

ABSOLUTE_TIMES = False  # `--utc`: timestamps rather than relative times

_COLOURS = {
    "completed": "32",
    "failed": "31",
    "cancelled": "90",
    "running": "36",
    "sleeping": "33",
    "waiting": "35",
    "blocked": "31",
    "paused": "33",
    "throttled": "33",
    "queued": "33",
    "terminated": "31",
}


def render_json(value: Any) -> str:
    """Views (dataclasses, lists of them, dicts) as one JSON document; values that plain JSON
    cannot hold are written in the journal's tagged form (bridge.values)."""
    return dumps_text(to_json_form(_plain(value)))


def _plain(value: Any) -> Any:
    if isinstance(value, JsValue):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def render_publish(result: PublishResult) -> str:
    state = "new" if result.created else "already published"
    rows = [
        ("WORKFLOW", "ENTRY", "EXPORT"),
        *((w.workflow, w.entry_path, w.export) for w in result.workflows),
    ]
    return "\n".join(
        [f"snapshot {result.snapshot_id} in scope {result.scope} ({state})", *table(rows),
         f"capabilities: {describe_capabilities(result.capabilities)}"]
    )  # fmt: skip


def describe_capabilities(declared: Capabilities | None) -> str:
    """What a snapshot's manifest declares, in one line."""
    if declared is None:
        return "none declared (bounded by the scope's policy)"
    parts = [
        f"{name} {', '.join(items) if items else '(none)'}"
        for name, items in (("tools", declared.tools), ("bindings", declared.bindings),
                            ("fetch", declared.fetch))
    ]  # fmt: skip
    return printable("; ".join([*parts, f"sql {declared.sql}"]))


def render_snapshots(snapshots: Sequence[SnapshotRecord]) -> str:
    if not snapshots:
        return "no snapshots"
    rows = [("SNAPSHOT", "SCOPE", "CREATED", "WORKFLOWS", "CAPABILITIES")]
    rows += [
        (s.snapshot_id[:16], s.scope, age(s.created_at), ", ".join(w.workflow for w in s.workflows),
         describe_capabilities(s.capabilities))
        for s in snapshots
    ]  # fmt: skip
    return "\n".join(table(rows))


def render_workers(workers: Sequence[WorkerView]) -> str:
    if not workers:
        return "no workers have registered in this journal"
    rows = [("WORKER", "STATE", "HOST", "PID", "VERSION", "TOOLS", "HEARD")]
    rows += [
        (w.worker_id, w.state, w.host, str(w.pid), w.version, ", ".join(w.tools) or "-",
         age(w.heartbeat_at))
        for w in workers
    ]  # fmt: skip
    return "\n".join(table([tuple(printable(cell) for cell in row) for row in rows]))


def render_usage(found: Mapping[str, ScopeUsage]) -> str:
    """Each scope: its runs by status, then each measure used in its window, of its budget."""
    if not found:
        return "no scopes"
    blocks = []
    for scope, usage in found.items():
        live = f"{usage.live}" + ("" if usage.live_budget is None else f" of {usage.live_budget}")
        by_status = ", ".join(f"{status} {n}" for status, n in usage.runs.items()) or "none"
        rows = [("MEASURE", "USED", "BUDGET", "RESETS")]
        rows += [
            (m.budget_name, f"{m.used:g}", "-" if m.budget is None else f"{m.budget:g}",
             "never" if m.resets_at is None else age(m.resets_at))
            for m in usage.measures
        ]  # fmt: skip
        blocks.append(
            "\n".join([f"scope {printable(scope)}: {live} live runs ({by_status})", *table(rows)])
        )
    return "\n\n".join(blocks)


def render_retries(steps: Sequence[StepView]) -> list[tuple[str, str]]:
    """For a run's status: each step waiting for its next attempt, why, and when."""
    return [
        ("retry", printable(
            f"step {s.name!r} attempt {s.attempt + 1} {age(s.retry_at)}"
            + (f" after: {s.error}" if s.error else "")
        ))
        for s in steps if s.status == "retrying" and s.retry_at is not None
    ]  # fmt: skip


def render_run(run: RunView, colour: bool, retries: Sequence[tuple[str, str]] = ()) -> str:
    lines = [
        ("run", printable(run.run_id)),
        ("status", _status(run.status, colour)),
        (
            "workflow",
            printable(f"{run.workflow} (scope {run.scope}, snapshot {run.snapshot_id[:12]})"),
        ),
        ("created", age(run.created_at)),
        ("updated", age(run.updated_at)),
    ]
    next_up = _next(run)
    if next_up:
        lines.append(("next", next_up))
    lines += retries
    lines.append(("input", _short(run.input)))
    if run.status == "completed":
        lines.append(("output", _short(run.output)))
    if run.error:  # a line each, escaped each (a newline shown as `\x0a` reads as none)
        first, *rest = run.error.splitlines() or [""]
        lines.append(("error", printable(first)))
        lines += [("", printable(line)) for line in rest]
        lines += [("", printable(frame)) for frame in run.error_stack]
    width = max(len(name) for name, _ in lines)
    return "\n".join(f"{name.ljust(width)}  {value}" for name, value in lines)


def render_runs(runs: Sequence[RunView], colour: bool) -> str:
    if not runs:
        return "no runs"
    rows = [("RUN", "STATUS", "WORKFLOW", "AGE", "NEXT")]
    rows += [
        (
            printable(r.run_id),
            _status(r.status, colour),
            printable(r.workflow),
            age(r.created_at),
            _next(r),
        )
        for r in runs
    ]
    return "\n".join(table(rows))


def render_steps(steps: Sequence[StepView]) -> str:
    if not steps:
        return "no steps"
    rows = [("KIND", "NAME", "#", "STATUS", "ATTEMPT", "STARTED", "TOOK", "RESULT")]
    rows += [
        (printable(s.kind), printable(s.name), str(s.count), printable(s.status),
         str(s.attempt), "" if s.started_at is None else age(s.started_at),
         "" if s.duration_s is None else f"{s.duration_s:.3f}s",
         printable(_located(s.error, s.error_stack)) if s.error else _short(s.output))
        for s in steps
    ]  # fmt: skip
    return "\n".join(table(rows))


def render_logs(lines: Sequence[LogRecord]) -> str:
    if not lines:
        return "no console lines"
    return "\n".join(f"{line.level:5}  {printable(line.text)}" for line in lines)


def render_tool_calls(calls: Sequence[ToolCallView]) -> str:
    if not calls:
        return "no tool calls"
    rows = [("STEP", "ATTEMPT", "ADDRESS", "OUTCOME", "TOOK")]
    rows += [
        (printable(c.step), str(c.attempt), printable(c.address),
         printable(c.error) if c.error else _short(c.result),
         "" if c.duration_s is None else f"{c.duration_s:.3f}s")
        for c in calls
    ]  # fmt: skip
    return "\n".join(table(rows))


def render_history(events: Sequence[EventView]) -> str:
    if not events:
        return "no events"
    rows = [("#", "WHEN", "EVENT", "DETAILS")]
    rows += [(str(e.seq), age(e.at), printable(e.type), _short(e.data, 80)) for e in events]
    return "\n".join(table(rows))


def _located(error: str, frames: Sequence[str]) -> str:
    """An error with where it was thrown: "TypeError: … (at workflows/x.ts:3:7)"."""
    if not frames:
        return error
    innermost = frames[0]
    where = innermost[innermost.rfind("(") + 1 : -1] if innermost.endswith(")") else innermost[3:]
    return f"{error} (at {where})"


def table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(_visible(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [
            cell + " " * (width - _visible(cell)) for cell, width in zip(row, widths, strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


def age(moment: float, now: float | None = None) -> str:
    """A relative time: '3s ago', 'in 2m' (with `--utc`, '2026-11-30T18:24:21.123Z')."""
    if ABSOLUTE_TIMES:
        stamp = datetime.fromtimestamp(moment, UTC).isoformat(timespec="milliseconds")
        return stamp.replace("+00:00", "Z")
    delta = (time.time() if now is None else now) - moment
    text = _span(abs(delta))
    return f"{text} ago" if delta >= 0 else f"in {text}"


def _span(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def _next(run: RunView) -> str:
    if run.status == "blocked" and run.waiting_for:
        return f"needs the tool {printable(run.waiting_for)} bound"
    if run.status == "waiting" and run.waiting_for:
        timeout = f" (times out {age(run.wake_at)})" if run.wake_at else ""
        return f"event {printable(run.waiting_for)}{timeout}"
    if run.status == "throttled" and run.waiting_for:
        return f"its scope's {printable(run.waiting_for)} budget is spent; driven again " + (
            age(run.wake_at) if run.wake_at else "when it has room"
        )
    if run.status == "queued":
        place = f"{run.queue_position} in its queue" if run.queue_position else "queued"
        return f"{place}: its workflow's flow control admits it when a place is free"
    if run.status == "paused":
        return "resume it to go on" + (
            f" (its timer is due {age(run.wake_at)})" if run.wake_at else ""
        )
    if run.wake_at is not None and run.status not in TERMINAL:
        return f"wakes {age(run.wake_at)}"
    return ""


def _status(status: str, colour: bool) -> str:
    if not colour or status not in _COLOURS:
        return printable(status)
    return f"\x1b[{_COLOURS[status]}m{status}\x1b[0m"


def _visible(cell: str) -> int:
    return len(cell) - (9 if cell.startswith("\x1b[") else 0)


def _short(value: Any, limit: int = 60) -> str:
    # JSON text escapes controls; `printable` catches what JSON leaves as is (C1, bidi).
    text = printable(dumps_text(to_json_form(value)))
    return text if len(text) <= limit else text[: limit - 1] + "…"
