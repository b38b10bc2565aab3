"""How a drive leaves its run, at its beginning or its end: released, failed, cancelled,
paused, throttled, or marked begun; and the timers that only wake a run.

Each is a step of a journal transaction (`tx`), fenced by the drive's lease where it writes.
"""

from __future__ import annotations

from typing import Any

from qjsflow.bridge import dumps_text
from qjsflow.runner.store import THROTTLE_TIMER, JournalTransaction, Lease, RunRecord, RunStatus
from qjsflow.runner.telemetry.metrics import METRICS
from qjsflow.runner.tenancy.budgets import Throttle

__all__ = [
    "EXECUTOR_TIMER", "SIGNAL_TIMER", "WAKE_UPS", "cancel", "fail", "mark_begun", "park_paused",
    "park_throttled", "release",
]  # fmt: skip

SIGNAL_TIMER = "signal"  # a timer key that wakes a waiting run when an event arrives
EXECUTOR_TIMER = "executor"  # the timer that wakes a run parked after its executor died
# The timers that only wake a run (no step waits on them): a drive's beginning serves them.
WAKE_UPS = (SIGNAL_TIMER, EXECUTOR_TIMER, THROTTLE_TIMER)


def fail(
    tx: JournalTransaction, lease: Lease, message: str, now: int, common: dict[str, object]
) -> RunRecord:
    tx.delete_timers(lease.run_id)
    tx.update_run(
        lease.run_id,
        status=RunStatus.failed,
        error=message,
        wake_at=None,
        waiting_for=None,
        **common,
    )
    tx.append_event(lease.run_id, "run_failed", now, dumps_text({"reason": message}))
    return release(tx, lease)


def terminated_after_rollbacks(
    tx: JournalTransaction,
    lease: Lease,
    run: RunRecord,
    rollback_failed: str | None,
    *,
    now: int,
    common: dict[str, object],
) -> RunRecord:
    """`terminate --rollback`: the drive that ran the rollbacks ends the run `terminated`,
    with the operator's message (and the rollbacks' failure, when one failed for good)."""
    asked = run.rollback_requested or "terminated by an operator"
    error = asked + (f" (a rollback failed: {rollback_failed})" if rollback_failed else "")
    tx.delete_timers(lease.run_id)
    tx.update_run(
        lease.run_id, status=RunStatus.terminated, error=error, wake_at=None, waiting_for=None,
        rollback_requested=None, cancel_requested=0, pause_requested=0, **common,
    )  # fmt: skip
    tx.append_event(lease.run_id, "run_terminated", now, dumps_text({"reason": error}))
    return release(tx, lease)


def release(tx: JournalTransaction, lease: Lease, **fields: Any) -> RunRecord:
    """The lease given up, with the run's last `fields` in the same statement, and the run."""
    tx.release_lease(lease, **fields)
    run = tx.get_run(lease.run_id)
    assert run is not None
    return run


def park_paused(tx: JournalTransaction, run: RunRecord, now: int) -> None:
    """A run whose pause was asked, with no step under way: it waits for `resume`; its timers
    keep their due times and events sent meanwhile stay in its inbox."""
    if run.status == RunStatus.paused:
        return
    tx.update_run(
        run.run_id, status=RunStatus.paused, updated_at=now, wake_at=tx.next_timer(run.run_id)
    )
    tx.append_event(run.run_id, "run_paused", now, None)


def park_throttled(tx: JournalTransaction, run: RunRecord, now: int, spent: Throttle) -> None:
    """A run whose scope spent a budget: it waits, with its timers and inbox kept, until the
    budget's window ends; only then may a worker claim it (and look at the budget again)."""
    tx.set_timer(run.run_id, THROTTLE_TIMER, "throttle", spent.until_ms)
    budget = spent.measure.budget
    tx.update_run(
        run.run_id, status=RunStatus.throttled, updated_at=now, wake_at=spent.until_ms,
        waiting_for=budget, error=spent.reason,
    )  # fmt: skip
    if run.status != RunStatus.throttled or run.waiting_for != budget:
        detail = {"budget": budget, "until": spent.until_ms, "reason": spent.reason}
        tx.append_event(run.run_id, "run_throttled", now, dumps_text(detail))
        METRICS.throttled.labels(scope=run.scope, budget=budget).inc()


def cancel(tx: JournalTransaction, run_id: str, now: int, common: dict[str, object]) -> None:
    tx.delete_timers(run_id)
    tx.update_run(run_id, status=RunStatus.cancelled, wake_at=None, waiting_for=None, **common)
    tx.append_event(run_id, "run_cancelled", now, None)


def mark_begun(
    tx: JournalTransaction,
    run_id: str,
    worker_id: str,
    snapshot_id: str,
    now: int,
    *,
    woken: bool = True,
) -> None:
    """A drive's beginning under its lease: the wake-ups it serves go (none, unless `woken`),
    and the event."""
    if woken:
        tx.delete_timers(run_id, WAKE_UPS)
    driven = {"worker": worker_id, "snapshot": snapshot_id}
    tx.append_event(run_id, "drive_started", now, dumps_text(driven))
