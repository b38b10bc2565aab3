"""`JournalTransaction`: named statements that run inside one `BEGIN IMMEDIATE` transaction.

The run lifecycle (runner/host.py, runner/runner.py) decides; this module only reads and
writes. Every method here assumes the caller holds the transaction (hence no `_txn` suffix on a
class whose every method is one).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import aiosqlite

from bridge import QjsflowError, dumps_text
from runner.store.records import InboxRecord, RunRecord, StepRow

__all__ = ["RUN_COLUMNS", "STEP_COLUMNS", "JournalTransaction", "Lease", "LeaseLost", "run_record"]

RUN_COLUMNS = (
    "run_id, scope, workflow, snapshot_id, entry_path, status, input, persisted_bindings,"
    " output, error, created_at, updated_at, wake_at, waiting_for, cpu_used_s, logs_count,"
    " cancel_requested, sql_used_s"
)
STEP_COLUMNS = (
    "run_id, kind, name, count, status, attempt, config, detail, output, error, started_at,"
    " completed_at, settled_seq"
)
_RUN_UPDATABLE = {
    "status", "output", "error", "updated_at", "wake_at", "waiting_for", "cpu_used_s",
    "logs_count", "cancel_requested", "sql_used_s",
}  # fmt: skip
_STEP_UPDATABLE = {"status", "attempt", "config", "detail", "output", "error", "started_at"}


@dataclass(frozen=True, slots=True)
class Lease:
    """One driver's hold on a run; `epoch` fences every write of its drive."""

    run_id: str
    worker_id: str
    epoch: int


class LeaseLost(QjsflowError):
    """Another driver took the run over: this driver must stop without writing."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        super().__init__(f"the lease on run {lease.run_id!r} (epoch {lease.epoch}) was taken over")


def run_record(row: Iterable[Any]) -> RunRecord:
    values = list(row)
    values[16] = bool(values[16])  # cancel_requested
    return RunRecord(*values)


class JournalTransaction:
    def __init__(self, connection: aiosqlite.Connection, fence: Lease | None = None) -> None:
        self._db = connection
        self._epoch = None if fence is None else fence.epoch

    async def check_fence(self, lease: Lease) -> None:
        row = await self._one("SELECT epoch, worker_id FROM runs WHERE run_id = ?", (lease.run_id,))
        if row is None or row[0] != lease.epoch or row[1] != lease.worker_id:
            raise LeaseLost(lease)

    async def _one(self, sql: str, args: tuple[Any, ...]) -> Any:
        async with self._db.execute(sql, args) as cursor:
            return await cursor.fetchone()

    # -- runs --------------------------------------------------------------------------------

    async def get_run(self, run_id: str) -> RunRecord | None:
        row = await self._one(f"SELECT {RUN_COLUMNS} FROM runs WHERE run_id = ?", (run_id,))
        return None if row is None else run_record(row)

    async def insert_run(self, run: RunRecord) -> bool:
        """First writer wins: False when a run with this id already exists."""
        values = (
            run.run_id, run.scope, run.workflow, run.snapshot_id, run.entry_path, run.status,
            run.input, run.persisted_bindings, run.output, run.error, run.created_at,
            run.updated_at, run.wake_at, run.waiting_for, run.cpu_used_s, run.logs_count,
            int(run.cancel_requested), run.sql_used_s,
        )  # fmt: skip
        placeholders = ", ".join("?" for _ in values)
        row = await self._one(
            f"INSERT INTO runs ({RUN_COLUMNS}) VALUES ({placeholders})"
            " ON CONFLICT DO NOTHING RETURNING 1",
            values,
        )
        return row is not None

    async def update_run(self, run_id: str, **fields: Any) -> None:
        unknown = set(fields) - _RUN_UPDATABLE
        if unknown:
            raise ValueError(f"runs has no updatable columns {sorted(unknown)}")
        assignments = ", ".join(f"{name} = ?" for name in fields)
        await self._db.execute(
            f"UPDATE runs SET {assignments} WHERE run_id = ?", (*fields.values(), run_id)
        )

    # -- steps -------------------------------------------------------------------------------

    async def get_step(self, run_id: str, kind: str, name: str, count: int) -> StepRow | None:
        row = await self._one(
            f"SELECT {STEP_COLUMNS} FROM steps"
            " WHERE run_id = ? AND kind = ? AND name = ? AND count = ?",
            (run_id, kind, name, count),
        )
        return None if row is None else StepRow(*row)

    async def insert_step(
        self,
        run_id: str,
        kind: str,
        name: str,
        count: int,
        *,
        status: str,
        attempt: int,
        started_at: int,
        config: str | None = None,
        detail: str | None = None,
    ) -> bool:
        row = await self._one(
            "INSERT INTO steps (run_id, kind, name, count, status, attempt, config, detail,"
            " started_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING RETURNING 1",
            (run_id, kind, name, count, status, attempt, config, detail, started_at),
        )
        return row is not None

    async def update_step(
        self, run_id: str, kind: str, name: str, count: int, **fields: Any
    ) -> None:
        unknown = set(fields) - _STEP_UPDATABLE
        if unknown:
            raise ValueError(f"steps has no updatable columns {sorted(unknown)}")
        assignments = ", ".join(f"{name} = ?" for name in fields)
        await self._db.execute(
            f"UPDATE steps SET {assignments}"
            " WHERE run_id = ? AND kind = ? AND name = ? AND count = ?",
            (*fields.values(), run_id, kind, name, count),
        )

    async def settle_step(
        self,
        step: StepRow,
        *,
        status: str,
        output: str | None,
        error: str | None,
        at: int,
        event_type: str,
    ) -> bool:
        """Record a step's final result once: False (nothing written) if it already settled."""
        seq = await self.append_event(
            step.run_id, event_type, at, f'{{"key":{dumps_text(step.key)}}}'
        )
        row = await self._one(
            "UPDATE steps SET status = ?, output = ?, error = ?, completed_at = ?,"
            " settled_seq = ? WHERE run_id = ? AND kind = ? AND name = ? AND count = ?"
            " AND settled_seq IS NULL RETURNING 1",
            (status, output, error, at, seq, step.run_id, step.kind, step.name, step.count),
        )
        return row is not None

    # -- events, timers, inbox ---------------------------------------------------------------

    async def append_event(self, run_id: str, event_type: str, at: int, data: str | None) -> int:
        row = await self._one(
            "INSERT INTO events (run_id, type, at, data, epoch) VALUES (?, ?, ?, ?, ?)"
            " RETURNING seq",
            (run_id, event_type, at, data, self._epoch),
        )
        return int(row[0])

    async def set_timer(self, run_id: str, step_key: str, kind: str, due_at: int) -> None:
        await self._db.execute(
            "INSERT INTO timers (run_id, step_key, kind, due_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (run_id, step_key) DO UPDATE SET kind = excluded.kind,"
            " due_at = excluded.due_at",
            (run_id, step_key, kind, due_at),
        )

    async def delete_timer(self, run_id: str, step_key: str) -> None:
        await self._db.execute(
            "DELETE FROM timers WHERE run_id = ? AND step_key = ?", (run_id, step_key)
        )

    async def delete_timers(self, run_id: str) -> None:
        await self._db.execute("DELETE FROM timers WHERE run_id = ?", (run_id,))

    async def next_timer(self, run_id: str) -> int | None:
        row = await self._one("SELECT min(due_at) FROM timers WHERE run_id = ?", (run_id,))
        return None if row is None or row[0] is None else int(row[0])

    async def insert_inbox(self, run_id: str, event_type: str, payload: str, at: int) -> int:
        row = await self._one(
            "INSERT INTO inbox (run_id, type, payload, received_at) VALUES (?, ?, ?, ?)"
            " RETURNING seq",
            (run_id, event_type, payload, at),
        )
        return int(row[0])

    async def oldest_unconsumed(
        self, run_id: str, event_type: str, received_by: int
    ) -> InboxRecord | None:
        row = await self._one(
            "SELECT seq, run_id, type, payload, received_at, consumed_by FROM inbox"
            " WHERE run_id = ? AND type = ? AND consumed_by IS NULL AND received_at <= ?"
            " ORDER BY seq LIMIT 1",
            (run_id, event_type, received_by),
        )
        return None if row is None else InboxRecord(*row)

    async def consume(self, seq: int, step_key: str) -> None:
        await self._db.execute("UPDATE inbox SET consumed_by = ? WHERE seq = ?", (step_key, seq))

    # -- tool calls and logs -----------------------------------------------------------------

    async def start_tool_call(
        self, run_id: str, step_key: str, attempt: int, *, address: str, args: str, at: int
    ) -> int:
        row = await self._one(
            "INSERT INTO tool_calls (run_id, step_key, attempt, address, args, started_at)"
            " VALUES (?, ?, ?, ?, ?, ?) RETURNING seq",
            (run_id, step_key, attempt, address, args, at),
        )
        return int(row[0])

    async def finish_tool_call(
        self, seq: int, result: str | None, error: str | None, duration_ms: int
    ) -> None:
        await self._db.execute(
            "UPDATE tool_calls SET result = ?, error = ?, duration_ms = ? WHERE seq = ?",
            (result, error, duration_ms, seq),
        )

    async def insert_log(self, run_id: str, count: int, level: str, text: str, at: int) -> bool:
        row = await self._one(
            "INSERT INTO logs (run_id, count, level, text, at) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT DO NOTHING RETURNING 1",
            (run_id, count, level, text, at),
        )
        return row is not None
