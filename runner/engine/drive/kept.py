"""A waiting run's beginning, kept by its driver from a drive that left it as it found it.

A drive that replays to waits the journal answers only with a suspension, and sends nothing,
ends where it began: the run's journal and open steps are what it read, and its end moves the
run's epoch to its lease's. The next drive of that run asked of this process (a resume) begins
from what is kept, without reading the journal, as a drive read first does: its lease is taken
at the epoch kept (by its first write, its heartbeat or its end), so if anything took the run
since, nothing of that drive is written and the driver reads the run afresh and drives it
again (docs/ARCHITECTURE.md, "A beginning kept").
"""

from __future__ import annotations

import collections
import dataclasses
from dataclasses import dataclass

from qjsflow.bridge.types import JournalEntry
from qjsflow.runner.store import RunRecord, RunStatus

__all__ = ["Kept", "KeptBeginnings", "OpenSteps"]


@dataclass(frozen=True, slots=True)
class OpenSteps:
    """A run's steps that have a row but have not settled, as a drive begins."""

    keys: tuple[str, ...]
    waiting: tuple[tuple[str, str], ...]  # waits with nothing to take: (key, event type)
    until: int | None = None  # the earliest deadline of those waits (ms; None: no wait)


@dataclass(frozen=True, slots=True)
class Kept:
    run: RunRecord  # as the drive's end left it
    epoch: int  # the run's epoch after that end (its lease's)
    journal: tuple[JournalEntry, ...]
    open: OpenSteps
    chars: int  # the journal's values' length, counted against `KeptBeginnings` bound
    # The journal's mark once a commit certified the run as kept (`KeptBeginnings.certify`):
    # while the journal's mark is still this, nothing was committed since, and the next
    # drive's end need not read the run (runner/engine/drive/, "An end already certified").
    mark: bytes | None = None


# Bounds of what one driver keeps: a beginning costs what its journal holds.
RUNS_KEPT = 256
CHARS_KEPT = 8 * 2**20


class KeptBeginnings:
    """The beginnings a driver keeps, by run, the least recently kept dropped first."""

    def __init__(self) -> None:
        self._kept: collections.OrderedDict[str, Kept] = collections.OrderedDict()
        self._chars = 0

    def __len__(self) -> int:
        return len(self._kept)

    def keep(self, kept: Kept) -> None:
        """Keep `kept` (in place of any kept of its run), within the bounds."""
        self.forget(kept.run.run_id)
        if kept.chars > CHARS_KEPT:
            return
        self._kept[kept.run.run_id] = kept
        self._chars += kept.chars
        while len(self._kept) > RUNS_KEPT or self._chars > CHARS_KEPT:
            _, dropped = self._kept.popitem(last=False)
            self._chars -= dropped.chars

    def certify(self, run: RunRecord, epoch: int, mark: bytes) -> None:
        """Note the `mark` of the commit that found the journal holding `run` at `epoch` as
        kept (no lease, wake-up or event since), if that is still what is kept of it."""
        kept = self._kept.get(run.run_id)
        if kept is not None and kept.epoch == epoch and kept.run == run:
            self._kept[run.run_id] = dataclasses.replace(kept, mark=mark)

    def forget(self, run_id: str) -> Kept | None:
        """Drop (and return) what is kept of `run_id`: a drive of it begins, or what is kept
        no longer says how it would begin (an event delivered here)."""
        kept = self._kept.pop(run_id, None)
        if kept is not None:
            self._chars -= kept.chars
        return kept

    def take(self, run_id: str, now: int) -> Kept | None:
        """What is kept of `run_id`, if a drive at `now` may begin from it: dropped either
        way (the drive's end keeps it again). Not once a wait's deadline has come (the replay
        would time it out), nor for a run a cancel or a pause was asked of when it was kept."""
        kept = self.forget(run_id)
        if kept is None or kept.run.status != RunStatus.waiting:
            return None
        if kept.run.cancel_requested or kept.run.pause_requested:
            return None
        if kept.open.until is None or now >= kept.open.until:
            return None
        return kept
