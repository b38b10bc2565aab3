"""qjsflow: durable, sandboxed JavaScript/TypeScript workflows, run from Python.

The public API in one place; the parts live in `qjsflow.runner` (the journal, runs, the CLI),
`qjsflow.sandbox` (QuickJS executors), `qjsflow.bridge` (the wire and value encoding) and
`qjsflow.bundles` (publishing with esbuild).
"""

from importlib.metadata import PackageNotFoundError, version

from qjsflow.bridge import InvalidInput, QjsflowError
from qjsflow.bridge.limits import Limits
from qjsflow.bridge.values import JsValue
from qjsflow.runner import (
    ALL_SCOPES,
    Bindings,
    FatalToolError,
    Notification,
    PublishResult,
    Runner,
    RunnerConfig,
    RunNotFound,
    RunView,
    StartRunInput,
    StepView,
    ToolCall,
    ToolCallView,
    current_tool_call,
)

try:
    __version__ = version("qjsflow")
except PackageNotFoundError:  # a checkout that was never installed
    __version__ = "0+unknown"

__all__ = [
    "ALL_SCOPES",
    "Bindings",
    "FatalToolError",
    "InvalidInput",
    "JsValue",
    "Limits",
    "Notification",
    "PublishResult",
    "QjsflowError",
    "RunNotFound",
    "RunView",
    "Runner",
    "RunnerConfig",
    "StartRunInput",
    "StepView",
    "ToolCall",
    "ToolCallView",
    "__version__",
    "current_tool_call",
]
