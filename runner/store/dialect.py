"""Where the journal's two SQL dialects differ: named here, chosen once by the backend."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["POSTGRES", "SQLITE", "WAKE_CHANNEL", "Dialect"]

WAKE_CHANNEL = "qjsflow_work"  # PostgreSQL's LISTEN/NOTIFY channel of runs made claimable


@dataclass(frozen=True, slots=True)
class Dialect:
    name: str
    begin: str  # a write transaction that takes the database's write lock at once
    lock_run: str  # appended to the fence's read of a run row
    list_tables: str
    # Claims skip a run another claimer has locked (FOR UPDATE SKIP LOCKED) instead of
    # waiting; SQLite needs none: BEGIN IMMEDIATE already serializes writers.
    skip_locked_claims: bool
    # Whether a write transaction holds the whole database (SQLite's BEGIN IMMEDIATE): a row
    # it has read cannot change under it. Otherwise only a row it has locked cannot.
    serialized: bool = False
    # The clock that judges leases: None for the caller's (SQLite: one machine, one clock);
    # SQL for the database's own (PostgreSQL: workers on many machines whose clocks differ).
    lease_clock: str | None = None
    # Schema migrations: a query with a row when `schema_migrations` exists, and what opens
    # each migration's transaction after `begin` (locks, the version table).
    has_version_table: str = ""
    migration_prologue: tuple[str, ...] = ()
    # What a transaction that makes a run claimable runs, to wake the workers waiting on the
    # journal (delivered at its commit; "" where workers on one machine poll a local file).
    wake: str = ""
    # Whether the journal connection's statements are pipelined: sent without waiting for
    # their answers, a failure told with the next answer read or by `sync`
    # (runner/store/pg_connection.py).
    pipelined: bool = False
    # The seq of the event this connection inserted last, named in the statement right after
    # it (a step settled at its event) so that nothing is read back in between.
    last_seq: str = "last_insert_rowid()"


SQLITE = Dialect(
    name="sqlite",
    begin="BEGIN IMMEDIATE",
    lock_run="",
    skip_locked_claims=False,
    serialized=True,
    list_tables="SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%'",
    has_version_table=(
        "SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'schema_migrations'"
    ),
    migration_prologue=(
        "CREATE TABLE IF NOT EXISTS schema_migrations ("
        " version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL) STRICT",
    ),
)
POSTGRES = Dialect(
    name="postgresql",
    begin="BEGIN",
    lock_run=" FOR UPDATE",  # fencing: a lease takeover waits for (or fails) this drive's write
    skip_locked_claims=True,
    list_tables="SELECT tablename FROM pg_tables WHERE schemaname = current_schema()",
    lease_clock="(extract(epoch FROM clock_timestamp()) * 1000)::bigint",
    has_version_table="SELECT 1 WHERE to_regclass('schema_migrations') IS NOT NULL",
    wake=f"NOTIFY {WAKE_CHANNEL}",
    pipelined=True,
    last_seq="currval(pg_get_serial_sequence('events', 'seq'))",
    migration_prologue=(
        f"SELECT pg_advisory_xact_lock({0x716A73666C6F77})",  # "qjsflow": openers take turns
        "CREATE TABLE IF NOT EXISTS schema_migrations ("
        " version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)",
    ),
)
