"""How a drive begins: the transactions that take a run's lease and read what the drive
needs (the run, its journal, its unsettled steps, its scope's usage), or read them with no
lease held, to be taken later (docs/ARCHITECTURE.md, "A lease taken late").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from qjsflow.bridge import dumps_text
from qjsflow.bridge.failure import failure_from_json
from qjsflow.bridge.types import JournalEntry
from qjsflow.runner.engine.drive.kept import OpenSteps
from qjsflow.runner.engine.drive.runs import (
    WAKE_UPS,
    cancel,
    mark_begun,
    park_paused,
    park_throttled,
    release,
)
from qjsflow.runner.engine.steps import still_waiting
from qjsflow.runner.store import ENDED as TERMINAL
from qjsflow.runner.store import (
    JournalTransaction,
    Lease,
    LeaseLost,
    LeaseMode,
    RunRecord,
    RunStatus,
)
from qjsflow.runner.tenancy.budgets import AT_DRIVE, Budgets, current_windows, exhausted
from qjsflow.runner.tenancy.scope_config import ConfigCache
from qjsflow.runner.tenancy.scopes import split_run_key

__all__ = [
    "BeforeLease", "Begun", "Presuming", "Taken", "begin_drive", "read_begin", "set_budgets",
    "take_and_begin", "take_read", "write_nothing",
]  # fmt: skip


class BeforeLease(Protocol):
    """Work written in the transaction that takes a run's lease, before it is taken; True
    when it wrote something (the drive's end then makes it durable, whatever the drive did)."""

    def __call__(self, tx: JournalTransaction, *, now: int) -> bool: ...


@dataclass(frozen=True, slots=True)
class Presuming:
    """A `BeforeLease` that presumes what is nearly always so (a start's: its run is new, what
    the start before it read is still so), and the careful one that runs instead where the
    journal says otherwise (`JournalCore.transact`'s `careful`)."""

    presumed: BeforeLease
    careful: BeforeLease


# the drive began (empty for a scope without budgets).
Begun = tuple[RunRecord, tuple[JournalEntry, ...], OpenSteps, dict[str, float]]
# A drive's lease, its beginning (or the run, released: nothing to drive), and whether the
# caller's change was written with it.
Taken = tuple[Lease, Begun | RunRecord, bool]


def set_budgets(budgets: Mapping[str, Budgets], scope: str) -> Budgets | None:
    """The scope's budgets, if it has any set (None: the scope is not budgeted)."""
    scope_budgets = budgets.get(scope)
    return scope_budgets if scope_budgets is not None and scope_budgets.any else None


def run_budgets(
    tx: JournalTransaction,
    run: RunRecord,
    budgets: Mapping[str, Budgets],
    configs: ConfigCache | None,
) -> Budgets | None:
    """A run's budgets, if any are set: its scope's configuration version's (read once a
    process), or this process's settings for a run that recorded no version."""
    if run.config_version is None or configs is None:
        return set_budgets(budgets, run.scope)
    parsed = configs.cached(run.scope, run.config_version)
    if parsed is None:
        found = tx.scope_config(run.scope, run.config_version)
        if found is None:
            return None
        parsed = configs.parsed(run.scope, found[0], found[1])
    return parsed.budgets if parsed.budgets is not None and parsed.budgets.any else None


def take_and_begin(
    tx: JournalTransaction,
    *,
    run_id: str,
    worker_id: str,
    now: int,
    ttl_ms: int,
    budgets: Mapping[str, Budgets],
    first: BeforeLease | None = None,
    configs: ConfigCache | None = None,
) -> tuple[Lease, Begun | RunRecord, bool] | None:
    """The run's lease, if no live driver holds it, the drive's beginning under it, and
    whether `first` wrote anything."""
    wrote = first is not None and first(tx, now=now)
    # A scope with budgets looks at them before its run is marked running (a spent one parks
    # it as it was); otherwise the lease's statement marks it, and `begin_drive` finds it so.
    begin = set_budgets(budgets, split_run_key(run_id)[0]) is None
    lease = tx.acquire_lease(run_id, worker_id, now, ttl_ms, begin=begin, wake_ups=WAKE_UPS)
    if lease is None:
        return None
    tx.adopt(lease)  # the beginning's events carry the new epoch
    return lease, begin_drive(tx, lease, now, budgets, configs), wrote


def read_begin(
    tx: JournalTransaction,
    *,
    run_id: str,
    worker_id: str,
    now: int,
    take: partial[None],
    configs: ConfigCache | None = None,
) -> tuple[Lease, Begun, bool] | None:
    """A drive's beginning read without taking the lease (`writes=False`): the run, its
    journal, and a lease to take later (`take_read`) at the epoch after the one read. None
    when the beginning must be written now (`take_and_begin`): there is no such run, it has
    ended, is paused or queued, a cancel or a pause is asked, a driver holds (or held) its lease, or
    its configuration version sets budgets (looked at as its drive begins, under the lease)."""
    found = tx.unleased_run(run_id, WAKE_UPS)
    if found is None:
        return None
    run, epoch, woken = found.run, found.epoch, found.woken
    if run.status in TERMINAL or run.status in (RunStatus.paused, RunStatus.queued):
        return None
    if run.cancel_requested or run.pause_requested:
        return None
    if run_budgets(tx, run, {}, configs) is not None:
        return None
    later = partial(take, run_id=run_id, epoch=epoch, snapshot_id=run.snapshot_id, woken=woken)
    lease = Lease(run_id, worker_id, epoch + 1, take=later)
    journal, unsettled = journal_and_open(tx, run_id, now, budgeted=False)
    return lease, (run, journal, unsettled, {}), False


def take_read(
    tx: JournalTransaction,
    written: bool,
    *,
    run_id: str,
    worker_id: str,
    epoch: int,
    snapshot_id: str,
    ttl_ms: int,
    clock: Callable[[], int],
    woken: bool,
    kept: RunRecord | None = None,
) -> None:
    """The drive's beginning, for a run read at `epoch` with no lease held (`read_begin`),
    and, when `written`, its lease (`LeaseLost` if another driver took the run since; without
    it, the drive's end writes the lease: `JournalTransaction.check_fence`). The wake-up
    timers it serves are those the read found (`woken`): one set since is left to wake the
    run again, as it would be under a lease taken first. A drive begun from what was
    `kept` (runner/engine/drive/kept.py) also needs the run's row as that was kept: anything
    written to it since (a pause or a cancel asked, a migration) may change how the drive
    should begin."""
    now = clock()
    if kept is not None and tx.get_run(run_id) != kept:  # (before the lease marks it running)
        raise LeaseLost(Lease(run_id, worker_id, epoch + 1))
    if written:
        lease = tx.acquire_lease(
            run_id, worker_id, now, ttl_ms, mode=LeaseMode.AS_READ, read_at=epoch, begin=True
        )
        if lease is None:
            raise LeaseLost(Lease(run_id, worker_id, epoch + 1))
    mark_begun(tx, run_id, worker_id, snapshot_id, now, woken=woken)


def write_nothing(tx: JournalTransaction) -> bool:
    """A transaction fenced by a lease not taken yet takes it (`Lease.take`)."""
    return True


def journal_and_open(
    tx: JournalTransaction, run_id: str, now: int, *, budgeted: bool
) -> tuple[tuple[JournalEntry, ...], OpenSteps]:
    """The run's journal and its unsettled steps, as a drive begins."""
    journal = tuple(
        JournalEntry(
            row.key,
            row.output,
            None if row.error is None else failure_from_json(row.error),
            row.completed_at,
            row.args_digest,
        )
        for row in tx.load_journal(run_id)
    )
    open_rows = tx.unsettled_steps(run_id)
    # A scope with budgets has every wait asked of the host, which parks the run when one is
    # spent (runner/tenancy/budgets.py); otherwise a wait with nothing to take is answered
    # in the drive.
    waits = () if budgeted else still_waiting(tx, open_rows, now)
    waiting = tuple((key, event_type) for key, event_type, _ in waits)
    until = min((deadline for _, _, deadline in waits), default=None)
    return journal, OpenSteps(tuple(row.key for row in open_rows), waiting, until)


def begin_drive(
    tx: JournalTransaction,
    lease: Lease,
    now: int,
    budgets: Mapping[str, Budgets],
    configs: ConfigCache | None = None,
) -> Begun | RunRecord:
    """Mark the run running and load its journal: one transaction, one query for the journal.
    A run that is over (or cancelled now), queued, paused, or whose scope has spent a budget is
    released and returned instead. A run this transaction created (`start`) has no journal,
    timer or open step yet: none is looked for; nor a journal or open step for a run that had
    no step as its lease was taken (a run never driven, as most a worker claims)."""
    created = tx.created(lease.run_id)
    run = tx.get_run(lease.run_id)
    assert run is not None
    if run.status in TERMINAL or run.cancel_requested:
        if run.status not in TERMINAL:
            cancel(tx, run.run_id, now, {"updated_at": now})
        return release(tx, lease)
    if run.status == RunStatus.queued:  # its gate admits it (runner/tenancy/flow_gates.py)
        return release(tx, lease)
    if run.pause_requested:
        park_paused(tx, run, now)
        return release(tx, lease)
    used: dict[str, float] = {}
    scope_budgets = run_budgets(tx, run, budgets, configs)
    if scope_budgets is not None:
        used = tx.scope_usage(run.scope, current_windows(now))
        spent = exhausted(scope_budgets, used, now, AT_DRIVE)
        if spent is not None:
            park_throttled(tx, run, now, spent)
            return release(tx, lease)
    tx.update_run(run.run_id, status=RunStatus.running, error=None, updated_at=now)
    if created:  # no timer yet
        driven = {"worker": lease.worker_id, "snapshot": run.snapshot_id}
        tx.append_event(run.run_id, "drive_started", now, dumps_text(driven))
        return run, (), OpenSteps((), ()), used
    looks = tx.lease_looks(run.run_id)
    mark_begun(tx, run.run_id, lease.worker_id, run.snapshot_id, now, woken=looks.woken)
    if not looks.stepped:  # a run never driven, say: its journal and open steps are empty
        return run, (), OpenSteps((), ()), used
    journal, unsettled = journal_and_open(tx, run.run_id, now, budgeted=scope_budgets is not None)
    return run, journal, unsettled, used
