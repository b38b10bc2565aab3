"""The journal store: every SQL statement of qjsflow lives in this package, behind named methods.

Public methods own their transaction (`BEGIN IMMEDIATE` … `COMMIT`); helpers that must run
inside one end in `_txn`. Rows leave this module only as frozen dataclasses.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiosqlite

from bridge import dumps_text
from bundles import Snapshot
from runner.store.connection import connect
from runner.store.migrations import migrate
from runner.store.records import (
    EventRecord,
    JournalRow,
    LogRecord,
    RunRecord,
    StepRow,
    ToolCallRecord,
)
from runner.store.tx import RUN_COLUMNS, STEP_COLUMNS, JournalTransaction, Lease, run_record

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
        # One connection serves the whole runner: statements of concurrent coroutines must not
        # interleave inside another's transaction.
        self._lock = asyncio.Lock()

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
        async with self._lock:
            await self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                await self._db.execute("ROLLBACK")
                raise
            await self._db.execute("COMMIT")

    @asynccontextmanager
    async def transaction(self, fence: Lease | None = None) -> AsyncIterator[JournalTransaction]:
        """`async with store.transaction() as tx:` — committed on exit, rolled back on error.

        With a `fence`, the transaction first checks that the lease's epoch is still the run's
        and raises `LeaseLost` (writing nothing) if another driver has taken the run over.
        """
        async with self._transaction() as connection:
            tx = JournalTransaction(connection, fence)
            if fence is not None:
                await tx.check_fence(fence)
            yield tx

    # -- leases ------------------------------------------------------------------------------

    async def acquire_lease(
        self, run_id: str, worker_id: str, now: int, ttl_ms: int
    ) -> Lease | None:
        """Take the run for one driver, or None while another live driver holds it."""
        async with (
            self._transaction() as db,
            db.execute(
                "UPDATE runs SET worker_id = ?, lease_expires_at = ?, epoch = epoch + 1"
                " WHERE run_id = ? AND status NOT IN ('completed', 'failed', 'cancelled')"
                " AND (worker_id IS NULL OR lease_expires_at IS NULL OR lease_expires_at <= ?)"
                " RETURNING epoch",
                (worker_id, now + ttl_ms, run_id, now),
            ) as cursor,
        ):
            row = await cursor.fetchone()
        return None if row is None else Lease(run_id, worker_id, int(row[0]))

    async def renew_lease(self, lease: Lease, now: int, ttl_ms: int) -> bool:
        async with (
            self._transaction() as db,
            db.execute(
                "UPDATE runs SET lease_expires_at = ? WHERE run_id = ? AND epoch = ?"
                " AND worker_id = ? RETURNING 1",
                (now + ttl_ms, lease.run_id, lease.epoch, lease.worker_id),
            ) as cursor,
        ):
            return await cursor.fetchone() is not None

    async def release_lease(self, lease: Lease) -> None:
        async with self._transaction() as db:
            await db.execute(
                "UPDATE runs SET worker_id = NULL, lease_expires_at = NULL"
                " WHERE run_id = ? AND epoch = ? AND worker_id = ?",
                (lease.run_id, lease.epoch, lease.worker_id),
            )

    async def claimable_runs(self, now: int, limit: int) -> list[str]:
        """Runs a worker should drive now: a timer is due, a cancel is pending, or the run is
        `running` with no live lease (its driver died, or it was started without a drive)."""
        rows = await self._all(
            "SELECT run_id FROM runs r"
            " WHERE status NOT IN ('completed', 'failed', 'cancelled')"
            " AND (worker_id IS NULL OR lease_expires_at IS NULL OR lease_expires_at <= ?)"
            " AND (status = 'running' OR cancel_requested = 1 OR EXISTS"
            "  (SELECT 1 FROM timers t WHERE t.run_id = r.run_id AND t.due_at <= ?))"
            " ORDER BY updated_at LIMIT ?",
            (now, now, limit),
        )
        return [str(row[0]) for row in rows]

    async def next_due(self) -> int | None:
        """The earliest timer of any unfinished run."""
        rows = await self._all(
            "SELECT min(t.due_at) FROM timers t JOIN runs r USING (run_id)"
            " WHERE r.status NOT IN ('completed', 'failed', 'cancelled')"
        )
        return None if rows[0][0] is None else int(rows[0][0])

    async def _all(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        async with self._lock, self._db.execute(sql, args) as cursor:
            return list(await cursor.fetchall())

    # -- snapshots -----------------------------------------------------------------------------

    async def find_snapshot(self, scope: str, snapshot_id: str) -> SnapshotRecord | None:
        rows = await self._all(
            "SELECT s.created_at, b.workflow, b.entry_path FROM snapshots s"
            " JOIN bundles b USING (scope, snapshot_id)"
            " WHERE s.scope = ? AND s.snapshot_id = ? ORDER BY b.workflow",
            (scope, snapshot_id),
        )
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
        rows = await self._all(
            "SELECT entry_path, code FROM bundles"
            " WHERE scope = ? AND snapshot_id = ? AND workflow = ?",
            (scope, snapshot_id, workflow),
        )
        if not rows:
            return None
        return BundleRecord(scope, snapshot_id, workflow, str(rows[0][0]), str(rows[0][1]))

    async def table_counts(self) -> dict[str, int]:
        """Rows in each journal table: what tests use to show that nothing was written."""
        rows = await self._all(
            "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        )
        counts: dict[str, int] = {}
        for table in sorted(str(row[0]) for row in rows):
            # `table` comes from sqlite_schema, not from a caller.
            counted = await self._all(f'SELECT count(*) FROM "{table}"')
            counts[table] = int(counted[0][0])
        return counts

    # -- runs: reads outside any write transaction --------------------------------------------

    async def get_run(self, run_id: str) -> RunRecord | None:
        rows = await self._all(f"SELECT {RUN_COLUMNS} FROM runs WHERE run_id = ?", (run_id,))
        return run_record(rows[0]) if rows else None

    async def list_runs(
        self, scope: str | None, workflow: str | None, status: str | None, limit: int
    ) -> list[RunRecord]:
        clauses, args = [], []
        for column, value in (("scope", scope), ("workflow", workflow), ("status", status)):
            if value is not None:
                clauses.append(f"{column} = ?")
                args.append(value)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = await self._all(
            f"SELECT {RUN_COLUMNS} FROM runs{where} ORDER BY created_at, run_id LIMIT ?",
            (*args, limit),
        )
        return [run_record(row) for row in rows]

    async def load_journal(self, run_id: str) -> list[JournalRow]:
        """Every settled step of a run in the order it was reached: one query per drive."""
        rows = await self._all(
            "SELECT kind, name, count, output, error, completed_at FROM steps"
            " WHERE run_id = ? AND settled_seq IS NOT NULL ORDER BY settled_seq",
            (run_id,),
        )
        return [JournalRow(f"{r[0]}:{r[2]}:{r[1]}", r[3], r[4], int(r[5])) for r in rows]

    async def list_steps(self, run_id: str) -> list[StepRow]:
        rows = await self._all(
            f"SELECT {STEP_COLUMNS} FROM steps WHERE run_id = ?"
            " ORDER BY settled_seq IS NULL, settled_seq, started_at",
            (run_id,),
        )
        return [StepRow(*row) for row in rows]

    async def list_events(self, run_id: str) -> list[EventRecord]:
        rows = await self._all(
            "SELECT seq, run_id, type, at, data FROM events WHERE run_id = ? ORDER BY seq",
            (run_id,),
        )
        return [EventRecord(*row) for row in rows]

    async def list_tool_calls(self, run_id: str) -> list[ToolCallRecord]:
        rows = await self._all(
            "SELECT seq, run_id, step_key, attempt, address, args, result, error, started_at,"
            " duration_ms FROM tool_calls WHERE run_id = ? ORDER BY seq",
            (run_id,),
        )
        return [ToolCallRecord(*row) for row in rows]

    async def list_logs(self, run_id: str) -> list[LogRecord]:
        rows = await self._all(
            "SELECT run_id, count, level, text, at FROM logs WHERE run_id = ? ORDER BY count",
            (run_id,),
        )
        return [LogRecord(*row) for row in rows]
