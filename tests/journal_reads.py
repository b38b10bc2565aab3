"""Reading a journal behind the runner's back, on either backend: what tests use to show what
was (or was not) written. A connection of its own, so nothing here is in production code."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

import psycopg

from qjsflow.runner.store import JournalStore
from qjsflow.runner.store.backends import transaction_pooled
from qjsflow.runner.store.dialect import POSTGRES, SQLITE


def is_postgres(journal: str | Path) -> bool:
    return str(journal).startswith("postgresql://")


def query(journal: str | Path, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows of one statement written with `?` placeholders."""
    if is_postgres(journal):
        with psycopg.connect(transaction_pooled(str(journal))[0]) as connection:
            rows = connection.execute(sql.replace("%", "%%").replace("?", "%s"), args)
            return [tuple(row) for row in rows.fetchall()]
    location = str(journal).removeprefix("sqlite:///")
    uri = f"file:{location}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as connection:
        return connection.execute(sql, args).fetchall()


def execute(journal: str | Path, sql: str, args: tuple[Any, ...] = ()) -> int:
    """Change the journal behind the runner's back (a test's fault): the rows changed."""
    if is_postgres(journal):
        with psycopg.connect(transaction_pooled(str(journal))[0]) as connection:
            return connection.execute(sql.replace("?", "%s"), args).rowcount
    location = str(journal).removeprefix("sqlite:///")
    with contextlib.closing(sqlite3.connect(location)) as local, local:
        return local.execute(sql, args).rowcount


def table_counts(journal: str | Path | JournalStore) -> dict[str, int]:
    """Rows in each journal table (but the commit marks a server's every commit writes)."""
    location = journal.location if isinstance(journal, JournalStore) else journal
    dialect = POSTGRES if is_postgres(location) else SQLITE
    listed = (str(row[0]) for row in query(location, dialect.list_tables))
    tables = sorted(name for name in listed if name != "commit_marks")
    # Table names come from the database's catalog, not from a caller.
    return {t: int(query(location, f'SELECT count(*) FROM "{t}"')[0][0]) for t in tables}
