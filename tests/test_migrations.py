"""A journal written by an earlier version opens with its runs intact."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import psycopg

from qjsflow.runner import Runner
from qjsflow.runner.store import MIGRATIONS
from tests.postgres import PostgresServer


def _journal_at(path: Path, version: int) -> None:
    with sqlite3.connect(path) as connection:
        connection.execute(
            "CREATE TABLE schema_migrations ("
            " version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL) STRICT"
        )
        for number, name, script in MIGRATIONS:
            if number > version:
                break
            connection.executescript(script)
            connection.execute(
                "INSERT INTO schema_migrations VALUES (?, ?, ?)", (number, name, time.time())
            )


async def test_runs_of_a_version_6_journal_are_keyed_by_scope(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    _journal_at(db, 6)
    with sqlite3.connect(db) as connection:
        connection.execute("INSERT INTO snapshots VALUES ('acme', 'snap', 0, 1, 1, '[]')")
        connection.execute(
            "INSERT INTO runs (run_id, scope, workflow, snapshot_id, entry_path, status, input,"
            " persisted_bindings, output, created_at, updated_at)"
            " VALUES ('r1', 'acme', 'flow', 'snap', 'workflows/flow.ts', 'completed', 'null',"
            " '{}', '7', 1000, 2000)"
        )
        connection.execute(
            "INSERT INTO steps (run_id, kind, name, count, status, attempt, output, started_at,"
            " completed_at, settled_seq) VALUES ('r1', 'do', 'a', 1, 'completed', 1, '1', 1, 2, 1)"
        )
        connection.execute(
            "INSERT INTO events (run_id, type, at) VALUES ('r1', 'run_created', 1000)"
        )
    async with Runner.open(db) as runner:
        run = await runner.get("r1", scope="acme")
        assert (run.run_id, run.scope, run.output) == ("r1", "acme", 7)
        steps = await runner.list_steps("r1", scope="acme")
        assert [(s.name, s.output) for s in steps] == [("a", 1)]
        assert [e.type for e in await runner.store.list_events("acme/r1")] == ["run_created"]
    with sqlite3.connect(db) as connection:
        keys = connection.execute("SELECT run_id FROM runs").fetchall()
        assert keys == [("acme/r1",)]
        assert connection.execute("PRAGMA foreign_key_check").fetchall() == []


async def test_both_backends_build_the_same_schema(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    """The SQLite migrations and the PostgreSQL schema hold the same tables, columns and
    indexes: the store's one set of statements runs on both."""
    db = tmp_path / "journal.db"
    async with Runner.open(db):
        pass
    with sqlite3.connect(db) as connection:
        tables = [r[0] for r in connection.execute(
            "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        )]  # fmt: skip
        sqlite_columns = {
            t: {r[1] for r in connection.execute(f'PRAGMA table_info("{t}")')} for t in tables
        }
        sqlite_indexes = {
            r[0] for r in connection.execute(
                "SELECT name FROM sqlite_schema WHERE type = 'index' AND sql IS NOT NULL"
            )
        }  # fmt: skip
    url = postgres.new_database()
    async with Runner.open(url):
        pass
    with psycopg.connect(url) as connection:
        rows = connection.execute(
            "SELECT table_name, column_name FROM information_schema.columns"
            " WHERE table_schema = current_schema()"
        ).fetchall()
        pg_columns: dict[str, set[str]] = {}
        for table, column in rows:
            pg_columns.setdefault(table, set()).add(column)
        pg_indexes = {
            r[0] for r in connection.execute(
                "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()"
                " AND indexname NOT LIKE '%_pkey'"
            ).fetchall()
        }  # fmt: skip
    assert pg_columns == sqlite_columns
    assert pg_indexes == sqlite_indexes
