"""A PostgreSQL journal's connection: its statements pipelined on libpq itself.

The connection stays in libpq's pipeline mode: each statement is sent without waiting for
its answer, and the round trip is paid only where an answer is read (a row fetched, a row
count) or asked for (`sync`), and for a COMMIT, which is always answered before `execute`
returns. A statement's error comes with the next answer read or asked for: every part of a
transaction that must fail alone (a job of a group commit, a savepoint) asks (`sync`) before
it counts as done.

psycopg's cursors did this first, at 17-21 µs of the worker's compute a statement (a
cursor, its transformer and adapters made, the pipeline's queues walked, the socket polled),
against 3-6 here, the send itself most of it: the statement goes to psycopg's libpq wrapper
(`pq.PGconn`) at once, with its parameters dumped and its rows loaded by psycopg's own
transformer (so every value is adapted exactly as psycopg's cursors adapt it), and its errors
are psycopg's. A pure ten-step run sends 18 statements, a tool step six
(docs/performance-log.md, 2026-12-05).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections import OrderedDict, deque
from typing import Any

__all__ = ["PgConnection"]

# Statements kept prepared on the server, the least recently used deallocated past this
# (psycopg's own default keeps 100). The journal's statements are a few dozen texts; a batch
# of settled steps makes one more for each size it is sent at.
_PREPARED_MAX = 200

# Statements worth preparing (their plan is reused); the others (BEGIN, COMMIT, SET LOCAL,
# SAVEPOINT, NOTIFY, a migration's DDL) are parsed each time, as the server would anyway.
_PREPARED_VERBS = (b"SELECT", b"INSERT", b"UPDATE", b"DELETE", b"WITH")
# A statement that may change what a prepared one returns: every prepared one is dropped.
_SCHEMA_VERBS = (b"CREATE", b"ALTER", b"DROP")


# A prepared statement's errors that say the server no longer has it as it was prepared
# (deallocated by a pooler's reset; a result type changed under it): all are prepared again.
_PREPARED_LOST = ("26000", "0A000")


@functools.lru_cache(maxsize=1024)
def _statement(sql: str) -> tuple[bytes, bool, bool]:
    """A statement's text with its `?` placeholders as the server's own `$1, $2, …` (the
    journal's statements are written with `?` for both backends); whether it is worth
    preparing; whether it changes the schema."""
    first, *rest = sql.split("?")
    text = first + "".join(f"${n}{part}" for n, part in enumerate(rest, 1))
    verb = (text.split(None, 1) or [""])[0].upper().encode()
    return text.encode(), verb in _PREPARED_VERBS, verb in _SCHEMA_VERBS


class _Answer:
    """A statement's answer, read when asked for: reading it ends the batch sent so far with
    a sync, not a flush — the server then waits for this worker idle in its transaction
    (bounded by `idle_in_transaction_session_timeout`), not inside a batch that counts as
    one statement."""

    __slots__ = ("_connection", "_read", "error", "result")

    def __init__(self, connection: PgConnection) -> None:
        self._connection = connection
        self.result: Any = None
        self.error: BaseException | None = None
        self._read = 0

    def _answered(self) -> Any:
        if self.result is None and self.error is None:
            self._connection.sync()
        if self.error is not None:
            raise self.error
        return self.result

    def fetchone(self) -> Any:
        result = self._answered()
        if self._read >= result.ntuples:
            return None
        self._read += 1
        return self._connection.rows(result, self._read - 1, self._read)[0]

    def fetchall(self) -> list[Any]:
        result = self._answered()
        start, self._read = self._read, result.ntuples
        return self._connection.rows(result, start, result.ntuples)

    @property
    def rowcount(self) -> int:
        counted = self._answered().command_tuples
        return -1 if counted is None else int(counted)


class _Prepared:
    """A statement's preparation, answered like any command: if it did not happen (an error,
    or a batch aborted before it), the statement is prepared again when next sent."""

    __slots__ = ("key", "name")

    def __init__(self, key: tuple[bytes, Any], name: bytes) -> None:
        self.key, self.name = key, name


class _Deallocation:
    """A DEALLOCATE this connection sent itself: its answer is checked, not kept."""


_DEALLOCATION = _Deallocation()
_SYNC = None  # a sync's place among the answers awaited


class PgConnection:
    """psycopg's connection (`raw`: how it connects, closes and waits, green in a job:
    runner/store/green.py), its statements sent on libpq's pipeline by this class alone.
    `prepare`: statements are prepared on the server (not behind a transaction pooler, where
    the next transaction may find another server session)."""

    def __init__(self, raw: Any, *, prepare: bool = True) -> None:
        psycopg = importlib.import_module("psycopg")
        self._errors = psycopg.errors
        self._status = psycopg.pq.ExecStatus
        generators = importlib.import_module("psycopg.generators")
        self._send, self._fetch_many = generators.send, generators.fetch_many
        self._auto = psycopg.adapt.PyFormat.AUTO
        self.raw = raw
        self._pg = raw.pgconn
        self._transformer = psycopg.adapt.Transformer(raw)
        self._encoding = raw.info.encoding
        self._prepare = prepare
        self._prepared: OrderedDict[tuple[bytes, Any], bytes] = OrderedDict()
        self._names = 0
        self._awaited: deque[_Answer | _Prepared | _Deallocation | None] = deque()
        self._unsynced = False  # a statement was sent since the last sync
        self.statements_sent = 0  # (a read sent ahead is told by it)
        self.waits = 0  # round trips waited for (syncs): what a transaction costs the run
        self._lost = False  # a send or a wait failed: the connection is made again
        self._pg.enter_pipeline_mode()

    @property
    def broken(self) -> bool:
        return bool(self._lost or self.raw.closed or self._pg.status != 0)  # (CONNECTION_OK)

    def execute(self, sql: str, args: Any = ()) -> _Answer:
        if sql.startswith("ROLLBACK"):
            # After a failed statement the server skips what was sent behind it until told
            # the batch is over: tell it (the skipped statements' errors are the failure's).
            with contextlib.suppress(self._errors.Error):
                self.sync()
        self._unsynced = True
        self.statements_sent += 1
        query, worth_preparing, changes_schema = _statement(sql)
        pg, transformer = self._pg, self._transformer
        if args:
            params = transformer.dump_sequence(args, [self._auto] * len(args))
            types, formats = transformer.types, transformer.formats
        else:
            params, types, formats = None, None, None
        answer = _Answer(self)
        try:
            if self._prepare and worth_preparing:
                name = self._name(query, types)
                pg.send_query_prepared(name, params, param_formats=formats)
            else:
                pg.send_query_params(query, params, param_types=types, param_formats=formats)
            self._awaited.append(answer)
            if changes_schema and self._prepared:
                self._forget_prepared()
            if pg.flush():  # the rest once the socket takes it (reading the server meanwhile)
                self.raw.wait(self._send(pg))
        except BaseException:
            self._lost = True  # what was sent and what is awaited may no longer match
            raise
        if sql == "COMMIT":  # its outcome, and any error of a statement sent before it
            self.sync()
        return answer

    def executemany(self, sql: str, rows: Any) -> None:
        for row in rows:
            self.execute(sql, row)

    def _name(self, query: bytes, types: Any) -> bytes:
        """The name the statement is prepared under, prepared now (ahead of it, in the same
        batch) if it was not."""
        key = (query, types)
        name = self._prepared.get(key)
        if name is not None:
            self._prepared.move_to_end(key)
            return name
        if len(self._prepared) >= _PREPARED_MAX:
            _, oldest = self._prepared.popitem(last=False)
            self._pg.send_query_params(b"DEALLOCATE " + oldest, None)
            self._awaited.append(_DEALLOCATION)
        self._names += 1
        name = b"qjsflow_%d" % self._names
        self._pg.send_prepare(name, query, param_types=types)
        self._awaited.append(_Prepared(key, name))
        self._prepared[key] = name
        return name

    def _forget_prepared(self) -> None:
        """After a statement that changes the schema: nothing prepared before it is used
        again (psycopg's rule too: a prepared statement's result may no longer fit)."""
        self._prepared.clear()
        self._pg.send_query_params(b"DEALLOCATE ALL", None)
        self._awaited.append(_DEALLOCATION)

    def sync(self) -> None:
        """Wait for the answers of every statement sent; raise the first one's error."""
        if not self._unsynced:
            return
        self._unsynced = False
        self.waits += 1
        try:
            self._pg.pipeline_sync()
            self._awaited.append(_SYNC)
            self.raw.wait(self._send(self._pg))
            first = self._answers()
        except BaseException:
            self._lost = True  # (the server gone, or the socket: answers lost with it)
            raise
        if first is not None:
            raise first

    def _answers(self) -> BaseException | None:
        """Each answer awaited up to the sync, given to its statement: the first error."""
        first: BaseException | None = None
        while True:
            awaited = self._awaited.popleft()
            results = self.raw.wait(self._fetch_many(self._pg))
            if awaited is _SYNC:
                return first
            error = self._error(results[-1]) if results else None
            if isinstance(awaited, _Answer):
                awaited.result, awaited.error = (results[-1] if error is None else None), error
                if getattr(error, "sqlstate", None) in _PREPARED_LOST:
                    self._prepared.clear()  # (new names: none meets one the server kept)
            elif isinstance(awaited, _Prepared) and error is not None:
                self._unprepared(awaited)
            if first is None and error is not None:
                first = error

    def _unprepared(self, failed: _Prepared) -> None:
        """A preparation that did not happen: the statement is prepared again when next sent
        (unless the name was dropped already)."""
        if self._prepared.get(failed.key) == failed.name:
            del self._prepared[failed.key]

    def _error(self, result: Any) -> BaseException | None:
        status = result.status
        if status == self._status.FATAL_ERROR:
            return self._errors.error_from_result(result, encoding=self._encoding)  # type: ignore[no-any-return]
        if status == self._status.PIPELINE_ABORTED:
            return self._errors.PipelineAborted("pipeline aborted")  # type: ignore[no-any-return]
        return None

    def rows(self, result: Any, start: int, end: int) -> list[Any]:
        transformer = self._transformer
        transformer.set_pgresult(result)
        rows: list[Any] = transformer.load_rows(start, end, tuple)
        return rows

    def close(self) -> None:
        self.raw.close()

    @property
    def in_transaction(self) -> bool:
        return bool(self._pg.transaction_status != 0)  # (libpq's PQTRANS_IDLE)
