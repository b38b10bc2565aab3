"""How the journal commits: one transaction is one function of a `JournalTransaction` run as
one job on the connection's thread; jobs queued while a commit is in flight go into the next
one (group commit), each in its own savepoint; transient faults are retried; a commit of
unknown outcome is looked up by its mark. `JournalStore` (runner/store/journal.py) adds the
named reads and writes on top of `JournalCore`.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from qjsflow.runner.errors import JournalUnavailable
from qjsflow.runner.store.backends import Backend, is_postgres_url, open_backend
from qjsflow.runner.store.records import RunRecord, StepPlace
from qjsflow.runner.store.tx import (
    JournalTransaction,
    Lease,
    UsageCharge,
    write_batch_usage,
)
from qjsflow.runner.store.wakeups import listen_for_wakeups
from qjsflow.runner.store.wal_mark import follows
from qjsflow.runner.telemetry.metrics import METRICS

if TYPE_CHECKING:  # only publishing builds one: reading the journal loads no esbuild driver
    pass

__all__ = ["DEFAULT_RETRY_S", "BatchJob", "JournalCore", "run_batch"]

T = TypeVar("T")
_log = logging.getLogger("qjsflow.journal")
_MAX_BATCH = 256
# A server's commit marks (`_commit_marked`): kept an hour, longer than any retry looks for
# one; swept by about one commit in this many.
_MARK_KEEP_MS = 3_600_000
_MARK_SWEEP_EVERY = 1000
# A batch that needs no fsync (leases and drives' beginnings, writes behind an answer) is taken
# at most this many jobs at a time: a worker that claims a hundred runs starts its first drives
# once their leases are in (~0.15 ms a job), not once all hundred are.
_MAX_QUICK_BATCH = 16
DEFAULT_RETRY_S = 60.0
_FIRST_RETRY_S = 0.05
_LAST_RETRY_S = 2.0


# Told a job's result and its commit's mark (`BatchJob.then`).
_Then = Callable[[Any, bytes | None], None]


class Presumption(enum.Enum):
    """What a transaction that presumes (`JournalCore.transact`'s `careful`) takes as so."""

    # Rows it inserts are not there (`TransactionBase.presumes`); its fence is read.
    ROWS = "rows"
    # That, and its fence holds: asserted, not read (`LeaseStatements.assert_fence`), a
    # statement that fails the transaction if the lease is lost or a pause asked.
    ROWS_AND_FENCE = "rows and fence"


@dataclass(slots=True)
class BatchJob:
    work: Callable[[JournalTransaction], Any]
    fence: Lease | None
    durable: bool
    future: asyncio.Future[Any]
    writes: bool = True  # False: it only reads (a batch of such opens no write transaction)
    # Told, on the event loop's thread, the work's result and the commit's mark: the journal's
    # WAL-index header right after it, when no other commit came between (else None).
    then: _Then | None = None
    # The step row its work reads first, if it knows: read with the fence's row, in the same
    # round trip on a pipelined journal (`LeaseStatements.send_step_read`).
    step: StepPlace | None = None
    # What it presumes, if anything (`JournalCore.transact`'s `careful`).
    presumes: Presumption | None = None


# A batch's outcomes, one a job, and the mark of its commit (for jobs told `then`).
_Batch = tuple[list[tuple[bool, Any]], bytes | None]


def run_batch(connection: Any, batch: list[BatchJob], backend: Backend) -> _Batch:
    """On the connection's thread: the whole batch in one transaction and one commit, and,
    for a job told `then`, the commit's mark (runner/store/wal_mark.py).

    The commit is fsynced (`synchronous=FULL`) when any job of the batch is durable. A job that
    is not (the start of an attempt, a drive or a lease) still commits before it is answered;
    only a power loss can undo it, and then every later fsynced commit would be undone too, as
    the WAL is written in order — so nothing durable ever depends on a lost one.
    """
    outcomes: list[tuple[bool, Any]] = []
    alone = len(batch) == 1  # no savepoint needed: the transaction is the job's
    usage: list[UsageCharge] = []  # what the jobs that succeed charge, written last
    # The fence the job before checked, and the run's row it read with it, while no job has
    # written a run's row since: a drive's writes queued one after another check it once.
    held: tuple[Lease, RunRecord] | None = None
    backend.begin(
        connection,
        full=any(job.durable for job in batch),
        write=any(job.writes for job in batch),
    )
    # Read holding the write lock: no other commit comes before this batch's.
    before = backend.mark() if any(job.then is not None for job in batch) else None
    try:
        for job in batch:
            if not alone:
                connection.execute("SAVEPOINT job")
            try:
                tx = JournalTransaction(connection, job.fence, backend.dialect)
                tx.presumes = job.presumes is not None
                charged = tx.collect_usage()
                if job.fence is not None and held is not None and held[0] == job.fence:
                    tx.fence_held(job.fence, held[1])
                elif job.fence is not None and job.presumes is Presumption.ROWS_AND_FENCE:
                    tx.assert_fence(job.fence)
                elif job.fence is not None:
                    tx.check_fence(job.fence, step=job.step)
                held = None
                result = job.work(tx)
                tx.check_leases_written()
                tx.wake_for_new_runs()
                if not alone:  # its statements' errors are its own (alone: the commit's)
                    tx.sync()
                    connection.execute("RELEASE job")
                outcomes.append((True, result))
                usage += charged
                asserted = job.presumes is Presumption.ROWS_AND_FENCE
                if job.fence is not None and not tx.runs_written and not asserted:
                    held = (job.fence, tx.fence_read(job.fence))
            except Exception as error:
                if not alone:
                    connection.execute("ROLLBACK TO job")
                    connection.execute("RELEASE job")
                outcomes.append((False, error))
        if alone and not outcomes[0][0]:
            connection.execute("ROLLBACK")
        else:
            if usage:
                write_batch_usage(JournalTransaction(connection, None, backend.dialect), usage)
            _commit_marked(connection, backend, outcomes, any(job.writes for job in batch))
    except BaseException:
        with contextlib.suppress(Exception):  # a connection lost in the commit: gone with it
            if connection.in_transaction:
                connection.execute("ROLLBACK")
        raise
    if before is None:
        return outcomes, None
    after = backend.mark()
    return outcomes, after if follows(before, after) else None


class UnknownCommit(Exception):
    """The server may or may not have committed a batch: the answer to COMMIT was lost. Its
    mark says which (`JournalStore._settle_unknown`); its outcomes stand if it did."""

    def __init__(self, mark: str, outcomes: list[tuple[bool, Any]], cause: BaseException):
        super().__init__(f"the commit's answer was lost: {cause}")
        self.mark, self.outcomes, self.cause = mark, outcomes, cause


def _commit_marked(
    connection: Any, backend: Backend, outcomes: list[tuple[bool, Any]], writes: bool
) -> None:
    """COMMIT; on a server, with a mark of its own written in the same transaction, so that a
    commit whose answer is lost is found committed or not, never made twice (docs/OPERATIONS.md,
    What is promised)."""
    if not backend.marks_commits or not writes:  # a read-only batch: the same run twice
        connection.execute("COMMIT")  # answered (pipelined: with any error sent before it)
        return
    mark = uuid.uuid4().hex
    now_ms = int(time.time() * 1000)
    connection.execute("INSERT INTO commit_marks (mark, at) VALUES (?, ?)", (mark, now_ms))
    if now_ms % _MARK_SWEEP_EVERY == 0:  # now and then, the marks no retry will look for
        connection.execute("DELETE FROM commit_marks WHERE at < ?", (now_ms - _MARK_KEEP_MS,))
    try:
        connection.execute("COMMIT")  # answered (pipelined: with any error sent before it)
    except Exception as error:
        if backend.is_transient(error):
            raise UnknownCommit(mark, outcomes, error) from error
        raise


def _never() -> bool:
    return False


def _one_drives(batch: list[BatchJob]) -> bool:
    """Whether `batch` serves one drive (a single job, or jobs all under one lease), so that it
    may commit on the event loop's thread (`JournalStore.commit_here`). One that serves several
    (a burst of leases, several drives' ends) goes to the journal's thread: on the loop it
    would hold it for all of them, and the loop would take none of their answers, nor anything
    else, until the last was in."""
    first = batch[0].fence
    return len(batch) == 1 or (first is not None and all(job.fence == first for job in batch))


def _tell(then: _Then, value: Any, mark: bytes | None) -> None:
    """Tell a job's `then` its result and mark; a failure there is logged, never let stop the
    answers of the batch's other jobs."""
    try:
        then(value, mark)
    except Exception:
        _log.exception("a committed job's follow-up failed")


class JournalCore:
    """The journal database of one runner process: its transactions and their commits."""

    def __init__(self, backend: Backend, location: str | Path) -> None:
        self._backend = backend
        self.location = str(location)
        # The journal file for SQLite; None for a server database.
        self.path = (
            None if is_postgres_url(location) else Path(str(location).removeprefix("sqlite:///"))
        )
        self._queue: list[BatchJob] = []
        self._committer: asyncio.Task[None] | None = None
        self._busy = False  # a batch is being committed (by the committer, or in place)
        self.retry_s = DEFAULT_RETRY_S  # how long a transient write failure is retried
        self.transient_faults = 0  # transactions met by a transient fault (and run again)
        self._faulted = asyncio.Event()
        # Whether a transaction may run on the event loop's own thread now, which saves two
        # wake-ups (`SqliteBackend.transaction`): the runner says yes while at most one drive
        # is in progress, when the loop would only wait for it.
        self.commit_here: Callable[[], bool] = _never
        self._behind: set[asyncio.Future[Any]] = set()  # `write_behind` work not yet committed
        self._unqueued: list[tuple[Callable[[JournalTransaction], Any], _Then | None]] = []

    async def transient_fault(self) -> None:
        """Return once a transaction has met a transient fault (and is being run again)."""
        await self._faulted.wait()

    def serve_runner(self, *, retry_s: float, commit_here: Callable[[], bool]) -> None:
        """What the runner using this store decides of it: how long a transient write failure
        is retried, and whether a transaction may commit on the event loop's thread now."""
        self.retry_s = retry_s
        self.commit_here = commit_here

    @classmethod
    async def open(cls, location: str | Path, *, create: bool = True) -> Self:
        """A path or `sqlite:///path` (created if missing), or a `postgresql://` URL. Without
        `create` the journal must exist with a current schema: nothing is written."""
        return cls(await open_backend(location, create=create), location)

    def trace(self, callback: Callable[[str], None] | None) -> None:
        """Tell `callback` every statement a SQLite journal's connection runs from now, on the
        thread that runs it (None: stop); for diagnosis and tests. A server journal refuses."""
        self._backend.trace(callback)

    def listen(self, on_wake: Callable[[], None]) -> asyncio.Task[None] | None:
        """Call `on_wake` whenever a transaction anywhere makes a run claimable, until the task
        returned is cancelled (runner/store/wakeups.py); None where workers poll instead."""
        source = self._backend.wake_source
        if source is None:
            return None
        return asyncio.get_running_loop().create_task(listen_for_wakeups(source, on_wake))

    def own_files(self) -> tuple[Path, ...]:
        """The journal's own file (SQLite), which a publish of a folder holding it never reads."""
        return () if self.path is None else (self.path,)

    async def aclose(self) -> None:
        await self.caught_up()
        if self._committer is not None:
            await asyncio.gather(self._committer, return_exceptions=True)
        await self._backend.close()

    async def transact(
        self,
        work: Callable[[JournalTransaction], T],
        fence: Lease | None = None,
        *,
        durable: bool = True,
        writes: bool = True,
        step: StepPlace | None = None,
        careful: Callable[[JournalTransaction], T] | None = None,
        reads_fence: bool = False,
    ) -> T:
        """Run `work` in a write transaction; return its result once it is committed.

        With a `fence`, the lease's epoch is checked first and `LeaseLost` raised (nothing
        written) if another driver has taken the run over. `durable=False` is for writes that
        nothing outside the journal depends on (see `run_batch`); `writes=False` for work
        that only reads, but must see the journal as of one moment (a batch of such work
        alone takes no write lock). `step`: the step row `work` reads first, read with the
        fence's (on PostgreSQL in the same round trip).

        A transient failure (the database locked past its busy timeout, a full disk, a dropped
        server connection) rolls the transaction back and runs it again, with back-off, for
        up to `retry_s`: a tool's result, say, is kept and written once the fault clears,
        never lost and the tool run again. Past that, `JournalUnavailable` says why.

        With `careful`, `work` presumes on a pipelined journal: it may write without reading
        what it presumes (a row not there: the insert fails otherwise), and its fence, if it
        has one, is asserted, not read (it waits for no answer before its commit;
        `pause_requested` reads False, the assertion failing the transaction otherwise) —
        unless it `reads_fence` (a drive's end, which reads its run with it). If the
        database refuses it (for any reason but a transient fault), nothing of it was written
        and `careful`, which presumes nothing, runs instead (as `work` does everywhere else);
        an error of `work`'s own is raised as it is.
        """
        self._queue_behind()  # (committed before this, as it was asked for before)
        if careful is not None:
            if self._backend.dialect.pipelined and (fence is None or fence.take is None):
                try:
                    presumes = Presumption.ROWS if reads_fence else Presumption.ROWS_AND_FENCE
                    once = partial(self._transact_once, work, fence, durable, writes)
                    return await self._retrying(lambda: once(presumes=presumes))
                except JournalUnavailable:
                    raise
                except Exception as error:
                    if not self._backend.is_refusal(error):
                        raise
                    METRICS.presumptions_failed.inc()  # it did not hold: nothing was written
            work = careful
        return await self._retrying(lambda: self._transact_once(work, fence, durable, writes, step))

    async def _retrying(self, attempt: Callable[[], Awaitable[T]]) -> T:
        started = time.monotonic()
        delay = _FIRST_RETRY_S
        while True:
            try:
                return await attempt()
            except Exception as error:
                if not self._backend.is_transient(error):
                    raise
                self.transient_faults += 1
                self._faulted.set()
                waited = time.monotonic() - started
                if waited + delay > self.retry_s:
                    raise JournalUnavailable(
                        self.location if self.path is not None else "the given database URL",
                        f"could not be written for {waited:.0f} s: {str(error)[:200]}",
                    ) from error
                await asyncio.sleep(delay)
                delay = min(delay * 2, _LAST_RETRY_S)

    def transact_soon(
        self,
        work: Callable[[JournalTransaction], T],
        fence: Lease | None = None,
        *,
        durable: bool = True,
        then: Callable[[T, bytes | None], None] | None = None,
    ) -> asyncio.Future[T]:
        """`transact`, queued now — committed before any transaction queued after this call —
        and awaited later (a write behind an answer already given). `then` is told the result
        and the commit's mark (`BatchJob.then`; not if the commit has to be made again)."""
        self._queue_behind()
        first = self._enqueue(work, fence, durable, then=then)

        async def committed() -> T:
            try:
                result: T = await first
                return result
            except Exception as error:
                if not self._backend.is_transient(error):
                    raise
                return await self.transact(work, fence, durable=durable)

        return asyncio.ensure_future(committed())

    def write_behind(
        self,
        work: Callable[[JournalTransaction], T],
        then: Callable[[T, bytes | None], None] | None = None,
    ) -> None:
        """`work`, queued once the caller has gone on (or before any transaction asked for
        after this), committed as `transact_soon` would (not fsynced, `then` told its result
        and mark), and not awaited: for records nothing waits on (a drive that changed nothing
        of its run: runner/engine/drive/). Every read of this store waits for it first, so this
        process reads what it wrote; a failure is logged (nothing depends on it)."""
        self._unqueued.append((work, then))
        if len(self._unqueued) == 1:
            asyncio.get_running_loop().call_soon(self._queue_behind)

    def _queue_behind(self) -> None:
        """Queue the work written behind and not queued yet (none: nothing to do)."""
        if not self._unqueued:  # (asked before every transaction: most have none)
            return
        unqueued, self._unqueued = self._unqueued, []
        for work, then in unqueued:
            written = self.transact_soon(work, durable=False, then=then)
            self._behind.add(written)
            written.add_done_callback(self._written_behind)

    def _written_behind(self, written: asyncio.Future[Any]) -> None:
        self._behind.discard(written)
        if not written.cancelled() and written.exception() is not None:
            _log.warning("a record written behind was lost: %s", str(written.exception())[:200])

    @property
    def pipelined(self) -> bool:
        """Whether a transaction's statements go to a server without waiting for it (PostgreSQL):
        its commit is a round trip its caller may do something useful during."""
        return self._backend.dialect.pipelined

    @property
    def marks_commits(self) -> bool:
        """Whether this journal has marks (`journal_mark`): SQLite's WAL-index; a server has
        none, so nothing written here is worth certifying by one."""
        return self._backend.marks

    def journal_mark(self) -> bytes | None:
        """The journal's mark now (runner/store/wal_mark.py), the same as a commit's only if
        nothing was committed since it; None where there is none (a server)."""
        return self._backend.mark()

    async def caught_up(self) -> None:
        """Wait for the work written behind so far (`write_behind`)."""
        self._queue_behind()
        if self._behind:
            await asyncio.wait(list(self._behind))

    async def _transact_once(
        self,
        work: Callable[[JournalTransaction], T],
        fence: Lease | None,
        durable: bool,
        writes: bool,
        step: StepPlace | None = None,
        *,
        presumes: Presumption | None = None,
    ) -> T:
        if not self._queue and not self._busy and self.commit_here():
            # Nothing queued or being committed, and the loop would only wait for this: it
            # commits now, in the caller's task (no committer task, no turns of the loop).
            future = asyncio.get_running_loop().create_future()
            job = BatchJob(work, fence, durable, future, writes, step=step, presumes=presumes)
            ok, value = (await self._commit([job]))[0][0]
            if not ok:
                raise value
            return cast(T, value)
        result: T = await self._enqueue(work, fence, durable, writes, step=step, presumes=presumes)
        return result

    def _enqueue(
        self,
        work: Callable[[JournalTransaction], T],
        fence: Lease | None,
        durable: bool,
        writes: bool = True,
        *,
        then: _Then | None = None,
        step: StepPlace | None = None,
        presumes: Presumption | None = None,
    ) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.append(BatchJob(work, fence, durable, future, writes, then, step, presumes))
        if self._committer is None or self._committer.done():
            self._committer = loop.create_task(self._commit_queued())
        return future

    async def _commit(self, batch: list[BatchJob]) -> _Batch:
        """One batch in one transaction; each job's outcome (raises if the commit failed), and
        the commit's mark for the jobs told `then`."""
        began = time.monotonic()
        self._busy = True
        try:
            outcomes = await self._backend.transaction(
                partial(run_batch, batch=batch, backend=self._backend),
                here=_one_drives(batch) and self.commit_here(),
            )
        except UnknownCommit as unknown:
            outcomes = (await self._settle_unknown(unknown), None)
        finally:
            self._busy = False
        durable = "yes" if any(job.durable for job in batch) else "no"
        METRICS.journal_seconds.labels(durable=durable).observe(time.monotonic() - began)
        return outcomes

    async def _settle_unknown(self, unknown: UnknownCommit) -> list[tuple[bool, Any]]:
        """A batch whose COMMIT went unanswered: its outcomes if its mark is in the journal
        (it committed), else its commit's error (it did not: the jobs are run again)."""
        found = await self._retrying(
            lambda: self._backend.all("SELECT 1 FROM commit_marks WHERE mark = ?", (unknown.mark,))
        )
        if not found:
            raise unknown.cause
        _log.warning("a commit whose answer was lost had committed: its results stand")
        return unknown.outcomes

    async def _commit_queued(self) -> None:
        while self._queue:
            batch = self._queue[:_MAX_BATCH]
            if not any(job.durable for job in batch):
                batch = batch[:_MAX_QUICK_BATCH]
            self._queue = self._queue[len(batch) :]
            try:
                outcomes, mark = await self._commit(batch)
            except BaseException as error:  # the commit itself failed: no writes of the batch
                for job in batch:
                    if not job.future.done():
                        job.future.set_exception(error)
                if isinstance(error, asyncio.CancelledError):
                    raise
                continue
            for job, (ok, value) in zip(batch, outcomes, strict=True):
                if ok and job.then is not None:
                    _tell(job.then, value, mark)
                if job.future.done():
                    continue
                if ok:
                    job.future.set_result(value)
                else:
                    job.future.set_exception(value)

    async def _after_earlier_writes(self) -> None:
        """A read sees what this process asked to write before it: the writes behind, and the
        jobs queued and not yet taken by the committer (whose task may not have run since:
        one taken holds the connection, and a read waits for it there)."""
        if self._unqueued or self._behind:
            await self.caught_up()
        if self._queue:
            await asyncio.wait([job.future for job in self._queue])

    async def _all(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        await self._after_earlier_writes()
        return await self._retrying(lambda: self._backend.all(sql, args))

    async def read(self, work: Callable[[JournalTransaction], T], *, here: bool = False) -> T:
        """A read the write transactions also make, outside any transaction: one statement
        for both, written once in `JournalTransaction`. `work` runs on the journal's thread,
        or, `here`, on the event loop's when a transaction could (`commit_here`; a drive's
        end that only reads): each of its statements then sees the journal as of its own
        moment."""
        await self._after_earlier_writes()
        dialect = self._backend.dialect
        on_loop = here and self.commit_here()
        return await self._retrying(
            lambda: self._backend.read(
                lambda c: work(JournalTransaction(c, None, dialect, reading=True)), here=on_loop
            )
        )
