"""Opening the journal database: the one place the SQLite pragmas are set."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

__all__ = ["BUSY_TIMEOUT_MS", "connect", "run_in_thread"]

T = TypeVar("T")

BUSY_TIMEOUT_MS = 10_000


async def connect(path: str | Path) -> aiosqlite.Connection:
    """A connection in autocommit mode (transactions are explicit `BEGIN IMMEDIATE`), WAL,
    `synchronous=FULL` so a commit survives power loss, foreign keys on."""
    connection = await aiosqlite.connect(str(path), isolation_level=None)
    try:
        await connection.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        await connection.execute("PRAGMA journal_mode = WAL")
        await connection.execute("PRAGMA synchronous = FULL")
        await connection.execute("PRAGMA foreign_keys = ON")
    except BaseException:
        await connection.close()
        raise
    return connection


async def run_in_thread(connection: aiosqlite.Connection, work: Callable[..., T], *args: Any) -> T:
    """Run `work(sqlite3_connection, *args)` as one job on the aiosqlite connection's thread.

    aiosqlite's public methods cost a thread hop per call (three for a query with a cursor);
    a transaction of five statements made ~15 hops, which dominated the cost of a step. Its
    job queue (`_execute`) takes any function; this is the one place that relies on it.
    """

    def job() -> T:
        raw: sqlite3.Connection = connection._conn
        return work(raw, *args)

    result: T = await connection._execute(job)  # type: ignore[no-untyped-call]
    return result
