"""QuickJS executors: load a bundle, install the step API, drive one replay against the bridge.

The sandbox knows nothing of SQLite; it imports only `bridge`. See `docs/ARCHITECTURE.md`.
"""

from qjsflow.sandbox.pool import ExecutorPool, Host, PoolConfig, remove_stale_workdirs

__all__ = ["ExecutorPool", "Host", "PoolConfig", "remove_stale_workdirs"]
