"""What callers see of runs and steps: frozen dataclasses made from journal rows.

Values are decoded (bridge.values) and times are float seconds since the epoch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from qjsflow.bridge import loads
from qjsflow.bridge.failure import failure_from_json
from qjsflow.bridge.values import to_python
from qjsflow.bundles.manifest import Capabilities
from qjsflow.runner.store import (
    ENDED,
    EventRecord,
    RunRecord,
    RunStatus,
    SnapshotRecord,
    StepRow,
    ToolCallRecord,
    WorkerRecord,
    WorkflowRecord,
)
from qjsflow.runner.tenancy.scopes import split_run_key

__all__ = [
    "PersistedRun",
    "PublishResult",
    "PublishedWorkflow",
    "RunStatus",
    "RunView",
    "StartRunInput",
    "StepView",
    "ToolCallView",
    "WorkerView",
    "published_result",
    "run_view",
    "step_view",
    "tool_call_view",
    "worker_view",
]

# A run's statuses are the store's (runner/store/records.py, `RunStatus`: docs/OPERATIONS.md
# and docs/TENANCY.md say what "blocked", "paused" and "throttled" wait for).
TERMINAL: frozenset[str] = ENDED  # the statuses of a run that has ended
RUN_STATUSES: tuple[str, ...] = tuple(status.value for status in RunStatus)


@dataclass(frozen=True, slots=True)
class StartRunInput:
    """Arguments of `Runner.start`. `entry_path`, when given, must match the workflow's."""

    scope: str
    workflow: str
    snapshot_id: str
    input: Any = None
    run_id: str | None = None
    entry_path: str | None = None
    persisted_bindings: dict[str, Any] = field(default_factory=dict)
    # A W3C trace context (`00-<trace>-<span>-<flags>`) the run's drives are traced under, so
    # the caller's trace continues into the workflow; one is made when none is given.
    traceparent: str | None = None
    # Key/value tags of the run (`list --tag KEY=VALUE` finds it by them): at most 20, keys
    # of A-Z, a-z, 0-9, `_`, `.`, `-` (64 at most), values of 256 characters at most.
    tags: Mapping[str, str] | None = None
    # Flow control for this start (bundles/flow.py's form), in place of what its workflow
    # declares; and its priority (-1000 to 1000, higher first), over the declared one.
    flow: Mapping[str, Any] | None = None
    priority: int | None = None


@dataclass(frozen=True, slots=True)
class RunView:
    run_id: str
    scope: str
    workflow: str
    snapshot_id: str
    status: RunStatus
    input: Any
    output: Any
    error: str | None
    created_at: float
    updated_at: float
    wake_at: float | None = None  # the next timer: a sleep, a retry or a wait's timeout
    waiting_for: str | None = None  # the awaited event type, while waiting
    # Where it failed, innermost first: "at fn (workflows/x.ts:12:5)" in tree paths.
    error_stack: tuple[str, ...] = ()
    # Its scope's configuration version as it started (None: the starting process's own).
    config_version: int | None = None
    priority: int = 0  # higher is claimed first in its scope, and leaves its queue first
    # While queued by its workflow's flow control: 1 when it is the next of its keys to go.
    queue_position: int | None = None


@dataclass(frozen=True, slots=True)
class StepView:
    run_id: str
    name: str
    kind: str
    count: int
    status: str
    output: Any
    error: str | None
    attempt: int
    completed_at: float | None
    error_stack: tuple[str, ...] = ()  # where its last attempt threw, as in RunView
    started_at: float | None = None  # when its latest attempt started
    retry_at: float | None = None  # while retrying: when the next attempt is due

    @property
    def duration_s(self) -> float | None:
        """How long its latest attempt took, once the step settled."""
        if self.started_at is None or self.completed_at is None:
            return None
        return max(0.0, self.completed_at - self.started_at)


@dataclass(frozen=True, slots=True)
class ToolCallView:
    run_id: str
    step: str
    attempt: int
    address: str
    args: Any
    result: Any
    error: str | None
    started_at: float
    duration_s: float | None


@dataclass(frozen=True, slots=True)
class PersistedRun:
    run_id: str
    snapshot_id: str
    entry_path: str
    persisted_bindings: dict[str, Any]


def _seconds(ms: int | None) -> float | None:
    return None if ms is None else ms / 1000


def _decoded(text: str | None) -> Any:
    return None if text is None else to_python(text)


def _error_message(text: str | None) -> str | None:
    if text is None:
        return None
    failure = failure_from_json(text)
    return f"{failure.name}: {failure.message}"


def _frames(stack: str | None) -> tuple[str, ...]:
    return () if not stack else tuple(stack.splitlines())


def run_view(run: RunRecord) -> RunView:
    return RunView(
        run_id=split_run_key(run.run_id)[1],
        scope=run.scope,
        workflow=run.workflow,
        snapshot_id=run.snapshot_id,
        status=run.status,
        input=_decoded(run.input),
        output=_decoded(run.output),
        error=run.error,
        created_at=run.created_at / 1000,
        updated_at=run.updated_at / 1000,
        wake_at=_seconds(run.wake_at),
        waiting_for=run.waiting_for,
        error_stack=_frames(run.error_stack),
        config_version=run.config_version,
        priority=run.priority,
    )


def step_view(step: StepRow) -> StepView:
    return StepView(
        run_id=split_run_key(step.run_id)[1],
        name=step.name,
        kind=step.kind,
        count=step.count,
        status=step.status,
        output=_decoded(step.output),
        error=_error_message(step.error),
        attempt=step.attempt,
        completed_at=_seconds(step.completed_at),
        error_stack=_frames(None if step.error is None else failure_from_json(step.error).stack),
        started_at=_seconds(step.started_at),
        retry_at=_seconds(loads(step.detail).get("retryAt")) if step.status == "retrying"
        and step.detail else None,
    )  # fmt: skip


def tool_call_view(call: ToolCallRecord) -> ToolCallView:
    return ToolCallView(
        run_id=split_run_key(call.run_id)[1],
        step=call.step_key.split(":", 2)[2],
        attempt=call.attempt,
        address=call.address,
        args=_decoded(call.args),
        result=_decoded(call.result),
        error=_error_message(call.error),
        started_at=call.started_at / 1000,
        duration_s=_seconds(call.duration_ms),
    )


@dataclass(frozen=True, slots=True)
class EventView:
    """One entry of a run's history, in order: what happened, when, and its details."""

    seq: int
    type: str
    at: float
    data: Any


def event_view(event: EventRecord) -> EventView:
    return EventView(event.seq, event.type, event.at / 1000, _json_or_none(event.data))


def _json_or_none(text: str | None) -> Any:
    return None if text is None else loads(text)


@dataclass(frozen=True, slots=True)
class WorkerView:
    """A worker serving the journal: who and where it is, what it binds and serves, and whether
    it is "live", "gone" (it stopped heart-beating: killed, or cut off) or "stopped" cleanly.
    Times in seconds since the epoch."""

    worker_id: str
    state: str
    host: str
    pid: int
    version: str
    tools: tuple[str, ...]
    scopes: tuple[str, ...]  # empty: every scope
    secret_providers: tuple[str, ...]
    started_at: float
    heartbeat_at: float
    stopped_at: float | None


def worker_view(worker: WorkerRecord, now_ms: int) -> WorkerView:
    return WorkerView(
        worker.worker_id, worker.state(now_ms), worker.host, worker.pid, worker.version,
        worker.tools, worker.scopes, worker.secret_providers, worker.started_at / 1000,
        worker.heartbeat_at / 1000, _seconds(worker.stopped_at),
    )  # fmt: skip


PublishedWorkflow = WorkflowRecord  # a workflow of a snapshot: its name and its entry file


@dataclass(frozen=True, slots=True)
class PublishResult:
    scope: str
    snapshot_id: str
    workflows: tuple[PublishedWorkflow, ...]
    created: bool  # False when the same snapshot was already published in this scope
    capabilities: Capabilities | None = None  # what its manifest declares; None: nothing
    warnings: tuple[str, ...] = ()  # imports left out of it (bundles/driver.mjs), and why


def published_result(
    record: SnapshotRecord, *, created: bool, warnings: tuple[str, ...]
) -> PublishResult:
    return PublishResult(record.scope, record.snapshot_id, record.workflows, created,
                         record.capabilities, warnings)  # fmt: skip
