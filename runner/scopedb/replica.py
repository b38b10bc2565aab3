"""A scope database as a replica of the journal's (docs/ARCHITECTURE.md, Scope databases
across machines): the server process's side. Runs in that process only.

A statement that writes runs in an open transaction with a SQLite session attached (rowid
tables included); its change — the session's changeset, or for DDL the statement itself, and
the call's applied record — is handed to the host, which commits it in the journal with the
call's result and the scope's next version. Only then is the local transaction committed
(`finish`); if another machine took that version first, it is rolled back, the replica catches
up (`apply`) and the statement runs again: nothing was recorded, so nothing ran twice.
"""

from __future__ import annotations

import base64
import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import apsw

__all__ = [
    "DdlWithRows", "applied_result", "apply_changes", "finish", "image", "replica_version",
    "run_held",
]  # fmt: skip

_REPLICA = "_qjsflow_replica"
_PRIVATE = "_qjsflow"


class DdlWithRows(Exception):
    """A statement changed the schema and rows at once (CREATE TABLE ... AS SELECT): its
    change would be neither a changeset nor a statement every replica can run alike."""


def replica_version(connection: apsw.Connection) -> int:
    """The journal version this replica holds (0: none applied)."""
    connection.execute(f"CREATE TABLE IF NOT EXISTS {_REPLICA} (version INTEGER NOT NULL)")
    rows = connection.execute(f"SELECT version FROM {_REPLICA}").fetchall()  # all: none open
    if not rows:
        connection.execute(f"INSERT INTO {_REPLICA} (version) VALUES (0)")
        return 0
    return _integer(rows[0][0])


def applied_result(connection: apsw.Connection, run_id: str, call: str) -> str | None:
    """The stored result of a call this database applied already (None: not applied)."""
    rows = connection.execute(
        "SELECT result FROM _qjsflow_applied WHERE run_id = ? AND call_key = ?", (run_id, call)
    ).fetchall()
    return str(rows[0][0]) if rows else None


def run_held(
    connection: apsw.Connection,
    request: dict[str, Any],
    statement: Callable[[], str],
) -> dict[str, Any]:
    """Run the call's statement (`statement`: its encoded result) in a transaction
    left open when it changed anything (rows, or the schema): the change to commit in the journal at
    the replica's next version. A call already applied (here, or on any replica this one has
    caught up with) answers with its stored result."""
    run_id, call = request["runId"], request["call"]
    connection.execute("BEGIN IMMEDIATE")
    try:
        version = replica_version(connection)
        applied = applied_result(connection, run_id, call)
        if applied is not None:
            connection.execute("COMMIT")
            return {"result": applied, "change": None, "version": version}
        session = apsw.Session(connection, "main")
        session.config(apsw.SQLITE_SESSION_OBJCONFIG_ROWID, 1)
        session.table_filter(lambda name: not name.lower().startswith(_PRIVATE))
        session.attach(None)
        schema, tables = _schema_version(connection), _tables(connection)
        try:
            result = statement()
            changeset = session.changeset()
        finally:
            session.close()
        ddl = _schema_version(connection) != schema
        if ddl and any(_has_rows(connection, name) for name in _tables(connection) - tables):
            raise DdlWithRows  # CREATE TABLE ... AS SELECT: rows no session recorded
        if not ddl and not changeset:  # a read: nothing to replicate, no record needed
            connection.execute("COMMIT")
            return {"result": result, "change": None, "version": version}
        if ddl and changeset:
            raise DdlWithRows
        change: dict[str, Any] = {"applied": [run_id, call, result]}
        if ddl:
            change["ddl"] = [request["sql"], request["params"]]
        else:
            change["changeset"] = base64.b64encode(changeset).decode("ascii")
        connection.execute(
            "INSERT INTO _qjsflow_applied (run_id, call_key, result) VALUES (?, ?, ?)",
            (run_id, call, result),
        )
        return {"result": result, "change": change, "version": version, "held": True}
    except BaseException:
        if not connection.get_autocommit():
            connection.execute("ROLLBACK")
        raise


def finish(connection: apsw.Connection, version: int | None) -> None:
    """End a held transaction: committed as the journal's `version`, or (None) rolled back."""
    if connection.get_autocommit():
        return
    if version is None:
        connection.execute("ROLLBACK")
        return
    connection.execute(f"UPDATE {_REPLICA} SET version = ?", (version,))
    connection.execute("COMMIT")


def apply_changes(
    connection: apsw.Connection,
    changes: list[dict[str, Any]],
    execute_ddl: Callable[[str, str], object],
) -> int:
    """Apply the journal's changes after this replica's version, in order, each whole in a
    transaction of its own; the version reached. A change that does not follow on is an
    error (the host sends them in order), as is one whose rows conflict (a replica that
    diverged: rebuild it from an image)."""
    version = replica_version(connection)
    for change in changes:
        number = int(change["version"])
        if number <= version:
            continue
        if number != version + 1:
            raise ValueError(f"change {number} does not follow version {version}")
        body = change["change"]
        with connection:
            if "ddl" in body:
                sql, params = body["ddl"]
                execute_ddl(sql, params)
            if "changeset" in body:
                apsw.Changeset.apply(
                    base64.b64decode(body["changeset"]), connection, conflict=_refuse_conflict
                )
            for run_id in body.get("forget", ()):
                connection.execute("DELETE FROM _qjsflow_applied WHERE run_id = ?", (run_id,))
            if "applied" in body:
                connection.execute(
                    "INSERT OR REPLACE INTO _qjsflow_applied (run_id, call_key, result)"
                    " VALUES (?, ?, ?)",
                    tuple(body["applied"]),
                )
            connection.execute(f"UPDATE {_REPLICA} SET version = ?", (number,))
        version = number
    return version


def _schema_version(connection: apsw.Connection) -> int:
    [row] = connection.execute("PRAGMA schema_version").fetchall()
    return _integer(row[0])


def _integer(value: object) -> int:
    assert isinstance(value, int)
    return value


def _tables(connection: apsw.Connection) -> set[str]:
    rows = connection.execute("SELECT name FROM sqlite_schema WHERE type = 'table'").fetchall()
    return {str(name) for (name,) in rows}


def _has_rows(connection: apsw.Connection, table: str) -> bool:
    quoted = table.replace('"', '""')
    return bool(connection.execute(f'SELECT EXISTS (SELECT 1 FROM "{quoted}")').fetchall()[0][0])


def _refuse_conflict(reason: int, change: Any) -> int:
    return apsw.SQLITE_CHANGESET_ABORT


def image(connection: apsw.Connection, path: Path) -> int:
    """Write a full copy of the database (its replica version with it) to `path`; that
    version."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    version = replica_version(connection)
    # SQLite's online backup, not VACUUM INTO: that attaches the target, and a scope's
    # connection may attach nothing (SQLITE_LIMIT_ATTACHED is 0).
    target = apsw.Connection(str(path))
    try:
        with target.backup("main", connection, "main") as backup:
            backup.step(-1)
    finally:
        target.close()
    os.chmod(path, 0o600)
    return version
