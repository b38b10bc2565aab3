"""A journal connection's own thread, and opening a SQLite journal: the one place the SQLite
pragmas are set.

A SQLite journal's connection lives on one thread of its own; a job (a whole transaction, a
synchronous function) reaches it in one hop. A library that hops once per call cost ~15 hops
for a transaction of five statements, which dominated a step (docs/PERFORMANCE.md). A SQLite
journal's transaction may also run on the event loop's thread, never while this thread has a
job (`SqliteBackend.transaction`). (A PostgreSQL journal's jobs run on the loop's thread, their
waits the loop's: runner/store/green.py.)
"""

from __future__ import annotations

import asyncio
import os
import queue
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["BUSY_TIMEOUT_MS", "JobThread", "connect_sqlite"]

T = TypeVar("T")

BUSY_TIMEOUT_MS = 10_000


class JobThread:
    """Runs jobs one at a time, in order, on a single thread.

    A queue and a future settled with `call_soon_threadsafe`: an executor's hop (a concurrent
    future wrapped in an asyncio one) cost ~75 µs here against ~40 µs for this, and a step
    takes several. A job whose awaiting task is cancelled still runs (a transaction is never
    cut in half); its result is dropped.
    """

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        # Jobs handed to the thread and not yet done, counted on the event loop's thread: a
        # job is done once its answer is back there, even if its waiter was cancelled.
        self._pending = 0
        threading.Thread(target=self._serve, name=name, daemon=True).start()

    @property
    def idle(self) -> bool:
        """Whether the thread has no job: its connection may be used from the loop's thread."""
        return self._pending == 0

    async def run(self, job: Callable[..., T], *args: Any) -> T:
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._pending += 1
        self._jobs.put((future, job, args))
        return await future

    def stop(self) -> None:
        """No more jobs; the thread ends once the queued ones are done (none wait for it)."""
        self._jobs.put(None)

    def _serve(self) -> None:
        while (item := self._jobs.get()) is not None:
            future, job, args = item
            try:
                result = job(*args)
            except BaseException as error:  # the waiter gets it; this thread carries on
                future.get_loop().call_soon_threadsafe(self._fail, future, error)
            else:
                future.get_loop().call_soon_threadsafe(self._settle, future, result)

    def _settle(self, future: asyncio.Future[Any], result: Any) -> None:
        self._pending -= 1
        if not future.cancelled():
            future.set_result(result)

    def _fail(self, future: asyncio.Future[Any], error: BaseException) -> None:
        self._pending -= 1
        if not future.cancelled():
            future.set_exception(error)


_Job = tuple["asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...]]


def connect_sqlite(path: str | Path, *, writer: bool = True) -> sqlite3.Connection:
    """On the journal's thread: a connection in autocommit mode (transactions are explicit
    `BEGIN IMMEDIATE`), WAL, `synchronous=FULL` so a commit survives power loss, foreign
    keys on. It is used from the event loop's thread too, only while this one has no job
    (`SqliteBackend.transaction`). A `writer`'s is refused read-only (sqlite3's
    OperationalError, "attempt to write a readonly database"): SQLite opens a file it cannot
    write read-only without a word, and such a connection stays so."""
    if writer:
        _writable(Path(path))
    connection = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    try:
        connection.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        connection.execute("PRAGMA journal_mode = WAL")
        connection.execute("PRAGMA synchronous = FULL")
        connection.execute("PRAGMA foreign_keys = ON")
    except BaseException:
        connection.close()
        raise
    return connection


def _writable(path: Path) -> None:
    """Open the file for writing as SQLite would first try to (a new one is made writable by
    SQLite itself); where it cannot, refuse as SQLite does a write to a read-only database
    (BEGIN IMMEDIATE does not: on a read-only connection in WAL mode it succeeds)."""
    try:
        os.close(os.open(path, os.O_RDWR))
    except FileNotFoundError:
        return
    except OSError as error:
        raise sqlite3.OperationalError(
            f"attempt to write a readonly database ({error.strerror})"
        ) from None
