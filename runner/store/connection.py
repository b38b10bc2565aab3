"""Opening the journal database: the one place the SQLite pragmas are set."""

from __future__ import annotations

from pathlib import Path

import aiosqlite

__all__ = ["BUSY_TIMEOUT_MS", "connect"]

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
