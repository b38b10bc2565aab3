"""The statements that fence a drive's writes and take, renew and give up a run's lease."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from qjsflow.bridge import dumps_text
from qjsflow.runner.store.lease_types import (
    BEGIN_DRIVE_SQL,
    NOT_LOOKED,
    Lease,
    LeaseLooks,
    LeaseLost,
    LeaseMode,
)
from qjsflow.runner.store.records import (
    ENDED,
    ENDED_SQL,
    STEP_COLUMNS,
    RunRecord,
    StepPlace,
)
from qjsflow.runner.store.run_rows import (
    RUN_COLUMNS,
    RunStatements,
    as_read,
    assignments,
    check_updatable,
    lease_looks_sql,
    run_record,
)
from qjsflow.runner.telemetry.metrics import METRICS

__all__ = ["LeaseStatements"]


# A step's row by its key (`StepStatements.get_step`).
STEP_SQL = (
    f"SELECT {STEP_COLUMNS} FROM steps WHERE run_id = ? AND kind = ? AND name = ? AND count = ?"
)


@dataclass(frozen=True, slots=True)
class SentStepRead:
    """A step row's read sent ahead (`LeaseStatements.send_step_read`): where, its statement,
    and how many statements the connection had sent when nothing since could change the row
    (`StepStatements.get_step` takes it only if that is still so)."""

    place: StepPlace
    statement: Any
    sent_at: int


class LeaseStatements(RunStatements):
    _step_read: SentStepRead | None = None

    def send_step_read(self, place: StepPlace) -> None:
        """Send the read of a step's row now, with the fence's: it answers this job's first
        statement if that is the same read (`get_step`), as if sent then — nothing of this
        transaction came between."""
        read = self._db.execute(STEP_SQL, (place.run_id, place.kind, place.name, place.count))
        self._step_read = SentStepRead(place, read, self._db.statements_sent)

    def adopt(self, lease: Lease) -> None:
        """Write the rest of this transaction as the holder of a lease it just took."""
        self._epoch = lease.epoch

    def assert_fence(self, lease: Lease) -> None:
        """The fence of a transaction that presumes (`JournalCore.transact`'s `careful`): a
        statement that locks the run's row as `check_fence` does, and fails the transaction
        (dividing by zero) unless the lease still holds and no pause is asked; its answer is
        not waited for, so `pause_requested` reads False (it is, or nothing commits)."""
        self._db.execute(
            "SELECT 1 / count(*) FROM (SELECT 1 FROM runs WHERE run_id = ? AND epoch = ?"
            f" AND worker_id = ? AND pause_requested = 0{self._dialect.lock_run}) AS fenced",
            (lease.run_id, lease.epoch, lease.worker_id),
        )
        self._epoch = lease.epoch
        self._locked.add(lease.run_id)

    def check_fence(
        self, lease: Lease, *, ending: bool = False, step: StepPlace | None = None
    ) -> None:
        """Raise `LeaseLost` if another driver took the run; keep the run as read with the fence
        (`pause_requested`, and a drive's end, read it from there). A lease not taken yet
        (`Lease.take`) is taken now if no driver took the run since its drive read it; at a
        drive's `ending`, its last update of the run writes it (`release_lease`). On a
        pipelined journal the row of `step`, which the job reads first, is read too, in the
        same round trip."""
        fenced = self._db.execute(
            f"SELECT epoch, worker_id, {RUN_COLUMNS} FROM runs"
            f" WHERE run_id = ?{self._dialect.lock_run}",
            (lease.run_id,),
        )
        if step is not None and self._dialect.pipelined:
            self.send_step_read(step)
        row = fenced.fetchone()
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
            lease.take(self.whole(), False)  # the drive's beginning
            return
        lease.take(self.whole(), True)  # the lease and the drive's beginning, or LeaseLost
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
        taken = self.acquire_lease(
            lease.run_id, lease.worker_id, now, ttl_ms, mode=LeaseMode.AS_READ, read_at=read_at
        )
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

    # -- leases and snapshots ----------------------------------------------------------------

    def acquire_lease(
        self,
        run_id: str,
        worker_id: str,
        now: int,
        ttl_ms: int,
        *,
        mode: LeaseMode = LeaseMode.LAPSED,
        read_at: int | None = None,
        begin: bool = False,
        wake_ups: tuple[str, ...] = (),
    ) -> Lease | None:
        """Take the run as `mode` allows (`LeaseMode`; AS_READ: nobody holds it and its epoch
        is still `read_at`). With `begin`, the same statement marks it
        `running` for the drive the lease is taken for (`BEGIN_DRIVE_SQL`). With `wake_ups`
        (timers' keys: the lease begins a drive), it also tells whether the run has one of
        those timers and whether it has any step (`lease_looks`)."""
        clock, at = self._lease_now(now)
        sets = (
            f"worker_id = ?, lease_expires_at = {clock} + ?, epoch = epoch + 1"
            f"{BEGIN_DRIVE_SQL if begin else ''}"
        )
        set_args = (worker_id, *at, ttl_ms, *((now,) if begin else ()))
        fresh = run_id in self._fresh and mode is not LeaseMode.AS_READ
        if fresh and self._runs[run_id].status not in ENDED:
            self._fresh.discard(run_id)
            update = (f"UPDATE runs SET {sets} WHERE run_id = ?", (*set_args, run_id))
            return self._take_fresh(run_id, worker_id, update, begin=now if begin else None,
                                    looks=wake_ups)  # fmt: skip
        looks = lease_looks_sql(len(wake_ups)) if wake_ups else ""

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

        force = mode is LeaseMode.FORCED
        lapsed = (
            "" if force else
            f" AND (worker_id IS NULL OR lease_expires_at IS NULL OR lease_expires_at <= {clock})"
        )  # fmt: skip
        lapsed_args = () if force else at
        if mode is LeaseMode.AS_READ:
            if read_at is None:
                raise ValueError("a lease taken as read needs the epoch it was read at")
            held = None
            row = take(" AND worker_id IS NULL AND epoch = ?", (read_at,))
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
        self._runs[run_id] = as_read(run_record(row[1:]))  # RETURNING gives 2.0 as 2
        self._holders[run_id] = worker_id
        if held is not None:  # its driver never released it
            METRICS.lease_takeovers.inc()
            taken = {"from": held, "to": worker_id, "forced": force}
            self.append_event(run_id, "lease_taken_over", now, dumps_text(taken))
            return Lease(run_id, worker_id, int(row[0]), taken_from=str(held))
        return Lease(run_id, worker_id, int(row[0]))

    def _take_fresh(
        self,
        run_id: str,
        worker_id: str,
        update: tuple[str, tuple[Any, ...]],
        *,
        begin: int | None,
        looks: tuple[str, ...],
    ) -> Lease:
        """The lease of a run this transaction inserted (`insert_run`) and has not leased: its
        row is locked by the insert, at epoch 0, held by nobody, with no timer or step, so what
        the update finds is known — it is sent, not read (a start's round trip fewer). `begin`:
        the drive's time, when the update begins one (`BEGIN_DRIVE_SQL`)."""
        self._db.execute(*update)
        self.runs_written = True
        run = self._runs[run_id]
        runnable = not (run.cancel_requested or run.pause_requested or run.status == "queued")
        if begin is not None and runnable:
            self._runs[run_id] = as_read(run, status="running", error=None, updated_at=begin)
        if looks:
            self._looks[run_id] = LeaseLooks(woken=False, stepped=False)
        self._holders[run_id] = worker_id
        return Lease(run_id, worker_id, 1)

    def lease_looks(self, run_id: str) -> LeaseLooks:
        """What the run had as this transaction took its lease to begin a drive (for the
        beginning that follows it in the same job, before it writes anything)."""
        return self._looks.get(run_id, NOT_LOOKED)

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
        # Checked by this transaction's fence, its row locked since, and no run's row written
        # after: the update cannot miss, and its answer is not waited for.
        certain = self._fenced == lease.run_id and not self.runs_written and self._dialect.pipelined
        self.runs_written = True
        check_updatable(fields)
        known = self._runs.get(lease.run_id)
        if known is not None:
            fields = {name: v for name, v in fields.items() if getattr(known, name) != v}
        read_at = self._unwritten.pop(lease.run_id, None)
        if read_at is None:
            sets = assignments(fields, "worker_id = NULL", "lease_expires_at = NULL")
            held: tuple[Any, ...] = (lease.epoch, lease.worker_id)
            where = "epoch = ? AND worker_id = ?"
        else:  # taken and given up at once: its epoch still moves on, past every reader's
            certain = False
            sets = assignments(fields, "epoch = epoch + 1")
            held, where = (read_at,), "epoch = ? AND worker_id IS NULL"
        update = f"UPDATE runs SET {sets} WHERE run_id = ? AND {where}"
        if certain:
            self._db.execute(update, (*fields.values(), lease.run_id, *held))
            row: Any = (1,)
        else:
            row = self._one(update + " RETURNING 1", (*fields.values(), lease.run_id, *held))
        if row is not None:
            self._holders[lease.run_id] = None
        if not fields and read_at is None:
            return
        if row is None:  # nothing written: the caller's transaction must not go on
            raise LeaseLost(lease)
        self._locked.add(lease.run_id)
        if known is not None:
            self._runs[lease.run_id] = as_read(known, **fields)
