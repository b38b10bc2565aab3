"""A journal connection's own thread, and opening a SQLite journal: the one place the SQLite
pragmas are set.

Each backend's database connection lives on one thread of its own and is touched nowhere
else; a job (a whole transaction, a synchronous function) reaches it in one hop. A library
that hops once per call cost ~15 hops for a transaction of five statements, which dominated a
step (docs/PERFORMANCE.md).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["BUSY_TIMEOUT_MS", "JobThread", "connect_sqlite"]

T = TypeVar("T")

BUSY_TIMEOUT_MS = 10_000


class JobThread:
    """Runs jobs one at a time, in order, on a single thread."""

    def __init__(self, name: str) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=name)

    async def run(self, job: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, job, *args)

    def stop(self) -> None:
        """No more jobs; the thread ends once the queued ones are done (none wait for it)."""
        self._pool.shutdown(wait=False)


def connect_sqlite(path: str | Path) -> sqlite3.Connection:
    """On the journal's thread: a connection in autocommit mode (transactions are explicit
    `BEGIN IMMEDIATE`), WAL, `synchronous=FULL` so a commit survives power loss, foreign
    keys on."""
    connection = sqlite3.connect(str(path), isolation_level=None)
    try:
        connection.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        connection.execute("PRAGMA journal_mode = WAL")
        connection.execute("PRAGMA synchronous = FULL")
        connection.execute("PRAGMA foreign_keys = ON")
    except BaseException:
        connection.close()
        raise
    return connection
