"""How a drive ends: the transactions that record its outcome, charge what it used, park a
run whose executor died, and the quiet end of a drive that changed nothing (docs/ARCHITECTURE.md,
"An end that changed nothing").
"""

from __future__ import annotations

from qjsflow.bridge import dumps_text
from qjsflow.bridge.hints import with_run_hint
from qjsflow.bridge.types import Completed, DriveOutcome, Failed, Suspended
from qjsflow.runner.engine.drive.runs import (
    EXECUTOR_TIMER,
    SIGNAL_TIMER,
    WAKE_UPS,
    cancel,
    fail,
    mark_begun,
    park_paused,
    park_throttled,
    release,
    terminated_after_rollbacks,
)
from qjsflow.runner.engine.host import DriveHost
from qjsflow.runner.engine.steps import set_aside
from qjsflow.runner.store import JournalTransaction, Lease, RunRecord, RunStatus, Unleased
from qjsflow.runner.tenancy.budgets import Charges

__all__ = [
    "NotAllWritten", "as_found", "charge", "drive_again", "end_unchanged", "finish", "ledger",
    "left_as_found", "next_wake", "park", "record_unchanged_end", "waits",
]  # fmt: skip


def ledger(
    tx: JournalTransaction,
    current: RunRecord,
    outcome: DriveOutcome,
    host: DriveHost,
    *,
    charges: Charges,
    now: int,
) -> dict[str, object]:
    """What every drive adds, however it ended: to its scope's usage
    (runner/tenancy/budgets.py) and, returned, to its run: compute, and console lines."""
    tx.charge_usage(current.scope, charges.rows, charges.forget)
    return {
        "cpu_used_s": current.cpu_used_s + outcome.cpu_s,
        "logs_count": max(current.logs_count, host.logs_count),
    }


def charge(
    tx: JournalTransaction,
    lease: Lease,
    outcome: DriveOutcome,
    host: DriveHost,
    *,
    charges: Charges,
    now: int,
) -> None:
    current = tx.get_run(lease.run_id)
    assert current is not None
    tx.update_run(lease.run_id, **ledger(tx, current, outcome, host, charges=charges, now=now))


_PARK_FIRST_MS = 30_000
_PARK_LAST_MS = 3_600_000


def park(
    tx: JournalTransaction,
    *,
    lease: Lease,
    outcome: Failed,
    host: DriveHost,
    now: int,
    limit: int,
    charges: Charges,
) -> RunRecord:
    """Count an executor death against the run; park the run for a later drive, or fail it
    once its executors have died `limit` times."""
    run_id = lease.run_id
    current = tx.get_run(run_id)
    assert current is not None
    deaths = current.executor_deaths + 1
    common = {
        **ledger(tx, current, outcome, host, charges=charges, now=now), "updated_at": now,
        "executor_deaths": deaths,
    }  # fmt: skip
    if deaths >= limit:
        message = (
            f"the run's executor process died {deaths} times, its limit (killed from outside,"
            " or crashed by the run's own code)"
        )
        return fail(tx, lease, message, now, common)
    wake_at = now + min(_PARK_LAST_MS, _PARK_FIRST_MS * 2 ** (deaths - 1))
    reason = (
        f"parked: the executor process died ({outcome.message}); driven again at"
        f" {wake_at} ms, death {deaths} of at most {limit}"
    )
    tx.set_timer(run_id, EXECUTOR_TIMER, "retry", wake_at)
    tx.update_run(run_id, status=RunStatus.sleeping, error=reason, wake_at=wake_at, **common)
    tx.append_event(run_id, "run_parked", now, dumps_text({"reason": reason}))
    return release(tx, lease)


def finish(
    tx: JournalTransaction,
    lease: Lease,
    outcome: DriveOutcome,
    host: DriveHost,
    *,
    now: int,
    charges: Charges,
    taking: bool = False,
    ttl_ms: int = 0,
) -> RunRecord | None:
    """Record how the drive ended. None when the run should be driven again now; otherwise the
    lease is released in the same transaction and the run returned as it was left. Written
    after the drive's writes answered ahead, which must all be in (`NotAllWritten`).
    `taking`: the lease was never taken (`read_begin`); it is taken here, and written with
    the run's last update (kept for `ttl_ms` when the run is driven again at once)."""
    if not host.all_written():
        raise NotAllWritten
    if taking:
        tx.check_fence(lease, ending=True)
    if host.diverged:  # (a drive whose executor died is charged, not finished: `charge`)
        # What the sandbox did past a result the journal did not take as it assumed is void
        # (none of it was serviced): the run is driven again from its journal.
        outcome = Suspended((), outcome.cpu_s)
    run_id = lease.run_id
    current = tx.get_run(run_id)
    assert current is not None
    common = {**ledger(tx, current, outcome, host, charges=charges, now=now), "updated_at": now}
    match outcome:
        case Completed(output=output):
            tx.delete_timers(run_id)
            tx.append_event(run_id, "run_completed", now, None)
            return release(tx, lease, status=RunStatus.completed, output=output, wake_at=None,
                            waiting_for=None, **common)  # fmt: skip
        case Failed(rollback_failed=rollback_failed) if current.rollback_requested:
            return terminated_after_rollbacks(tx, lease, current, rollback_failed, now=now,
                                              common=common)  # fmt: skip
        case Failed(message=message, stack=stack):
            message = with_run_hint(message)
            return fail(tx, lease, message, now, {**common, "error_stack": stack})
        case Suspended(markers=markers):
            if current.cancel_requested:
                cancel(tx, run_id, now, common)
                return release(tx, lease)
            if current.pause_requested:
                tx.update_run(run_id, **common)
                park_paused(tx, current, now)
                return release(tx, lease)
            if host.throttle is not None:
                for key in sorted(host.set_aside):
                    set_aside(tx, run_id, key, now)
                tx.update_run(run_id, **common)
                park_throttled(tx, current, now, host.throttle)
                return release(tx, lease)
            if host.diverged:
                drive_again(tx, lease, now, ttl_ms, common)
                return None
            events = sorted({m.event for m in markers if m.kind == "event" and m.event})
            wake_at = next_wake(tx, run_id, events, now)
            status = "waiting" if events else "sleeping"
            waiting_for = ",".join(events) or None
            if host.blocked_on is not None:  # until a process that has the tool drives it
                status, waiting_for = "blocked", host.blocked_on
            left = {"status": status, "wake_at": wake_at, "waiting_for": waiting_for, **common}
            tx.append_event(run_id, "run_suspended", now, None)
            if wake_at is not None and wake_at <= now:
                drive_again(tx, lease, now, ttl_ms, left)
                return None
            return release(tx, lease, **left)
    raise AssertionError("unreachable")


def waits(outcome: DriveOutcome) -> tuple[str, ...]:
    """The event types a suspended drive waits on, in order (none for any other outcome)."""
    if not isinstance(outcome, Suspended):
        return ()
    return tuple(sorted({m.event for m in outcome.markers if m.kind == "event" and m.event}))


def end_unchanged(
    tx: JournalTransaction, *, found: RunRecord, epoch: int, events: tuple[str, ...], now: int
) -> RunRecord | None:
    """The end of a drive that took no lease and left its run as it found it
    (`left_as_found`: it sent nothing, so wrote no console line, met no budget and no
    missing tool), read only: the run, when its end would change nothing of it but its
    compute (added behind the answer: `record_unchanged_end`). None: the end is written in
    full (`finish`), as it may have to drive the run again."""
    return as_found(tx.unleased_run(found.run_id, WAKE_UPS, waits=events), found, epoch,
                     events, now)  # fmt: skip


def as_found(
    now_at: Unleased | None, found: RunRecord, epoch: int, events: tuple[str, ...], now: int
) -> RunRecord | None:
    """The run, if the journal holds it (`now_at`) as `found` at `epoch`: no lease held and
    no wake-up to serve, still waiting on `events`, none of which arrived, and no timer due.
    """
    if now_at is None or now_at.run != found or now_at.epoch != epoch or now_at.woken:
        return None
    current = now_at.run
    if current.status != RunStatus.waiting or current.waiting_for != ",".join(events):
        return None
    due = now_at.due
    if now_at.arrived or due != current.wake_at or (due is not None and due <= now):
        return None
    return current


def record_unchanged_end(
    tx: JournalTransaction,
    *,
    run: RunRecord,
    epoch: int,
    worker_id: str,
    cpu_s: float,
    events: tuple[str, ...],
    certify: bool,
    charges: Charges,
    now: int,
) -> bool:
    """What a drive that changed nothing of its run records (`end_unchanged`), fenced by the
    `epoch` it read: its compute added to the run's, its two events (with no lease's epoch:
    it took none), and what its scope used. Nothing, if a driver has taken the run since
    (as for a drive whose lease was taken over). With `certify`, True if the journal then
    holds the run as `run` (its compute added), waiting as it did: what the driver keeps of
    it is certified by this commit (`RunDriver._certified`)."""
    if not tx.still_unleased(run.run_id, epoch):
        return False
    if cpu_s:
        tx.add_compute(run.run_id, cpu_s)
    mark_begun(tx, run.run_id, worker_id, run.snapshot_id, now, woken=False)
    tx.append_event(run.run_id, "run_suspended", now, None)
    tx.charge_usage(run.scope, charges.rows, charges.forget)
    return certify and end_unchanged(tx, found=run, epoch=epoch, events=events, now=now) is not None


def drive_again(
    tx: JournalTransaction, lease: Lease, now: int, ttl_ms: int, fields: dict[str, object]
) -> None:
    """The drive's end, for a run driven again at once: the run's `fields` written, and the
    lease kept (written now, if the end took it: `JournalTransaction.hold_lease`)."""
    tx.update_run(lease.run_id, **fields)
    tx.hold_lease(lease, now, ttl_ms)


def next_wake(tx: JournalTransaction, run_id: str, events: list[str], now: int) -> int | None:
    """When the run suspending on `events` (none: a sleep) is next due. An event of one of them
    that arrived while the drive ran, after its wait looked, wakes it now (a signal timer)
    rather than leave it parked until the wait times out."""
    if not events:
        return tx.next_timer(run_id)
    arrived, due, due_but_signal = tx.waits_and_timers(run_id, events, SIGNAL_TIMER)
    if not arrived:
        return due
    tx.set_timer(run_id, SIGNAL_TIMER, "signal", now)
    return now if due_but_signal is None else min(due_but_signal, now)


def left_as_found(outcome: DriveOutcome, host: DriveHost) -> bool:
    """Whether a drive sent nothing and suspended again, on waits the journal answered only
    with a suspension as the drive began (`steps.still_waiting`): its end need not be fsynced.
    A power loss that undoes it leaves the run as the drive found it, or leased until the
    lease lapses; either way the next drive replays it to the same place. Anything the
    sandbox sent (a result, a line, a call) makes the end durable."""
    return isinstance(outcome, Suspended) and host.ops_seen == 0 and not host.diverged


class NotAllWritten(Exception):
    """A drive's end met a batch answered ahead that was not written (it failed, or waits to
    be written again): nothing is recorded; the driver waits for it, then records the end."""
