"""The statements of flow control (runner/tenancy/flow_gates.py decides): each gated run's
row in `run_flow`, and the row per gated workflow in `flow_gates` that every admission
locks, so two starts or two workers on PostgreSQL count a key's runs one after the other.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from qjsflow.runner.store.call_rows import CallStatements
from qjsflow.runner.store.records import ENDED_SQL, RunStatus

__all__ = ["COUNTED_WHILE_LIVE", "FLOW_COLUMNS", "FlowRow", "FlowStatements"]


COUNTED_WHILE_LIVE = 2**62


@dataclass(frozen=True, slots=True, kw_only=True)
class FlowRow:
    """A gated run as its workflow's gate sees it."""

    run_id: str
    scope: str
    workflow: str
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    singleton_key: str | None = None
    rate_key: str | None = None
    rate_limit: int | None = None
    rate_period_ms: int | None = None
    debounce_key: str | None = None
    not_before: int | None = None  # a debounced run waits until then
    queued_at: int = 0
    queue_seq: int = 0  # its turn in its workflow's queue (given as it is queued)
    admitted_at: int | None = None  # None: still queued
    # Until when its gate counts it: for ever while its run goes on, then to the end of its
    # rate window (`sweep_gate`), so the gate's reads skip the rest through the index.
    counts_until: int = COUNTED_WHILE_LIVE
    # Of the run, read with it (not stored in `run_flow`):
    status: RunStatus = RunStatus.queued
    priority: int = 0

    def queued_again(self, run_id: str, now: int) -> FlowRow:
        """This row's keys and limits for `run_id` queued anew (a restart, a fork)."""
        return replace(self, run_id=run_id, queued_at=now, admitted_at=None, not_before=None,
                       counts_until=COUNTED_WHILE_LIVE)  # fmt: skip


FLOW_COLUMNS = (
    "run_id", "scope", "workflow", "concurrency_key", "concurrency_limit", "singleton_key",
    "rate_key", "rate_limit", "rate_period_ms", "debounce_key", "not_before", "queued_at",
    "queue_seq", "admitted_at", "counts_until",
)  # fmt: skip
_SELECTED = ", ".join(f"f.{name}" for name in FLOW_COLUMNS)


def _flow_row(row: Any) -> FlowRow:
    values = dict(zip(FLOW_COLUMNS, row[: len(FLOW_COLUMNS)], strict=True))
    status, priority = row[len(FLOW_COLUMNS) :]
    return FlowRow(**values, status=RunStatus(status), priority=int(priority))


class FlowStatements(CallStatements):
    def lock_gate(self, scope: str, workflow: str, *, wait: bool = True) -> bool:
        """Hold the workflow's gate for the rest of the transaction (made if it is new).
        Without `wait`, False when another transaction holds it (a worker's look: the holder
        admits what can be admitted)."""
        lock = self._dialect.lock_run
        if wait:  # (a worker looks only at gates that exist)
            self._db.execute(
                "INSERT INTO flow_gates (scope, workflow) VALUES (?, ?) ON CONFLICT DO NOTHING",
                (scope, workflow),
            )
        elif lock:
            lock += " SKIP LOCKED"
        row = self._one(
            f"SELECT 1 FROM flow_gates WHERE scope = ? AND workflow = ?{lock}", (scope, workflow)
        )
        return row is not None

    def sweep_gate(self, scope: str, workflow: str) -> None:
        """Rows of runs that ended stop counting: at once, or at the end of their rate
        window. They stay (a restart finds its keys) until their run is pruned."""
        self._db.execute(
            "UPDATE run_flow SET counts_until = CASE WHEN rate_key IS NOT NULL"
            " AND admitted_at IS NOT NULL THEN admitted_at + rate_period_ms ELSE 0 END"
            " WHERE scope = ? AND workflow = ? AND counts_until = ?"
            " AND EXISTS (SELECT 1 FROM runs r WHERE r.run_id = run_flow.run_id"
            f" AND r.status IN {ENDED_SQL})",
            (scope, workflow, COUNTED_WHILE_LIVE),
        )

    def gate_rows(self, scope: str, workflow: str, now: int = 0) -> list[FlowRow]:
        """The workflow's gated runs that still count (`sweep_gate` first), through the
        index: queued ones in the order they leave (priority, then their turn)."""
        rows = self._db.execute(
            f"SELECT {_SELECTED}, r.status, r.priority FROM run_flow f"
            " JOIN runs r ON r.run_id = f.run_id WHERE f.scope = ? AND f.workflow = ?"
            " AND f.counts_until > ? ORDER BY r.priority DESC, f.queue_seq",
            (scope, workflow, now),
        ).fetchall()
        return [_flow_row(row) for row in rows]

    def insert_flow(self, row: FlowRow) -> None:
        """Queue a gated run, last in its workflow's queue (the caller holds the gate)."""
        names = [name for name in FLOW_COLUMNS if name != "queue_seq"]
        values = tuple(int(v) if isinstance(v, bool) else v for v in
                       (getattr(row, name) for name in names))  # fmt: skip
        self._db.execute(
            f"INSERT INTO run_flow ({', '.join(names)}, queue_seq)"
            f" VALUES ({', '.join('?' for _ in names)}, (SELECT coalesce(max(queue_seq), 0) + 1"
            " FROM run_flow WHERE scope = ? AND workflow = ?))",
            (*values, row.scope, row.workflow),
        )

    def requeue_flow(self, run_id: str, now: int) -> bool:
        """Queue a gated run again (a restart), last: it counts, and waits for its gate.
        False when the run is not gated."""
        row = self.flow_of(run_id)
        if row is None:
            return False
        self._db.execute("DELETE FROM run_flow WHERE run_id = ?", (run_id,))
        self.insert_flow(row.queued_again(run_id, now))
        return True

    def flow_of(self, run_id: str) -> FlowRow | None:
        row = self._one(
            f"SELECT {_SELECTED}, r.status, r.priority FROM run_flow f"
            " JOIN runs r ON r.run_id = f.run_id WHERE f.run_id = ?",
            (run_id,),
        )
        return None if row is None else _flow_row(row)

    def mark_admitted(self, run_id: str, now: int) -> None:
        self._db.execute(
            "UPDATE run_flow SET admitted_at = ?, not_before = NULL WHERE run_id = ?",
            (now, run_id),
        )

    def debounce_into(self, run_id: str, not_before: int) -> None:
        self._db.execute(
            "UPDATE run_flow SET not_before = ? WHERE run_id = ?", (not_before, run_id)
        )

    def set_gate(self, scope: str, workflow: str, *, waiting: int, next_at: int | None) -> None:
        """What workers look at: how many runs wait, and when time alone may admit one
        (None: only a run that ends may)."""
        self._db.execute(
            "UPDATE flow_gates SET waiting = ?, next_at = ? WHERE scope = ? AND workflow = ?",
            (waiting, next_at, scope, workflow),
        )

    def waiting_gates(self, now: int, limit: int) -> list[tuple[str, str]]:
        """(scope, workflow) of gates with runs waiting that a look may admit now."""
        rows = self._db.execute(
            "SELECT scope, workflow FROM flow_gates WHERE waiting > 0"
            " AND (next_at IS NULL OR next_at <= ?) ORDER BY scope, workflow LIMIT ?",
            (now, limit),
        ).fetchall()
        return [(str(scope), str(workflow)) for scope, workflow in rows]

    def queue_position(self, run_id: str) -> int | None:
        """How many runs of its workflow leave the queue before a queued run (1: it is next),
        among those sharing one of its keys; None when it is not queued."""
        mine = self.flow_of(run_id)
        if mine is None or mine.status != RunStatus.queued:
            return None
        ahead = sum(
            1
            for row in self.gate_rows(mine.scope, mine.workflow)
            if row.status == RunStatus.queued and row.run_id != run_id
            and _shares_key(row, mine)
            and (-row.priority, row.queue_seq) < (-mine.priority, mine.queue_seq)
        )  # fmt: skip
        return ahead + 1


def _shares_key(one: FlowRow, other: FlowRow) -> bool:
    pairs = (
        (one.concurrency_key, other.concurrency_key), (one.singleton_key, other.singleton_key),
        (one.rate_key, other.rate_key), (one.debounce_key, other.debounce_key),
    )  # fmt: skip
    return any(a is not None and a == b for a, b in pairs)
