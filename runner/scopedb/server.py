"""The scope-database process: runs author SQL through APSW's bundled SQLite, one statement per
call, hardened, and records each applied call in the same transaction as its statement.

Started by `ScopeDatabases` as `python -I -m qjsflow.runner.scopedb.server ROOT` with an empty
environment. It speaks length-prefixed JSON frames on stdin/stdout: a request
`{scope, runId, call, sql, params, deadlineS, limits}` gets `{ok: {result, elapsedS}}` or
`{error: {code, message, elapsedS}}`; `{scope, forget: [runId…], limits}` drops the records of
pruned runs. Each scope's file is `ROOT/<scope>.sqlite`; the scope id is
validated by the host before a request is sent, and again here.

Exactly once: `_qjsflow_applied(run_id, call_key, result)` lives in the scope's own database.
A call first looks its key up there; if present, the stored result is returned and nothing
runs again. Otherwise the author's statement and the applied row commit together.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import apsw

from qjsflow.bridge.codec import dumps, loads
from qjsflow.bridge.values import JsValue, from_python, to_python
from qjsflow.runner.scopedb import replica
from qjsflow.runner.scopedb.policy import MIN_SQLITE_VERSION, SqlLimits
from qjsflow.sandbox.confine import confine_paths
from qjsflow.sandbox.frames import frame, read_frame_fd

_SCOPE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
_PRIVATE = "_qjsflow"
_DDL = {
    apsw.SQLITE_CREATE_TABLE, apsw.SQLITE_CREATE_INDEX, apsw.SQLITE_CREATE_VIEW,
    apsw.SQLITE_DROP_TABLE, apsw.SQLITE_DROP_INDEX, apsw.SQLITE_DROP_VIEW,
}  # fmt: skip
_DML = {apsw.SQLITE_INSERT, apsw.SQLITE_UPDATE, apsw.SQLITE_DELETE, apsw.SQLITE_READ}
_READS = {apsw.SQLITE_SELECT, apsw.SQLITE_RECURSIVE, apsw.SQLITE_READ, apsw.SQLITE_FUNCTION}
_DENIED_FUNCTIONS = {
    "load_extension", "readfile", "writefile", "edit", "fts3_tokenizer", "sqlite_dbpage",
    "sqlite_offset", "unlikely_host_access",
}  # fmt: skip


class SqlFailure(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _Authorizer:
    """The allowlist: plain DML and DDL on the scope's own tables, and nothing else. It keeps
    what it last refused, so the error can say what was not allowed."""

    def __init__(self, read_only: bool = False, *, replica: bool = False) -> None:
        self.refused: str | None = None
        self.read_only = read_only  # the snapshot declares `sql: read`
        self.wrote = False  # refused because the statement would write
        # A replica's statement runs under a SQLite session, which reads a table's columns
        # (`PRAGMA table_xinfo`, read-only) as the statement first writes it (replica.py).
        self.replica = replica

    def __call__(
        self, op: int, first: str | None, second: str | None, db: str | None, _: Any
    ) -> int:
        if self.replica and op == apsw.SQLITE_PRAGMA and first == "table_xinfo" and db == "main":
            return apsw.SQLITE_OK
        verdict = _authorize(op, first, second, db)
        if verdict == apsw.SQLITE_OK and self.read_only and op not in _READS:
            verdict = apsw.SQLITE_DENY
            self.wrote = True
        if verdict != apsw.SQLITE_OK and self.refused is None:
            action = str(apsw.mapping_authorizer_function.get(op, op)).removeprefix("SQLITE_")
            subject = second if op == apsw.SQLITE_FUNCTION else first
            if op in (apsw.SQLITE_ATTACH, apsw.SQLITE_DETACH):
                subject = None  # a file name: not echoed back
            self.refused = f"{action} {subject}" if subject else action
        return verdict


def _authorize(op: int, first: str | None, second: str | None, db: str | None) -> int:
    if op in (apsw.SQLITE_SELECT, apsw.SQLITE_RECURSIVE):
        return apsw.SQLITE_OK
    if op in _DML:
        if db not in (None, "main") or (first or "").lower().startswith(_PRIVATE):
            return apsw.SQLITE_DENY
        return apsw.SQLITE_OK
    if op in _DDL:
        if db not in (None, "main") or (first or "").lower().startswith((_PRIVATE, "sqlite_")):
            return apsw.SQLITE_DENY
        return apsw.SQLITE_OK
    if op == apsw.SQLITE_ALTER_TABLE:
        return apsw.SQLITE_DENY if (second or "").lower().startswith(_PRIVATE) else apsw.SQLITE_OK
    if op == apsw.SQLITE_FUNCTION:
        return apsw.SQLITE_DENY if (second or "").lower() in _DENIED_FUNCTIONS else apsw.SQLITE_OK
    if op == apsw.SQLITE_REINDEX:
        return apsw.SQLITE_OK
    # ATTACH (and VACUUM INTO), DETACH, PRAGMA (and pragma_* functions), transactions,
    # savepoints, triggers, virtual tables, temp objects, ANALYZE: denied.
    return apsw.SQLITE_DENY


class ScopeServer:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.connections: OrderedDict[str, apsw.Connection] = OrderedDict()

    def connection(self, scope: str, limits: SqlLimits) -> apsw.Connection:
        if not _SCOPE.fullmatch(scope):
            raise SqlFailure("bad_scope", "invalid scope id")
        if scope in self.connections:
            self.connections.move_to_end(scope)
            return self.connections[scope]
        path = self.root / f"{scope}.sqlite"
        flags = apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE | apsw.SQLITE_OPEN_NOFOLLOW
        connection = apsw.Connection(str(path), flags=flags)
        # Another process may hold the file's write lock (two workers on one machine share
        # the scope folder): waited for, up to a bound, never an error at once.
        connection.set_busy_timeout(int(limits.busy_wait_s * 1000))
        _harden(connection, limits)
        self.connections[scope] = connection
        while len(self.connections) > limits.cached_connections:
            _, oldest = self.connections.popitem(last=False)
            oldest.close()
        return connection

    def execute(self, request: dict[str, Any]) -> dict[str, Any]:
        if "forget" in request:
            return self.forget(request)
        limits = SqlLimits(**request["limits"])
        started = time.monotonic()
        try:
            connection = self.connection(request["scope"], limits)
            if "replica" in request:  # a replica's own business (replica.py)
                return {"ok": self.replica(request["scope"], connection, request["replica"])}
            if request.get("replicated"):
                held = replica.run_held(
                    connection, request, lambda: _run_statement(connection, request, limits)
                )
                return {"ok": {**held, "elapsedS": time.monotonic() - started}}
            result = _apply(connection, request, limits)
            return {"ok": {"result": result, "elapsedS": time.monotonic() - started}}
        except SqlFailure as failure:
            code, message = failure.code, failure.message
        except apsw.Error as error:  # opening, hardening: another process's lock, say
            translated = _translate(error, limits)
            code, message = translated.code, translated.message
        except replica.DdlWithRows:
            code = "not_authorized"
            message = (
                "a statement that changes the schema and writes rows at once (CREATE "
                "TABLE ... AS SELECT) is not replicated: create the table, then INSERT"
            )
        except UnicodeDecodeError:
            code = "bad_text"
            message = "a result holds text that is not valid UTF-8: CAST it to BLOB"
        except (OverflowError, ValueError, TypeError, MemoryError) as error:
            # Whatever else hostile SQL or parameters provoke is the call's error, coded,
            # never this process's crash (and never a traceback on anyone's terminal).
            code, message = "error", f"the statement failed ({type(error).__name__})"
        return {"error": {"code": code, "message": message,
                          "elapsedS": time.monotonic() - started}}  # fmt: skip

    def replica(self, scope: str, connection: apsw.Connection, asked: dict[str, Any]) -> Any:
        """What the host asks of a replica: its version, a held call's end, the journal's
        changes to apply, an image written to a file, or the database replaced by one."""
        match asked.get("op"):
            case "version":
                with connection:
                    return {"version": replica.replica_version(connection)}
            case "finish":
                replica.finish(connection, asked.get("version"))
                return {}
            case "apply":
                return {"version": replica.apply_changes(
                    connection, asked["changes"],
                    lambda sql, params: connection.execute(sql, _params(params)),
                )}  # fmt: skip
            case "image":
                return {"version": replica.image(connection, self.root / _file(asked["file"]))}
            case "restore":
                connection.close()
                del self.connections[scope]
                target = self.root / f"{scope}.sqlite"
                for suffix in ("-wal", "-shm"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(f"{target}{suffix}")
                os.replace(self.root / _file(asked["file"]), target)
                return {}
        raise SqlFailure("bad_request", "unknown replica request")

    def forget(self, request: dict[str, Any]) -> dict[str, Any]:
        """Drop the applied-call records of pruned runs (a run id used again later must not
        find the old run's calls applied)."""
        limits = SqlLimits(**request["limits"])
        run_ids = [str(run_id) for run_id in request["forget"]]
        try:
            connection = self.connection(request["scope"], limits)
            with connection:
                connection.executemany(
                    "DELETE FROM _qjsflow_applied WHERE run_id = ?", [(r,) for r in run_ids]
                )
        except (apsw.Error, SqlFailure) as error:
            failure = error if isinstance(error, SqlFailure) else _translate(error, limits)
            return {"error": {"code": failure.code, "message": failure.message, "elapsedS": 0.0}}
        return {"ok": {"result": None, "elapsedS": 0.0}}


def _harden(connection: apsw.Connection, limits: SqlLimits) -> None:
    connection.config(apsw.SQLITE_DBCONFIG_DEFENSIVE, 1)
    connection.config(apsw.SQLITE_DBCONFIG_TRUSTED_SCHEMA, 0)
    connection.config(apsw.SQLITE_DBCONFIG_ENABLE_LOAD_EXTENSION, 0)
    connection.config(apsw.SQLITE_DBCONFIG_ENABLE_TRIGGER, 0)
    connection.config(apsw.SQLITE_DBCONFIG_DQS_DML, 0)
    connection.config(apsw.SQLITE_DBCONFIG_DQS_DDL, 0)
    for limit, value in (
        (apsw.SQLITE_LIMIT_ATTACHED, 0),
        (apsw.SQLITE_LIMIT_LENGTH, limits.max_length),
        (apsw.SQLITE_LIMIT_SQL_LENGTH, limits.max_sql_length),
        (apsw.SQLITE_LIMIT_EXPR_DEPTH, limits.max_expr_depth),
        (apsw.SQLITE_LIMIT_COMPOUND_SELECT, limits.max_compound_select),
        (apsw.SQLITE_LIMIT_COLUMN, limits.max_columns),
        (apsw.SQLITE_LIMIT_VARIABLE_NUMBER, limits.max_variables),
        (apsw.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, limits.max_like_pattern),
        (apsw.SQLITE_LIMIT_TRIGGER_DEPTH, limits.max_trigger_depth),
    ):
        connection.limit(limit, value)
    for pragma in (
        "PRAGMA journal_mode = WAL",
        "PRAGMA synchronous = FULL",
        "PRAGMA trusted_schema = OFF",
        f"PRAGMA max_page_count = {int(limits.max_pages)}",
        "CREATE TABLE IF NOT EXISTS _qjsflow_applied ("
        " run_id TEXT NOT NULL, call_key TEXT NOT NULL, result TEXT NOT NULL,"
        " PRIMARY KEY (run_id, call_key))",
    ):
        connection.execute(pragma)


def _apply(connection: apsw.Connection, request: dict[str, Any], limits: SqlLimits) -> str:
    run_id, call = request["runId"], request["call"]
    params = _params(request["params"])
    try:
        connection.execute("BEGIN IMMEDIATE")  # waits for another process's lock (bounded)
        applied = replica.applied_result(connection, run_id, call)
        if applied is not None:
            connection.execute("COMMIT")
            return applied
        result = _run_author_statement(
            connection, request["sql"], params, limits=limits,
            deadline=time.monotonic() + float(request["deadlineS"]),  # after the lock wait
            read_only=bool(request.get("readOnly")),
        )  # fmt: skip
        connection.execute(
            "INSERT INTO _qjsflow_applied (run_id, call_key, result) VALUES (?, ?, ?)",
            (run_id, call, result),
        )
        connection.execute("COMMIT")
        return result
    except BaseException as error:
        if not connection.get_autocommit():
            connection.execute("ROLLBACK")
        if isinstance(error, SqlFailure):
            raise
        if isinstance(error, apsw.Error):
            raise _translate(error, limits) from None
        raise


def _run_statement(connection: apsw.Connection, request: dict[str, Any], limits: SqlLimits) -> str:
    """A replicated call's statement, in the transaction its replica holds open."""
    try:
        return _run_author_statement(
            connection, request["sql"], _params(request["params"]), limits=limits,
            deadline=time.monotonic() + float(request["deadlineS"]),
            read_only=bool(request.get("readOnly")), replica=True,
        )  # fmt: skip
    except apsw.Error as error:
        raise _translate(error, limits) from None


def _file(name: object) -> str:
    """A file the host names in the scope folder: a plain name, never a path."""
    if not isinstance(name, str) or not re.fullmatch(r"\.[a-z0-9_-]{1,80}\.(image|restore)", name):
        raise SqlFailure("bad_request", "not a replica file name")
    return name


def _run_author_statement(
    connection: apsw.Connection,
    sql: str,
    params: list[Any],
    *,
    limits: SqlLimits,
    deadline: float,
    read_only: bool = False,
    replica: bool = False,
) -> str:
    size = len(sql.encode("utf-8", "surrogatepass"))
    if size > limits.max_sql_length:
        raise SqlFailure(
            "too_big", f"the SQL text is {size} bytes; the limit is {limits.max_sql_length} bytes"
        )
    statements = 0

    def one_statement(cursor: Any, text: str, bindings: Any) -> bool:
        nonlocal statements
        statements += 1
        if statements > 1:
            raise SqlFailure("multiple_statements", "db.sql runs one statement per call")
        return True

    connection.set_progress_handler(lambda: time.monotonic() > deadline, 1000)
    authorizer = _Authorizer(read_only, replica=replica)
    connection.authorizer = authorizer
    before = connection.total_changes()
    try:
        cursor = connection.cursor()
        cursor.exec_trace = one_statement
        rows: list[dict[str, Any]] = []
        names: list[str] | None = None
        for row in cursor.execute(sql, params):
            if names is None:
                names = [column[0] for column in cursor.get_description()]
            if len(rows) >= limits.max_rows:
                raise SqlFailure("too_big", f"the result has more than {limits.max_rows} rows")
            rows.append(dict(zip(names, row, strict=True)))
        changes = connection.total_changes() - before
    except apsw.Error as error:
        if authorizer.wrote:
            raise SqlFailure(
                "capability_denied",
                f"{(authorizer.refused or 'a write').lower()}: db.sql may only read (the"
                " snapshot declares sql: read): denied",
            ) from None
        if authorizer.refused is not None:
            raise SqlFailure(
                "not_authorized", f"{authorizer.refused.lower()} is not allowed in db.sql"
            ) from None
        raise _translate(error, limits) from None
    finally:
        connection.authorizer = None
        connection.set_progress_handler(None)
    result = {
        "rows": rows,
        "changes": changes,
        "lastInsertRowid": connection.last_insert_rowid() if changes else 0,
    }
    try:
        return from_python(result, max_bytes=limits.max_result_bytes, what="the result")
    except ValueError:
        raise SqlFailure(
            "too_big", f"the result is larger than {limits.max_result_bytes} bytes"
        ) from None


def _params(encoded: str) -> list[Any]:
    values = to_python(encoded)
    if not isinstance(values, list):
        raise SqlFailure("bad_params", "params must be an array")
    bound: list[Any] = []
    for index, value in enumerate(values):
        plain = int(value) if isinstance(value, bool) else value
        if isinstance(plain, int) and not -(2**63) <= plain < 2**63:
            raise SqlFailure("bad_params", f"params[{index}] is an integer beyond 64 bits")
        if isinstance(plain, str):
            try:
                plain.encode("utf-8")
            except UnicodeEncodeError:
                raise SqlFailure(
                    "bad_params", f"params[{index}] is a string with a lone surrogate"
                ) from None
        if plain is not None and not isinstance(plain, int | float | str | bytes):
            kind = plain.tag if isinstance(plain, JsValue) else type(plain).__name__
            raise SqlFailure("bad_params", f"params[{index}] is a {kind}; "
                             "use null, a number, a string or a Uint8Array")  # fmt: skip
        bound.append(plain)
    return bound


def _translate(error: apsw.Error, limits: SqlLimits) -> SqlFailure:
    message = str(error).removeprefix(f"{type(error).__name__}: ")[:500]
    match error:
        case apsw.AuthError():
            return SqlFailure("not_authorized", f"not authorized: {message}")
        case apsw.InterruptError():
            return SqlFailure("interrupted", "the statement ran past its deadline and was stopped")
        case apsw.TooBigError():  # SQLite says only "string or blob too big"
            return SqlFailure(
                "too_big",
                f"a string or blob made by the statement is longer than {limits.max_length} "
                "bytes, the limit of a value in a scope database (SqlLimits.max_length, set by "
                "the operator)",
            )
        case apsw.FullError():
            return SqlFailure("quota", "the scope's database is full (its page quota is reached)")
        case apsw.ConstraintError():
            return SqlFailure("constraint", message)
        case apsw.ExecTraceAbort():
            return SqlFailure("multiple_statements", "db.sql runs one statement per call")
        case apsw.SQLError() if "may not be modified" in message or "authoriz" in message:
            return SqlFailure("not_authorized", message)
        case apsw.SQLError() if "cannot VACUUM" in message or "attached databases" in message:
            return SqlFailure("not_authorized", "VACUUM and ATTACH are not allowed in db.sql")
        case apsw.SQLError():
            return SqlFailure("syntax", message)
        case apsw.BusyError() | apsw.LockedError():
            return SqlFailure(
                "busy",
                f"another process held the scope database's lock for more than "
                f"{limits.busy_wait_s:g} s (SqlLimits.busy_wait_s): {message}",
            )
    return SqlFailure("error", message)


def main() -> None:
    if tuple(int(p) for p in apsw.sqlite_lib_version().split(".")[:3]) < MIN_SQLITE_VERSION:
        sys.exit(f"SQLite {apsw.sqlite_lib_version()} is older than 3.50.2; upgrade apsw")
    root = Path(sys.argv[1])
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    server = ScopeServer(root)
    out = os.dup(1)
    os.dup2(2, 1)
    # Files beneath the scope folder only (and the interpreter's own, read-only, for a late
    # import), no TCP: a hostile statement that escaped SQLite's authorizer would gain nothing.
    readable = [sys.prefix, sys.base_prefix, *sys.path]
    layers = confine_paths([(str(root.resolve()), "write"), *((p, "read") for p in readable)])
    os.write(out, frame(dumps({"ready": True, "layers": layers.as_wire()})))
    while True:
        payload = read_frame_fd(0)
        if payload is None:
            return
        request = loads(payload, max_depth=None)
        # The answer repeats the request's id: the host matches them (client.py).
        reply = dumps({**server.execute(request), "id": request.get("id")})
        view = memoryview(frame(reply))
        while view:
            view = view[os.write(out, view) :]


if __name__ == "__main__":
    main()
