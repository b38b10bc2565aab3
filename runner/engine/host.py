"""The host side of the bridge: the ops of one drive serviced against the journal.

The meaning of each op lives in runner/engine/steps.py as a synchronous journal transaction; this
module runs them (`JournalStore.transact`, fenced by the drive's lease: each commits before its
answer goes back) and does what must happen outside any transaction: calling tools, sending
notifications, running author SQL in the scope-database process. A tool call is written ahead
(attempt and audit row), then made, then its result is recorded.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from qjsflow.bridge import dumps_text
from qjsflow.bridge.failure import StepFailure, failure_to_json
from qjsflow.bridge.hints import with_run_hint
from qjsflow.bridge.keys import step_key
from qjsflow.bridge.limits import Limits
from qjsflow.bridge.types import (
    Answer,
    DbSql,
    Log,
    Op,
    OpEnvelope,
    RetryPolicy,
    StepBegin,
    StepCheck,
    StepNotify,
    StepRecord,
    StepSleep,
    StepTool,
    StepWaitForEvent,
    Suspend,
    Value,
    needs_answer,
)
from qjsflow.bridge.values import from_python, to_python
from qjsflow.runner.bindings import (
    Bindings,
    Notification,
    ToolCall,
    ToolFn,
    bind_tool_call,
    unbind_tool_call,
)
from qjsflow.runner.engine import steps
from qjsflow.runner.engine.locations import Locator
from qjsflow.runner.engine.steps import Answered
from qjsflow.runner.errors import FatalToolError
from qjsflow.runner.scopedb import ScopeDatabases, SqlOutcome
from qjsflow.runner.store import JournalStore, JournalTransaction, Lease
from qjsflow.runner.telemetry import tracing
from qjsflow.runner.telemetry.metrics import METRICS
from qjsflow.runner.tenancy.budgets import BY_CALL, Budgets, DriveUsage, Throttle, exhausted
from qjsflow.runner.tenancy.capabilities import DENIED, SQL_ADDRESS, Reach
from qjsflow.runner.tenancy.cloudflare_bindings import (
    BINDING_ADDRESSES,
    KV_ADDRESS,
    QUEUE_ADDRESS,
    R2_ADDRESS,
    kv_tool,
    queue_tool,
    r2_tool,
)
from qjsflow.runner.tenancy.egress import FETCH_ADDRESS, fetch
from qjsflow.runner.tenancy.environment import MissingSecret, ScopeEnvironment, reveal
from qjsflow.runner.tenancy.scopes import split_run_key
from qjsflow.runner.tenancy.secret_values import RunSecrets

__all__ = ["PARKED", "DriveHost"]

_ONCE = RetryPolicy(limit=0, delay_ms=0, backoff="constant", timeout_ms=1000)  # a denied call

# The answer to the run's own calls while a pause is asked: the body waits there until the run
# is resumed, and the drive ends as soon as the steps under way have recorded their results.
PARKED = Suspend("retry")


def _count_step(kind: str, result: object, elapsed_ms: int | None) -> None:
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


@dataclass(frozen=True, slots=True)
class _ToolCall:
    attempt: int
    seq: int  # the audit row


@dataclass(frozen=True, slots=True)
class _SqlCall:
    scope: str
    used_s: float


_NO_ENVIRONMENT = ScopeEnvironment()  # a scope's with none set (made once: it checks itself)


class DriveHost:
    """Services the ops of drives of one run. Callable as the sandbox's host callback."""

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
    ) -> None:
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

    async def __call__(self, ops: Sequence[OpEnvelope]) -> list[Answer]:
        """Answers in op order. Ops that only touch the journal are serviced together in one
        transaction; tools, notifications and SQL each need their own, around their call."""
        self.ops_seen += len(ops)
        answers: list[Answer] = []
        group: list[OpEnvelope] = []
        for envelope in ops:
            op = envelope.op
            if isinstance(op, StepTool | StepNotify | DbSql):
                self._effect(op.step)
                answers += await self._in_journal(group)
                await self.flush()  # an effect only ever follows what is journaled before it
                group = []
                if self.diverged:  # it follows a result the journal did not take: never made
                    answers.append(Answer(envelope.id, PARKED, None))
                    continue
                match op:
                    case StepTool():
                        result, at = await self._tool(op)
                    case StepNotify():
                        result, at = await self._notify(op)
                    case DbSql():
                        result, at = await self._sql(op)
                answers.append(Answer(envelope.id, result, at))
            else:
                group.append(envelope)
        answers += await self._in_journal(group)
        return answers

    async def _in_journal(self, group: list[OpEnvelope]) -> list[Answer]:
        if not group:
            return []
        now = self.now()
        group = [self._admitted(envelope) for envelope in group]
        self._trace_attempts(group)
        ahead = self._answers_ahead(group, now)
        if ahead is not None:
            self._write_behind(group, now)
            return ahead
        await self.flush()
        # Only a batch that settles an effect is fsynced (see JournalStore and docs/
        # PERFORMANCE.md, Durable writes). Starting attempts, console lines, sleeps, waits (an
        # event consumed is the oldest of the durable inbox: a replay consumes the same one),
        # and the result of a step whose body made no effect in this drive (no tool, fetch,
        # SQL or notification: a pure function of the journal, which a replay computes again
        # alike) are committed without an fsync; the next fsynced commit (the next effect,
        # the suspension or the end reported to the caller) makes them durable with it, as the
        # journal's log is written in order.
        durable = any(isinstance(e.op, StepRecord) and self._had_effect(e.op) for e in group)
        answers = await self.store.transact(
            lambda tx: self._serviced(tx, group, now), self.lease, durable=durable
        )
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

    def _write_behind(self, group: list[OpEnvelope], now: int) -> None:
        """Journal a batch answered ahead: queued now (the journal commits in queue order),
        awaited before anything that is not answered ahead (`flush`) and at the drive's end."""

        def work(tx: JournalTransaction) -> bool:
            self._serviced(tx, group, now)
            self._written_behind += 1
            return tx.pause_requested

        self._queued_behind += 1
        written = self.store.transact_soon(work, self.lease, durable=False)
        written.add_done_callback(self._note_pause)
        self._behind.append(written)
        self._count_logs(group)

    def _note_pause(self, written: asyncio.Future[bool]) -> None:
        if not written.cancelled() and written.exception() is None and written.result():
            self.pause_seen = True

    def all_written(self) -> bool:
        """On the journal's thread, in a transaction queued after this drive's last op: whether
        every batch answered ahead has been written before it (in order, so in this commit or
        an earlier one). False when one failed or waits to be written again."""
        return self._written_behind == self._queued_behind

    async def flush(self) -> None:
        """Wait for the batches answered ahead to be committed; raise the first failure (a
        lost lease, an unavailable journal) after all have finished."""
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
                _count_step("do", Value(None), self._elapsed_ms_of(op))
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
                _count_step("do", answered[0], self._elapsed_ms_of(op))
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
                _count_step("do", answer[0], elapsed)
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

    # -- tools ---------------------------------------------------------------------------------

    async def _tool(self, op: StepTool) -> Answered:
        key = step_key("tool", op.count, op.step)
        now = self.now()
        refusal = self.reach.tool_refusal(op.address, to_python(op.args))
        if refusal is not None:
            return await self._deny(op.step, op.count, kind="tool", address=op.address,
                                    args=op.args, refusal=refusal, digest=op.digest)  # fmt: skip
        tool, args, missing = self._tool_and_args(op)

        def begin(tx: JournalTransaction) -> Answered | _ToolCall | None:
            if self._refuses(tx, op.step, "fetch" if op.address == FETCH_ADDRESS else "tool"):
                return PARKED, None
            if tool is None or missing is not None:
                # Not bound in this process: an operator's problem, never the author's final
                # result. A recorded result still answers; otherwise the run is blocked.
                row = tx.get_step(self.run_id, "tool", op.step, op.count)
                return None if row is None else steps.settled(row)
            begun = steps.begin_attempt(
                tx, self.run_id, "tool", name=op.step, count=op.count, policy=op.config, now=now,
                digest=op.digest,
            )  # fmt: skip
            if not isinstance(begun, int):
                return begun
            call = tx.start_tool_call(
                self.run_id, key, begun, address=op.address, args=op.args, at=now
            )
            steps.event(tx, self.run_id, "tool_called", now, key, address=op.address)
            return _ToolCall(begun, call)

        started = await self.store.transact(begin, self.lease)
        if started is None:
            self.blocked_on = op.address if missing is None else f"secret {missing}"
            return Suspend("retry"), None
        if not isinstance(started, _ToolCall):
            return started  # recorded already (another writer settled it): it answers
        assert tool is not None  # begin() starts an attempt only with the tool in hand
        attempt, call = started.attempt, started.seq
        self.usage.add("steps", 1)
        self.usage.add("fetches" if op.address == FETCH_ADDRESS else "tool_calls", 1)
        scope, run_id = split_run_key(self.run_id)
        token = bind_tool_call(ToolCall(scope, run_id, key, attempt, op.address))
        try:
            traced = {"qjsflow.step": key, "qjsflow.attempt": attempt}
            with tracing.call_span(self.trace, f"qjsflow.tool {op.address[:100]}", traced) as span:
                value, failure, duration_ms = await self._call_tool(op, tool, args)
                if failure is not None:
                    tracing.failed(span, f"{failure.name}: {failure.message}")
        finally:
            unbind_tool_call(token)
        if value is not None:
            refused = self._over_journal_limit(key, value)
            if refused is not None:
                value, failure = None, refused
        finished = self.now()

        def end(tx: JournalTransaction) -> Answered:
            error = None if failure is None else failure_to_json(failure)
            tx.finish_tool_call(call, value, error, duration_ms)
            row = tx.get_step(self.run_id, "tool", op.step, op.count)
            assert row is not None
            answer = steps.settle_call(
                tx, row, attempt=attempt, value=value, failure=failure, now=finished,
                elapsed_ms=duration_ms,
            )  # fmt: skip
            return (PARKED, None) if self._holds(tx, op.step) else answer

        answered = await self.store.transact(end, self.lease)
        _count_step("tool", answered[0], duration_ms)
        return answered

    def _tool_and_args(self, op: StepTool) -> tuple[ToolFn | None, Any, str | None]:
        """The tool that serves `op`, its arguments (decoded once; secret values put in only
        for a tool or fetch, where they leave the host), and the secret this worker lacks."""
        tool = self.bindings.tool(op.address) or self._builtin(op.address)
        if op.address in BINDING_ADDRESSES:  # they store what they get: no value goes there
            args = to_python(op.args)
            where = args.get("binding") if isinstance(args, dict) else op.address
            try:
                self.secrets.refuse_handles(args, str(where)[:80])
            except FatalToolError as error:
                return _failing(error), args, None
            return tool, args, None
        try:
            return tool, reveal(to_python(op.args), self.secrets.reachable), None
        except MissingSecret as lacking:
            return tool, None, lacking.name

    async def _deny(
        self,
        step: str,
        count: int,
        *,
        kind: str,
        address: str,
        args: str,
        refusal: str,
        digest: str | None,
    ) -> Answered:
        """A call outside what the run may reach: it fails (not retried) with the coded error
        `capability_denied`, journaled in the tool audit as denied; nothing is called."""
        key = step_key(kind, count, step)
        now = self.now()
        failure = StepFailure("CapabilityDenied", f"{refusal}: denied", False, code=DENIED)

        def deny(tx: JournalTransaction) -> Answered:
            if self._refuses(tx, step, "tool"):
                return PARKED, None
            begun = steps.begin_attempt(
                tx, self.run_id, kind, name=step, count=count, policy=_ONCE,
                now=now, digest=digest,
            )  # fmt: skip
            if not isinstance(begun, int):
                return begun
            call = tx.start_tool_call(self.run_id, key, begun, address=address, args=args, at=now)
            tx.finish_tool_call(call, None, failure_to_json(failure), 0)
            steps.event(tx, self.run_id, "call_denied", now, key, address=address)
            row = tx.get_step(self.run_id, kind, step, count)
            assert row is not None
            return steps.settle_call(
                tx, row, attempt=begun, value=None, failure=failure, now=now, elapsed_ms=0
            )

        return await self.store.transact(deny, self.lease)

    def _builtin(self, address: str) -> ToolFn | None:
        """fetch, and the local KV, queue and R2 bindings, unless the operator bound these."""
        if address == FETCH_ADDRESS:
            return self._fetch
        local = {KV_ADDRESS: kv_tool, QUEUE_ADDRESS: queue_tool, R2_ADDRESS: r2_tool}.get(address)
        return (
            None
            if local is None
            else functools.partial(local, self.store, self.scope, now=self.now)
        )

    async def _fetch(self, args: Any) -> Any:
        """The sandbox's `fetch`, under the scope's egress policy (runner/tenancy/egress.py)."""
        egress = self.reach.egress(self.environment.egress)
        response = await fetch(args, egress, self.scope, self.secrets.reachable)
        if response.get("bodyEncoding") == "base64":  # masked as bytes: text masks cannot see
            raw = self.secrets.mask_bytes(base64.b64decode(response["body"]))
            response["body"] = base64.b64encode(raw).decode("ascii")
        return response

    async def _call_tool(
        self, op: StepTool, tool: ToolFn, args: Any
    ) -> tuple[str | None, StepFailure | None, int]:
        started = self.monotonic()
        try:
            result = await asyncio.wait_for(tool(args), op.config.timeout_ms / 1000)
            # What comes back is recorded: no secret's value may be in it (secret_values.py).
            value = from_python(self.secrets.mask(result), max_bytes=self.limits.value_bytes,
                                what="the tool result")  # fmt: skip
            return value, None, self._elapsed_ms(started)
        except TimeoutError:
            message = f"tool {op.address!r} exceeded its timeout of {op.config.timeout_ms} ms"
            return None, StepFailure("StepTimeoutError", message), self._elapsed_ms(started)
        except FatalToolError as error:
            message = self.secrets.mask_text(str(error))
            return None, StepFailure("FatalError", message, False), self._elapsed_ms(started)
        except Exception as error:  # a tool's failure is the step's, never the host's
            name, message = type(error).__name__, self.secrets.mask_text(str(error))
            return None, StepFailure(name, message), self._elapsed_ms(started)

    def _elapsed_ms(self, started: float) -> int:
        return int((self.monotonic() - started) * 1000)

    # -- notifications, logs -------------------------------------------------------------------

    async def _notify(self, op: StepNotify) -> Answered:
        now = self.now()
        message = dumps_text({"title": op.title, "body": op.body, "link": op.link})

        def record_first(tx: JournalTransaction) -> tuple[Answered, bool]:
            if self._refuses(tx, op.step, "notify"):
                return (PARKED, None), False
            row = tx.get_step(self.run_id, "notify", op.step, op.count)
            answer = steps.settled(row)
            if answer is not None:
                return answer, False
            tx.insert_step(
                self.run_id, "notify", op.step, op.count, status="running", attempt=1,
                started_at=now, detail=message,
            )  # fmt: skip
            row = tx.get_step(self.run_id, "notify", op.step, op.count)
            assert row is not None
            tx.settle_step(
                row, status="completed", output=None, error=None, at=now, event_type="notified"
            )
            return (Value(None), now), True

        # Recorded before it is sent: at most once, even if the process dies right after.
        answer, send = await self.store.transact(record_first, self.lease)
        if send:
            self.usage.add("steps", 1)
            # Best effort by contract: a failed notification fails nothing.
            with contextlib.suppress(Exception):
                scope, run_id = split_run_key(self.run_id)
                await self.bindings.notify(Notification(run_id, op.title, op.body, op.link, scope))
        return answer

    # -- author SQL ----------------------------------------------------------------------------

    async def _sql(self, op: DbSql) -> Answered:
        """Author SQL in the scope's database. The scope database records the call as applied
        in the statement's own transaction, so re-asking after a crash never applies it twice."""
        now = self.now()
        key = step_key("sql", op.count, op.step)
        refusal = self.reach.sql_refusal()
        if refusal is not None:
            args = dumps_text({"sql": op.sql[:500]})
            return await self._deny(op.step, op.count, kind="sql", address=SQL_ADDRESS,
                                    args=args, refusal=refusal, digest=op.digest)  # fmt: skip

        def begin(tx: JournalTransaction) -> Answered | _SqlCall:
            if self._refuses(tx, op.step, "sql"):
                return PARKED, None
            row = tx.get_step(self.run_id, "sql", op.step, op.count)
            answer = steps.settled(row)
            if answer is not None:
                return answer
            if row is None:
                tx.insert_step(
                    self.run_id, "sql", op.step, op.count, status="running", attempt=1,
                    started_at=now, detail=dumps_text({"sql": op.sql[:500]}),
                    args_digest=op.digest,
                )  # fmt: skip
            run = tx.get_run(self.run_id)
            assert run is not None
            return _SqlCall(run.scope, run.sql_used_s)

        begun = await self.store.transact(begin, self.lease)
        if not isinstance(begun, _SqlCall):
            return begun
        scope, used_s = begun.scope, begun.used_s
        sql_limits = self.scopes.limits
        left = sql_limits.run_budget_s - used_s
        if left <= 0:
            budget = f"{sql_limits.run_budget_s:g} s"
            message = f"the run's SQL time budget of {budget} is used up"
            outcome = SqlOutcome(None, "quota", message, 0.0)
        else:
            with tracing.call_span(self.trace, "qjsflow.db.sql", {"qjsflow.step": key}):
                outcome = await self.scopes.execute(
                    scope, run_id=self.run_id, call_key=self._renewed(key), sql=op.sql,
                    params=op.params, deadline_s=min(sql_limits.deadline_s, left),
                    read_only=self.reach.sql == "read",
                )  # fmt: skip
        METRICS.sql_seconds.observe(outcome.elapsed_s)
        self.usage.add("steps", 1)
        self.usage.add("sql_s", outcome.elapsed_s)
        # Counted once, outside the transaction below (which may run again after a fault).
        refused = None if outcome.result is None else self._over_journal_limit(key, outcome.result)
        finished = self.now()

        def end(tx: JournalTransaction) -> Answered:
            answer = settle(tx)
            return (PARKED, None) if self._holds(tx, op.step) else answer

        def settle(tx: JournalTransaction) -> Answered:
            run = tx.get_run(self.run_id)
            assert run is not None
            tx.update_run(self.run_id, sql_used_s=run.sql_used_s + outcome.elapsed_s)
            row = tx.get_step(self.run_id, "sql", op.step, op.count)
            assert row is not None
            answer = steps.settled(row)
            if answer is not None:
                return answer
            if outcome.result is not None and refused is None:
                tx.settle_step(
                    row, status="completed", output=outcome.result, error=None, at=finished,
                    event_type="sql_completed",
                )  # fmt: skip
                return Value(outcome.result), finished
            failure = refused or StepFailure(
                "SqlError", outcome.message or "the statement failed", False, code=outcome.code
            )
            if outcome.code == DENIED:  # a write where the snapshot may only read: audited
                audit = dumps_text({"sql": op.sql[:500]})
                call = tx.start_tool_call(self.run_id, key, 1, address=SQL_ADDRESS, args=audit,
                                          at=finished)  # fmt: skip
                tx.finish_tool_call(call, None, failure_to_json(failure), 0)
            tx.settle_step(
                row, status="failed", output=None, error=failure_to_json(failure), at=finished,
                event_type="sql_failed",
            )  # fmt: skip
            return failure, finished

        return await self.store.transact(end, self.lease)


def _failing(error: FatalToolError) -> ToolFn:
    """A tool that fails its call with `error` (a call refused before any tool runs)."""

    async def refuse(args: Any) -> Any:
        raise error

    return refuse
