"""`RunReads`: what the journal says of runs and snapshots, for callers that only look.

`Runner` is a `RunReads` that also publishes and drives; the CLI's reading commands (`status`,
`list`, `steps`, ...) open a `RunReads` alone, so they load neither the driver, the publish
path nor the executor pool (docs/PERFORMANCE.md: a command's start-up is its imports).
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import dataclasses
import os
import re
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from functools import partial

from qjsflow.bridge import InvalidInput
from qjsflow.bridge.values import to_python
from qjsflow.bundles.manifest import Capabilities
from qjsflow.runner.errors import RunNotFound, RunTimeout, SnapshotNotFound
from qjsflow.runner.store import (
    JournalStore,
    JournalTransaction,
    LogRecord,
    RunRecord,
    RunStatus,
    SnapshotRecord,
    snapshot_records,
)
from qjsflow.runner.tenancy.scopes import (
    ALL_SCOPES,
    AllScopes,
    InvalidScope,
    run_key,
    validate_scope,
)
from qjsflow.runner.views import (
    TERMINAL,
    EventView,
    PersistedRun,
    RunView,
    StepView,
    ToolCallView,
    WorkerView,
    event_view,
    run_view,
    step_view,
    tool_call_view,
    worker_view,
)

__all__ = [
    "RUN_ID",
    "SNAPSHOT_ID",
    "RunReads",
    "caller_key",
    "found_run",
    "reading",
    "snapshot_in",
]

RUN_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
SNAPSHOT_ID = re.compile(r"[0-9a-f]{64}")
_SNAPSHOT_PREFIX = re.compile(r"[0-9a-f]{8,63}")
_MAX_PAGE = 10_001  # runs a page may hold (the CLI asks for one more than it shows)


class RunReads:
    """Reads of one journal: runs, their steps, tool calls, events and console lines, and
    published snapshots. Every read of a run names its scope (run ids are per scope)."""

    def __init__(self, store: JournalStore) -> None:
        self._store = store

    @property
    def store(self) -> JournalStore:
        return self._store

    async def get(self, run_id: str, *, scope: str) -> RunView:
        """The run; a queued one with its place in its queue."""
        run = await self._run(run_id, scope)
        view = run_view(run)
        if run.status != RunStatus.queued:
            return view
        position = await self._store.read(lambda tx: tx.queue_position(run.run_id))
        return dataclasses.replace(view, queue_position=position)

    async def wait(
        self, run_id: str, *, scope: str, timeout_s: float | None = None, poll_s: float = 0.2
    ) -> RunView:
        """The run once it has ended (completed, failed or cancelled), read from the journal
        every `poll_s` while some process drives it; `RunTimeout` past `timeout_s`."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            run = await self.get(run_id, scope=scope)
            if run.status in TERMINAL:
                return run
            if deadline is not None and time.monotonic() >= deadline:
                raise RunTimeout(run_id, run.status, timeout_s or 0.0)
            await asyncio.sleep(poll_s)

    async def wait_suspended(
        self, run_id: str, *, scope: str, timeout_s: float | None = None, poll_s: float = 0.2
    ) -> RunView:
        """The run once it is at rest: ended, or suspended (sleeping, waiting, blocked, paused,
        throttled, queued) with no timer due, so no driver has anything to do for it until its
        time, an event or its gate comes; `RunTimeout` past `timeout_s`. A runnable run
        (started, resumed, restarted, or woken by an event) is at rest only once a worker has
        driven it."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            run = await self._run(run_id, scope)
            if run.status in TERMINAL or (
                run.status != "running"
                and not await self._store.timer_due(run.run_id, int(time.time() * 1000))
            ):
                return run_view(run)
            if deadline is not None and time.monotonic() >= deadline:
                raise RunTimeout(run_id, run.status, timeout_s or 0.0)
            await asyncio.sleep(poll_s)

    async def get_persisted(self, run_id: str, *, scope: str) -> PersistedRun:
        run = await self._run(run_id, scope)
        bindings = to_python(run.persisted_bindings)
        return PersistedRun(run_id, run.snapshot_id, run.entry_path, dict(bindings))

    async def list(
        self,
        *,
        scope: str | AllScopes,
        workflow: str | None = None,
        status: str | None = None,
        limit: int = 1000,
        offset: int = 0,
        newest_first: bool = False,
        since: float | None = None,
        cursor: str | None = None,
        tags: Mapping[str, str] | None = None,
        until: float | None = None,
    ) -> list[RunView]:
        """Runs of one scope, oldest first (or newest first), a page of `limit` from `offset`
        or after `cursor` (`cursor_after` of the last run of the page before), created
        from `since` to `until` (seconds since the epoch), with every one of `tags`; an
        operator passes `scope=ALL_SCOPES` to see every scope's (there is no default, so
        isolation is never off by omission)."""
        chosen = None if scope is ALL_SCOPES else validate_scope(scope)
        if not 1 <= limit <= _MAX_PAGE or not 0 <= offset < 2**62:
            raise InvalidInput(f"limit must be 1 to {_MAX_PAGE} and offset 0 or more")
        runs = await self._store.list_runs(
            chosen, workflow, status, limit, offset=offset, newest_first=newest_first,
            since_ms=None if since is None else int(since * 1000),
            after=None if cursor is None else _parse_cursor(cursor), tags=tags,
            until_ms=None if until is None else int(until * 1000),
        )  # fmt: skip
        return [run_view(run) for run in runs]

    async def tags(self, run_id: str, *, scope: str) -> builtins.list[tuple[str, str]]:
        """The run's tags, as its start gave them and its code set them (`setTags`)."""
        found = await self._store.tags_of((await self._run(run_id, scope)).run_id)
        return sorted(found.items())

    async def workers(self) -> builtins.list[WorkerView]:
        """The workers registered in the journal, the most recently heard of first."""
        now = int(time.time() * 1000)
        return [worker_view(worker, now) for worker in await self._store.list_workers()]

    async def unbound_tools(self, snapshot: SnapshotRecord) -> builtins.list[str]:
        """The tools `snapshot`'s manifest declares (address patterns) that no live worker
        binds: its runs that call one park `blocked` until a worker that binds it runs."""
        live = [w for w in await self.workers() if w.state == "live"]
        declared = () if snapshot.capabilities is None else snapshot.capabilities.tools
        return [
            pattern for pattern in declared
            if not any(Capabilities(tools=(pattern,)).allows_tool(tool)
                       for worker in live for tool in worker.tools)
        ]  # fmt: skip

    @staticmethod
    def cursor_after(run: RunView) -> str:
        """Where the next page starts: after this run."""
        key = run_key(run.scope, run.run_id)
        return f"{round(run.created_at * 1000)}.{base64.urlsafe_b64encode(key.encode()).decode()}"

    async def snapshots(
        self, *, scope: str | AllScopes, limit: int = 1000
    ) -> builtins.list[SnapshotRecord]:
        """Published snapshots, newest first, with their workflows."""
        chosen = None if scope is ALL_SCOPES else validate_scope(scope)
        return await self._store.list_snapshots(chosen, limit=limit)

    async def find_snapshot(self, reference: str, *, scope: str) -> SnapshotRecord:
        """A snapshot of `scope` by its id, a unique prefix of it (8 or more hex digits), or
        `latest` (the scope's newest). Another scope's snapshot is not found, like a missing
        one."""
        scope = validate_scope(scope)
        return await self._store.read(partial(snapshot_in, reference=reference, scope=scope))

    async def scopes_of(self, run_id: str) -> builtins.list[str]:
        """For operators: every scope that has a run with this id (run ids are per scope)."""
        _check_run_names(run_id, None)
        return await self._store.scopes_of_run(run_id)

    async def list_steps(self, run_id: str, *, scope: str) -> builtins.list[StepView]:
        run = await self._run(run_id, scope)
        return [step_view(step) for step in await self._store.list_steps(run.run_id)]

    async def list_tool_calls(self, run_id: str, *, scope: str) -> builtins.list[ToolCallView]:
        """The audit trail of `step.tool`: one row per call, in order."""
        run = await self._run(run_id, scope)
        return [tool_call_view(call) for call in await self._store.list_tool_calls(run.run_id)]

    async def history(self, run_id: str, *, scope: str) -> builtins.list[EventView]:
        """Every event of the run, in order: drives and their workers, step attempts, retries
        with their reason and due time, sleeps, waits, signals."""
        run = await self._run(run_id, scope)
        return [event_view(event) for event in await self._store.list_events(run.run_id)]

    async def list_logs(self, run_id: str, *, scope: str) -> builtins.list[LogRecord]:
        run = await self._run(run_id, scope)
        logs = await self._store.list_logs(run.run_id)
        return [dataclasses.replace(log, run_id=run_id) for log in logs]

    async def _run(self, run_id: str, scope: str) -> RunRecord:
        """The run of this scope, or RunNotFound."""
        return found_run(await self._store.get_run(caller_key(run_id, scope)), run_id)


@asynccontextmanager
async def reading(db_path: str | os.PathLike[str]) -> AsyncIterator[RunReads]:
    """`async with reading(path) as reads:` the reads of an existing journal; opening it
    writes nothing. (A function, not a classmethod: `Runner`, a `RunReads`, is opened with
    its configuration by `Runner.open`.)"""
    store = await JournalStore.open(os.fspath(db_path), create=False)
    try:
        yield RunReads(store)
    finally:
        await store.aclose()


def _parse_cursor(cursor: str) -> tuple[int, str]:
    created, _, key = str(cursor).partition(".")
    try:
        raw = base64.b64decode(key.encode("ascii"), altchars=b"-_", validate=True)
        decoded = raw.decode("utf-8")
        if not created.isdigit() or len(created) > 15 or "/" not in decoded[:300]:
            raise ValueError(cursor)
        return int(created), decoded
    except (ValueError, UnicodeError):
        raise InvalidInput(
            f"invalid cursor {str(cursor)[:80]!r}: pass one a listing gave"
        ) from None


def _check_run_names(run_id: str, scope: str | None) -> None:
    if scope is not None:
        validate_scope(scope)
    if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id):
        raise RunNotFound(str(run_id)[:128])


def caller_key(run_id: str, scope: str) -> str:
    """The journal key of a caller's run: a scope must always be named."""
    if scope is None:
        raise InvalidScope(scope)
    _check_run_names(run_id, scope)
    return run_key(scope, run_id)


def found_run(run: RunRecord | None, run_id: str) -> RunRecord:
    if run is None:
        raise RunNotFound(run_id)
    return run


def snapshot_in(tx: JournalTransaction, *, reference: str, scope: str) -> SnapshotRecord:
    """`find_snapshot`, within a transaction (a start reads it in its own)."""
    if reference == "latest":
        rows = tx.snapshot_rows(scope, limit=1)
    elif SNAPSHOT_ID.fullmatch(reference):
        rows = tx.snapshot_rows(scope, snapshot_id=reference)
    elif _SNAPSHOT_PREFIX.fullmatch(reference):
        rows = tx.snapshot_rows(scope, id_prefix=reference, limit=2)
    else:
        raise SnapshotNotFound(
            scope, reference[:80], "a snapshot is named by its id, a prefix of it of 8 or more "
            "hex digits (0-9, a-f), or `latest`",
        )  # fmt: skip
    found = snapshot_records(rows)
    if len(found) > 1:
        raise InvalidInput(
            f"several snapshots in scope {scope!r} start with {reference!r}: give more of the id"
        )
    if not found:
        raise SnapshotNotFound(scope, reference[:80])
    return found[0]
