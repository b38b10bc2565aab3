"""The host: the journal, the run lifecycle, the servicing of bridge ops, the CLI."""

from qjsflow.runner.bindings import Bindings, Notification, ToolCall, ToolFn, current_tool_call
from qjsflow.runner.config import RunnerConfig
from qjsflow.runner.errors import (
    FatalToolError,
    InvalidEvent,
    InvalidRunId,
    RunClosed,
    RunConflict,
    RunNotFound,
    SnapshotNotFound,
    UnknownWorkflow,
)
from qjsflow.runner.runner import PublishedWorkflow, PublishResult, Runner
from qjsflow.runner.scopes import ALL_SCOPES, AllScopes, InvalidScope, validate_scope
from qjsflow.runner.views import PersistedRun, RunView, StartRunInput, StepView, ToolCallView

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
