"""Scope databases: author SQL, hardened, in a process of its own per scope
(docs/ARCHITECTURE.md, Scope databases)."""

from qjsflow.runner.scopedb.client import ScopeDatabases, SqlOutcome, default_root
from qjsflow.runner.scopedb.policy import MIN_SQLITE_VERSION, SqlLimits

__all__ = ["MIN_SQLITE_VERSION", "ScopeDatabases", "SqlLimits", "SqlOutcome", "default_root"]
