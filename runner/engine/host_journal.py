"""The journal side of a drive's host: the ops that only touch the journal (steps begun and
recorded, checks, sleeps, waits, console lines), serviced together in one transaction, and what
the host counts, bounds and answers ahead. The ops with an effect outside the journal (tools,
fetch, notifications, author SQL) are `DriveHost`'s (runner/engine/host.py).

The meaning of each op lives in runner/engine/steps.py as a synchronous journal transaction;
this module runs them (`JournalStore.transact`, fenced by the drive's lease: each commits
before its answer goes back).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import TypeVar, cast

from qjsflow.bridge.failure import StepFailure
from qjsflow.bridge.hints import with_run_hint
from qjsflow.bridge.keys import step_key
from qjsflow.bridge.limits import Limits
from qjsflow.bridge.types import (
    Answer,
    Log,
    Op,
    OpEnvelope,
    RetryPolicy,
    StepBegin,
    StepCheck,
    StepRecord,
    StepSleep,
    StepWaitForEvent,
    Suspend,
    Value,
    needs_answer,
)
from qjsflow.runner.bindings import (
    Bindings,
    ToolFn,
)
from qjsflow.runner.engine import steps
from qjsflow.runner.engine.locations import Locator
from qjsflow.runner.scopedb import ScopeDatabases
from qjsflow.runner.store import JournalStore, JournalTransaction, Lease
from qjsflow.runner.store.records import StepPlace
from qjsflow.runner.telemetry import tracing
from qjsflow.runner.telemetry.metrics import METRICS
from qjsflow.runner.tenancy.budgets import BY_CALL, Budgets, DriveUsage, Throttle, exhausted
from qjsflow.runner.tenancy.capabilities import Reach
from qjsflow.runner.tenancy.environment import ScopeEnvironment
from qjsflow.runner.tenancy.scopes import split_run_key
from qjsflow.runner.tenancy.secret_values import RunSecrets

__all__ = ["PARKED", "JournalOps", "count_step"]

T = TypeVar("T")

_ONCE = RetryPolicy(limit=0, delay_ms=0, backoff="constant", timeout_ms=1000)  # a denied call

# The answer to the run's own calls while a pause is asked: the body waits there until the run
# is resumed, and the drive ends as soon as the steps under way have recorded their results.
PARKED = Suspend("retry")


def count_step(kind: str, result: object, elapsed_ms: int | None) -> None:
    outcome = (
        "ok"
        if isinstance(result, Value)
        else "error"
        if isinstance(result, StepFailure)
        else "suspended"
    )
    METRICS.steps.labels(kind=kind, outcome=outcome).inc()
    if elapsed_ms is not None:
        METRICS.step_seconds.labels(kind=kind).observe(elapsed_ms / 1000)


# Ops that await no answer are held for the drive's next transaction only while they are
# this small and this few (`_may_hold`); past that they are written at once.
_HELD_BYTES = 64 * 1024
_HELD_WRITES = 16

_NO_ENVIRONMENT = ScopeEnvironment()  # a scope's with none set (made once: it checks itself)


class JournalOps:
    """Services the journal ops of drives of one run (`DriveHost` adds the effects)."""

    def __init__(
        self,
        store: JournalStore,
        lease: Lease,
        bindings: Bindings,
        limits: Limits,
        clock_ms: Callable[[], int],
        *,
        scopes: ScopeDatabases,
        journal_bytes: int = 0,
        monotonic: Callable[[], float] = time.monotonic,
        locate: Locator = lambda stack: None,
        reach: Reach | None = None,
        environment: ScopeEnvironment | None = None,
        run_env: str | None = None,
        generation: int = 0,
        budgets: Budgets | None = None,
        used: Mapping[str, float] | None = None,
        traced: bool = True,
        children: ToolFn | None = None,
    ) -> None:
        # A workflow binding's calls (`env.MY_WORKFLOW.create(...)`), served by the runner for
        # this run: None where no runner hands it in (runner/operations/workflow_bindings.py).
        self.children = children
        # A restarted run's calls to its scope database and its console lines are new ones:
        # `generation` (how many restarts) tells them from those of the attempts before.
        self.generation = generation
        # The run's scope's env: secret values (only tool calls see them) and egress policy.
        self.environment = environment or _NO_ENVIRONMENT
        # Which of them the run may reach (its env's handles), and masks for all of them.
        self.secrets = RunSecrets(self.environment.secrets, run_env)
        self.monotonic = monotonic
        self.locate = locate  # the engine's frames -> the author's (runner/engine/locations.py)
        self.scopes = scopes
        self.journal_bytes = journal_bytes  # of the run's recorded results, kept up to date
        self.store = store
        self.lease = lease
        self.run_id = lease.run_id
        self.scope = split_run_key(lease.run_id)[0]
        self.bindings = bindings
        self.limits = limits
        self.now = clock_ms
        self.logs_count = 0
        self.blocked_on: str | None = None  # a tool address no binding of this process has
        # When each attempt this drive started began, on the monotonic clock: its timeout is
        # judged by how long it really took, whatever the wall clock does meanwhile.
        # and its timeout, and when it began on the wall clock (for its trace span)
        self._attempts: dict[tuple[str, int, int], tuple[float, int, int]] = {}
        # The drive's span, the parent of those made here (none when the drive has none).
        self.trace = tracing.current() if traced else None
        self.recording = tracing.recording(self.trace)
        self._effectful: set[str] = set()  # keys of steps whose body made an effect
        self._behind: list[asyncio.Future[bool]] = []  # batches answered ahead, being written
        self._queued_behind = 0  # such batches queued, and written (counted on the journal's
        self._written_behind = 0  # thread when one commits its work: see `all_written`)
        # Writes of what is answered already (a tool call's result: DriveHost._tool; ops that
        # await no answer), held until the drive's next transaction (its end is one), which
        # writes them first; or queued as a batch answered ahead (`flush`).
        self._held: list[Callable[[JournalTransaction], object]] = []
        self.pause_seen = False  # a pause was asked: every answer waits for the journal
        self.ops_seen = 0  # ops the sandbox sent this drive (none: it wrote nothing)
        # The sandbox settled a pure step itself and went on, and the journal did not take
        # the result as it assumed (a limit, a pause, a budget, its timeout): nothing the
        # sandbox sends after it is serviced, and the run is driven again from the journal.
        # Set on the journal's thread, in the transaction that met it.
        self.diverged = False
        # The scope's budgets, what it had used when the drive began, what this drive used
        # since (charged when it ends), and the budget it spent, if it did: the run's own
        # next call then parks it (runner/tenancy/budgets.py).
        self.budgets = budgets if budgets is not None and budgets.any else None
        self.used = dict(used or {})
        self.usage = DriveUsage()
        self.throttle: Throttle | None = None
        # Steps the sandbox began (without asking) after a budget was spent: neither begun
        # nor recorded in the journal, so the next drive runs them afresh.
        self._unbegun: set[tuple[str, int]] = set()
        self.set_aside: set[str] = set()  # keys of the run's steps whose attempt is undone
        # What the run may reach: its snapshot's manifest and its scope's policy.
        self.reach = reach or Reach()

    def _holds(self, tx: JournalTransaction, step: str) -> bool:
        """Whether the answer to a call parks the run: a pause is asked, and the call is the
        run's own, not one inside a step under way (their names hold the step's key and a
        '/'; an author's '/' is escaped)."""
        return tx.pause_requested and "/" not in step

    def _refuses(self, tx: JournalTransaction, step: str, call: str) -> bool:
        """Whether a call parks the run before it starts: a pause is asked and the call is the
        run's own, or its scope has spent a budget this kind of call uses
        (runner/tenancy/budgets.py).
        A call inside a step body parks it too: the step's attempt is set aside when the
        drive ends, and runs again, answered from what it recorded, after the throttle."""
        if self._holds(tx, step):
            return True
        if not self._spent(call):
            return False
        if "/" in step:
            self.set_aside.add(step.split("/", 1)[0])
        return True

    def _spent(self, call: str) -> bool:
        """Whether a budget `call` would use is spent; the drive then ends throttled."""
        if self.budgets is not None and self.throttle is None:
            measures = BY_CALL[call]
            self.throttle = exhausted(self.budgets, self.used, self.now(), measures, self.usage)
        return self.throttle is not None

    async def _in_journal(self, group: list[OpEnvelope]) -> list[Answer]:
        if not group:
            return []
        now = self.now()
        group = [self._admitted(envelope) for envelope in group]
        self._trace_attempts(group)
        ahead = self._answers_ahead(group, now)
        if ahead == [] and self._may_hold(group):  # nothing awaits them (the drive's last
            self.hold(lambda tx: self._serviced(tx, group, now))  # ops): the next writes them
            self._count_logs(group)
            return ahead
        if ahead is not None:
            self._write_behind(group, now)
            return ahead
        await self._behind_written()
        # Only a batch that settles an effect is fsynced (see JournalStore and docs/
        # PERFORMANCE.md, Durable writes). Starting attempts, console lines, sleeps, waits (an
        # event consumed is the oldest of the durable inbox: a replay consumes the same one),
        # and the result of a step whose body made no effect in this drive (no tool, fetch,
        # SQL or notification: a pure function of the journal, which a replay computes again
        # alike) are committed without an fsync; the next fsynced commit (the next effect,
        # the suspension or the end reported to the caller) makes them durable with it, as the
        # journal's log is written in order.
        durable = any(isinstance(e.op, StepRecord) and self._had_effect(e.op) for e in group)
        answers = await self.transact(lambda tx: self._serviced(tx, group, now), durable=durable)
        waits = {e.id for e in group if isinstance(e.op, StepWaitForEvent)}
        for answer in answers:  # an event a wait consumed is part of the run's journal now
            consumed = answer.result.value if isinstance(answer.result, Value) else None
            if answer.id in waits and isinstance(consumed, str):
                self.journal_bytes += len(consumed)
                # Stored again as the wait's result: charged here, as the inbox's copy was
                # when the signal stored it (usage.admit); pruning frees both.
                self.usage.add("journal_bytes", len(consumed))
        self._count_logs(group)
        return answers

    def _admitted(self, envelope: OpEnvelope) -> OpEnvelope:
        """An op of a journal batch as it will be serviced, counted once, before the
        transaction (which may run again after a transient fault): an attempt the sandbox
        began is timed from here, on this thread (or, past a spent budget, left unbegun); a
        result is bounded by the journal limit and located; what it uses is counted."""
        op = envelope.op
        if isinstance(op, StepBegin):
            self._begun(op.step, op.count, op.config)
            return envelope
        if isinstance(op, StepRecord) and op.begun_with is not None:  # its begin inside it
            self._begun(op.step, op.count, op.begun_with)
        if isinstance(op, Log):
            self.usage.add("journal_bytes", len(op.text))
            return envelope
        if not isinstance(op, StepRecord) or self._is_unbegun(op):
            return envelope
        self.usage.add("steps", 1)
        return self._located(self._bounded(envelope))

    def _begun(self, step: str, count: int, policy: RetryPolicy) -> None:
        """A step the sandbox began without asking: its first attempt is timed from here (or,
        past a spent budget, the step is left unbegun)."""
        if "/" not in step and self._spent("step"):
            self._unbegun.add((step, count))
        self._attempts[(step, count, 1)] = (self.monotonic(), policy.timeout_ms, time.time_ns())

    def _count_logs(self, group: list[OpEnvelope]) -> None:
        """The workflow body's lines stored so far: the next drive skips as many."""
        counts = [e.op.count for e in group if isinstance(e.op, Log) and e.op.source == ""]
        self.logs_count = max([self.logs_count, *counts])

    def _trace_attempts(self, group: list[OpEnvelope]) -> None:
        """A span for each step attempt this batch ends."""
        if not self.recording:
            return
        for envelope in group:
            op = envelope.op
            if isinstance(op, StepRecord):
                began = self._attempts.get((op.step, op.count, op.attempt))
                if began is not None:
                    tracing.attempt_span(
                        self.trace, f"qjsflow.step {op.step[:100]}", start_ns=began[2],
                        end_ns=time.time_ns(),
                        attributes={"qjsflow.step": step_key("do", op.count, op.step),
                                    "qjsflow.attempt": op.attempt},
                        error=None if op.error is None else f"{op.error.name}: {op.error.message}",
                    )  # fmt: skip

    def _answers_ahead(self, group: list[OpEnvelope], now: int) -> list[Answer] | None:
        """The answers of a batch that needs nothing from the journal to be answered: steps
        beginning, console lines, and the successful results of steps whose body made no
        effect, begun in this drive, within their timeout (under this drive's lease nothing
        else can settle them). None when some op's answer depends on the journal."""
        if self.pause_seen or self.throttle is not None or self.diverged:
            return None
        answers = []
        for envelope in group:
            op = envelope.op
            if isinstance(op, StepBegin | Log):
                continue
            if not isinstance(op, StepRecord) or op.error is not None or self._had_effect(op):
                return None
            began = self._attempts.get((op.step, op.count, op.attempt))
            if began is None or (self.monotonic() - began[0]) * 1000 > began[1]:
                return None  # not begun in this drive, or past its timeout: the journal says
            if op.settled_at is None:  # one the sandbox settled itself awaits no answer
                answers.append(Answer(envelope.id, Value(None), now))
        return answers

    def _may_hold(self, group: list[OpEnvelope]) -> bool:
        """Whether ops that await no answer may wait in this process's memory for the next
        transaction: a drive's last ops, small and few; not frame after frame of them from a
        sandbox that misbehaves (those are written at once, as answered-ahead batches are)."""
        size = sum(
            len(op.value or "") if isinstance(op, StepRecord) else len(op.text)
            if isinstance(op, Log) else 0
            for op in (envelope.op for envelope in group)
        )  # fmt: skip
        return size <= _HELD_BYTES and len(self._held) < _HELD_WRITES

    def _write_behind(self, group: list[OpEnvelope], now: int) -> None:
        """Journal a batch answered ahead (`_queue_written`)."""
        self._queue_written(lambda tx: self._serviced(tx, group, now))
        self._count_logs(group)

    def _queue_written(self, write: Callable[[JournalTransaction], object]) -> None:
        """Journal what was answered ahead, after the writes held: queued now (the journal
        commits in queue order), awaited before anything that is not answered ahead and at
        the drive's end (`flush`)."""
        with_held = self._with_held(write)

        def work(tx: JournalTransaction) -> bool:
            with_held(tx)
            self._written_behind += 1
            return tx.pause_requested

        self._queued_behind += 1
        written = self.store.transact_soon(work, self.lease, durable=False)
        written.add_done_callback(self._note_pause)
        self._behind.append(written)

    def hold(self, write: Callable[[JournalTransaction], object]) -> None:
        """Hold the write of what is answered already (a tool's result, ops that await no
        answer) until the drive's next transaction (`transact`: the drive's end is one), or
        `flush`. Nothing outside the journal sees it before then: every effect begins with a
        transaction, which writes it first."""
        self._held.append(write)

    def _with_held(
        self, work: Callable[[JournalTransaction], T]
    ) -> Callable[[JournalTransaction], T]:
        """`work` after the writes held so far, which it takes (none: `work` itself)."""
        held, self._held = self._held, []
        return _after(held, work)

    async def transact(
        self,
        work: Callable[[JournalTransaction], T],
        *,
        durable: bool = True,
        step: StepPlace | None = None,
        fenced: bool = True,
        careful: Callable[[JournalTransaction], T] | None = None,
        reads_fence: bool = False,
    ) -> T:
        """A transaction of this drive, fenced by its lease (unless not `fenced`: the drive's
        end that takes it checks it itself), that first writes what is held (`hold`); if it
        fails, they stay held (nothing of it was written). With `careful`, `work` presumes
        (`JournalCore.transact`, and `reads_fence`), and `careful` runs if it fails, the held
        writes first."""
        held, self._held = self._held, []

        fence = self.lease if fenced else None
        try:
            return await self.store.transact(
                _after(held, work), fence, durable=durable, step=step,
                careful=None if careful is None else _after(held, careful),
                reads_fence=reads_fence,
            )  # fmt: skip
        except BaseException:
            self._held[:0] = held
            raise

    def _note_pause(self, written: asyncio.Future[bool]) -> None:
        if not written.cancelled() and written.exception() is None and written.result():
            self.pause_seen = True

    def take_usage(self) -> DriveUsage:
        """What this drive counted so far, handed over once (it is charged at the end)."""
        used, self.usage = self.usage, DriveUsage()
        return used

    def all_written(self) -> bool:
        """On the journal's thread, in a transaction queued after this drive's last op: whether
        every batch answered ahead has been written before it (in order, so in this commit or
        an earlier one). False when one failed or waits to be written again."""
        return self._written_behind == self._queued_behind

    async def flush(self) -> None:
        """Wait for everything answered ahead to be committed, the writes held too; raise the
        first failure (a lost lease, an unavailable journal) after all have finished."""
        if self._held:  # queued as a batch answered ahead: what comes after finds them written
            self._queue_written(lambda tx: None)
        await self._behind_written()

    async def _behind_written(self) -> None:
        """Wait for the batches answered ahead and queued (`flush`, without the writes held)."""
        behind, self._behind = self._behind, []
        if behind:
            outcomes = await asyncio.gather(*behind, return_exceptions=True)
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    raise outcome

    def _serviced(self, tx: JournalTransaction, group: list[OpEnvelope], now: int) -> list[Answer]:
        """The answers of a journal batch, in op order. A result the sandbox settled itself is
        checked against what the journal makes of it; from the first that differs on (and from
        the start once the drive has diverged), nothing is serviced and every call is parked."""
        answers: list[Answer] = []
        together: list[OpEnvelope] = []  # pure steps' results in a row: written together
        for envelope in group:
            if self._writes_together(tx, envelope.op):
                together.append(envelope)
                continue
            self._settle_together(tx, together, now, answers)
            together = []
            self._service_one(tx, envelope, now, answers)
        self._settle_together(tx, together, now, answers)
        return answers

    def _service_one(
        self, tx: JournalTransaction, envelope: OpEnvelope, now: int, answers: list[Answer]
    ) -> None:
        op = envelope.op
        if self.diverged:
            if needs_answer(op):
                answers.append(Answer(envelope.id, PARKED, None))
            return
        answer = self._service(tx, envelope, now)
        if needs_answer(op):
            if answer is not None:
                answers.append(answer)
        elif isinstance(op, StepRecord) and (answer is None or answer.result != Value(None)):
            self.diverged = True

    def _writes_together(self, tx: JournalTransaction, op: Op) -> bool:
        """A pure step's result with its begin inside it that nothing would hold up (no
        pause asked, no budget spent when it began, no divergence): `_service` would write it
        alone with `steps.begun_settled` and answer it `Value(None)`."""
        return (
            isinstance(op, StepRecord)
            and op.begun_with is not None
            and op.value is not None
            and not self.diverged
            and not tx.pause_requested
            and not self._is_unbegun(op)
        )

    def _settle_together(
        self, tx: JournalTransaction, together: list[OpEnvelope], now: int, answers: list[Answer]
    ) -> None:
        """Write these results (see `_writes_together`) in two statements; when one of them
        has a row already (or comes twice), write each as `_service` does."""
        ops = [cast(StepRecord, envelope.op) for envelope in together]
        if not ops:
            return
        if steps.begun_settled_together(tx, self.run_id, ops, now):
            for op in ops:
                count_step("do", Value(None), self._elapsed_ms_of(op))
            return
        for envelope in together:
            self._service_one(tx, envelope, now, answers)

    def _service(self, tx: JournalTransaction, envelope: OpEnvelope, now: int) -> Answer | None:
        op = envelope.op
        match op:
            case Log():
                tx.insert_log(
                    self.run_id, self._renewed(f"{op.source}#{op.count}"), op.level, op.text, now,
                    max_lines=self.limits.log_lines_per_run,
                )  # fmt: skip
                return None
            case StepCheck() | StepSleep() | StepWaitForEvent() if self._refuses(
                tx, op.step, "step"
            ):
                return Answer(envelope.id, PARKED, None)
            case StepBegin() if (op.step, op.count) in self._unbegun:
                return None
            case StepBegin():  # under way in the sandbox already: it finishes, paused or not
                steps.begin(tx, self.run_id, op, now)
                return None
            case StepRecord() if self._is_unbegun(op):
                return Answer(envelope.id, PARKED, None)
            case StepRecord(begun_with=RetryPolicy()):
                answered = steps.begun_settled(tx, self.run_id, op, now)
                count_step("do", answered[0], self._elapsed_ms_of(op))
                if self._holds(tx, op.step):
                    return Answer(envelope.id, PARKED, None)
                return Answer(envelope.id, *answered)
            case StepCheck():
                result, at = steps.check(tx, self.run_id, op, now)
                started = result.value if isinstance(result, Value) else None
                if isinstance(started, dict) and started.get("hit") is False:
                    began = (self.monotonic(), op.config.timeout_ms, time.time_ns())
                    self._attempts[(op.step, op.count, started["attempt"])] = began
                return Answer(envelope.id, result, at)
            case StepRecord():
                elapsed = self._elapsed_ms_of(op)
                answer = steps.record(
                    tx, self.run_id, op, now, elapsed_ms=elapsed,
                    retry_in_drive_ms=self.limits.retry_in_drive_ms,
                )  # fmt: skip
                count_step("do", answer[0], elapsed)
                if self._holds(tx, op.step):  # recorded; the body goes on after the resume
                    return Answer(envelope.id, PARKED, None)
                return Answer(envelope.id, *answer)
            case StepSleep():
                return Answer(envelope.id, *steps.sleep(tx, self.run_id, op, now))
            case StepWaitForEvent():
                room = self.limits.journal_bytes_per_run - self.journal_bytes
                return Answer(envelope.id, *steps.wait_for_event(tx, self.run_id, op, now, room))
        raise AssertionError(f"not a journal op: {type(op).__name__}")

    def _is_unbegun(self, op: StepRecord) -> bool:
        return op.attempt == 1 and (op.step, op.count) in self._unbegun

    def _elapsed_ms_of(self, op: StepRecord) -> int | None:
        """How long the attempt took, if this drive began it."""
        began = self._attempts.get((op.step, op.count, op.attempt))
        return None if began is None else int((self.monotonic() - began[0]) * 1000)

    def _had_effect(self, op: StepRecord) -> bool:
        return bool(self._effectful) and step_key("do", op.count, op.step) in self._effectful

    def _effect(self, step: str) -> None:
        """Note an effect made under `step` (a call's full name): every step enclosing it had
        an effect in this drive. A call's name is its enclosing step's key, '/', its own name;
        that key is `kind:count:` and the enclosing step's own full name (an author's '/' is
        escaped)."""
        name = step
        while "/" in name:
            enclosing = name[: name.rfind("/")]
            self._effectful.add(enclosing)
            name = enclosing.split(":", 2)[2]

    def _renewed(self, name: str) -> str:
        return name if self.generation == 0 else f"{self.generation}@{name}"

    def _bounded(self, envelope: OpEnvelope) -> OpEnvelope:
        op = envelope.op
        if not isinstance(op, StepRecord) or op.value is None:
            return envelope
        refused = self._over_journal_limit(op.step, op.value)
        if refused is None:
            return envelope
        return OpEnvelope(envelope.id, dataclasses.replace(op, value=None, error=refused))

    def _located(self, envelope: OpEnvelope) -> OpEnvelope:
        """A step's error is journaled with the author's frames, not the engine's."""
        op = envelope.op
        if not isinstance(op, StepRecord) or op.error is None:
            return envelope
        error = dataclasses.replace(
            op.error,
            stack=self.locate(op.error.stack),  # None stays None
            message=with_run_hint(op.error.message, op.error.name),
        )
        return OpEnvelope(envelope.id, dataclasses.replace(op, error=error))

    def _over_journal_limit(self, step: str, value: str) -> StepFailure | None:
        """A result that would take the run's journal past its limit fails its step (not
        retried), naming the step: refused when recorded, never on a later replay."""
        size = len(value)
        limit = self.limits.journal_bytes_per_run
        if self.journal_bytes + size <= limit:
            self.journal_bytes += size
            self.usage.add("journal_bytes", size)
            return None
        return StepFailure(
            "LimitError",
            f"the result of step {step!r} ({size} bytes) would take the run's journal past its"
            f" limit of {limit} bytes ({self.journal_bytes} bytes recorded)",
            retryable=False,
        )


def _after(
    held: list[Callable[[JournalTransaction], object]], work: Callable[[JournalTransaction], T]
) -> Callable[[JournalTransaction], T]:
    """`work` after the writes `held` (none: `work` itself)."""
    if not held:
        return work

    def after_held(tx: JournalTransaction) -> T:
        for write in held:
            write(tx)
        return work(tx)

    return after_held
