"""Scope databases: author SQL, hardened, in a process of its own (DESIGN §8)."""

from runner.scopedb.client import ScopeDatabases, SqlOutcome
from runner.scopedb.policy import MIN_SQLITE_VERSION, SqlLimits

__all__ = ["MIN_SQLITE_VERSION", "ScopeDatabases", "SqlLimits", "SqlOutcome"]
