"""The journal store: the only SQL in qjsflow (docs/ARCHITECTURE.md, The journal)."""

from qjsflow.runner.store.journal import (
    BundleRecord,
    JournalStore,
    SnapshotRecord,
    WorkflowRecord,
    snapshot_records,
)
from qjsflow.runner.store.lease_types import LeaseMode, Unleased
from qjsflow.runner.store.migrations import MIGRATIONS
from qjsflow.runner.store.records import (
    ENDED,
    THROTTLE_TIMER,
    WORKER_BEAT_MS,
    WORKER_GONE_MS,
    EventRecord,
    InboxRecord,
    JournalRow,
    LogRecord,
    RunRecord,
    RunStatus,
    StepRow,
    StepStatus,
    ToolCallRecord,
    WorkerRecord,
    with_compute,
)
from qjsflow.runner.store.tx import JournalTransaction, Lease, LeaseLost, SettledStep

__all__ = [
    "ENDED",
    "MIGRATIONS",
    "THROTTLE_TIMER",
    "WORKER_BEAT_MS",
    "WORKER_GONE_MS",
    "BundleRecord",
    "EventRecord",
    "InboxRecord",
    "JournalRow",
    "JournalStore",
    "JournalTransaction",
    "Lease",
    "LeaseLost",
    "LeaseMode",
    "LogRecord",
    "RunRecord",
    "RunStatus",
    "SettledStep",
    "SnapshotRecord",
    "StepRow",
    "StepStatus",
    "ToolCallRecord",
    "Unleased",
    "WorkerRecord",
    "WorkflowRecord",
    "snapshot_records",
    "with_compute",
]
