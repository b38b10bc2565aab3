"""A run's lease as the journal holds it: the `Lease` a drive writes under, what the statement
that takes one finds (`LeaseLooks`, `Unleased`), and the SQL those statements share.
How a drive moves through its lease is runner/engine/drive/lease.py; the statements that take,
renew and give one up are `LeaseStatements` (runner/store/leases.py).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from qjsflow.bridge import QjsflowError
from qjsflow.runner.store.records import (
    RunRecord,
)

if TYPE_CHECKING:
    from qjsflow.runner.store.tx import JournalTransaction

__all__ = [
    "BEGIN_DRIVE_SQL", "NOT_LOOKED", "Lease", "LeaseLooks", "LeaseLost", "LeaseMode", "Unleased",
    "lease_now",
]  # fmt: skip


class LeaseMode(enum.Enum):
    """When `acquire_lease` may take a run's lease."""

    LAPSED = "lapsed"  # nobody holds it, or its holder's lease has lapsed (taken over)
    AS_READ = "as_read"  # nobody holds it and its epoch is still the one a drive read it at
    FORCED = "forced"  # whatever holds it: an operator fencing a stuck driver out


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


class LeaseLooks(NamedTuple):
    """What the statement that took a drive's lease found of its run (`acquire_lease`'s
    `wake_ups`); both True when it was not asked, so that a caller that does not know looks."""

    woken: bool  # it had a timer of the wake-ups asked for (the drive's beginning serves it)
    stepped: bool  # it had a step at all (else its journal and open steps are empty)


NOT_LOOKED = LeaseLooks(woken=True, stepped=True)


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


# A drive's beginning marks its run `running` (no error, updated now) in the statement that
# takes the lease, unless a cancel or a pause was asked, or the run is queued (its gate has
# not admitted it): those the beginning handles itself (runner/engine/drive/beginning.py,
# begin_drive), which then finds the run as it was. One parameter: now.
RUNNABLE = "cancel_requested = 0 AND pause_requested = 0 AND status <> 'queued'"
BEGIN_DRIVE_SQL = (
    f", status = CASE WHEN {RUNNABLE} THEN 'running' ELSE status END"
    f", error = CASE WHEN {RUNNABLE} THEN NULL ELSE error END"
    f", updated_at = CASE WHEN {RUNNABLE} THEN ? ELSE updated_at END"
)


def lease_now(lease_clock: str | None, now: int) -> tuple[str, tuple[int, ...]]:
    """SQL and arguments for the time leases are judged and written by: the caller's `now`,
    or on a database with a clock of its own, that clock (a worker's skewed clock then
    cannot take over a live lease, nor write one that has already lapsed)."""
    return ("?", (now,)) if lease_clock is None else (lease_clock, ())
