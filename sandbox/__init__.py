"""QuickJS executors: load a bundle, install the step API, drive one replay against the bridge.

The sandbox knows nothing of SQLite; it imports only `bridge`. See `docs/ARCHITECTURE.md`.
Its names are imported when first used, so that an executor process (`python -m
qjsflow.sandbox.executor`) loads neither the pool nor asyncio.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qjsflow.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from qjsflow.sandbox.pool import ExecutorPool, Host, PoolConfig, remove_stale_workdirs

__all__ = ["ExecutorPool", "Host", "PoolConfig", "remove_stale_workdirs"]

__getattr__ = lazy_exports(__name__, {"qjsflow.sandbox.pool": tuple(__all__)})
