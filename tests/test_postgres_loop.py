"""A PostgreSQL journal's jobs run on the event loop's thread (no thread hop each way) and wait
for the server without holding the loop: while one waits, every other task goes on
(runner/store/green.py)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from qjsflow.runner.store.backends import Backend


@pytest.fixture
def url(pg_url: str) -> str:
    return pg_url


@pytest.fixture
async def backend(pg_backend: Backend) -> Backend:
    def made(c: Any) -> None:
        c.execute("CREATE TABLE held (k INT PRIMARY KEY, v INT)")
        c.execute("INSERT INTO held VALUES (1, 0)")
        c.sync()

    await pg_backend.run(made)
    return pg_backend


@pytest.fixture
def holder(url: str, backend: Backend) -> Iterator[psycopg.Connection[Any]]:
    """Another session, which locks the row a job then waits for."""
    with psycopg.connect(url) as connection:
        connection.execute("SELECT v FROM held WHERE k = 1 FOR UPDATE")
        yield connection


class _Begun:
    """Which threads a job ran on, and an event set (from any of them) once it has begun."""

    def __init__(self) -> None:
        self.threads: list[int] = []
        self.event = asyncio.Event()
        self._loop = asyncio.get_running_loop()

    def note(self) -> None:
        self.threads.append(threading.get_ident())
        self._loop.call_soon_threadsafe(self.event.set)


def _waits_for_the_row(begun: _Begun, *, then_writes: int | None = None) -> Any:
    def work(c: Any) -> Any:
        begun.note()
        c.execute("BEGIN")
        c.execute("SET LOCAL lock_timeout = '5s'")  # a loop held by the wait fails, not hangs
        row = c.execute("SELECT v FROM held WHERE k = 1 FOR UPDATE").fetchone()
        if then_writes is not None:
            c.execute("UPDATE held SET v = ? WHERE k = 1", (then_writes,))
        c.execute("COMMIT")
        return row[0]

    return work


async def test_a_job_waiting_for_the_server_leaves_the_loop_free(
    backend: Backend, holder: psycopg.Connection[Any]
) -> None:
    """The job waits for a row another session holds; only this task, on the loop, lets the
    row go: had the job's wait held the loop, it would have waited out its lock timeout."""
    begun = _Begun()
    job = asyncio.create_task(backend.run(_waits_for_the_row(begun)))
    await begun.event.wait()  # the job has begun, and is waiting for the row
    assert not job.done()
    holder.execute("UPDATE held SET v = 7 WHERE k = 1")
    holder.commit()
    assert await job == 7
    assert begun.threads == [threading.get_ident()]  # on the loop's own thread


async def test_a_job_whose_caller_is_cancelled_runs_to_its_end(
    backend: Backend, holder: psycopg.Connection[Any]
) -> None:
    """A transaction is never cut in half: the caller learns of its cancellation once the job
    has committed, and the next job runs after it, on a connection as usable as before."""
    begun = _Begun()
    job = asyncio.create_task(backend.run(_waits_for_the_row(begun, then_writes=42)))
    await begun.event.wait()
    job.cancel()
    after = asyncio.create_task(backend.run(lambda c: c.execute("SELECT v FROM held").fetchone()))
    holder.commit()
    with pytest.raises(asyncio.CancelledError):
        await job
    assert await after == (42,)


async def test_jobs_run_one_at_a_time_in_the_order_asked(backend: Backend) -> None:
    seen: list[int] = []

    def noting(n: int) -> Any:
        def work(c: Any) -> None:
            c.execute("SELECT 1").fetchall()  # each job waits for the server's answer
            seen.append(n)

        return work

    await asyncio.gather(*(backend.run(noting(n)) for n in range(20)))
    assert seen == list(range(20))


async def test_a_cancelled_caller_learns_of_its_cancellation_whatever_its_job_did(
    backend: Backend, holder: psycopg.Connection[Any]
) -> None:
    """The job fails once the row is let go (a statement the server refuses): the caller,
    cancelled meanwhile, is told it was cancelled (what a timeout around it relies on), and
    the connection serves the next job."""
    begun = _Begun()

    def failing(c: Any) -> None:
        begun.note()
        c.execute("BEGIN")
        c.execute("SELECT v FROM held WHERE k = 1 FOR UPDATE").fetchone()
        c.execute("SELECT no_such_column FROM held").fetchone()

    job = asyncio.create_task(backend.run(failing))
    await begun.event.wait()
    job.cancel()
    holder.commit()
    with pytest.raises(asyncio.CancelledError):
        await job

    def rolled_back(c: Any) -> Any:
        c.execute("ROLLBACK")
        return c.execute("SELECT v FROM held").fetchone()

    assert await backend.run(rolled_back) == (0,)
