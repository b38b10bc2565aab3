"""The two journal backends behind one contract: a connection whose work runs as one job.

`JournalStore` holds the semantics (group commit, fencing, every statement in
`JournalTransaction`); a backend only says how a job reaches its database and the few places
the SQL dialects differ. SQLite (sqlite3, the embedded default; its
connection on a thread of its own, `JobThread`) and PostgreSQL (psycopg; its jobs on the event
loop's thread, `runner/store/green.py`) run transactions as synchronous functions, one job
each. The database URL chooses: a path or `sqlite:///path`, or `postgresql://…`.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import sqlite3
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, TypeVar

from qjsflow.runner.errors import JournalUnavailable
from qjsflow.runner.store.connection import JobThread, connect_sqlite
from qjsflow.runner.store.dialect import POSTGRES, SQLITE, Dialect
from qjsflow.runner.store.migrations import migrate
from qjsflow.runner.store.pg_connection import PgConnection
from qjsflow.runner.store.pg_schema import PG_MIGRATIONS
from qjsflow.runner.store.wal_mark import WalMarks

__all__ = ["Backend", "Dialect", "is_postgres_url", "open_backend", "transaction_pooled"]

T = TypeVar("T")


class Connection(Protocol):
    """What `JournalTransaction` needs of a DB-API connection, in `?` placeholder style."""

    def execute(self, sql: str, args: Any = ...) -> Any: ...
    def executemany(self, sql: str, rows: Any) -> Any: ...


class Backend(Protocol):
    dialect: Dialect

    def is_transient(self, error: BaseException) -> bool: ...
    def is_refusal(self, error: BaseException) -> bool:
        """Whether the database refused a statement (rather than the work raising an error of
        its own): what tells that a transaction's presumption did not hold."""

    async def run(self, work: Callable[[Any], T]) -> T: ...
    async def transaction(self, work: Callable[[Any], T], *, here: bool) -> T: ...
    async def read(self, work: Callable[[Any], T], *, here: bool) -> T: ...
    async def all(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]: ...
    def begin(self, connection: Any, full: bool, write: bool = True) -> None: ...
    def mark(self) -> bytes | None: ...
    def trace(self, callback: Callable[[str], None] | None) -> None: ...
    async def close(self) -> None: ...

    @property
    def wake_source(self) -> str | None:
        """Where a worker listens for runs made claimable (None: it polls)."""

    @property
    def marks(self) -> bool: ...

    @property
    def marks_commits(self) -> bool: ...


def is_postgres_url(location: str | Path) -> bool:
    return str(location).startswith(("postgresql://", "postgres://"))


async def open_backend(location: str | Path, *, create: bool = True) -> Backend:
    """The backend for a location; without `create`, a missing or empty journal is refused
    and nothing is written (read-only commands)."""
    if is_postgres_url(location):
        return await PostgresBackend.open(str(location), create=create)
    text = str(location)
    path = Path(text.removeprefix("sqlite:///")) if text.startswith("sqlite:///") else Path(text)
    return await SqliteBackend.open(path, create=create)


# What a SQLite write can meet that goes away by itself: another process holding the write
# lock past the busy timeout, a full disk, an I/O error of the moment.
_SQLITE_TRANSIENT = (
    "database is locked", "database table is locked", "disk i/o error",
    "database or disk is full", "unable to open database file", "readonly database",
)  # fmt: skip


class SqliteBackend:
    dialect = SQLITE
    marks = True  # `mark`: its WAL-index header
    wake_source = None  # workers on one machine poll its file
    marks_commits = False  # a local COMMIT is answered or the process is gone with it

    def is_transient(self, error: BaseException) -> bool:
        text = str(error).lower()
        transient = isinstance(error, sqlite3.OperationalError) and any(
            fault in text for fault in _SQLITE_TRANSIENT
        )
        if transient and "readonly" in text:
            # SQLite opened (or reopened) the file read-only, and stays so: a new connection
            # is made before the next try, which writes once the file can be written again.
            self._reopen = True
        return transient

    @staticmethod
    def is_refusal(error: BaseException) -> bool:
        return isinstance(error, sqlite3.Error)

    def __init__(self, thread: JobThread, connection: sqlite3.Connection, path: Path) -> None:
        self._thread = thread
        self._path = path
        self._db = connection
        self._reopen = False
        # The file this process opened: a path that comes to name another (a backup renamed
        # over it) or an emptied one is noticed before every write (`_same_file`).
        self._opened = _identity(path)
        self._marks = WalMarks(path)
        self._full = True  # connect_sqlite() sets synchronous=FULL
        # How long the connection waits for another process's lock (connect_sqlite's busy
        # timeout), and whether it does now: not while used on the event loop's thread.
        self._busy_ms = int(connection.execute("PRAGMA busy_timeout").fetchone()[0])
        self._waits = True

    @classmethod
    async def open(cls, path: Path, *, create: bool = True) -> SqliteBackend:
        if not create and not path.is_file():
            raise JournalUnavailable(str(path), "does not exist: publish something first")
        if not create and path.stat().st_size == 0:  # opening it would write a header
            raise JournalUnavailable(str(path), "is empty (0 bytes): it holds no journal")
        thread = JobThread("qjsflow-sqlite")
        try:
            connection = await thread.run(partial(connect_sqlite, path, writer=create))
        except BaseException as error:
            thread.stop()
            if isinstance(error, sqlite3.OperationalError) and "readonly" in str(error):
                raise JournalUnavailable(str(path), READ_ONLY) from None
            raise
        backend = cls(thread, connection, path)
        try:
            await backend.run(partial(migrate, location=str(path), dialect=SQLITE, create=create))
        except BaseException:
            await backend.close()
            raise
        return backend

    async def run(self, work: Callable[[Any], T]) -> T:
        return await self._thread.run(self._waiting, work)

    def _waiting(self, work: Callable[[Any], T]) -> T:
        if self._reopen:  # on the journal's thread, between jobs
            self._db.close()
            self._db = connect_sqlite(self._path)  # refuses a read-only open: tried again
            self._reopen, self._full, self._waits = False, True, True
        self._wait_for_locks(True)
        return work(self._db)

    def _wait_for_locks(self, wait: bool) -> None:
        """The busy timeout: set only when it changes (between a run of transactions on the
        event loop's thread and jobs on the journal's), so neither pays a statement a job."""
        if wait != self._waits:
            self._db.execute(f"PRAGMA busy_timeout = {self._busy_ms if wait else 0}")
            self._waits = wait

    async def transaction(self, work: Callable[[Any], T], *, here: bool) -> T:
        """A write transaction (`work` opens it with `begin`). With `here`, while the journal's
        thread has no job, it runs on the calling thread — the event loop's, which would
        only wait for it: handing it over and back is two wake-ups, ~0.2 ms each on a small
        idle machine. There it never waits for another process's write lock (a blocked event
        loop would stall every other task): locked, it goes to the journal's thread, which
        waits as usual."""
        if here and self._thread.idle and not self._reopen:
            self._wait_for_locks(False)
            try:
                return work(self._db)
            except _LockedHere:
                pass  # nothing ran
        return await self.run(work)

    async def read(self, work: Callable[[Any], T], *, here: bool) -> T:
        """`work` that only reads, outside any transaction: with `here`, where `transaction`
        would run it (a reader that would wait, as while another process recovers the
        journal, goes to the journal's thread, as a locked `begin` does)."""
        return await self.transaction(partial(self._read_no_wait, work), here=here)

    def _read_no_wait(self, work: Callable[[Any], T], connection: Any) -> T:
        try:
            return work(connection)
        except sqlite3.OperationalError as error:
            if not self._waits and "locked" in str(error):
                raise _LockedHere from error  # nothing ran: to the journal's thread
            raise

    async def all(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        return await self.run(lambda c: c.execute(sql, args).fetchall())

    def begin(self, connection: Any, full: bool, write: bool = True) -> None:
        """Open a write transaction whose commit is fsynced when `full`; without `write`, one
        that only reads (it sees the journal as of its first read and takes no lock)."""
        if write:
            self._same_file()
        if full != self._full:  # only outside a transaction: SQLite refuses it inside one
            connection.execute(f"PRAGMA synchronous = {'FULL' if full else 'NORMAL'}")
            self._full = full
        try:
            connection.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        except sqlite3.OperationalError as error:
            if not self._waits and "locked" in str(error):  # on the loop's thread: go to the
                raise _LockedHere from error  # journal's, which waits (`transaction`)
            raise

    def mark(self) -> bytes | None:
        """The journal's WAL-index header now (runner/store/wal_mark.py): the same later only
        if nothing was committed between."""
        return self._marks.mark()

    def trace(self, callback: Callable[[str], None] | None) -> None:
        self._db.set_trace_callback(callback)

    def _same_file(self) -> None:
        """Refuse to write when the journal's path no longer names the file this process
        opened, or names it emptied: its pages still in memory and the WAL would go on being
        written beside a journal nobody reads, and tools called that it records nowhere."""
        now, opened = _identity(self._path), self._opened
        if now is not None and opened is not None and now[:2] == opened[:2] and now[2] > 0:
            return
        if now is None:
            happened = "is gone"
        elif opened is not None and now[:2] == opened[:2]:
            happened = "was emptied"
        else:
            happened = "now names another file (replaced: a backup renamed over it?)"
        raise JournalUnavailable(
            str(self._path),
            f"{happened} since this process opened it: it writes nothing more; restart it on "
            "the journal as it is now",
        )

    async def close(self) -> None:
        await self._thread.run(self._db.close)
        self._thread.stop()
        self._marks.close()


READ_ONLY = (
    "cannot be written by this process (the file or its folder is read-only): a worker, "
    "or any command that changes runs, needs to write it"
)


def _identity(path: Path) -> tuple[int, int, int] | None:
    """The file `path` names (device, inode) and its size; None when there is none."""
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return None
    return found.st_dev, found.st_ino, found.st_size


def _psycopg() -> ModuleType:
    """psycopg, imported only when a postgresql:// journal is opened (`qjsflow[postgres]`)."""
    return _postgres_module("psycopg")


def _postgres_module(name: str) -> ModuleType:
    """A module of the `qjsflow[postgres]` extra (psycopg, greenlet), or what to install."""
    try:
        return importlib.import_module(name)
    except ImportError:
        raise JournalUnavailable(
            "the given database URL",
            "needs PostgreSQL support: install it with `pip install 'qjsflow[postgres]'`",
        ) from None


class _LockedHere(Exception):
    """Another process holds the write lock, and the transaction is on the event loop's
    thread, which must not wait for it."""


# What bounds a worker's server session, so that a worker lost in the middle of a transaction
# (its machine gone, its link cut, its process frozen) holds no lock past about its lease: the
# server ends a session idle in a transaction, or a statement, past these; TCP keepalives and
# the user timeout end a connection whose peer is gone. A parameter in the journal's URL wins.
PG_SESSION_BOUNDS = {
    "keepalives": "1", "keepalives_idle": "5", "keepalives_interval": "2",
    "keepalives_count": "3", "tcp_user_timeout": "10000",
}  # fmt: skip
# The server's side: it ends a session idle in a transaction or a statement past these, and
# its own keepalives and user timeout drop a connection whose worker's link is cut.
PG_SERVER_BOUNDS = (
    "-c idle_in_transaction_session_timeout=10000 -c statement_timeout=60000"
    " -c tcp_keepalives_idle=5 -c tcp_keepalives_interval=2 -c tcp_keepalives_count=3"
    " -c tcp_user_timeout=10000"
)


_POOLED = "qjsflow_pooling=transaction"


def transaction_pooled(url: str) -> tuple[str, bool]:
    """The URL without qjsflow's own `qjsflow_pooling=transaction` parameter (a journal
    reached through PgBouncer's transaction pooling: docs/OPERATIONS.md), and whether it had
    it. libpq knows no such parameter, so it is taken out before any connection."""
    base, question, query = url.partition("?")
    if not question:
        return url, False
    kept = [part for part in query.split("&") if part and part != _POOLED]
    pooled = len(kept) != len([part for part in query.split("&") if part])
    return (base + ("?" + "&".join(kept) if kept else "")), pooled


def _bounded(url: str) -> str:
    """The URL's connection string with the session bounds it does not set itself (its own
    `options` come after ours, and so win)."""
    conninfo = importlib.import_module("psycopg.conninfo")
    given = conninfo.conninfo_to_dict(url)
    options = " ".join(part for part in (PG_SERVER_BOUNDS, given.get("options")) if part)
    return str(conninfo.make_conninfo("", **{**PG_SESSION_BOUNDS, **given, "options": options}))


# SQLSTATEs of faults that pass: read_only_sql_transaction, serialization_failure,
# deadlock_detected, admin_shutdown, crash_shutdown, cannot_connect_now; and whole classes:
# connection exceptions (08) and insufficient resources (53: too many connections, a full disk).
_PG_TRANSIENT_STATES = frozenset({"25006", "40001", "40P01", "57P01", "57P02", "57P03"})
_PG_TRANSIENT_CLASSES = frozenset({"08", "53"})


class PostgresBackend:
    dialect = POSTGRES
    marks = False  # `mark` is always None
    # A COMMIT can reach the server while its answer is lost: each writes a mark to look for
    # (runner/store/journal.py, `_commit_marked`).
    marks_commits = True

    @staticmethod
    def is_transient(error: BaseException) -> bool:
        """A fault that passes by itself, told by its SQLSTATE (not its exception type): a
        dropped connection, a server restarting or shutting down, too many connections, a
        serialization failure or deadlock, and a server that is read-only for now (what a
        demoted primary answers during a failover)."""
        if isinstance(error, _psycopg().OperationalError):
            return True
        state = getattr(error, "sqlstate", None)
        return isinstance(state, str) and (
            state in _PG_TRANSIENT_STATES or state[:2] in _PG_TRANSIENT_CLASSES
        )

    @staticmethod
    def is_refusal(error: BaseException) -> bool:
        return isinstance(error, _psycopg().Error)

    def __init__(self, url: str) -> None:
        self._url, self._pooled = transaction_pooled(url)
        self._connection: PgConnection | None = None  # made before the first job
        self._one_job = asyncio.Lock()  # one job at a time on the connection, in order
        _psycopg()  # says how to install it, if it is not
        self._green = _postgres_module("qjsflow.runner.store.green")  # it needs greenlet

    @property
    def wake_source(self) -> str | None:
        """The server a worker LISTENs on (runner/store/wakeups.py), bounded as its journal
        connection is; None behind a transaction pooler, which keeps no session to listen
        on (workers poll)."""
        return None if self._pooled else _bounded(self._url)

    @classmethod
    async def open(cls, url: str, *, create: bool = True) -> PostgresBackend:
        backend = cls(url)
        try:
            await backend.run(
                partial(
                    migrate, location="the given database URL", dialect=POSTGRES,
                    migrations=PG_MIGRATIONS, create=create,
                )
            )  # fmt: skip
        except BaseException:
            await backend.close()
            raise
        return backend

    def trace(self, callback: Callable[[str], None] | None) -> None:
        raise ValueError("statement traces are a SQLite journal's (use pg_stat_statements)")

    async def run(self, work: Callable[[Any], T]) -> T:
        """`work` on the event loop's thread, its waits for the server the loop's
        (runner/store/green.py): neither a thread hop each way nor a stalled loop."""
        async with self._one_job:
            connection = await self._connected()
            done: T = await self._green.run_green(work, connection)
            return done

    async def transaction(self, work: Callable[[Any], T], *, here: bool) -> T:
        return await self.run(work)

    async def read(self, work: Callable[[Any], T], *, here: bool) -> T:
        return await self.run(work)

    async def _connected(self) -> PgConnection:
        """The connection, made on a thread (a connect waits for the server as psycopg does).
        One the server dropped (a restart, a failover) is replaced before the job: the job
        that met the drop failed and was rolled back."""
        current = self._connection
        if current is None or current.broken:
            current = await asyncio.to_thread(self._connect)
            self._connection = current
        return current

    def _connect(self) -> PgConnection:
        # Behind a transaction pooler a statement prepared on one server session may be run
        # on another: nothing is prepared.
        connect = self._green.green_connection_class().connect
        return PgConnection(connect(_bounded(self._url), autocommit=True),
                            prepare=not self._pooled)  # fmt: skip

    async def all(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        rows: list[Any] = await self.run(lambda c: c.execute(sql, args).fetchall())
        return rows

    def begin(self, connection: Any, full: bool, write: bool = True) -> None:
        """Open a transaction whose commit waits for the WAL flush when `full` (one that only
        reads, without `write`, is the same to the server)."""
        connection.execute("BEGIN")
        if not full:
            connection.execute("SET LOCAL synchronous_commit = off")

    def mark(self) -> bytes | None:
        """None: a server tells no one what was committed since (every check reads)."""
        return None

    async def close(self) -> None:
        async with self._one_job:  # after the jobs before it (one may replace the connection)
            if self._connection is not None:
                await self._green.run_green(self._connection.close)
