"""Scope databases: author SQL, hardened, in a process of its own per scope
(docs/ARCHITECTURE.md, Scope databases)."""

from qjsflow.runner.scopedb.client import ScopeDatabases, SqlCall, SqlOutcome, default_root
from qjsflow.runner.scopedb.policy import MIN_SQLITE_VERSION, SqlLimits

__all__ = [
    "MIN_SQLITE_VERSION", "ScopeDatabases", "SqlCall", "SqlLimits", "SqlOutcome", "default_root",
]  # fmt: skip
