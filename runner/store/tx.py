"""`JournalTransaction`: named statements that run inside one `BEGIN IMMEDIATE` transaction.

The run lifecycle (runner/engine/host.py, runner/engine/drive/, runner/runner.py)
decides; this module only reads and writes. Its methods are synchronous: a whole transaction
runs as one job on the journal connection's thread (see `JournalStore.transact`), so a
transaction costs one thread hop however many statements it holds. Every method assumes the
caller holds the transaction (hence no `_txn` suffix on a class whose every method is one).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from qjsflow.bridge import QjsflowError, dumps_text
from qjsflow.bridge.keys import step_key
from qjsflow.runner.store.dialect import SQLITE, Dialect
from qjsflow.runner.store.records import (
    ENDED,
    ENDED_SQL,
    InboxRecord,
    JournalRow,
    RunRecord,
    StepRow,
)
from qjsflow.runner.telemetry.metrics import METRICS

__all__ = [
    "RUN_COLUMNS",
    "STEP_COLUMNS",
    "JournalTransaction",
    "Lease",
    "LeaseLost",
    "SettledStep",
    "UsageCharge",
    "lease_now",
    "run_record",
    "write_batch_usage",
]

RUN_COLUMNS = (
    "run_id, scope, workflow, snapshot_id, entry_path, status, input, persisted_bindings,"
    " output, error, created_at, updated_at, wake_at, waiting_for, cpu_used_s, logs_count,"
    " cancel_requested, sql_used_s, executor_deaths, error_stack, pause_requested, generation,"
    " traceparent"
)
STEP_COLUMNS = (
    "run_id, kind, name, count, status, attempt, config, detail, output, error, started_at,"
    " completed_at, settled_seq, args_digest, replay_at"
)
_RUN_UPDATABLE = {
    "status", "output", "error", "updated_at", "wake_at", "waiting_for", "cpu_used_s",
    "logs_count", "cancel_requested", "sql_used_s", "executor_deaths", "error_stack",
    "pause_requested", "generation", "input", "persisted_bindings", "snapshot_id", "entry_path",
}  # fmt: skip
# The tables holding a run's rows besides `runs` itself.
RUN_TABLES = ("steps", "events", "inbox", "timers", "tool_calls", "logs")
_STEP_UPDATABLE = {"status", "attempt", "config", "detail", "output", "error", "started_at"}


@dataclass(frozen=True, slots=True)
class Lease:
    """One driver's hold on a run; `epoch` fences every write of its drive."""

    run_id: str
    worker_id: str
    epoch: int
    taken_from: str | None = None  # the driver it was taken over from, which never released it
    # A lease not taken yet, `epoch` the one it will have: its drive read the run while no
    # driver held it (runner/engine/drive/), and the first transaction fenced by it takes it
    # with this, if the run is as read (`check_fence`): it writes the drive's beginning, and
    # the lease too unless the drive's end gives it up in the same transaction (`written`).
    take: Callable[[JournalTransaction, bool], None] | None = field(default=None, compare=False)


def _has_timer_sql(timer_keys: int) -> str:
    """Whether the row's run has a timer of so many keys (as parameters): one look for a drive
    that reads its run first (`_unleased_sql`) and one that takes its lease first
    (`_lease_looks_sql`)."""
    keys = ", ".join("?" * timer_keys)
    return (
        f"EXISTS (SELECT 1 FROM timers WHERE timers.run_id = runs.run_id AND step_key IN ({keys}))"
    )


@functools.lru_cache(maxsize=4)
def _lease_looks_sql(wake_ups: int) -> str:
    """What the statement that takes a drive's lease also returns (`LeaseLooks`)."""
    has_step = "EXISTS (SELECT 1 FROM steps WHERE steps.run_id = runs.run_id)"
    return f", {_has_timer_sql(wake_ups)}, {has_step}"


@functools.lru_cache(maxsize=16)
def _unleased_sql(timer_keys: int, waits: int) -> str:
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
        f"SELECT epoch, worker_id, {_has_timer_sql(timer_keys)}{looks}, {RUN_COLUMNS} FROM runs"
        " WHERE run_id = ?"
    )


class LeaseLooks(NamedTuple):
    """What the statement that took a drive's lease found of its run (`acquire_lease`'s
    `wake_ups`); both True when it was not asked, so that a caller that does not know looks."""

    woken: bool  # it had a timer of the wake-ups asked for (the drive's beginning serves it)
    stepped: bool  # it had a step at all (else its journal and open steps are empty)


_NOT_LOOKED = LeaseLooks(woken=True, stepped=True)


@dataclass(frozen=True, slots=True)
class Unleased:
    """A run no driver holds (`JournalTransaction.unleased_run`)."""

    run: RunRecord
    epoch: int  # its lease's, as the last driver left it
    woken: bool  # it has a timer of the keys asked (a wake-up to serve)
    arrived: bool = False  # an event of the waits asked waits unconsumed in its inbox
    due: int | None = None  # its next timer (asked with the waits)


class LeaseLost(QjsflowError):
    """Another driver took the run over: this driver must stop without writing."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        super().__init__(f"the lease on run {lease.run_id!r} (epoch {lease.epoch}) was taken over")


# A scope's usage to add, (measure, window start, amount) rows, and the windows to forget.
UsageCharge = tuple[str, tuple[tuple[str, int, float], ...], dict[str, int]]


def write_batch_usage(tx: JournalTransaction, charges: list[UsageCharge]) -> None:
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


# A drive's beginning marks its run `running` (no error, updated now) in the statement that
# takes the lease, unless a cancel or a pause was asked: those the beginning handles itself
# (runner/engine/drive/beginning.py, begin_drive), which then finds the run as it was. One
# parameter: now.
_RUNNABLE = "cancel_requested = 0 AND pause_requested = 0"
BEGIN_DRIVE_SQL = (
    f", status = CASE WHEN {_RUNNABLE} THEN 'running' ELSE status END"
    f", error = CASE WHEN {_RUNNABLE} THEN NULL ELSE error END"
    f", updated_at = CASE WHEN {_RUNNABLE} THEN ? ELSE updated_at END"
)


def lease_now(lease_clock: str | None, now: int) -> tuple[str, tuple[int, ...]]:
    """SQL and arguments for the time leases are judged and written by: the caller's `now`,
    or on a database with a clock of its own, that clock (a worker's skewed clock then
    cannot take over a live lease, nor write one that has already lapsed)."""
    return ("?", (now,)) if lease_clock is None else (lease_clock, ())


def _check_updatable(fields: Mapping[str, Any]) -> None:
    unknown = set(fields) - _RUN_UPDATABLE
    if unknown:
        raise ValueError(f"runs has no updatable columns {sorted(unknown)}")


def _assignments(fields: Mapping[str, Any], *more: str) -> str:
    """A run's UPDATE's SET list: `name = ?` for each field (its values in the same order),
    then `more`."""
    return ", ".join([*(f"{name} = ?" for name in fields), *more])


def run_record(row: Iterable[Any]) -> RunRecord:
    values = list(row)
    values[16] = bool(values[16])  # cancel_requested
    values[20] = bool(values[20])  # pause_requested
    return RunRecord(*values)


# A run's columns whose type a read decides whatever was written (a REAL column given 0 reads
# 0.0, a flag given 1 reads True): a run kept by a transaction is the one a read returns.
_READ_TYPES: dict[str, type] = {
    "cpu_used_s": float, "sql_used_s": float, "created_at": int, "updated_at": int,
    "wake_at": int, "logs_count": int, "executor_deaths": int, "generation": int,
    "cancel_requested": bool, "pause_requested": bool,
}  # fmt: skip


def _read_back(name: str, value: Any) -> Any:
    kind = _READ_TYPES.get(name)
    return value if kind is None or value is None or type(value) is kind else kind(value)


def _as_read(run: RunRecord, **fields: Any) -> RunRecord:
    """`run` with `fields` written (none: `run` itself, written whole), as a read returns it."""
    if not fields:
        fields = {
            name: read
            for name in _READ_TYPES
            if (read := _read_back(name, getattr(run, name))) is not getattr(run, name)
        }
        return replace(run, **fields) if fields else run
    return replace(run, **{name: _read_back(name, value) for name, value in fields.items()})


def _ended_where(
    before: int, statuses: Iterable[str], scope: str | None
) -> tuple[str, tuple[Any, ...]]:
    """Runs that ended, in one of `statuses`, before `before` (of one scope, or any)."""
    chosen = sorted(set(statuses) & ENDED) or ["-"]  # no status: no run
    marks = ", ".join("?" for _ in chosen)
    where = f"updated_at < ? AND status IN ({marks})" + ("" if scope is None else " AND scope = ?")
    return where, (before, *chosen, *(() if scope is None else (scope,)))


@dataclass(frozen=True, slots=True)
class SettledStep:
    """A step.do completed by its first attempt, written at once (`insert_settled_steps`)."""

    name: str
    count: int
    config: str
    output: str
    at: int
    replay_at: int | None


_STEPS_PER_STATEMENT = 100  # 1,000 arguments a statement: within both databases' limits


class JournalTransaction:
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

    def _lease_now(self, now: int) -> tuple[str, tuple[int, ...]]:
        return lease_now(self._dialect.lease_clock, now)

    def adopt(self, lease: Lease) -> None:
        """Write the rest of this transaction as the holder of a lease it just took."""
        self._epoch = lease.epoch

    def check_fence(self, lease: Lease, *, ending: bool = False) -> None:
        """Raise `LeaseLost` if another driver took the run; keep the run as read with the fence
        (`pause_requested`, and a drive's end, read it from there). A lease not taken yet
        (`Lease.take`) is taken now if no driver took the run since its drive read it; at a
        drive's `ending`, its last update of the run writes it (`release_lease`)."""
        row = self._one(
            f"SELECT epoch, worker_id, {RUN_COLUMNS} FROM runs"
            f" WHERE run_id = ?{self._dialect.lock_run}",
            (lease.run_id,),
        )
        self._epoch = lease.epoch
        if row is not None and row[0] == lease.epoch and row[1] == lease.worker_id:
            # The run as read with its fence, under the lock: a drive's end reads it next.
            self.fence_held(lease, run_record(row[2:]))
            return
        if lease.take is None or row is None or row[0] != lease.epoch - 1 or row[1] is not None:
            raise LeaseLost(lease)
        if ending:
            self.fence_held(lease, run_record(row[2:]))
            self._holders[lease.run_id] = None
            self._unwritten[lease.run_id] = lease.epoch - 1
            lease.take(self, False)  # the drive's beginning
            return
        lease.take(self, True)  # the lease and the drive's beginning, or LeaseLost
        self.fence_held(lease, self._runs[lease.run_id])

    def check_leases_written(self) -> None:
        """After a job: a lease it took at a drive's end must be written by it (given up with
        the run's last update, or kept): else the job wrote a drive's beginning under a lease
        that no row records, and must be undone."""
        if self._unwritten:
            raise RuntimeError(
                f"a lease taken at the end of a drive of {next(iter(self._unwritten))!r}"
                " was neither given up nor kept"
            )

    def hold_lease(self, lease: Lease, now: int, ttl_ms: int) -> None:
        """Write a lease taken at a drive's end (`check_fence`) that the drive keeps: its run
        is driven again at once."""
        read_at = self._unwritten.pop(lease.run_id, None)
        if read_at is None:
            return
        taken = self.acquire_lease(lease.run_id, lease.worker_id, now, ttl_ms, free_at=read_at)
        if taken is None or taken.epoch != lease.epoch:
            raise LeaseLost(lease)

    def fence_held(self, lease: Lease, run: RunRecord) -> None:
        """`check_fence`, known to hold: the job before this one, in the same transaction,
        checked it and wrote nothing to any run's row since (see `run_batch`); `run` is what
        that check read (`fence_read`), still the row."""
        self._locked.add(lease.run_id)
        self._runs[lease.run_id] = run
        self._holders[lease.run_id] = lease.worker_id
        self._fenced = lease.run_id

    @property
    def pause_requested(self) -> bool:
        """Whether a pause is asked of the run whose fence this transaction checked (read with
        the fence, so a drive learns of it at no extra cost; kept current by its own writes)."""
        run = None if self._fenced is None else self._runs.get(self._fenced)
        return run is not None and run.pause_requested

    def fence_read(self, lease: Lease) -> RunRecord:
        """The run the fence was checked with, for the next job of the batch (`fence_held`)."""
        return self._runs[lease.run_id]

    def _one(self, sql: str, args: tuple[Any, ...]) -> Any:
        return self._db.execute(sql, args).fetchone()

    # -- leases and snapshots ----------------------------------------------------------------

    def acquire_lease(
        self,
        run_id: str,
        worker_id: str,
        now: int,
        ttl_ms: int,
        *,
        force: bool = False,
        begin: bool = False,
        free_at: int | None = None,
        wake_ups: tuple[str, ...] = (),
    ) -> Lease | None:
        """Take the run if no live lease holds it (with `force`, whatever holds it: an
        operator fencing a stuck driver out; with `free_at`, only if no lease holds it and its
        epoch is still that one, as a drive read it). With `begin`, the same statement marks it
        `running` for the drive the lease is taken for (`BEGIN_DRIVE_SQL`). With `wake_ups`
        (timers' keys: the lease begins a drive), it also tells whether the run has one of
        those timers and whether it has any step (`lease_looks`)."""
        clock, at = self._lease_now(now)
        sets = (
            f"worker_id = ?, lease_expires_at = {clock} + ?, epoch = epoch + 1"
            f"{BEGIN_DRIVE_SQL if begin else ''}"
        )
        set_args = (worker_id, *at, ttl_ms, *((now,) if begin else ()))
        looks = _lease_looks_sql(len(wake_ups)) if wake_ups else ""

        def take(condition: str, condition_args: tuple[Any, ...]) -> Any:
            """The run, with the lease, if it is unfinished and `condition` holds; read under
            the lock the update took (the drive's beginning reads it from here)."""
            free = f"run_id = ? AND status NOT IN {ENDED_SQL}{condition}"
            if self._dialect.skip_locked_claims:
                where = f"run_id = (SELECT run_id FROM runs WHERE {free} FOR UPDATE SKIP LOCKED)"
            else:  # SQLite: BEGIN IMMEDIATE has serialized the writers already
                where = free
            return self._one(
                f"UPDATE runs SET {sets} WHERE {where} RETURNING epoch, {RUN_COLUMNS}{looks}",
                (*set_args, run_id, *condition_args, *wake_ups),
            )

        lapsed = (
            "" if force else
            f" AND (worker_id IS NULL OR lease_expires_at IS NULL OR lease_expires_at <= {clock})"
        )  # fmt: skip
        lapsed_args = () if force else at
        if free_at is not None:
            held = None
            row = take(" AND worker_id IS NULL AND epoch = ?", (free_at,))
        elif run_id in self._holders:  # who holds it, known to this transaction
            held = self._holders[run_id]
            row = take(lapsed, lapsed_args)
        else:
            # A run nobody holds is taken at once; only when somebody does (a lapsed lease is
            # taken over from them, a live one is not taken) is the holder asked for.
            held = None
            row = take(" AND worker_id IS NULL", ())
            if row is None:
                found = self._one("SELECT worker_id FROM runs WHERE run_id = ?", (run_id,))
                held = None if found is None else found[0]
                row = None if held is None else take(lapsed, lapsed_args)
        if row is None:
            return None
        self.runs_written = True
        self._locked.add(run_id)
        if wake_ups:
            self._looks[run_id] = LeaseLooks(woken=bool(row[-2]), stepped=bool(row[-1]))
            row = row[:-2]
        self._runs[run_id] = _as_read(run_record(row[1:]))  # RETURNING gives 2.0 as 2
        self._holders[run_id] = worker_id
        if held is not None:  # its driver never released it
            METRICS.lease_takeovers.inc()
            taken = {"from": held, "to": worker_id, "forced": force}
            self.append_event(run_id, "lease_taken_over", now, dumps_text(taken))
            return Lease(run_id, worker_id, int(row[0]), taken_from=str(held))
        return Lease(run_id, worker_id, int(row[0]))

    def lease_looks(self, run_id: str) -> LeaseLooks:
        """What the run had as this transaction took its lease to begin a drive (for the
        beginning that follows it in the same job, before it writes anything)."""
        return self._looks.get(run_id, _NOT_LOOKED)

    def renew_lease(self, lease: Lease, now: int, ttl_ms: int) -> bool:
        clock, at = self._lease_now(now)
        self.runs_written = True
        row = self._one(
            f"UPDATE runs SET lease_expires_at = {clock} + ? WHERE run_id = ? AND epoch = ?"
            " AND worker_id = ? RETURNING 1",
            (*at, ttl_ms, lease.run_id, lease.epoch, lease.worker_id),
        )
        return row is not None

    def release_lease(self, lease: Lease, **fields: Any) -> None:
        """Give the lease up; with `fields`, written to the run in the same statement (what
        the kept run holds already is left out), which the lease must still hold."""
        self.runs_written = True
        _check_updatable(fields)
        known = self._runs.get(lease.run_id)
        if known is not None:
            fields = {name: v for name, v in fields.items() if getattr(known, name) != v}
        read_at = self._unwritten.pop(lease.run_id, None)
        if read_at is None:
            sets = _assignments(fields, "worker_id = NULL", "lease_expires_at = NULL")
            held: tuple[Any, ...] = (lease.epoch, lease.worker_id)
            where = "epoch = ? AND worker_id = ?"
        else:  # taken and given up at once: its epoch still moves on, past every reader's
            sets = _assignments(fields, "epoch = epoch + 1")
            held, where = (read_at,), "epoch = ? AND worker_id IS NULL"
        row = self._one(
            f"UPDATE runs SET {sets} WHERE run_id = ? AND {where} RETURNING 1",
            (*fields.values(), lease.run_id, *held),
        )
        if row is not None:
            self._holders[lease.run_id] = None
        if not fields and read_at is None:
            return
        if row is None:  # nothing written: the caller's transaction must not go on
            raise LeaseLost(lease)
        self._locked.add(lease.run_id)
        if known is not None:
            self._runs[lease.run_id] = _as_read(known, **fields)

    def insert_snapshot(
        self,
        scope: str,
        snapshot_id: str,
        created_at: float,
        facts: tuple[int, int, str, str | None],  # files, bytes, file list, capabilities
        # workflow, entry, code, digest, export, source map
        bundles: list[tuple[str, str, str, str, str, str]],
    ) -> bool:
        """First writer wins: False (and no bundle written) when the snapshot exists."""
        row = self._one(
            "INSERT INTO snapshots"
            " (scope, snapshot_id, created_at, file_count, total_bytes, manifest, capabilities)"
            " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING RETURNING 1",
            (scope, snapshot_id, created_at, *facts),
        )
        if row is None:
            return False
        self._db.executemany(
            "INSERT INTO bundles"
            " (scope, snapshot_id, workflow, entry_path, code, code_sha256, export_name,"
            " source_map) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [(scope, snapshot_id, *bundle) for bundle in bundles],
        )
        return True

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
        row = self._one(_unleased_sql(len(timer_keys), len(waits)), (*timer_keys, *waits, run_id))
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
        """`charge_usage`, written now."""
        self._db.executemany(
            "INSERT INTO scope_usage (scope, measure, window_start, amount) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (scope, measure, window_start)"
            " DO UPDATE SET amount = scope_usage.amount + excluded.amount",
            [(scope, measure, start, amount) for measure, start, amount in charges],
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

    def insert_run(self, run: RunRecord) -> bool:
        """First writer wins: False when a run with this id already exists."""
        values = (
            run.run_id, run.scope, run.workflow, run.snapshot_id, run.entry_path, run.status,
            run.input, run.persisted_bindings, run.output, run.error, run.created_at,
            run.updated_at, run.wake_at, run.waiting_for, run.cpu_used_s, run.logs_count,
            int(run.cancel_requested), run.sql_used_s, run.executor_deaths, run.error_stack,
            int(run.pause_requested), run.generation, run.traceparent,
        )  # fmt: skip
        placeholders = ", ".join("?" for _ in values)
        row = self._one(
            f"INSERT INTO runs ({RUN_COLUMNS}) VALUES ({placeholders})"
            " ON CONFLICT DO NOTHING RETURNING 1",
            values,
        )
        if row is None:
            return False
        self.runs_written = True
        self._locked.add(run.run_id)
        self._created.add(run.run_id)
        self._runs[run.run_id] = _as_read(run)
        self._holders[run.run_id] = None
        return True

    def update_run(self, run_id: str, **fields: Any) -> None:
        _check_updatable(fields)
        known = self._runs.get(run_id)
        if known is not None and all(getattr(known, name) == v for name, v in fields.items()):
            return  # the row (kept, so locked) holds these values already
        self._db.execute(
            f"UPDATE runs SET {_assignments(fields)} WHERE run_id = ?",
            (*fields.values(), run_id),
        )
        self.runs_written = True
        self._locked.add(run_id)  # the update locked its row
        if known is not None:
            self._runs[run_id] = _as_read(known, **fields)

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
            self._runs[run_id] = _as_read(known, cpu_used_s=known.cpu_used_s + seconds)

    # -- steps -------------------------------------------------------------------------------

    def get_step(self, run_id: str, kind: str, name: str, count: int) -> StepRow | None:
        row = self._one(
            f"SELECT {STEP_COLUMNS} FROM steps"
            " WHERE run_id = ? AND kind = ? AND name = ? AND count = ?",
            (run_id, kind, name, count),
        )
        return None if row is None else StepRow(*row)

    def insert_step(
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
        args_digest: str | None = None,
    ) -> bool:
        row = self._one(
            "INSERT INTO steps (run_id, kind, name, count, status, attempt, config, detail,"
            " started_at, args_digest) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT DO NOTHING RETURNING 1",
            (run_id, kind, name, count, status, attempt, config, detail, started_at, args_digest),
        )
        return row is not None

    def insert_settled_steps(self, run_id: str, steps: Sequence[SettledStep]) -> bool:
        """Steps completed by their first attempt, begun and settled at once (a pure step's
        record): for each, in order, its `step_started` and `step_completed` events and its row
        settled at the latter — every event in one statement, every row in another. False,
        with nothing written, when one of them has a row already or comes twice."""
        self._db.execute("SAVEPOINT settled_steps")
        try:
            written = 0
            for at in range(0, len(steps), _STEPS_PER_STATEMENT):
                written += self._insert_settled(run_id, steps[at : at + _STEPS_PER_STATEMENT])
        except BaseException:
            self._db.execute("ROLLBACK TO settled_steps")
            self._db.execute("RELEASE settled_steps")
            raise
        if written != len(steps):
            self._db.execute("ROLLBACK TO settled_steps")
        self._db.execute("RELEASE settled_steps")
        return written == len(steps)

    def _insert_settled(self, run_id: str, steps: Sequence[SettledStep]) -> int:
        events: list[Any] = []
        for step in steps:
            key = dumps_text(step_key("do", step.count, step.name))
            events += (run_id, "step_started", step.at, f'{{"key":{key},"attempt":1}}', self._epoch)
            events += (run_id, "step_completed", step.at, f'{{"key":{key}}}', self._epoch)
        marks = ", ".join(["(?, ?, ?, ?, ?)"] * (2 * len(steps)))
        rows = self._db.execute(
            f"INSERT INTO events (run_id, type, at, data, epoch) VALUES {marks} RETURNING seq",
            events,
        ).fetchall()
        # Sequence numbers are given in the order of the rows inserted: the second of each
        # step's pair is its completion's, which it settles at.
        seqs = sorted(int(row[0]) for row in rows)
        values: list[Any] = []
        for step, completed in zip(steps, seqs[1::2], strict=True):
            values += (run_id, step.name, step.count, step.config, step.output, step.at,
                       step.at, completed, step.replay_at)  # fmt: skip
        marks = ", ".join(["(?, 'do', ?, ?, 'completed', 1, ?, ?, ?, ?, ?, ?)"] * len(steps))
        inserted = self._db.execute(
            "INSERT INTO steps (run_id, kind, name, count, status, attempt, config, output,"
            f" started_at, completed_at, settled_seq, replay_at) VALUES {marks}"
            " ON CONFLICT DO NOTHING RETURNING 1",
            values,
        ).fetchall()
        return len(inserted)

    def update_step(self, run_id: str, kind: str, name: str, count: int, **fields: Any) -> None:
        unknown = set(fields) - _STEP_UPDATABLE
        if unknown:
            raise ValueError(f"steps has no updatable columns {sorted(unknown)}")
        assignments = ", ".join(f"{name} = ?" for name in fields)
        self._db.execute(
            f"UPDATE steps SET {assignments}"
            " WHERE run_id = ? AND kind = ? AND name = ? AND count = ?",
            (*fields.values(), run_id, kind, name, count),
        )

    def list_steps(self, run_id: str) -> list[StepRow]:
        """Every step row of a run: settled ones in the order they settled, then the rest."""
        rows = self._db.execute(
            f"SELECT {STEP_COLUMNS} FROM steps WHERE run_id = ?"
            " ORDER BY settled_seq IS NULL, settled_seq, started_at",
            (run_id,),
        ).fetchall()
        return [StepRow(*row) for row in rows]

    def delete_steps(self, run_id: str, rows: Iterable[StepRow]) -> None:
        """Forget these steps (an operator's restart runs them again); an event they consumed
        is delivered again, to the step that waits for it next."""
        doomed = [(row.kind, row.name, row.count) for row in rows]
        self._db.executemany(
            "DELETE FROM steps WHERE run_id = ? AND kind = ? AND name = ? AND count = ?",
            [(run_id, *step) for step in doomed],
        )
        self._db.executemany(
            "UPDATE inbox SET consumed_by = NULL WHERE run_id = ? AND consumed_by = ?",
            [(run_id, step_key(kind, count, name)) for kind, name, count in doomed],
        )

    def copy_step(self, run_id: str, row: StepRow, at: int) -> None:
        """A settled step of another run, recorded as this run's next settled step (a fork).
        Without its call's digest: the operator chose to reuse the result, and the fork's own
        call may differ in what only the new run has (its instance id)."""
        seq = self.append_event(run_id, "step_copied", at, dumps_text({"key": row.key}))
        self._db.execute(
            f"INSERT INTO steps ({STEP_COLUMNS})"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                run_id, row.kind, row.name, row.count, row.status, row.attempt, row.config,
                row.detail, row.output, row.error, row.started_at, row.completed_at, seq, None,
                row.replay_at,
            ),
        )  # fmt: skip

    def fence_out(self, run_id: str) -> None:
        """Void the run's lease: a driver holding it can write nothing more (its epoch is
        stale); its heartbeat notices and stops its executor."""
        self.runs_written = True
        self._db.execute(
            "UPDATE runs SET worker_id = NULL, lease_expires_at = NULL, epoch = epoch + 1"
            " WHERE run_id = ?",
            (run_id,),
        )
        self._holders[run_id] = None

    def ended_runs(
        self, before: int, statuses: Iterable[str], limit: int, scope: str | None = None
    ) -> list[tuple[str, str]]:
        """(run key, scope) of runs that ended (in one of `statuses`) before `before`, the
        oldest first."""
        where, args = _ended_where(before, statuses, scope)
        rows = self._db.execute(
            f"SELECT run_id, scope FROM runs WHERE {where} ORDER BY updated_at LIMIT ?",
            (*args, limit),
        ).fetchall()
        return [(str(row[0]), str(row[1])) for row in rows]

    def count_ended_runs(
        self, before: int, statuses: Iterable[str], scope: str | None = None
    ) -> int:
        where, args = _ended_where(before, statuses, scope)
        return int(self._one(f"SELECT count(*) FROM runs WHERE {where}", args)[0])

    def delete_ended_runs(
        self, run_ids: list[str], before: int, statuses: Iterable[str], scope: str | None = None
    ) -> list[tuple[str, str]]:
        """Of `run_ids`, delete those that still ended before `before` (chosen earlier, a run
        may have been restarted since); (run key, scope) of the runs deleted."""
        if not run_ids:
            return []
        where, args = _ended_where(before, statuses, scope)
        marks = ", ".join("?" for _ in run_ids)
        rows = self._db.execute(
            f"SELECT run_id, scope FROM runs WHERE run_id IN ({marks}) AND {where}",
            (*run_ids, *args),
        ).fetchall()
        still = [(str(row[0]), str(row[1])) for row in rows]
        if still:
            self.delete_runs([run_id for run_id, _ in still])
        return still

    def delete_runs(self, run_ids: list[str]) -> None:
        """Runs and everything recorded of them."""
        self._free_journal_bytes(run_ids)
        self.runs_written = True
        for run_id in run_ids:
            self._runs.pop(run_id, None)
            self._holders.pop(run_id, None)
        marks = ", ".join("?" for _ in run_ids)
        for table in (*RUN_TABLES, "runs"):
            self._db.execute(f"DELETE FROM {table} WHERE run_id IN ({marks})", run_ids)

    def snapshot_rows(
        self,
        scope: str | None,
        *,
        snapshot_id: str | None = None,
        id_prefix: str | None = None,
        limit: int = 1000,
    ) -> list[Any]:
        """Snapshots, newest first, a row for each of their workflows: of one scope (None:
        all), with one id or ids starting with a prefix of hex digits (`snapshot_records`
        makes records of them)."""
        where: list[str] = []
        args: list[object] = []
        for clause, value in (
            ("s.scope = ?", scope),
            ("s.snapshot_id = ?", snapshot_id),
            ("substr(s.snapshot_id, 1, ?) = ?", id_prefix),
        ):
            if value is not None:
                where.append(clause)
                args += [len(value), value] if clause.startswith("substr") else [value]
        rows: list[Any] = self._db.execute(
            "SELECT s.scope, s.snapshot_id, s.created_at, b.workflow, b.entry_path, b.export_name,"
            " s.capabilities"
            " FROM (SELECT * FROM snapshots s"
            + (" WHERE " + " AND ".join(where) if where else "")
            + " ORDER BY created_at DESC, snapshot_id LIMIT ?) s"
            " JOIN bundles b USING (scope, snapshot_id)"
            " ORDER BY s.created_at DESC, s.scope, s.snapshot_id, b.workflow",
            (*args, limit),
        ).fetchall()
        return rows

    def unused_snapshots(self, before: float, scope: str | None = None) -> list[tuple[str, str]]:
        """(scope, id) of snapshots published before `before` (seconds) that no run is
        pinned to."""
        in_scope = "" if scope is None else " AND s.scope = ?"
        rows = self._db.execute(
            "SELECT s.scope, s.snapshot_id FROM snapshots s WHERE s.created_at < ?"
            f"{in_scope} AND NOT EXISTS (SELECT 1 FROM runs r"
            " WHERE r.scope = s.scope AND r.snapshot_id = s.snapshot_id)",
            (before, *(() if scope is None else (scope,))),
        ).fetchall()
        return [(str(row[0]), str(row[1])) for row in rows]

    def delete_unused_snapshots(self, before: float, scope: str | None = None) -> int:
        unused = self.unused_snapshots(before, scope)
        for table in ("bundles", "snapshots"):
            self._db.executemany(f"DELETE FROM {table} WHERE scope = ? AND snapshot_id = ?", unused)
        return len(unused)

    def kv_put(self, scope: str, namespace: str, key: str, value: str | None, now: int) -> None:
        if value is None:
            self._db.execute(
                "DELETE FROM kv_entries WHERE scope = ? AND namespace = ? AND key = ?",
                (scope, namespace, key),
            )
            return
        self._db.execute(
            "INSERT INTO kv_entries (scope, namespace, key, value, updated_at)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT (scope, namespace, key)"
            " DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
            (scope, namespace, key, value, now),
        )

    def queue_send(self, scope: str, queue: str, bodies: list[str], now: int) -> None:
        self._db.executemany(
            "INSERT INTO queue_messages (scope, queue, body, sent_at) VALUES (?, ?, ?, ?)",
            [(scope, queue, body, now) for body in bodies],
        )

    def reopen_failed_steps(self, run_id: str, prefix: str) -> None:
        """Failed calls named under `prefix` (those inside a step whose next attempt begins)
        become due again: they run anew in that attempt, as they would on Cloudflare."""
        self._db.execute(
            "UPDATE steps SET status = 'retrying', detail = NULL, settled_seq = NULL,"
            " completed_at = NULL WHERE run_id = ? AND status = 'failed'"
            " AND substr(name, 1, ?) = ?",
            (run_id, len(prefix), prefix),
        )

    def settle_step(
        self,
        step: StepRow,
        *,
        status: str,
        output: str | None,
        error: str | None,
        at: int,
        event_type: str,
        replay_at: int | None = None,
    ) -> bool:
        """Record a step's final result once: False (nothing written) if it already settled.
        `replay_at`: the run's clock a replay reaches at it, when not `at` (StepRow)."""
        seq = self.append_event(step.run_id, event_type, at, f'{{"key":{dumps_text(step.key)}}}')
        row = self._one(
            "UPDATE steps SET status = ?, output = ?, error = ?, completed_at = ?,"
            " settled_seq = ?, replay_at = ? WHERE run_id = ? AND kind = ? AND name = ?"
            " AND count = ? AND settled_seq IS NULL RETURNING 1",
            (
                status, output, error, at, seq, replay_at, step.run_id, step.kind, step.name,
                step.count,
            ),
        )  # fmt: skip
        return row is not None

    def load_journal(self, run_id: str) -> list[JournalRow]:
        """Every settled step of a run in the order it was reached: one query per drive."""
        rows = self._db.execute(
            "SELECT kind, name, count, output, error, coalesce(replay_at, completed_at),"
            " args_digest FROM steps"
            " WHERE run_id = ? AND settled_seq IS NOT NULL ORDER BY settled_seq",
            (run_id,),
        ).fetchall()
        return [JournalRow(step_key(r[0], r[2], r[1]), r[3], r[4], int(r[5]), r[6]) for r in rows]

    def count_settled(self, run_id: str) -> int:
        """How many steps of the run have settled (its journal's length)."""
        row = self._one(
            "SELECT count(*) FROM steps WHERE run_id = ? AND settled_seq IS NOT NULL", (run_id,)
        )
        return int(row[0])

    def unsettled_steps(self, run_id: str) -> list[StepRow]:
        """The run's step rows that exist but have not settled (retrying, waiting, in flight)."""
        rows = self._db.execute(
            f"SELECT {STEP_COLUMNS} FROM steps WHERE run_id = ? AND settled_seq IS NULL",
            (run_id,),
        ).fetchall()
        return [StepRow(*row) for row in rows]

    # -- events, timers, inbox ---------------------------------------------------------------

    def append_event(self, run_id: str, event_type: str, at: int, data: str | None) -> int:
        row = self._one(
            "INSERT INTO events (run_id, type, at, data, epoch) VALUES (?, ?, ?, ?, ?)"
            " RETURNING seq",
            (run_id, event_type, at, data, self._epoch),
        )
        return int(row[0])

    def set_timer(self, run_id: str, step_key: str, kind: str, due_at: int) -> None:
        self._db.execute(
            "INSERT INTO timers (run_id, step_key, kind, due_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (run_id, step_key) DO UPDATE SET kind = excluded.kind,"
            " due_at = excluded.due_at",
            (run_id, step_key, kind, due_at),
        )

    def delete_timer(self, run_id: str, step_key: str) -> None:
        self._db.execute("DELETE FROM timers WHERE run_id = ? AND step_key = ?", (run_id, step_key))

    def delete_timers(self, run_id: str, keys: tuple[str, ...] | None = None) -> None:
        """The run's timers: all of them, or those of the given keys."""
        if keys is not None:
            marks = ", ".join("?" for _ in keys)
            self._db.execute(
                f"DELETE FROM timers WHERE run_id = ? AND step_key IN ({marks})", (run_id, *keys)
            )
            return
        self._db.execute("DELETE FROM timers WHERE run_id = ?", (run_id,))

    def next_timer(self, run_id: str) -> int | None:
        row = self._one("SELECT min(due_at) FROM timers WHERE run_id = ?", (run_id,))
        return None if row is None or row[0] is None else int(row[0])

    def insert_inbox(
        self, run_id: str, event_type: str, payload: str, at: int, event_id: str | None = None
    ) -> int | None:
        """The new inbox row's seq; None when an event with this `event_id` was delivered
        already (a caller's retry), and nothing is written."""
        row = self._one(
            "INSERT INTO inbox (run_id, type, payload, received_at, event_id)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT (run_id, event_id) WHERE event_id IS NOT NULL"
            " DO NOTHING RETURNING seq",
            (run_id, event_type, payload, at, event_id),
        )
        return None if row is None else int(row[0])

    def oldest_unconsumed(
        self, run_id: str, event_type: str, received_by: int
    ) -> InboxRecord | None:
        row = self._one(
            "SELECT seq, run_id, type, payload, received_at, consumed_by FROM inbox"
            " WHERE run_id = ? AND type = ? AND consumed_by IS NULL AND received_at <= ?"
            " ORDER BY seq LIMIT 1",
            (run_id, event_type, received_by),
        )
        return None if row is None else InboxRecord(*row)

    def waits_and_timers(
        self, run_id: str, event_types: list[str], signal_key: str
    ) -> tuple[bool, int | None, int | None]:
        """In one statement: whether an event of one of `event_types` waits unconsumed in the
        run's inbox, the run's next timer, and its next timer but the one keyed `signal_key`
        (what the next timer is once that one is set anew)."""
        marks = ", ".join("?" for _ in event_types)
        row = self._one(
            f"SELECT (SELECT 1 FROM inbox WHERE run_id = ? AND type IN ({marks})"
            " AND consumed_by IS NULL LIMIT 1), min(due_at),"
            " min(CASE WHEN step_key <> ? THEN due_at END) FROM timers WHERE run_id = ?",
            (run_id, *event_types, signal_key, run_id),
        )
        return (
            row[0] is not None,
            None if row[1] is None else int(row[1]),
            None if row[2] is None else int(row[2]),
        )

    def count_unconsumed(self, run_id: str) -> int:
        """Events delivered to the run that no wait has taken yet."""
        row = self._one(
            "SELECT count(*) FROM inbox WHERE run_id = ? AND consumed_by IS NULL", (run_id,)
        )
        return int(row[0])

    def consume(self, seq: int, step_key: str) -> None:
        self._db.execute("UPDATE inbox SET consumed_by = ? WHERE seq = ?", (step_key, seq))

    # -- tool calls and logs -----------------------------------------------------------------

    def start_tool_call(
        self, run_id: str, step_key: str, attempt: int, *, address: str, args: str, at: int
    ) -> int:
        row = self._one(
            "INSERT INTO tool_calls (run_id, step_key, attempt, address, args, started_at)"
            " VALUES (?, ?, ?, ?, ?, ?) RETURNING seq",
            (run_id, step_key, attempt, address, args, at),
        )
        return int(row[0])

    def finish_tool_call(
        self, seq: int, result: str | None, error: str | None, duration_ms: int
    ) -> None:
        self._db.execute(
            "UPDATE tool_calls SET result = ?, error = ?, duration_ms = ? WHERE seq = ?",
            (result, error, duration_ms, seq),
        )

    def mark_tool_calls_unknown(self, run_id: str, step_key: str, attempt: int, error: str) -> None:
        """Audit rows of an attempt that never reported: their outcome is unknown."""
        self._db.execute(
            "UPDATE tool_calls SET error = ? WHERE run_id = ? AND step_key = ? AND attempt = ?"
            " AND result IS NULL AND error IS NULL",
            (error, run_id, step_key, attempt),
        )

    def insert_log(
        self, run_id: str, source: str, level: str, text: str, at: int, *, max_lines: int
    ) -> bool:
        """Store a console line once (a line already stored from `source` is skipped), as the
        run's next line. A run keeps at most `max_lines`: the last one says the rest were
        dropped."""
        row = self._one("SELECT coalesce(max(count), 0) FROM logs WHERE run_id = ?", (run_id,))
        count = int(row[0]) + 1
        if count > max_lines:
            return False
        if count == max_lines:
            level, text = "warn", f"[console: the run's limit of {max_lines} lines was reached]"
        inserted = self._one(
            "INSERT INTO logs (run_id, count, level, text, at, source) VALUES (?, ?, ?, ?, ?, ?)"
            " ON CONFLICT DO NOTHING RETURNING 1",
            (run_id, count, level, text, at, source),
        )
        return inserted is not None
