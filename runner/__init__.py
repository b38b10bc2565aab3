"""The host: the journal, the run lifecycle, the servicing of bridge ops, the CLI.

Its names are imported when first used (`qjsflow.lazy_exports`): a command that only reads
the journal does not load the driver, the publish path or the executor pool.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qjsflow.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from qjsflow.runner.bindings import (
        Bindings,
        Notification,
        ToolCall,
        ToolFn,
        current_tool_call,
    )
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
    from qjsflow.runner.tenancy.scopes import ALL_SCOPES, AllScopes, InvalidScope, validate_scope
    from qjsflow.runner.views import (
        PersistedRun,
        RunView,
        StartRunInput,
        StepView,
        ToolCallView,
    )

_HOMES = {
    "qjsflow.runner.bindings": (
        "Bindings", "Notification", "ToolCall", "ToolFn", "current_tool_call",
    ),
    "qjsflow.runner.config": ("RunnerConfig",),
    "qjsflow.runner.errors": (
        "FatalToolError", "InvalidEvent", "InvalidRunId", "RunClosed", "RunConflict",
        "RunNotFound", "SnapshotNotFound", "UnknownWorkflow",
    ),
    "qjsflow.runner.runner": ("PublishResult", "PublishedWorkflow", "Runner"),
    "qjsflow.runner.tenancy.scopes": ("ALL_SCOPES", "AllScopes", "InvalidScope", "validate_scope"),
    "qjsflow.runner.views": (
        "PersistedRun", "RunView", "StartRunInput", "StepView", "ToolCallView",
    ),
}  # fmt: skip

__getattr__ = lazy_exports(__name__, _HOMES)

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
