"""What author SQL may do in its scope database, and the limits it runs under
(docs/ARCHITECTURE.md, Scope databases).

Shared by the server process (which enforces it) and the host (which configures it).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MIN_SQLITE_VERSION", "SqlLimits"]

MIN_SQLITE_VERSION = (3, 50, 2)  # CVE-2025-6965 and CVE-2025-7458 are fixed from here on


@dataclass(frozen=True, slots=True)
class SqlLimits:
    """Bounds on one `db.sql` call, on a scope's database, and on a run's SQL time."""

    deadline_s: float = 1.0  # per statement, enforced by a progress handler
    run_budget_s: float = 10.0  # all SQL of one run, across drives
    max_rows: int = 1000
    max_result_bytes: int = 1024 * 1024
    max_pages: int = 16_384  # the scope's quota: 64 MiB at 4 KiB pages
    # SQLITE_LIMIT_LENGTH: any string or blob. Small, because one native function call is
    # never interrupted: instr() over two strings of this length compares up to its square.
    max_length: int = 64 * 1024
    # UTF-8 bytes of one statement's text (SQLITE_LIMIT_SQL_LENGTH). SQLite also holds SQL
    # text to `max_length`, so it may be no more; checked before preparing, with a message
    # that names it (the prelude's own bound, in characters, is `RULES.sql_chars`).
    max_sql_length: int = 64 * 1024
    max_expr_depth: int = 100
    max_compound_select: int = 50
    max_columns: int = 200
    max_variables: int = 100
    max_like_pattern: int = 1000
    max_trigger_depth: int = 10
    cached_connections: int = 16
    # Scopes run in processes of their own, so that one scope's statement never waits on
    # another's; at most this many stay alive (the least recently used idle one goes first).
    max_processes: int = 8
    kill_grace_s: float = 1.0  # past its deadline, a statement's process is killed
    # How long a call waits for another process's write lock on the scope's file (two
    # workers on one machine share the scope folder); past it the call fails, coded `busy`.
    # Short: the host cannot tell a wait for the lock from a statement past its deadline, so
    # a runaway native call is killed only after its deadline, this and `kill_grace_s`.
    busy_wait_s: float = 2.0

    def __post_init__(self) -> None:
        if self.max_sql_length > self.max_length:
            raise ValueError(
                "max_sql_length may be at most max_length (SQLite holds SQL text to both)"
            )
