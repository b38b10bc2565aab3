"""Waiting for a dead driver's lease to lapse: read its expiry from the journal instead of
guessing a sleep (too short under load, too long otherwise)."""

from __future__ import annotations

import time
from pathlib import Path

from qjsflow.runner.store.dialect import POSTGRES
from tests.journal_reads import is_postgres, query

_MARGIN_S = 0.02  # a lease is free once its expiry is in the past, not at the same millisecond


def seconds_until_lease_lapses(journal: str | Path, run_key: str) -> float:
    """How long until the lease on `run_key` (scope/run-id) lapses, by the clock that judges
    it (the host's on SQLite, the server's on PostgreSQL); 0 if none is held."""
    now = f" - {POSTGRES.lease_clock}" if is_postgres(journal) else ""
    rows = query(journal, f"SELECT lease_expires_at{now} FROM runs WHERE run_id = ?", (run_key,))
    if not rows or rows[0][0] is None:
        return 0.0
    left_ms = float(rows[0][0]) - (0 if is_postgres(journal) else time.time() * 1000)
    return max(0.0, left_ms / 1000) + _MARGIN_S
