"""What a start reads before it writes — its scope's latest configuration version and the
snapshot it names — kept from the last start that read them, so that the next start of the
same (scope, snapshot reference) in this process need not wait for them: a start that
presumes (`Presuming`, PostgreSQL) takes them as kept and asserts, in a statement answered
with its commit, that the journal still holds them (`JournalTransaction.assert_start_reads`).
If it does not (a configuration applied, a snapshot published since, elsewhere or here), the
transaction fails, writing nothing, and the careful start reads them afresh.

Sound because both only grow: configuration versions and snapshots are never changed or
deleted, so a version still the latest, and a reference that still finds the same snapshot,
read exactly what a read now would."""

from __future__ import annotations

from dataclasses import dataclass

from qjsflow.runner.reads import SNAPSHOT_ID
from qjsflow.runner.store import JournalTransaction
from qjsflow.runner.store.journal import SnapshotRecord

__all__ = ["KeptReads", "StartReads"]

# The scope's latest configuration as a start reads it: (version, text, created_at).
LatestConfig = tuple[int, str, int] | None


@dataclass(frozen=True, slots=True)
class KeptReads:
    latest: LatestConfig
    snapshot: SnapshotRecord


class StartReads:
    """The reads of the last start of each (scope, snapshot reference), the most recent
    `_KEPT` of them."""

    _KEPT = 256

    def __init__(self) -> None:
        self._kept: dict[tuple[str, str], KeptReads] = {}

    def presumed(self, tx: JournalTransaction, scope: str, reference: str) -> KeptReads | None:
        """The reads kept for this start, asserted in `tx` (None: none kept, read them)."""
        kept = self.kept(scope, reference)
        if kept is None:
            return None
        version = None if kept.latest is None else kept.latest[0]
        snapshot_id = kept.snapshot.snapshot_id
        tx.assert_start_reads(
            scope, version,
            latest=snapshot_id if reference == "latest" else None,
            prefix=None if reference == "latest" or SNAPSHOT_ID.fullmatch(reference) else reference,
        )  # fmt: skip
        return kept

    def kept(self, scope: str, reference: str) -> KeptReads | None:
        """The reads kept for this start, not asserted (what a start that presumes takes)."""
        return self._kept.get((scope, reference))

    def keep(self, scope: str, reference: str, reads: KeptReads) -> None:
        key = (scope, reference)
        self._kept.pop(key, None)
        self._kept[key] = reads
        while len(self._kept) > self._KEPT:
            del self._kept[next(iter(self._kept))]
