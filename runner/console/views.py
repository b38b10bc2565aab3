"""What the console's pages and API show, gathered from the Runner, and its actions."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from starlette.exceptions import HTTPException

from qjsflow.bridge import CodecError, InvalidInput, loads
from qjsflow.bridge.codec import dumps_text
from qjsflow.bridge.printable import printable
from qjsflow.bridge.values import to_json_form
from qjsflow.runner.console.auth import Principal
from qjsflow.runner.operations.timeline import rows_of
from qjsflow.runner.runner import Runner
from qjsflow.runner.tenancy.scopes import ALL_SCOPES, run_key
from qjsflow.runner.views import RUN_STATUSES, TERMINAL, RunView, event_view, step_view

__all__ = ["FILTERS", "RunQuery", "act", "list_runs", "plain", "run_detail", "snapshot_detail"]

_PAGE = 50
_SHOWN_CHARS = 20_000  # a value longer than this is cut on the page (the API has it whole)


@dataclass(frozen=True, slots=True)
class RunQuery:
    scope: str | None
    workflow: str | None
    status: str | None
    since_hours: float | None
    cursor: str | None
    tag: tuple[str, str] | None = None  # KEY=VALUE: runs that carry it
    schedule: str | None = None  # the runs a schedule started (its tag `schedule`)

    @classmethod
    def parse(cls, params: Mapping[str, str], principal: Principal) -> RunQuery:
        asked = params.get("scope") or None
        if principal.scope is not None and asked not in (None, principal.scope):
            raise HTTPException(404)
        status = params.get("status") or None
        if status is not None and status not in RUN_STATUSES:
            raise HTTPException(400, "unknown status")
        since = params.get("since_hours") or None
        try:
            hours = None if since is None else float(since)
        except ValueError:
            raise HTTPException(400, "since_hours must be a number") from None
        if hours is not None and not (math.isfinite(hours) and hours > 0):
            raise HTTPException(400, "since_hours must be more than 0")
        tag_text = params.get("tag") or None
        tag = None
        if tag_text is not None:
            key, equals, value = tag_text.partition("=")
            if not equals or not key:
                raise HTTPException(400, "tag is KEY=VALUE")
            tag = (key, value)
        return cls(principal.scope or asked, params.get("workflow") or None, status, hours,
                   params.get("cursor") or None, tag, params.get("schedule") or None)  # fmt: skip

    @property
    def tags(self) -> dict[str, str] | None:
        wanted = dict([self.tag] if self.tag else [])
        if self.schedule is not None:
            wanted["schedule"] = self.schedule
        return wanted or None

    @property
    def link(self) -> str:
        """The query as a page's parameters (a cursor's link keeps the filters)."""
        shown = {"scope": self.scope, "workflow": self.workflow, "status": self.status,
                 "since_hours": self.since_hours, "schedule": self.schedule,
                 "tag": None if self.tag is None else "=".join(self.tag)}  # fmt: skip
        return urlencode({key: value for key, value in shown.items() if value is not None})


async def list_runs(runner: Runner, query: RunQuery) -> dict[str, Any]:
    since = None if query.since_hours is None else time.time() - query.since_hours * 3600
    try:
        page = await runner.list(
            scope=query.scope or ALL_SCOPES, workflow=query.workflow, status=query.status,
            limit=_PAGE + 1, newest_first=True, since=since, cursor=query.cursor,
            tags=query.tags,
        )  # fmt: skip
    except InvalidInput as error:
        raise HTTPException(400, str(error)) from None
    runs, more = page[:_PAGE], len(page) > _PAGE
    return {"runs": runs, "next_cursor": Runner.cursor_after(runs[-1]) if more else None}


async def run_detail(runner: Runner, scope: str, run_id: str) -> dict[str, Any]:
    try:
        run = await runner.get(run_id, scope=scope)
    except InvalidInput:
        raise HTTPException(404) from None
    key = run_key(scope, run_id)
    events, step_rows = await runner.store.list_events(key), await runner.store.list_steps(key)
    history = [event_view(event) for event in events]
    return {
        "run": run,
        "steps": [step_view(row) for row in step_rows],
        "logs": await runner.list_logs(run_id, scope=scope),
        "tools": await runner.list_tool_calls(run_id, scope=scope),
        "history": history,
        "drives": rows_of(events, step_rows)[1:],  # from the same reads, not again
        "timeline": _timeline(run, history),
    }


_OPENS = {"step_started": "attempt", "sleep_scheduled": "sleep", "waiting_for_event": "wait",
          "tool_called": None}  # fmt: skip
_CLOSES = {"step_completed": "completed", "step_failed": "failed", "step_retrying": "retrying",
           "sleep_completed": "completed", "event_consumed": "completed",
           "event_timed_out": "failed", "event_refused": "failed"}  # fmt: skip


def _timeline(run: RunView, history: list[Any]) -> dict[str, Any]:
    """The run on a time axis, from its history: a bar per step attempt, sleep and wait (in
    percent of the run's span), a dashed bar for each retry's delay, and a tick per drive."""
    start = run.created_at
    end = max([run.updated_at, *(e.at for e in history)])
    now = time.time() if run.status not in TERMINAL else end
    spans: list[dict[str, Any]] = []
    open_spans: dict[str, dict[str, Any]] = {}
    drives: list[float] = []
    for event in history:
        data = event.data if isinstance(event.data, dict) else {}
        key = str(data.get("key", ""))
        if event.type == "drive_started":
            drives.append(event.at)
        elif event.type in _OPENS and _OPENS[event.type] is not None and key not in open_spans:
            kind = _OPENS[event.type]
            label = f"{key} (attempt {data.get('attempt', 1)})" if kind == "attempt" else key
            span = {"label": label, "from": event.at, "to": None, "status": kind}
            if kind == "sleep" and isinstance(data.get("dueAt"), int | float):
                span["due"] = data["dueAt"] / 1000
            open_spans[key] = span
            spans.append(span)
        elif event.type in _CLOSES and key in open_spans:
            span = open_spans.pop(key)
            span["to"], span["status"] = event.at, _CLOSES[event.type]
            if event.type == "step_retrying" and isinstance(data.get("retryAt"), int | float):
                retry = data["retryAt"] / 1000
                spans.append({"label": f"{key}: retry delay", "from": event.at, "to": retry,
                              "status": "delay"})  # fmt: skip
                end = max(end, retry)
    end = max(end, *(s.get("due", 0) for s in spans), start + 0.001)
    span_s = end - start

    def x(moment: float) -> float:
        return float(1000 * (min(max(moment, start), end) - start) / span_s)

    bars = []
    for row, span in enumerate(spans[:300]):
        finished = span["to"] if span["to"] is not None else span.get("due", now)
        bars.append({"y": 24 + row * 20, "x": x(span["from"]),
                     "width": max(2.0, x(finished) - x(span["from"])),
                     "label": str(span["label"])[:100], "status": span["status"]})  # fmt: skip
    return {"bars": bars, "drives": [x(at) for at in drives], "span_s": span_s,
            "height": 40 + 20 * len(bars)}  # fmt: skip


async def act(
    runner: Runner, verb: str, scope: str, run_id: str, form: Mapping[str, Any]
) -> RunView:
    """One action, through the same Runner methods as the CLI; runs that must move are left
    to the workers (this process binds no tools)."""
    text = {key: str(form.get(key) or "").strip() for key in
            ("type", "payload", "reason", "from_step", "new_run_id")}  # fmt: skip
    match verb:
        case "signal":
            try:
                payload = loads(text["payload"] or "null")
            except CodecError as error:
                raise InvalidInput(f"the payload is not valid JSON: {error}") from None
            return await runner.signal(run_id, text["type"], payload, scope=scope, drive=False)
        case "cancel":
            return await runner.cancel(run_id, scope=scope)
        case "terminate":
            return await runner.terminate(run_id, scope=scope, reason=text["reason"] or None)
        case "pause":
            return await runner.pause(run_id, scope=scope)
        case "resume":
            return await runner.resume(run_id, scope=scope, drive=False)
        case "restart":
            return await runner.restart(
                run_id, scope=scope, from_step=text["from_step"] or None, drive=False
            )
        case "fork":
            return await runner.fork(
                run_id, scope=scope, from_step=text["from_step"] or None,
                new_run_id=text["new_run_id"] or None, drive=False,
            )  # fmt: skip
    raise HTTPException(404)


async def snapshot_detail(runner: Runner, scope: str, snapshot_id: str) -> dict[str, Any]:
    try:
        snapshot = await runner.find_snapshot(snapshot_id, scope=scope)
    except InvalidInput:
        raise HTTPException(404) from None
    bundles = []
    for workflow in snapshot.workflows:
        bundle = await runner.store.load_bundle(scope, snapshot.snapshot_id, workflow.workflow)
        if bundle is None:
            continue
        sources: list[tuple[str, list[str]]] = []
        if bundle.source_map:
            source_map = loads(bundle.source_map)
            contents = source_map.get("sourcesContent") or []
            for name, content in zip(source_map.get("sources") or [], contents, strict=False):
                if isinstance(name, str) and isinstance(content, str):
                    sources.append((name, content.splitlines()))
        if not sources:  # no sources kept with the map: the bundle itself, as it runs
            sources.append((f"{workflow.entry_path} (as bundled)", bundle.code.splitlines()))
        bundles.append({"workflow": workflow, "sources": sources})
    runs = await runner.list(scope=scope, limit=1000, newest_first=True)
    pinned = [run for run in runs if run.snapshot_id == snapshot.snapshot_id][:100]
    return {"snapshot": snapshot, "bundles": bundles, "runs": pinned}


def plain(value: Any) -> Any:
    """JSON-ready: dataclasses as dicts, author values in the journal's tagged form."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return to_json_form(value)


def _shown(value: Any) -> str:
    """An author value as JSON text, cut to a size a page can hold (escaped by Jinja2)."""
    text = dumps_text(to_json_form(value))
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + f"… ({len(text)} chars)"


def _text(value: Any) -> str:
    """Author text with controls and bidirectional overrides made visible, cut to size."""
    text = printable(str(value))
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + f"… ({len(text)} chars)"


def _when(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return (
        time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(seconds))
        + f".{int(seconds * 1000) % 1000:03d}Z"
    )


FILTERS = {"shown": _shown, "text": _text, "when": _when, "key": run_key}
