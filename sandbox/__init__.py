"""QuickJS executors: load a bundle, install the step API, drive one replay against the bridge.

The sandbox knows nothing of SQLite; it imports only `bridge`. See `docs/ARCHITECTURE.md`.
Its names are imported when first used, so that an executor process (`python -m
qjsflow.sandbox.executor`) loads neither the pool nor asyncio.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from qjsflow.sandbox.pool import ExecutorPool, Host, PoolConfig, remove_stale_workdirs

__all__ = ["ExecutorPool", "Host", "PoolConfig", "remove_stale_workdirs"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module("qjsflow.sandbox.pool"), name)
    globals()[name] = value
    return value
