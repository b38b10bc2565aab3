"""Versioned schema migrations (SQLite's here, PostgreSQL's in `pg_schema`), and the one
function that applies either. Append new ones; never edit one that has shipped.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from qjsflow.runner.errors import JournalUnavailable
from qjsflow.runner.store.dialect import Dialect

__all__ = [
    "CALL_DIGESTS",
    "CANCELLING",
    "COMMIT_MARKS",
    "MIGRATIONS",
    "ROLLBACK_REQUESTED",
    "RUN_CONTROL",
    "RUN_TAGS",
    "SNAPSHOT_VARS",
    "TRACE_CONTEXT",
    "WORKERS",
    "WORKFLOW_BINDINGS",
    "Migration",
    "current_version",
    "migrate",
    "replay_clock",
    "schedules",
    "scope_configs",
    "scope_secrets",
    "scoped_run_keys",
    "tenancy",
]

Migration = tuple[int, str, str]  # version, what it does, its statements

_RUN_TABLES = ("steps", "events", "inbox", "timers", "tool_calls", "logs")
_RUN_COLUMNS_V6 = (
    "scope, workflow, snapshot_id, entry_path, status, input, persisted_bindings, output, error,"
    " created_at, updated_at, wake_at, waiting_for, cpu_used_s, logs_count, cancel_requested,"
    " worker_id, lease_expires_at, epoch, sql_used_s"
)


def scoped_run_keys(unkeyed: str) -> str:
    """Migration 7 (PostgreSQL's 2): every run's id becomes the key `scope/run-id`, in every
    table, new rows first so that foreign keys hold at each statement; then the columns of
    signal idempotency keys, executor deaths and console line sources. `unkeyed` is the
    dialect's test for a run id without a '/'."""
    moves = "".join(
        f"UPDATE {table} SET run_id = (SELECT r.scope FROM runs r WHERE r.run_id = {table}.run_id)"
        f" || '/' || run_id WHERE {unkeyed};\n"
        for table in _RUN_TABLES
    )
    return (
        f"INSERT INTO runs (run_id, {_RUN_COLUMNS_V6})"
        f" SELECT scope || '/' || run_id, {_RUN_COLUMNS_V6} FROM runs WHERE {unkeyed};\n"
        f"{moves}"
        f"DELETE FROM runs WHERE {unkeyed};\n"
        "ALTER TABLE inbox ADD COLUMN event_id TEXT;\n"
        "ALTER TABLE runs ADD COLUMN executor_deaths INTEGER NOT NULL DEFAULT 0;\n"
        "ALTER TABLE logs ADD COLUMN source TEXT;\n"
        # The audit is read per run (views) and per step key (an attempt whose outcome is
        # unknown): without this, each was a scan of every run's tool calls.
        "CREATE INDEX tool_calls_by_run ON tool_calls (run_id, step_key);\n"
        "CREATE UNIQUE INDEX logs_by_source ON logs (run_id, source) WHERE source IS NOT NULL;\n"
        "CREATE UNIQUE INDEX inbox_event_ids ON inbox (run_id, event_id)"
        " WHERE event_id IS NOT NULL;\n"
    )


# Migration 10 (PostgreSQL's 5): a pause asked of a run (its driver parks it after the step in
# progress); how many times it was restarted (a restart's calls are new calls to the scope
# database and its console lines new lines); ended runs found by age for pruning.
RUN_CONTROL = (
    "ALTER TABLE runs ADD COLUMN pause_requested INTEGER NOT NULL DEFAULT 0;"
    " ALTER TABLE runs ADD COLUMN generation INTEGER NOT NULL DEFAULT 0;"
    " CREATE INDEX runs_by_age ON runs (updated_at)"
)


# Migration 11 (PostgreSQL's 6): the W3C traceparent every drive of a run is traced under.
TRACE_CONTEXT = "ALTER TABLE runs ADD COLUMN traceparent TEXT"


# Migration 13 (PostgreSQL's 8): what a tool, fetch or db.sql call was asked with, as the
# sandbox's digest of it: a replay (or a migration's check) whose call differs is a divergence.
CALL_DIGESTS = "ALTER TABLE steps ADD COLUMN args_digest TEXT"


# Migration 14 (PostgreSQL's 9): a worker's claim finds runs with a cancel asked through this
# (partial, so it holds only those) instead of scanning every run that has not ended.
# A server's commits each write a mark (runner/store/journal.py, `_commit_marked`); the table
# is in both schemas, SQLite's unused, so that the two stay alike.
COMMIT_MARKS = "CREATE TABLE commit_marks (mark TEXT PRIMARY KEY, at BIGINT NOT NULL)"
CANCELLING = "CREATE INDEX runs_cancelling ON runs (run_id) WHERE cancel_requested = 1"


# Migration 18 (PostgreSQL's 13): each scope's configuration, versioned like snapshots (vars,
# secret names and where a worker finds their values, bindings, egress, budgets, capability
# policy: runner/tenancy/scope_config.py), and the version each run started with.
# Workflow bindings (`env.MY_WORKFLOW.create(...)`): the name a project's wrangler file gives
# each of its workflows in `env`, NULL for none.
WORKFLOW_BINDINGS = "ALTER TABLE bundles ADD COLUMN binding TEXT"
# `terminate --rollback`: the operator's message, until the run's rollbacks ran.
ROLLBACK_REQUESTED = "ALTER TABLE runs ADD COLUMN rollback_requested TEXT"
# A project's wrangler `vars` (JSON): what its runs' env holds unless the scope says otherwise.
SNAPSHOT_VARS = "ALTER TABLE snapshots ADD COLUMN vars TEXT"


def schedules(integer: str) -> str:
    """Schedules (runner/operations/schedules.py): when each fires next (its nominal time,
    NULL once it has ended), the run it started last, a firing kept while that run goes on
    (`overlap: buffer_one`), and how many it started and skipped."""
    return f"""CREATE TABLE schedules (
    scope TEXT NOT NULL,
    name TEXT NOT NULL,
    workflow TEXT NOT NULL,
    spec TEXT NOT NULL,
    next_at {integer},
    last_run TEXT,
    buffered_at {integer},
    fired {integer} NOT NULL DEFAULT 0,
    skipped {integer} NOT NULL DEFAULT 0,
    paused {integer} NOT NULL DEFAULT 0,
    created_at {integer} NOT NULL,
    updated_at {integer} NOT NULL,
    PRIMARY KEY (scope, name)
);
CREATE INDEX schedules_due ON schedules (next_at) WHERE paused = 0;
CREATE INDEX schedules_buffered ON schedules (buffered_at) WHERE buffered_at IS NOT NULL"""


# Runs' tags (key/value, from their start): `list --tag`, found through the index, not a scan.
RUN_TAGS = """CREATE TABLE run_tags (
    run_id TEXT NOT NULL REFERENCES runs (run_id),
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (run_id, key)
);
CREATE INDEX run_tags_by_value ON run_tags (key, value, run_id)"""


def flow_control(integer: str) -> str:
    """Flow control (runner/tenancy/flow_gates.py): each gated run's keys and limits, when
    it was queued and admitted, and until when its gate counts it (`counts_until`: for ever
    while the run goes on, then to the end of its rate window, if it has one); a row per
    gated workflow that admissions lock and workers look at (`waiting` runs, `next_at` when
    time alone may admit one). A run's priority orders its scope's claims and its workflow's
    queue."""
    return f"""ALTER TABLE runs ADD COLUMN priority {integer} NOT NULL DEFAULT 0;
ALTER TABLE bundles ADD COLUMN flow TEXT;
CREATE TABLE run_flow (
    run_id TEXT PRIMARY KEY REFERENCES runs (run_id),
    scope TEXT NOT NULL,
    workflow TEXT NOT NULL,
    concurrency_key TEXT,
    concurrency_limit {integer},
    singleton_key TEXT,
    rate_key TEXT,
    rate_limit {integer},
    rate_period_ms {integer},
    debounce_key TEXT,
    not_before {integer},
    queued_at {integer} NOT NULL,
    queue_seq {integer} NOT NULL,
    admitted_at {integer},
    counts_until {integer} NOT NULL
);
CREATE INDEX run_flow_by_gate ON run_flow (scope, workflow, counts_until);
CREATE TABLE flow_gates (
    scope TEXT NOT NULL,
    workflow TEXT NOT NULL,
    waiting {integer} NOT NULL DEFAULT 0,
    next_at {integer},
    PRIMARY KEY (scope, workflow)
);
CREATE INDEX flow_gates_waiting ON flow_gates (next_at) WHERE waiting > 0"""


def scope_changes(integer: str, blob: str) -> str:
    """Scope databases replicated through the journal (runner/scopedb/replication.py): each
    scope's changes, numbered from 1 with no gap (a writer inserts the next number or loses),
    and the image that replaces those before it."""
    return f"""CREATE TABLE scope_changes (
    scope TEXT NOT NULL,
    version {integer} NOT NULL,
    change TEXT NOT NULL,
    created_at {integer} NOT NULL,
    PRIMARY KEY (scope, version)
);
CREATE TABLE scope_images (
    scope TEXT NOT NULL,
    version {integer} NOT NULL,
    image {blob} NOT NULL,
    created_at {integer} NOT NULL,
    PRIMARY KEY (scope, version)
)"""


def scope_configs(integer: str) -> str:
    return f"""CREATE TABLE scope_configs (
    scope TEXT NOT NULL,
    version {integer} NOT NULL,
    config TEXT NOT NULL,
    created_at {integer} NOT NULL,
    PRIMARY KEY (scope, version)
);
ALTER TABLE runs ADD COLUMN config_version {integer}"""


def scope_secrets(integer: str) -> str:
    """Migration 19 (PostgreSQL's 14): secret values sealed with AES-GCM under their scope's
    key, which only workers and operators hold (runner/tenancy/sealed_secrets.py): the journal
    holds the nonce and the ciphertext (base64) and which key sealed them, never a value."""
    return f"""CREATE TABLE scope_secrets (
    scope TEXT NOT NULL,
    name TEXT NOT NULL,
    key_id TEXT NOT NULL,
    nonce TEXT NOT NULL,
    ciphertext TEXT NOT NULL,
    updated_at {integer} NOT NULL,
    PRIMARY KEY (scope, name)
)"""


# Migration 17 (PostgreSQL's 12): the workers serving this journal, each registered as it
# starts and heart-beating while it runs (runner/engine/worker.py): what it binds (tool
# addresses), which scopes it serves ([]: all) and where its secret values come from, all JSON
# lists; `stopped_at` once it stopped cleanly. One shape on both databases.
WORKERS = """CREATE TABLE workers (
    worker_id TEXT PRIMARY KEY,
    host TEXT NOT NULL,
    pid BIGINT NOT NULL,
    version TEXT NOT NULL,
    tools TEXT NOT NULL,
    scopes TEXT NOT NULL,
    secret_providers TEXT NOT NULL,
    started_at BIGINT NOT NULL,
    heartbeat_at BIGINT NOT NULL,
    stopped_at BIGINT
)"""


# Migration 15 (PostgreSQL's 10): the run's clock when a step's result was settled by the
# sandbox itself (a pure step, sandbox/prelude/80-dispatch.js): a replay reaches that time,
# not the journal's wall-clock `completed_at`, so the body sees the same Date.now() again.
def replay_clock(integer: str) -> str:
    return f"ALTER TABLE steps ADD COLUMN replay_at {integer}"


def tenancy(integer: str, real: str, strict: str) -> str:
    """Migration 12 (PostgreSQL's 7): what each scope used per measure and window (runner/
    budgets.py), and the capabilities a snapshot declares (bundles/manifest.py; NULL: none
    declared)."""
    return (
        "CREATE TABLE scope_usage ("
        f" scope TEXT NOT NULL, measure TEXT NOT NULL, window_start {integer} NOT NULL,"
        f" amount {real} NOT NULL, PRIMARY KEY (scope, measure, window_start)){strict};"
        " ALTER TABLE snapshots ADD COLUMN capabilities TEXT"
    )


MIGRATIONS: tuple[tuple[int, str, str], ...] = (
    (
        1,
        "snapshots and bundles",
        """
        CREATE TABLE snapshots (
            scope TEXT NOT NULL,
            snapshot_id TEXT NOT NULL,
            created_at REAL NOT NULL,
            file_count INTEGER NOT NULL,
            total_bytes INTEGER NOT NULL,
            manifest TEXT NOT NULL,
            PRIMARY KEY (scope, snapshot_id)
        ) STRICT;
        CREATE TABLE bundles (
            scope TEXT NOT NULL,
            snapshot_id TEXT NOT NULL,
            workflow TEXT NOT NULL,
            entry_path TEXT NOT NULL,
            code TEXT NOT NULL,
            code_sha256 TEXT NOT NULL,
            PRIMARY KEY (scope, snapshot_id, workflow),
            FOREIGN KEY (scope, snapshot_id) REFERENCES snapshots (scope, snapshot_id)
        ) STRICT;
        """,
    ),
    (
        2,
        "runs, steps, events, inbox, timers, tool calls, logs",
        """
        CREATE TABLE runs (
            run_id TEXT PRIMARY KEY,
            scope TEXT NOT NULL,
            workflow TEXT NOT NULL,
            snapshot_id TEXT NOT NULL,
            entry_path TEXT NOT NULL,
            status TEXT NOT NULL,
            input TEXT NOT NULL,
            persisted_bindings TEXT NOT NULL,
            output TEXT,
            error TEXT,
            created_at INTEGER NOT NULL,
            updated_at INTEGER NOT NULL,
            wake_at INTEGER,
            waiting_for TEXT,
            cpu_used_s REAL NOT NULL DEFAULT 0,
            logs_count INTEGER NOT NULL DEFAULT 0,
            cancel_requested INTEGER NOT NULL DEFAULT 0,
            FOREIGN KEY (scope, snapshot_id) REFERENCES snapshots (scope, snapshot_id)
        ) STRICT;
        CREATE INDEX runs_by_scope ON runs (scope, status, created_at);
        CREATE TABLE steps (
            run_id TEXT NOT NULL REFERENCES runs (run_id),
            kind TEXT NOT NULL,
            name TEXT NOT NULL,
            count INTEGER NOT NULL,
            status TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            config TEXT,
            detail TEXT,
            output TEXT,
            error TEXT,
            started_at INTEGER NOT NULL,
            completed_at INTEGER,
            settled_seq INTEGER,
            PRIMARY KEY (run_id, kind, name, count)
        ) STRICT;
        CREATE INDEX steps_settled ON steps (run_id, settled_seq);
        CREATE TABLE events (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            run_id TEXT NOT NULL,
            type TEXT NOT NULL,
            at INTEGER NOT NULL,
            data TEXT
        ) STRICT;
        CREATE INDEX events_by_run ON events (run_id, seq);
        CREATE TABLE inbox (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            run_id TEXT NOT NULL REFERENCES runs (run_id),
            type TEXT NOT NULL,
            payload TEXT NOT NULL,
            received_at INTEGER NOT NULL,
            consumed_by TEXT
        ) STRICT;
        CREATE INDEX inbox_unconsumed ON inbox (run_id, type, seq) WHERE consumed_by IS NULL;
        CREATE TABLE timers (
            run_id TEXT NOT NULL REFERENCES runs (run_id),
            step_key TEXT NOT NULL,
            kind TEXT NOT NULL,
            due_at INTEGER NOT NULL,
            PRIMARY KEY (run_id, step_key)
        ) STRICT;
        CREATE INDEX timers_by_due ON timers (due_at);
        CREATE TABLE tool_calls (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            run_id TEXT NOT NULL REFERENCES runs (run_id),
            step_key TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            address TEXT NOT NULL,
            args TEXT NOT NULL,
            result TEXT,
            error TEXT,
            started_at INTEGER NOT NULL,
            duration_ms INTEGER
        ) STRICT;
        CREATE TABLE logs (
            run_id TEXT NOT NULL REFERENCES runs (run_id),
            count INTEGER NOT NULL,
            level TEXT NOT NULL,
            text TEXT NOT NULL,
            at INTEGER NOT NULL,
            PRIMARY KEY (run_id, count)
        ) STRICT;
        """,
    ),
    (
        3,
        "leases on runs, fencing epochs on events",
        """
        ALTER TABLE runs ADD COLUMN worker_id TEXT;
        ALTER TABLE runs ADD COLUMN lease_expires_at INTEGER;
        ALTER TABLE runs ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE events ADD COLUMN epoch INTEGER;
        CREATE INDEX runs_unleased ON runs (status, lease_expires_at);
        """,
    ),
    (
        4,
        "a per-run SQL time ledger",
        """
        ALTER TABLE runs ADD COLUMN sql_used_s REAL NOT NULL DEFAULT 0;
        """,
    ),
    (
        5,
        "settling a step writes one index fewer",
        """
        DROP INDEX steps_settled;
        """,
    ),
    (
        6,
        "events numbered by rowid: AUTOINCREMENT cost a page write per event",
        """
        CREATE TABLE events_v6 (
            seq INTEGER PRIMARY KEY,
            run_id TEXT NOT NULL,
            type TEXT NOT NULL,
            at INTEGER NOT NULL,
            data TEXT,
            epoch INTEGER
        ) STRICT;
        INSERT INTO events_v6 (seq, run_id, type, at, data, epoch)
            SELECT seq, run_id, type, at, data, epoch FROM events;
        DROP TABLE events;
        ALTER TABLE events_v6 RENAME TO events;
        CREATE INDEX events_by_run ON events (run_id, seq);
        """,
    ),
    (
        7,
        "runs keyed by (scope, run id); idempotency keys for signals",
        scoped_run_keys("instr(run_id, '/') = 0"),
    ),
    (
        8,
        "each workflow's export (a file may hold several) and source map; where a run failed",
        "ALTER TABLE bundles ADD COLUMN export_name TEXT NOT NULL DEFAULT 'default';"
        " ALTER TABLE bundles ADD COLUMN source_map TEXT NOT NULL DEFAULT '';"
        " ALTER TABLE runs ADD COLUMN error_stack TEXT",
    ),
    (
        9,
        "the local Cloudflare bindings: a KV namespace and a queue per scope",
        """
        CREATE TABLE kv_entries (
            scope TEXT NOT NULL, namespace TEXT NOT NULL, key TEXT NOT NULL,
            value TEXT NOT NULL, updated_at INTEGER NOT NULL,
            PRIMARY KEY (scope, namespace, key)
        ) STRICT;
        CREATE TABLE queue_messages (
            seq INTEGER PRIMARY KEY, scope TEXT NOT NULL, queue TEXT NOT NULL,
            body TEXT NOT NULL, sent_at INTEGER NOT NULL
        ) STRICT;
        CREATE INDEX queue_messages_by_queue ON queue_messages (scope, queue, seq)
        """,
    ),
    (10, "run control: pause requests, restarts; ended runs by age", RUN_CONTROL),
    (11, "each run's trace context", TRACE_CONTEXT),
    (12, "usage per scope; a snapshot's capabilities", tenancy("INTEGER", "REAL", " STRICT")),
    (13, "the digest of each call's arguments, checked on replay", CALL_DIGESTS),
    (14, "runs with a cancel asked, found without a scan", CANCELLING),
    (15, "the run's clock of a step the sandbox settled itself", replay_clock("INTEGER")),
    (16, "marks of commits, for a commit whose answer is lost", COMMIT_MARKS),
    (17, "the workers serving the journal, and their heartbeats", WORKERS),
    (
        18,
        "each scope's configuration, versioned, and the version each run started with",
        scope_configs("INTEGER"),
    ),
    (19, "secret values sealed under their scope's key", scope_secrets("INTEGER")),
    (
        20,
        "the env binding a project gives each workflow (wrangler's workflows[].binding)",
        WORKFLOW_BINDINGS,
    ),
    (21, "a terminate that runs the run's rollbacks first", ROLLBACK_REQUESTED),
    (22, "a project's wrangler vars, the defaults of its runs' env", SNAPSHOT_VARS),
    (23, "schedules: cron or interval firings, each run started once", schedules("INTEGER")),
    (24, "runs' tags, found through an index", RUN_TAGS),
    (25, "flow control: queued runs, their keys and gates; priorities", flow_control("INTEGER")),
    (26, "scope databases' changes and images, for replicas", scope_changes("INTEGER", "BLOB")),
)


def current_version(connection: Any, dialect: Dialect) -> int | None:
    """The schema version, read without a write transaction; None when there is no schema."""
    if connection.execute(dialect.has_version_table).fetchone() is None:
        return None
    row = connection.execute("SELECT max(version) FROM schema_migrations").fetchone()
    return None if row is None or row[0] is None else int(row[0])


def migrate(
    connection: Any,
    location: str,
    *,
    dialect: Dialect,
    migrations: Sequence[Migration] | None = None,
    create: bool = True,
) -> int:
    """On the journal's thread: bring the schema up to date; returns the version it is at.

    A current schema is only read (no write lock: a read-only command works while another
    process writes); without `create`, a database with no schema or an old one is refused,
    never written. Each migration is one transaction with the row that records it, opened by
    the dialect's prologue (the write lock; on PostgreSQL an advisory lock too), so concurrent
    openers apply each exactly once."""
    steps = migrations if migrations is not None else MIGRATIONS
    version = current_version(connection, dialect)
    latest = steps[-1][0]
    if version is not None and version > latest:
        raise JournalUnavailable(
            location, f"is at schema version {version}, newer than this qjsflow"
        )
    if version == latest:
        return version
    if not create:
        problem = (
            "is empty or damaged: it holds no qjsflow journal"
            if version is None
            else f"is at schema version {version}: open it once with a writing command"
        )
        raise JournalUnavailable(location, problem)
    for version, name, script in steps:
        connection.execute(dialect.begin)
        try:
            for statement in dialect.migration_prologue:
                connection.execute(statement)
            applied = connection.execute(
                "SELECT 1 FROM schema_migrations WHERE version = ?", (version,)
            ).fetchone()
            if applied is None:
                for statement in _statements(script):
                    connection.execute(statement)
                connection.execute(
                    "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                    (version, name, time.time()),
                )
            connection.execute("COMMIT")
        except BaseException:
            connection.execute("ROLLBACK")
            raise
    return latest


def _statements(script: str) -> list[str]:
    # Migration scripts are ours and hold no semicolons inside literals.
    return [part.strip() for part in script.split(";") if part.strip()]
