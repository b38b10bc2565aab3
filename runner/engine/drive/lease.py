"""A drive's lease as a state machine: what the drive knows of the lease it drives under.

Every journal write of a drive is fenced by its lease's epoch (runner/store/tx.py); this
module decides only *when* the lease is taken, renewed and given up, in one place:

    READ ──────────────► TAKEN ◄──────► RENEWING
      │  (a write asks     │ ▲              │
      │   to take it)      │ │ (held to     │
      ▼                    │ │  drive again)│
    ENDING ────────────────┼─┘              │
      │  (the end's own    ▼                ▼
      │   last update)   RELEASED         LOST (from any live state)
      └────────────────► RELEASED

- READ: the run was read with no lease held (`Lease.take` is set: a resume or a signal
  that a caller waits for, runner/engine/drive/beginning.py, `read_begin`); no write has
  asked to take it yet. The heartbeat asks after `RunDriver.take_after_s`.
- TAKEN: held, or asked to be taken by a transaction fenced by it. The heartbeat renews it
  every third of its TTL.
- RENEWING: the heartbeat's renewal is in flight.
- ENDING: the drive's end takes it in its own last update (a drive still READ that serviced
  no op): nothing to renew meanwhile.
- RELEASED: given up with the drive's last update, or never taken (a quiet end: nothing was
  written under it).
- LOST: another driver has the run, or an operator stopped the drive: nothing more is
  written, and the drive's task is cancelled.

The drive (runner/engine/drive/session.py) and its heartbeat are two tasks on one event loop:
each transition is one synchronous call, and one that the table does not allow is a bug
(`LeaseStateError`), never a silent flag flip.
"""

from __future__ import annotations

import enum

__all__ = ["LeaseState", "LeaseStateError", "LeaseWatch"]


class LeaseState(enum.Enum):
    READ = "read"
    TAKEN = "taken"
    RENEWING = "renewing"
    ENDING = "ending"
    RELEASED = "released"
    LOST = "lost"


class LeaseStateError(AssertionError):
    """A transition the lease's table does not allow: a bug in the drive, not a fault."""


_LIVE = frozenset({LeaseState.READ, LeaseState.TAKEN, LeaseState.RENEWING, LeaseState.ENDING})
_NEXT: dict[LeaseState, frozenset[LeaseState]] = {
    LeaseState.READ: frozenset({LeaseState.TAKEN, LeaseState.ENDING, LeaseState.LOST}),
    LeaseState.TAKEN: frozenset({LeaseState.RENEWING, LeaseState.RELEASED, LeaseState.LOST}),
    LeaseState.RENEWING: frozenset({LeaseState.TAKEN, LeaseState.RELEASED, LeaseState.LOST}),
    LeaseState.ENDING: frozenset({LeaseState.TAKEN, LeaseState.RELEASED, LeaseState.LOST}),
    LeaseState.RELEASED: frozenset(),
    LeaseState.LOST: frozenset({LeaseState.LOST}),  # stopped twice: still lost
}


class LeaseWatch:
    """One drive's lease state, moved only by the named transitions below."""

    __slots__ = ("state",)

    def __init__(self, *, read: bool) -> None:
        self.state = LeaseState.READ if read else LeaseState.TAKEN

    def _move(self, to: LeaseState) -> None:
        if to not in _NEXT[self.state]:
            raise LeaseStateError(
                f"a drive's lease may not go from {self.state.value} to {to.value}"
            )
        self.state = to

    @property
    def lost(self) -> bool:
        return self.state is LeaseState.LOST

    @property
    def released(self) -> bool:
        return self.state is LeaseState.RELEASED

    @property
    def ending(self) -> bool:
        """The drive's end is taking the lease itself: the heartbeat has nothing to renew."""
        return self.state is LeaseState.ENDING

    def heartbeat_takes(self) -> bool:
        """The heartbeat is due: True when it is to take the lease (READ -> TAKEN, by a
        transaction fenced by it), False when it is to renew it (TAKEN -> RENEWING)."""
        if self.state is LeaseState.READ:
            self._move(LeaseState.TAKEN)
            return True
        self._move(LeaseState.RENEWING)
        return False

    def renewed(self) -> None:
        """The renewal answered (RENEWING -> TAKEN); the drive may have ended meanwhile."""
        if self.state is LeaseState.RENEWING:
            self._move(LeaseState.TAKEN)

    def end_begins(self, *, ops_seen: int) -> bool:
        """The drive's end is about to be written. A lease still READ is taken by the end's
        own last update (READ -> ENDING) unless an op the host serviced asked for it (READ ->
        TAKEN: that write took it, and the end's fence finds it held). True: ENDING."""
        if self.state is LeaseState.READ:
            self._move(LeaseState.ENDING if not ops_seen else LeaseState.TAKEN)
        return self.state is LeaseState.ENDING

    def end_written(self, *, released: bool) -> None:
        """The end's transaction is in: the lease given up with it, or (not `released`) held
        to drive the run again at once; a quiet end releases what it never took. A lease lost
        meanwhile stays lost (its drive is being cancelled)."""
        if self.lost:
            return
        if released:
            self._move(LeaseState.RELEASED)
        elif self.state is LeaseState.ENDING:  # the end wrote it: held now
            self._move(LeaseState.TAKEN)

    def lose(self) -> None:
        """The lease is gone (its renewal failed, or the drive was stopped): from any live
        state; a drive already released has nothing left to lose."""
        if self.state in _LIVE or self.state is LeaseState.LOST:
            self._move(LeaseState.LOST)
