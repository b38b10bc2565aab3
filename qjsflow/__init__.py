"""qjsflow: durable, sandboxed JavaScript/TypeScript workflows, run from Python.

The public API in one place; the parts live in `qjsflow.runner` (the journal, runs, the CLI),
`qjsflow.sandbox` (QuickJS executors), `qjsflow.bridge` (the wire and value encoding) and
`qjsflow.bundles` (publishing with esbuild).
"""

from typing import TYPE_CHECKING, Any

from qjsflow.lazy_exports import lazy_exports

if TYPE_CHECKING:
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

# Imported when first used: `python -m qjsflow.sandbox.executor` (each executor process) must
# not load the runner, asyncio and the journal's drivers just because it lives in qjsflow.
_FROM_RUNNER = (
    "ALL_SCOPES", "Bindings", "FatalToolError", "Notification", "PublishResult", "RunNotFound",
    "RunView", "Runner", "RunnerConfig", "StartRunInput", "StepView", "ToolCall", "ToolCallView",
    "current_tool_call",
)  # fmt: skip
_exports = lazy_exports(__name__, {
    "qjsflow.bridge": ("InvalidInput", "QjsflowError"),
    "qjsflow.bridge.limits": ("Limits",),
    "qjsflow.bridge.values": ("JsValue",),
    "qjsflow.runner": _FROM_RUNNER,
})  # fmt: skip


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
