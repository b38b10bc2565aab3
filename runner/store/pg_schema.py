"""The journal's schema on PostgreSQL: the same tables as SQLite's migrations 1-6, with
PostgreSQL's types (times and counts are BIGINT milliseconds; sequences are identities).

Versioned like the SQLite migrations and applied by the same function; concurrent openers
serialize on an advisory lock (the dialect's migration prologue).
"""

from __future__ import annotations

from qjsflow.runner.store.migrations import (
    CALL_DIGESTS,
    CANCELLING,
    COMMIT_MARKS,
    ROLLBACK_REQUESTED,
    RUN_CONTROL,
    RUN_TAGS,
    SNAPSHOT_VARS,
    TRACE_CONTEXT,
    WORKERS,
    WORKFLOW_BINDINGS,
    Migration,
    flow_control,
    replay_clock,
    schedules,
    scope_changes,
    scope_configs,
    scope_secrets,
    scoped_run_keys,
    tenancy,
)

__all__ = ["PG_MIGRATIONS"]

PG_MIGRATIONS: tuple[Migration, ...] = (
    (
        1,
        "the journal (SQLite migrations 1-6)",
        """
        CREATE TABLE snapshots (
            scope TEXT NOT NULL, snapshot_id TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
            file_count BIGINT NOT NULL, total_bytes BIGINT NOT NULL, manifest TEXT NOT NULL,
            PRIMARY KEY (scope, snapshot_id)
        );
        CREATE TABLE bundles (
            scope TEXT NOT NULL, snapshot_id TEXT NOT NULL, workflow TEXT NOT NULL,
            entry_path TEXT NOT NULL, code TEXT NOT NULL, code_sha256 TEXT NOT NULL,
            PRIMARY KEY (scope, snapshot_id, workflow),
            FOREIGN KEY (scope, snapshot_id) REFERENCES snapshots (scope, snapshot_id)
        );
        CREATE TABLE runs (
            run_id TEXT PRIMARY KEY, scope TEXT NOT NULL, workflow TEXT NOT NULL,
            snapshot_id TEXT NOT NULL, entry_path TEXT NOT NULL, status TEXT NOT NULL,
            input TEXT NOT NULL, persisted_bindings TEXT NOT NULL, output TEXT, error TEXT,
            created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL, wake_at BIGINT,
            waiting_for TEXT, cpu_used_s DOUBLE PRECISION NOT NULL DEFAULT 0,
            logs_count BIGINT NOT NULL DEFAULT 0, cancel_requested BIGINT NOT NULL DEFAULT 0,
            worker_id TEXT, lease_expires_at BIGINT, epoch BIGINT NOT NULL DEFAULT 0,
            sql_used_s DOUBLE PRECISION NOT NULL DEFAULT 0,
            FOREIGN KEY (scope, snapshot_id) REFERENCES snapshots (scope, snapshot_id)
        );
        CREATE INDEX runs_by_scope ON runs (scope, status, created_at);
        CREATE INDEX runs_unleased ON runs (status, lease_expires_at);
        CREATE TABLE steps (
            run_id TEXT NOT NULL REFERENCES runs (run_id), kind TEXT NOT NULL,
            name TEXT NOT NULL, count BIGINT NOT NULL, status TEXT NOT NULL,
            attempt BIGINT NOT NULL, config TEXT, detail TEXT, output TEXT, error TEXT,
            started_at BIGINT NOT NULL, completed_at BIGINT, settled_seq BIGINT,
            PRIMARY KEY (run_id, kind, name, count)
        );
        CREATE TABLE events (
            seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, run_id TEXT NOT NULL,
            type TEXT NOT NULL, at BIGINT NOT NULL, data TEXT, epoch BIGINT
        );
        CREATE INDEX events_by_run ON events (run_id, seq);
        CREATE TABLE inbox (
            seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            run_id TEXT NOT NULL REFERENCES runs (run_id), type TEXT NOT NULL,
            payload TEXT NOT NULL, received_at BIGINT NOT NULL, consumed_by TEXT
        );
        CREATE INDEX inbox_unconsumed ON inbox (run_id, type, seq) WHERE consumed_by IS NULL;
        CREATE TABLE timers (
            run_id TEXT NOT NULL REFERENCES runs (run_id), step_key TEXT NOT NULL,
            kind TEXT NOT NULL, due_at BIGINT NOT NULL, PRIMARY KEY (run_id, step_key)
        );
        CREATE INDEX timers_by_due ON timers (due_at);
        CREATE TABLE tool_calls (
            seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            run_id TEXT NOT NULL REFERENCES runs (run_id), step_key TEXT NOT NULL,
            attempt BIGINT NOT NULL, address TEXT NOT NULL, args TEXT NOT NULL, result TEXT,
            error TEXT, started_at BIGINT NOT NULL, duration_ms BIGINT
        );
        CREATE TABLE logs (
            run_id TEXT NOT NULL REFERENCES runs (run_id), count BIGINT NOT NULL,
            level TEXT NOT NULL, text TEXT NOT NULL, at BIGINT NOT NULL,
            PRIMARY KEY (run_id, count)
        )
        """,
    ),
    (
        2,
        "runs keyed by (scope, run id); idempotency keys for signals (SQLite migration 7)",
        scoped_run_keys("strpos(run_id, '/') = 0"),
    ),
    (
        3,
        "each workflow's export and source map; where a run failed (SQLite migration 8)",
        "ALTER TABLE bundles ADD COLUMN export_name TEXT NOT NULL DEFAULT 'default';"
        " ALTER TABLE bundles ADD COLUMN source_map TEXT NOT NULL DEFAULT '';"
        " ALTER TABLE runs ADD COLUMN error_stack TEXT",
    ),
    (
        4,
        "the local Cloudflare bindings (SQLite migration 9)",
        """
        CREATE TABLE kv_entries (
            scope TEXT NOT NULL, namespace TEXT NOT NULL, key TEXT NOT NULL,
            value TEXT NOT NULL, updated_at BIGINT NOT NULL,
            PRIMARY KEY (scope, namespace, key)
        );
        CREATE TABLE queue_messages (
            seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, scope TEXT NOT NULL,
            queue TEXT NOT NULL, body TEXT NOT NULL, sent_at BIGINT NOT NULL
        );
        CREATE INDEX queue_messages_by_queue ON queue_messages (scope, queue, seq)
        """,
    ),
    (5, "run control (SQLite migration 10)", RUN_CONTROL),
    (6, "each run's trace context (SQLite migration 11)", TRACE_CONTEXT),
    (
        7,
        "usage per scope; a snapshot's capabilities (SQLite migration 12)",
        tenancy("BIGINT", "DOUBLE PRECISION", ""),
    ),
    (8, "the digest of each call's arguments (SQLite migration 13)", CALL_DIGESTS),
    (9, "runs with a cancel asked, found without a scan (SQLite migration 14)", CANCELLING),
    (
        10,
        "the run's clock of a step the sandbox settled itself (SQLite migration 15)",
        replay_clock("BIGINT"),
    ),
    (11, "marks of commits, for a commit whose answer is lost (SQLite migration 16)", COMMIT_MARKS),
    (12, "the workers serving the journal (SQLite migration 17)", WORKERS),
    (13, "each scope's configuration, versioned (SQLite migration 18)", scope_configs("BIGINT")),
    (
        14,
        "secret values sealed under their scope's key (SQLite migration 19)",
        scope_secrets("BIGINT"),
    ),
    (15, "the env binding of each workflow (SQLite migration 20)", WORKFLOW_BINDINGS),
    (
        16,
        "a terminate that runs the run's rollbacks first (SQLite migration 21)",
        ROLLBACK_REQUESTED,
    ),
    (17, "a project's wrangler vars (SQLite migration 22)", SNAPSHOT_VARS),
    (18, "schedules (SQLite migration 23)", schedules("BIGINT")),
    (19, "runs' tags (SQLite migration 24)", RUN_TAGS),
    (20, "flow control (SQLite migration 25)", flow_control("BIGINT")),
    (21, "scope databases' changes (SQLite migration 26)", scope_changes("BIGINT", "BYTEA")),
)
