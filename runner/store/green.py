"""A PostgreSQL journal's jobs on the event loop's own thread, never blocking it.

A job is a synchronous function (a whole transaction: `JournalTransaction`'s statements), and
psycopg's synchronous connection waits for the server inside it. Run on a thread of its own,
each job cost two thread hops (~100 µs on this small machine, a tenth of a tool step). Here a
job runs in a greenlet on the loop's thread instead: where psycopg would wait for the socket
(`GreenConnection.wait`), the greenlet hands the wait to the event loop, which goes on with
every other task until the server answers, and then resumes the job where it stopped.

Only a job run by `run_green` waits that way; the same connection used anywhere else (a
connect, on a thread) waits as psycopg does. One job at a time uses a connection: the backend
holds a lock around each.
"""

from __future__ import annotations

import asyncio
import functools
import select
from collections.abc import Callable
from typing import Any, TypeVar

from greenlet import getcurrent, greenlet

__all__ = ["green_connection_class", "run_green"]

T = TypeVar("T")

# psycopg's wait and ready states (psycopg.waiting: Wait.R = Ready.R = 1, Wait.W = Ready.W = 2)
_R, _W = 1, 2


class _Job(greenlet):  # type: ignore[misc]  # greenlet is untyped
    """A job's greenlet: its waits are handed to the event loop (`GreenConnection.wait`)."""


async def run_green(work: Callable[..., T], *args: Any) -> T:
    """`work(*args)` on this thread, its socket waits awaited. A job whose caller is cancelled
    still runs to its end (a transaction is never cut in half); the caller's cancellation is
    raised after it, whatever the job's outcome (as `JobThread` drops it)."""
    job = _Job(work, getcurrent())
    awaited = job.switch(*args)
    cancelled: asyncio.CancelledError | None = None
    while not job.dead:
        try:
            ready = await awaited
        except asyncio.CancelledError as error:
            cancelled, ready = error, 0  # nothing ready: the job waits again
        try:
            awaited = job.switch(ready)
        except BaseException:
            if cancelled is not None:  # the caller left: the job's error is not its
                raise cancelled from None
            raise
    if cancelled is not None:
        raise cancelled
    return awaited  # type: ignore[no-any-return]


def _ready_now(fileno: int, wanted: int) -> int:
    """What the socket is ready for at once (a socket asked for writing nearly always is:
    a loop round trip for each statement sent would cost more than this poll)."""
    readable, writable, _ = select.select(
        [fileno] if wanted & _R else [], [fileno] if wanted & _W else [], [], 0
    )
    return (_R if readable else 0) | (_W if writable else 0)


def _awaited(fileno: int, wanted: int) -> int:
    """In a job: the loop's answer to when the socket is ready (the job's greenlet is
    suspended meanwhile, the loop free)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[int] = loop.create_future()

    def wake(state: int) -> None:
        if not future.done():
            future.set_result(state)

    if wanted & _R:
        loop.add_reader(fileno, wake, _R)
    if wanted & _W:
        loop.add_writer(fileno, wake, _W)
    try:
        ready: int = getcurrent().parent.switch(future)
    finally:
        if wanted & _R:
            loop.remove_reader(fileno)
        if wanted & _W:
            loop.remove_writer(fileno)
    return ready


@functools.cache
def green_connection_class() -> type[Any]:
    """psycopg's Connection whose waits, inside `run_green`, are the event loop's (psycopg is
    imported only once a PostgreSQL journal is opened)."""
    import psycopg  # noqa: PLC0415  # the optional extra, as backends._psycopg
    from psycopg import errors  # noqa: PLC0415

    class GreenConnection(psycopg.Connection):
        def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
            if timeout is not None or not isinstance(getcurrent(), _Job):
                # A wait with a deadline (psycopg's `notifies`; no journal job waits so) is
                # psycopg's own, which keeps it.
                return super().wait(gen, interval, timeout)
            fileno = self.pgconn.socket
            try:
                wanted = next(gen)
                while True:
                    ready = _ready_now(fileno, wanted) or _awaited(fileno, wanted)
                    wanted = gen.send(ready)
            except StopIteration as done:
                return done.value
            except OSError as error:  # as psycopg's own waits: the socket is gone
                raise errors.OperationalError("connection socket closed") from error

    return GreenConnection
