"""A transaction's state and its statements on runs' rows: read, insert, update, and what a
scope has used (runner/tenancy/budgets.py). The statements of one `JournalTransaction` are in
layers, each a class over the one before: runs (here), leases (runner/store/leases.py), steps
(runner/store/step_rows.py), then events, timers, inbox, tool calls, logs, snapshots and
retention (runner/store/tx.py).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from qjsflow.runner.store.dialect import SQLITE, Dialect
from qjsflow.runner.store.lease_types import LeaseLooks, Unleased, lease_now
from qjsflow.runner.store.records import (
    ENDED,
    ENDED_SQL,
    RUN_COLUMNS,
    RUN_FIELDS,
    RunRecord,
    RunStatus,
    run_record,
)

if TYPE_CHECKING:
    from qjsflow.runner.store.lease_types import Lease
    from qjsflow.runner.store.tx import JournalTransaction

__all__ = [
    "RUN_COLUMNS", "RUN_TABLES", "RunStatements", "TransactionBase", "UsageCharge",
    "as_read", "assignments", "check_updatable", "ended_where", "lease_looks_sql", "run_record",
    "write_batch_usage",
]  # fmt: skip

_RUN_UPDATABLE = {
    "status", "output", "error", "updated_at", "wake_at", "waiting_for", "cpu_used_s",
    "logs_count", "cancel_requested", "sql_used_s", "executor_deaths", "error_stack",
    "pause_requested", "generation", "input", "persisted_bindings", "snapshot_id", "entry_path",
    "config_version", "rollback_requested", "priority",
}  # fmt: skip
# The tables holding a run's rows besides `runs` itself.
RUN_TABLES = (
    "steps", "events", "inbox", "timers", "tool_calls", "logs", "run_tags", "run_flow",
)  # fmt: skip


# An event of a run (`RunStatements.append_event`).
EVENT_SQL = "INSERT INTO events (run_id, type, at, data, epoch) VALUES (?, ?, ?, ?, ?)"

# A scope's usage to add, (measure, window start, amount) rows, and the windows to forget.
UsageCharge = tuple[str, tuple[tuple[str, int, float], ...], dict[str, int]]


def write_batch_usage(tx: RunStatements, charges: list[UsageCharge]) -> None:
    """The usage a group commit's jobs charged, written last, as one sum per scope, measure
    and window, in one order. Every batch that charges a scope updates the same few rows: a
    transaction that holds them then waits for nothing but its commit, and no two lock them
    in a different order (on PostgreSQL, batches of several workers deadlocked there)."""
    sums: dict[tuple[str, str, int], float] = {}
    forget: dict[str, dict[str, int]] = {}
    for scope, charged, before in charges:
        for measure, start, amount in charged:
            sums[(scope, measure, start)] = sums.get((scope, measure, start), 0.0) + amount
        forget.setdefault(scope, {}).update(before)
    rows: dict[str, list[tuple[str, int, float]]] = {scope: [] for scope in forget}
    for scope, measure, start in sorted(sums):
        rows[scope].append((measure, start, sums[(scope, measure, start)]))
    for scope in sorted(rows):
        tx.write_usage(scope, rows[scope], forget[scope])


def has_timer_sql(timer_keys: int) -> str:
    """Whether the row's run has a timer of so many keys (as parameters): one look for a drive
    that reads its run first (`unleased_sql`) and one that takes its lease first
    (`lease_looks_sql`)."""
    keys = ", ".join("?" * timer_keys)
    return (
        f"EXISTS (SELECT 1 FROM timers WHERE timers.run_id = runs.run_id AND step_key IN ({keys}))"
    )


@functools.lru_cache(maxsize=4)
def lease_looks_sql(wake_ups: int) -> str:
    """What the statement that takes a drive's lease also returns (`LeaseLooks`)."""
    has_step = "EXISTS (SELECT 1 FROM steps WHERE steps.run_id = runs.run_id)"
    return f", {has_timer_sql(wake_ups)}, {has_step}"


@functools.lru_cache(maxsize=16)
def unleased_sql(timer_keys: int, waits: int) -> str:
    """`JournalTransaction.unleased_run`'s statement, for so many timer keys and wait types
    (made once: the statement is the same each drive)."""
    looks = ""
    if waits:
        types = ", ".join("?" * waits)
        looks = (
            f", EXISTS (SELECT 1 FROM inbox WHERE inbox.run_id = runs.run_id AND type IN"
            f" ({types}) AND consumed_by IS NULL),"
            " (SELECT min(due_at) FROM timers WHERE timers.run_id = runs.run_id)"
        )
    return (
        f"SELECT epoch, worker_id, {has_timer_sql(timer_keys)}{looks}, {RUN_COLUMNS} FROM runs"
        " WHERE run_id = ?"
    )


def check_updatable(fields: Mapping[str, Any]) -> None:
    unknown = set(fields) - _RUN_UPDATABLE
    if unknown:
        raise ValueError(f"runs has no updatable columns {sorted(unknown)}")


def assignments(fields: Mapping[str, Any], *more: str) -> str:
    """A run's UPDATE's SET list: `name = ?` for each field (its values in the same order),
    then `more`."""
    return ", ".join([*(f"{name} = ?" for name in fields), *more])


# A run's columns whose type a read decides whatever was written (a REAL column given 0 reads
# 0.0, a flag given 1 reads True): a run kept by a transaction is the one a read returns.
_READ_TYPES: dict[str, type] = {
    "cpu_used_s": float, "sql_used_s": float, "created_at": int, "updated_at": int,
    "wake_at": int, "logs_count": int, "executor_deaths": int, "generation": int,
    "cancel_requested": bool, "pause_requested": bool, "status": RunStatus,
}  # fmt: skip


def _read_back(name: str, value: Any) -> Any:
    kind = _READ_TYPES.get(name)
    return value if kind is None or value is None or type(value) is kind else kind(value)


def as_read(run: RunRecord, **fields: Any) -> RunRecord:
    """`run` with `fields` written (none: `run` itself, written whole), as a read returns it."""
    if not fields:
        fields = {
            name: read
            for name in _READ_TYPES
            if (read := _read_back(name, getattr(run, name))) is not getattr(run, name)
        }
        return replace(run, **fields) if fields else run
    return replace(run, **{name: _read_back(name, value) for name, value in fields.items()})


def ended_where(
    before: int, statuses: Iterable[str], scope: str | None
) -> tuple[str, tuple[Any, ...]]:
    """Runs that ended, in one of `statuses`, before `before` (of one scope, or any)."""
    chosen = sorted(set(statuses) & ENDED) or ["-"]  # no status: no run
    marks = ", ".join("?" for _ in chosen)
    where = f"updated_at < ? AND status IN ({marks})" + ("" if scope is None else " AND scope = ?")
    return where, (before, *chosen, *(() if scope is None else (scope,)))


class TransactionBase:
    """What one transaction holds: its connection, its fence, the runs it read and wrote."""

    def __init__(
        self,
        connection: Any,
        fence: Lease | None = None,
        dialect: Dialect = SQLITE,
        *,
        reading: bool = False,
    ) -> None:
        self._db = connection  # a DB-API connection taking `?` placeholders
        # Reads outside a transaction (`JournalStore.read`): each statement sees the journal
        # as it is then, so nothing read is kept.
        self._reading = reading
        self._epoch = None if fence is None else fence.epoch
        self._dialect = dialect
        self._fenced: str | None = None  # the run whose fence this transaction checked
        # Runs this transaction has read or written, kept while no other transaction can
        # change their rows (`get_run`), and the rows it holds a lock on.
        self._runs: dict[str, RunRecord] = {}
        self._locked: set[str] = set()
        self._created: set[str] = set()  # runs this transaction inserted
        # Those of them whose lease it has not taken yet: at epoch 0, held by nobody, with no
        # timer or step (`acquire_lease` knows what taking it finds); the workers are told of
        # them as the job ends (`wake_for_new_runs`) — not of a run a start drives at once.
        self._fresh: set[str] = set()
        # Runs whose lease this transaction took at a drive's end without writing it yet, and
        # the epoch the drive read them at: the run's last update writes it (`release_lease`).
        self._unwritten: dict[str, int] = {}
        # Who held each kept run's lease as its row was read, kept up to date by this
        # transaction's lease writes: taking the lease asks no one again (`acquire_lease`).
        self._holders: dict[str, str | None] = {}
        # For each run whose lease it took to begin a drive, what the lease's statement found.
        self._looks: dict[str, LeaseLooks] = {}
        # Whether it wrote a run's row (its lease, epoch or anything else): a fence checked
        # before, and what that read, may no longer hold.
        self.runs_written = False
        # Usage charged by a job of a group commit, written at the batch's end (`write_usage`)
        # when the batch collects it; None: written at once.
        self.usage: list[UsageCharge] | None = None
        self._woke = False  # whether it told waiting workers of a claimable run
        # Whether rows it inserts are presumed not there (`JournalCore.transact`'s `careful`):
        # a statement may then fail the transaction rather than be read and answered.
        self.presumes = False

    def wake_workers(self) -> None:
        """Tell the workers waiting on the journal that a run may be claimable, as this
        transaction commits (PostgreSQL's NOTIFY: once a transaction; nothing on SQLite,
        whose workers share one machine and poll its file)."""
        if self._dialect.wake and not self._woke:
            self._db.execute(self._dialect.wake)
            self._woke = True

    def wake_for_new_runs(self) -> None:
        """As a job ends: tell the workers of the runs it inserted and did not lease (a run
        leased by the start that made it is driven here; a worker told of it would only find
        it taken)."""
        if self._fresh:
            self.wake_workers()

    def sync(self) -> None:
        """Raise now the error of any statement sent and not answered yet: on a pipelined
        journal (PostgreSQL) an error comes with the next answer read; a part of the
        transaction that must fail alone asks before it counts as done."""
        if self._dialect.pipelined:
            self._db.sync()

    def collect_usage(self) -> list[UsageCharge]:
        """Collect what this transaction charges (written at its batch's end) rather than
        write it at once; the list collected."""
        self.usage = []
        return self.usage

    def whole(self) -> JournalTransaction:
        """This transaction as the whole it is a layer of (what a lease's `take` is given)."""
        return cast("JournalTransaction", self)

    def _lease_now(self, now: int) -> tuple[str, tuple[int, ...]]:
        return lease_now(self._dialect.lease_clock, now)

    def _one(self, sql: str, args: tuple[Any, ...]) -> Any:
        return self._db.execute(sql, args).fetchone()


class RunStatements(TransactionBase):
    # -- runs --------------------------------------------------------------------------------

    def get_run(self, run_id: str) -> RunRecord | None:
        """The run as its row is now. Read once while no other transaction can change the
        row (the database is this transaction's, or the row is locked), then kept up to date
        by this transaction's own writes: a drive's beginning and end read it several times."""
        known = self._runs.get(run_id)
        if known is not None:
            return known
        row = self._one(f"SELECT worker_id, {RUN_COLUMNS} FROM runs WHERE run_id = ?", (run_id,))
        if row is None:
            return None
        run = run_record(row[1:])
        if not self._reading and (self._dialect.serialized or run_id in self._locked):
            self._runs[run_id] = run
            self._holders[run_id] = row[0]
        return run

    def unleased_run(
        self, run_id: str, timer_keys: tuple[str, ...], waits: tuple[str, ...] = ()
    ) -> Unleased | None:
        """The run, if no driver holds its lease (none, or the last one released it); None
        when one does, or there is no such run. In the same statement: whether it has a timer
        of one of `timer_keys`, and, for the event types of its `waits`, whether one waits
        unconsumed in its inbox, and its next timer. Not kept: the row is not locked (a drive
        reads it before it takes the lease: runner/engine/drive/)."""
        row = self._one(unleased_sql(len(timer_keys), len(waits)), (*timer_keys, *waits, run_id))
        if row is None or row[1] is not None:
            return None
        if not waits:
            return Unleased(run_record(row[3:]), int(row[0]), bool(row[2]))
        due = None if row[4] is None else int(row[4])
        return Unleased(run_record(row[5:]), int(row[0]), bool(row[2]), bool(row[3]), due)

    def created(self, run_id: str) -> bool:
        """Whether this transaction inserted the run: nothing else is recorded of it but what
        this transaction wrote."""
        return run_id in self._created

    def count_live_runs(self, scope: str) -> int:
        """Runs of a scope that have not ended."""
        row = self._one(
            f"SELECT count(*) FROM runs WHERE scope = ? AND status NOT IN {ENDED_SQL}", (scope,)
        )
        return int(row[0])

    # -- usage per scope (runner/tenancy/budgets.py) -----------------------------------------------

    def scope_usage(self, scope: str, windows: dict[str, int]) -> dict[str, float]:
        """What `scope` used of each measure in the window given for it."""
        starts = sorted(set(windows.values()))
        marks = ", ".join("?" for _ in starts)
        rows = self._db.execute(
            "SELECT measure, window_start, amount FROM scope_usage"
            f" WHERE scope = ? AND window_start IN ({marks})",
            (scope, *starts),
        ).fetchall()
        return {
            str(measure): float(amount)
            for measure, start, amount in rows
            if windows.get(str(measure)) == int(start)
        }

    def charge_usage(
        self,
        scope: str,
        charges: Iterable[tuple[str, int, float]],
        forget_before: Mapping[str, int] | None = None,
    ) -> None:
        """Add to what `scope` used; each measure's windows that began before its entry in
        `forget_before` (when given) are dropped, in one statement whatever the measures."""
        if self.usage is not None:
            self.usage.append((scope, tuple(charges), dict(forget_before or {})))
            return
        self.write_usage(scope, charges, forget_before)

    def write_usage(
        self,
        scope: str,
        charges: Iterable[tuple[str, int, float]],
        forget_before: Mapping[str, int] | None = None,
    ) -> None:
        """`charge_usage`, written now: one statement, its rows in the order given (each
        (measure, window) once: a statement may not change a row twice)."""
        values = [item for charge in charges for item in (scope, *charge)]
        if values:
            marks = ", ".join(["(?, ?, ?, ?)"] * (len(values) // 4))
            self._db.execute(
                f"INSERT INTO scope_usage (scope, measure, window_start, amount) VALUES {marks}"
                " ON CONFLICT (scope, measure, window_start)"
                " DO UPDATE SET amount = scope_usage.amount + excluded.amount",
                values,
            )
        if not forget_before:
            return
        cases = " ".join("WHEN ? THEN ?" for _ in forget_before)
        self._db.execute(
            "DELETE FROM scope_usage WHERE scope = ? AND window_start > 0"
            f" AND window_start < CASE measure {cases} ELSE 0 END",
            (scope, *(item for pair in forget_before.items() for item in pair)),
        )

    def _free_journal_bytes(self, run_ids: list[str]) -> None:
        """Runs about to be deleted give back the journal bytes they were charged: their
        steps' results, console lines and events (runner/tenancy/usage.py, `admit`)."""
        marks = ", ".join("?" for _ in run_ids)
        rows = self._db.execute(
            "SELECT r.scope, coalesce(sum(b.n), 0) FROM runs r JOIN ("
            f" SELECT run_id, length(output) AS n FROM steps WHERE run_id IN ({marks})"
            f" UNION ALL SELECT run_id, length(text) FROM logs WHERE run_id IN ({marks})"
            f" UNION ALL SELECT run_id, length(payload) FROM inbox WHERE run_id IN ({marks})"
            ") b USING (run_id) GROUP BY r.scope",
            (*run_ids, *run_ids, *run_ids),
        ).fetchall()
        for scope, freed in rows:
            self.free_journal_bytes(str(scope), int(freed))

    def free_journal_bytes(self, scope: str, freed: int) -> None:
        """Give `scope` back journal bytes it was charged (never below nothing)."""
        if freed > 0:
            self._db.execute(
                "UPDATE scope_usage SET amount = CASE WHEN amount > ? THEN amount - ? ELSE 0 END"
                " WHERE scope = ? AND measure = 'journal_bytes' AND window_start = 0",
                (freed, freed, scope),
            )

    def insert_run(self, run: RunRecord, *, presumed: bool = False) -> bool:
        """First writer wins: False when a run with this id already exists. `presumed`: it
        does not (a transaction that presumes, `JournalCore.transact`'s `careful`) — nothing
        is read, and a run there fails the insert, so the transaction."""
        fields = (getattr(run, name) for name in RUN_FIELDS)  # as RUN_COLUMNS names them
        values = tuple(int(value) if isinstance(value, bool) else value for value in fields)
        insert = f"INSERT INTO runs ({RUN_COLUMNS}) VALUES ({', '.join('?' for _ in values)})"
        if presumed:
            self._db.execute(insert, values)
        elif self._one(f"{insert} ON CONFLICT DO NOTHING RETURNING 1", values) is None:
            return False
        self.runs_written = True
        self._locked.add(run.run_id)
        self._created.add(run.run_id)
        self._fresh.add(run.run_id)  # a new run: a worker drives it, unless this does
        self._runs[run.run_id] = as_read(run)
        self._holders[run.run_id] = None
        return True

    def update_run(self, run_id: str, **fields: Any) -> None:
        check_updatable(fields)
        known = self._runs.get(run_id)
        if known is not None and all(getattr(known, name) == v for name, v in fields.items()):
            return  # the row (kept, so locked) holds these values already
        self._db.execute(
            f"UPDATE runs SET {assignments(fields)} WHERE run_id = ?",
            (*fields.values(), run_id),
        )
        if fields.get("status") == "running" or fields.get("cancel_requested") == 1:
            self.wake_workers()  # made runnable (admitted, resumed, restarted) or cancelled
        self.runs_written = True
        self._locked.add(run_id)  # the update locked its row
        if known is not None:
            self._runs[run_id] = as_read(known, **fields)

    def still_unleased(self, run_id: str, epoch: int) -> bool:
        """Whether the run is still at the `epoch` a drive that took no lease read it at, with
        no lease held; its row then locked for the rest of this transaction. Such a drive's
        records, written behind it, are fenced by this as any drive's writes are by its
        lease (runner/engine/drive/)."""
        row = self._one(
            f"SELECT epoch, worker_id FROM runs WHERE run_id = ?{self._dialect.lock_run}",
            (run_id,),
        )
        if row is None or row[0] != epoch or row[1] is not None:
            return False
        self._locked.add(run_id)
        return True

    def add_compute(self, run_id: str, seconds: float) -> None:
        """Add a drive's compute to what the run's row holds now, whatever that is (the
        records of a drive that took no lease, written behind it: `still_unleased`)."""
        self._db.execute(
            "UPDATE runs SET cpu_used_s = cpu_used_s + ? WHERE run_id = ?", (seconds, run_id)
        )
        self.runs_written = True
        self._locked.add(run_id)
        known = self._runs.get(run_id)
        if known is not None:
            self._runs[run_id] = as_read(known, cpu_used_s=known.cpu_used_s + seconds)

    def append_event(self, run_id: str, event_type: str, at: int, data: str | None) -> None:
        """An event of the run; the next statement may name its seq (`Dialect.last_seq`).
        Nothing is read back: on a pipelined journal it costs no round trip of its own."""
        self._db.execute(EVENT_SQL, (run_id, event_type, at, data, self._epoch))
