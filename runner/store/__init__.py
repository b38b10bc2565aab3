"""The journal store: the only SQL in qjsflow (DESIGN §6)."""

from runner.store.journal import BundleRecord, JournalStore, SnapshotRecord, WorkflowRecord
from runner.store.migrations import MIGRATIONS

__all__ = ["MIGRATIONS", "BundleRecord", "JournalStore", "SnapshotRecord", "WorkflowRecord"]
