"""The host: the journal, the run lifecycle, the servicing of bridge ops, the CLI."""

from runner.bindings import Bindings, Notification, ToolCall, ToolFn, current_tool_call
from runner.config import RunnerConfig
from runner.errors import (
    FatalToolError,
    InvalidEvent,
    InvalidRunId,
    RunClosed,
    RunConflict,
    RunNotFound,
    SnapshotNotFound,
    UnknownWorkflow,
)
from runner.runner import PublishedWorkflow, PublishResult, Runner
from runner.scopes import ALL_SCOPES, AllScopes, InvalidScope, validate_scope
from runner.views import PersistedRun, RunView, StartRunInput, StepView, ToolCallView

__all__ = [
    "ALL_SCOPES",
    "AllScopes",
    "Bindings",
    "FatalToolError",
    "InvalidEvent",
    "InvalidRunId",
    "InvalidScope",
    "Notification",
    "PersistedRun",
    "PublishResult",
    "PublishedWorkflow",
    "RunClosed",
    "RunConflict",
    "RunNotFound",
    "RunView",
    "Runner",
    "RunnerConfig",
    "SnapshotNotFound",
    "StartRunInput",
    "StepView",
    "ToolCall",
    "ToolCallView",
    "ToolFn",
    "UnknownWorkflow",
    "current_tool_call",
    "validate_scope",
]
