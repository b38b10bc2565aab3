"""The journal store: every SQL statement of qjsflow lives in this package, behind named methods.

Public methods own their transaction (`BEGIN IMMEDIATE` … `COMMIT`); helpers that must run
inside one end in `_txn`. Rows leave this module only as frozen dataclasses.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiosqlite

from bridge import dumps_text
from bundles import Snapshot
from runner.store.connection import connect
from runner.store.migrations import migrate

__all__ = ["BundleRecord", "JournalStore", "SnapshotRecord", "WorkflowRecord"]


@dataclass(frozen=True, slots=True)
class WorkflowRecord:
    workflow: str
    entry_path: str


@dataclass(frozen=True, slots=True)
class SnapshotRecord:
    scope: str
    snapshot_id: str
    created_at: float
    workflows: tuple[WorkflowRecord, ...]


@dataclass(frozen=True, slots=True)
class BundleRecord:
    scope: str
    snapshot_id: str
    workflow: str
    entry_path: str
    code: str


class JournalStore:
    """The journal database of one runner process."""

    def __init__(self, connection: aiosqlite.Connection, path: Path) -> None:
        self._db = connection
        self.path = path

    @classmethod
    async def open(cls, path: str | Path) -> JournalStore:
        connection = await connect(path)
        try:
            await migrate(connection)
        except BaseException:
            await connection.close()
            raise
        return cls(connection, Path(path))

    async def aclose(self) -> None:
        await self._db.close()

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[aiosqlite.Connection]:
        await self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            await self._db.execute("ROLLBACK")
            raise
        await self._db.execute("COMMIT")

    # -- snapshots -----------------------------------------------------------------------------

    async def find_snapshot(self, scope: str, snapshot_id: str) -> SnapshotRecord | None:
        async with self._db.execute(
            "SELECT s.created_at, b.workflow, b.entry_path FROM snapshots s"
            " JOIN bundles b USING (scope, snapshot_id)"
            " WHERE s.scope = ? AND s.snapshot_id = ? ORDER BY b.workflow",
            (scope, snapshot_id),
        ) as cursor:
            rows = list(await cursor.fetchall())
        if not rows:
            return None
        workflows = tuple(WorkflowRecord(row[1], row[2]) for row in rows)
        return SnapshotRecord(scope, snapshot_id, float(rows[0][0]), workflows)

    async def insert_snapshot(self, scope: str, snapshot: Snapshot, created_at: float) -> bool:
        """Store a snapshot and its bundles; False (and nothing written) if it already exists."""
        manifest = dumps_text(
            [
                [file.path, hashlib.sha256(file.content).hexdigest(), len(file.content)]
                for file in snapshot.tree.files
            ]
        )
        async with self._transaction() as db:
            async with db.execute(
                "INSERT INTO snapshots"
                " (scope, snapshot_id, created_at, file_count, total_bytes, manifest)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING RETURNING 1",
                (
                    scope,
                    snapshot.snapshot_id,
                    created_at,
                    len(snapshot.tree.files),
                    snapshot.tree.total_bytes,
                    manifest,
                ),
            ) as cursor:
                inserted = await cursor.fetchone() is not None
            if inserted:
                await db.executemany(
                    "INSERT INTO bundles"
                    " (scope, snapshot_id, workflow, entry_path, code, code_sha256)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    [
                        (
                            scope,
                            snapshot.snapshot_id,
                            bundle.workflow,
                            bundle.entry_path,
                            bundle.code,
                            hashlib.sha256(bundle.code.encode("utf-8")).hexdigest(),
                        )
                        for bundle in snapshot.bundles
                    ],
                )
        return inserted

    async def load_bundle(self, scope: str, snapshot_id: str, workflow: str) -> BundleRecord | None:
        async with self._db.execute(
            "SELECT entry_path, code FROM bundles"
            " WHERE scope = ? AND snapshot_id = ? AND workflow = ?",
            (scope, snapshot_id, workflow),
        ) as cursor:
            row = await cursor.fetchone()
        if row is None:
            return None
        return BundleRecord(scope, snapshot_id, workflow, str(row[0]), str(row[1]))

    async def table_counts(self) -> dict[str, int]:
        """Rows in each journal table: what tests use to show that nothing was written."""
        async with self._db.execute(
            "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        ) as cursor:
            tables = [str(row[0]) for row in await cursor.fetchall()]
        counts: dict[str, int] = {}
        for table in sorted(tables):
            # `table` comes from sqlite_schema, not from a caller.
            async with self._db.execute(f'SELECT count(*) FROM "{table}"') as cursor:
                row = await cursor.fetchone()
            counts[table] = int(row[0]) if row else 0
        return counts
