"""qjsflow: durable, sandboxed JavaScript/TypeScript workflows, run from Python.

The public API in one place; the parts live in `qjsflow.runner` (the journal, runs, the CLI),
`qjsflow.sandbox` (QuickJS executors), `qjsflow.bridge` (the wire and value encoding) and
`qjsflow.bundles` (publishing with esbuild).
"""

# In a checkout the subpackages (runner/, sandbox/, bridge/, bundles/ at the top level) are
# found through the editable install's tree of links; when this folder is found first on
# sys.path (the checkout as the working directory), that tree's qjsflow/ is added here.
# Installed from a wheel, there is only one qjsflow/ and this changes nothing.
__path__ = __import__("pkgutil").extend_path(__path__, __name__)

from typing import TYPE_CHECKING, Any

from qjsflow.lazy_exports import lazy_exports

# Where each public name lives. Every error, configuration and result type a user handles is
# here (README, The Python API; tests/test_layout.py imports each name the README lists).
_HOMES: dict[str, tuple[str, ...]] = {
    "qjsflow.bridge": ("InvalidInput", "QjsflowError"),
    "qjsflow.bridge.limits": ("Limits",),
    "qjsflow.bridge.values": ("JsValue",),
    "qjsflow.bundles": ("PublishError",),
    "qjsflow.bundles.manifest": ("Capabilities",),
    "qjsflow.sandbox": ("PoolConfig",),
    "qjsflow.runner": (
        "ALL_SCOPES", "Bindings", "Notification", "PublishResult", "RunView", "Runner",
        "StartRunInput", "StepView", "ToolCall", "ToolCallView", "current_tool_call",
    ),
    "qjsflow.runner.config": ("Retention", "RunnerConfig"),
    "qjsflow.runner.views": ("WorkerView",),
    "qjsflow.runner.operations.scope_configs": ("ScopeConfigVersion",),
    "qjsflow.runner.operations.workflow_bindings": ("WorkflowBinding", "WorkflowInstance"),
    "qjsflow.runner.errors": (
        "BudgetExceeded", "CapabilityRefused", "FatalToolError", "InvalidEvent", "InvalidRunId",
        "JournalUnavailable", "RunChanged", "RunClosed", "RunConflict", "RunNotFound",
        "RunTimeout", "SnapshotNotFound", "StoredCodeDamaged", "UnknownWorkflow",
    ),
    "qjsflow.runner.operations.fork_check": ("ForkMismatch",),
    "qjsflow.runner.operations.migrate": ("MigrationReport",),
    "qjsflow.runner.operations.retention": ("Pruned",),
    "qjsflow.runner.scopedb.policy": ("SqlLimits",),
    "qjsflow.runner.tenancy.budgets": ("Budgets",),
    "qjsflow.runner.tenancy.egress": ("EgressPolicy",),
    "qjsflow.runner.tenancy.environment": ("ScopeEnvironment",),
    "qjsflow.runner.tenancy.usage": ("ScopeUsage",),
}  # fmt: skip

if TYPE_CHECKING:
    from qjsflow.bridge import InvalidInput, QjsflowError
    from qjsflow.bridge.limits import Limits
    from qjsflow.bridge.values import JsValue
    from qjsflow.bundles import PublishError
    from qjsflow.bundles.manifest import Capabilities
    from qjsflow.runner import (
        ALL_SCOPES,
        Bindings,
        Notification,
        PublishResult,
        Runner,
        RunView,
        StartRunInput,
        StepView,
        ToolCall,
        ToolCallView,
        current_tool_call,
    )
    from qjsflow.runner.config import Retention, RunnerConfig
    from qjsflow.runner.errors import (
        BudgetExceeded,
        CapabilityRefused,
        FatalToolError,
        InvalidEvent,
        InvalidRunId,
        JournalUnavailable,
        RunChanged,
        RunClosed,
        RunConflict,
        RunNotFound,
        RunTimeout,
        SnapshotNotFound,
        StoredCodeDamaged,
        UnknownWorkflow,
    )
    from qjsflow.runner.operations.fork_check import ForkMismatch
    from qjsflow.runner.operations.migrate import MigrationReport
    from qjsflow.runner.operations.retention import Pruned
    from qjsflow.runner.operations.scope_configs import ScopeConfigVersion
    from qjsflow.runner.operations.workflow_bindings import WorkflowBinding, WorkflowInstance
    from qjsflow.runner.scopedb.policy import SqlLimits
    from qjsflow.runner.tenancy.budgets import Budgets
    from qjsflow.runner.tenancy.egress import EgressPolicy
    from qjsflow.runner.tenancy.environment import ScopeEnvironment
    from qjsflow.runner.tenancy.usage import ScopeUsage
    from qjsflow.runner.views import WorkerView
    from qjsflow.sandbox import PoolConfig

# Imported when first used: `python -m qjsflow.sandbox.executor` (each executor process) must
# not load the runner, asyncio and the journal's drivers just because it lives in qjsflow.
_exports = lazy_exports(__name__, _HOMES)


def __getattr__(name: str) -> Any:
    if name == "__version__":  # read from the metadata when asked: every command imports qjsflow
        from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

        try:
            value: Any = version("qjsflow")
        except PackageNotFoundError:  # a checkout that was never installed
            value = "0+unknown"
        globals()[name] = value
        return value
    return _exports(name)


__all__ = [
    "ALL_SCOPES",
    "Bindings",
    "BudgetExceeded",
    "Budgets",
    "Capabilities",
    "CapabilityRefused",
    "EgressPolicy",
    "FatalToolError",
    "ForkMismatch",
    "InvalidEvent",
    "InvalidInput",
    "InvalidRunId",
    "JournalUnavailable",
    "JsValue",
    "Limits",
    "MigrationReport",
    "Notification",
    "PoolConfig",
    "Pruned",
    "PublishError",
    "PublishResult",
    "QjsflowError",
    "Retention",
    "RunChanged",
    "RunClosed",
    "RunConflict",
    "RunNotFound",
    "RunTimeout",
    "RunView",
    "Runner",
    "RunnerConfig",
    "ScopeConfigVersion",
    "ScopeEnvironment",
    "ScopeUsage",
    "SnapshotNotFound",
    "SqlLimits",
    "StartRunInput",
    "StepView",
    "StoredCodeDamaged",
    "ToolCall",
    "ToolCallView",
    "UnknownWorkflow",
    "WorkerView",
    "WorkflowBinding",
    "WorkflowInstance",
    "__version__",
    "current_tool_call",
]
