"""Waiting for a dead driver's lease to lapse: read its expiry from the journal instead of
guessing a sleep (too short under load, too long otherwise)."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from pathlib import Path

import psycopg

from qjsflow.runner.store.dialect import POSTGRES

_MARGIN_S = 0.02  # a lease is free once its expiry is in the past, not at the same millisecond
_READ = "SELECT lease_expires_at{now} FROM runs WHERE run_id = {param}"


def seconds_until_lease_lapses(journal: str | Path, run_key: str) -> float:
    """How long until the lease on `run_key` (scope/run-id) lapses, by the clock that judges
    it (the host's on SQLite, the server's on PostgreSQL); 0 if none is held."""
    if str(journal).startswith("postgresql://"):
        sql = _READ.format(now=f" - {POSTGRES.lease_clock}", param="%s")
        with psycopg.connect(str(journal)) as connection:
            row = connection.execute(sql, (run_key,)).fetchone()
        left_ms = None if row is None or row[0] is None else float(row[0])
    else:
        uri = f"file:{journal}?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as connection:
            row = connection.execute(_READ.format(now="", param="?"), (run_key,)).fetchone()
        left_ms = None if row is None or row[0] is None else row[0] - time.time() * 1000
    if left_ms is None:
        return 0.0
    return max(0.0, left_ms / 1000) + _MARGIN_S
