"""The journal store: the only SQL in qjsflow (DESIGN §6)."""

from runner.store.journal import BundleRecord, JournalStore, SnapshotRecord, WorkflowRecord
from runner.store.migrations import MIGRATIONS
from runner.store.records import (
    EventRecord,
    InboxRecord,
    JournalRow,
    LogRecord,
    RunRecord,
    StepRow,
    ToolCallRecord,
)
from runner.store.tx import JournalTransaction, Lease, LeaseLost

__all__ = [
    "MIGRATIONS",
    "BundleRecord",
    "EventRecord",
    "InboxRecord",
    "JournalRow",
    "JournalStore",
    "JournalTransaction",
    "Lease",
    "LeaseLost",
    "LogRecord",
    "RunRecord",
    "SnapshotRecord",
    "StepRow",
    "ToolCallRecord",
    "WorkflowRecord",
]
