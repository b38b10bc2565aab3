"""Versioned schema migrations. Append new ones; never edit one that has shipped.

Each migration runs in its own `BEGIN IMMEDIATE` transaction together with the row that records
it in `schema_migrations`, so concurrent openers apply each exactly once.
"""

from __future__ import annotations

import time

import aiosqlite

__all__ = ["MIGRATIONS", "migrate"]

MIGRATIONS: tuple[tuple[int, str, str], ...] = (
    (
        1,
        "snapshots and bundles",
        """
        CREATE TABLE snapshots (
            scope TEXT NOT NULL,
            snapshot_id TEXT NOT NULL,
            created_at REAL NOT NULL,
            file_count INTEGER NOT NULL,
            total_bytes INTEGER NOT NULL,
            manifest TEXT NOT NULL,
            PRIMARY KEY (scope, snapshot_id)
        ) STRICT;
        CREATE TABLE bundles (
            scope TEXT NOT NULL,
            snapshot_id TEXT NOT NULL,
            workflow TEXT NOT NULL,
            entry_path TEXT NOT NULL,
            code TEXT NOT NULL,
            code_sha256 TEXT NOT NULL,
            PRIMARY KEY (scope, snapshot_id, workflow),
            FOREIGN KEY (scope, snapshot_id) REFERENCES snapshots (scope, snapshot_id)
        ) STRICT;
        """,
    ),
)


async def migrate(connection: aiosqlite.Connection) -> int:
    """Bring the schema up to date; returns the version it is at."""
    await connection.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations ("
        " version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL) STRICT"
    )
    for version, name, script in MIGRATIONS:
        await connection.execute("BEGIN IMMEDIATE")
        try:
            async with connection.execute(
                "SELECT 1 FROM schema_migrations WHERE version = ?", (version,)
            ) as cursor:
                applied = await cursor.fetchone() is not None
            if not applied:
                for statement in _statements(script):
                    await connection.execute(statement)
                await connection.execute(
                    "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                    (version, name, time.time()),
                )
            await connection.execute("COMMIT")
        except BaseException:
            await connection.execute("ROLLBACK")
            raise
    return MIGRATIONS[-1][0]


def _statements(script: str) -> list[str]:
    # Migration scripts are ours and hold no semicolons inside literals.
    return [part.strip() for part in script.split(";") if part.strip()]
