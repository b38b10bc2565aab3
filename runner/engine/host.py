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
import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from qjsflow.bridge import dumps_text
from qjsflow.bridge.failure import StepFailure, failure_to_json
from qjsflow.bridge.keys import step_key
from qjsflow.bridge.types import (
    Answer,
    DbSql,
    Op,
    OpEnvelope,
    RetryPolicy,
    StepNotify,
    StepTool,
    Suspend,
    Value,
)
from qjsflow.bridge.values import from_python, to_python
from qjsflow.runner.bindings import (
    Notification,
    ToolCall,
    ToolFn,
    bind_tool_call,
    unbind_tool_call,
)
from qjsflow.runner.engine import steps
from qjsflow.runner.engine.host_journal import PARKED, JournalOps, count_step
from qjsflow.runner.engine.steps import Answered
from qjsflow.runner.errors import FatalToolError
from qjsflow.runner.scopedb import SqlCall, SqlOutcome
from qjsflow.runner.scopedb.replication import ChangeLost
from qjsflow.runner.store import JournalTransaction, StepStatus
from qjsflow.runner.store.records import StepPlace
from qjsflow.runner.telemetry import tracing
from qjsflow.runner.telemetry.metrics import METRICS
from qjsflow.runner.tenancy.capabilities import DENIED, SQL_ADDRESS
from qjsflow.runner.tenancy.cloudflare_bindings import (
    BINDING_ADDRESSES,
    KV_ADDRESS,
    QUEUE_ADDRESS,
    R2_ADDRESS,
    WORKFLOW_ADDRESS,
    kv_tool,
    queue_tool,
    r2_tool,
)
from qjsflow.runner.tenancy.egress import FETCH_ADDRESS, fetch
from qjsflow.runner.tenancy.environment import MissingSecret, reveal
from qjsflow.runner.tenancy.run_tags import TAGS_ADDRESS, tags_tool
from qjsflow.runner.tenancy.scopes import split_run_key

__all__ = ["PARKED", "DriveHost"]

_ONCE = RetryPolicy(limit=0, delay_ms=0, backoff="constant", timeout_ms=1000)  # a denied call


@dataclass(frozen=True, slots=True)
class _SqlCall:
    scope: str
    used_s: float


class DriveHost(JournalOps):
    """Services the ops of drives of one run. Callable as the sandbox's host callback: journal
    ops in batches (`JournalOps`), each effect by its handler (`_EFFECTS`)."""

    async def __call__(self, ops: Sequence[OpEnvelope]) -> list[Answer]:
        """Answers in op order. Ops that only touch the journal are serviced together in one
        transaction; tools, notifications and SQL each need their own, around their call."""
        self.ops_seen += len(ops)
        answers: list[Answer] = []
        group: list[OpEnvelope] = []
        for envelope in ops:
            op = envelope.op
            effect = _EFFECTS.get(type(op))
            if effect is not None:
                self._effect(cast(EffectOp, op).step)
                answers += await self._in_journal(group)
                # An effect only ever follows what is journaled before it: what was answered
                # ahead is written, and the effect's first transaction writes what is held.
                await self._behind_written()
                group = []
                if self.diverged:  # it follows a result the journal did not take: never made
                    answers.append(Answer(envelope.id, PARKED, None))
                    continue
                result, at = await effect(self, op)
                answers.append(Answer(envelope.id, result, at))
            else:
                group.append(envelope)
        answers += await self._in_journal(group)
        return answers

    # -- tools ---------------------------------------------------------------------------------

    async def _tool(self, op: StepTool) -> Answered:
        key = step_key("tool", op.count, op.step)
        now = self.now()
        refusal = self.reach.tool_refusal(op.address, to_python(op.args))
        if refusal is not None:
            return await self._deny(op.step, op.count, kind="tool", address=op.address,
                                    args=op.args, refusal=refusal, digest=op.digest)  # fmt: skip
        tool, args, missing = self._tool_and_args(op)
        place = StepPlace(self.run_id, "tool", op.step, op.count)  # what both read first
        started = await self._begin_call(
            op, key, now, place, ready=tool is not None and missing is None
        )
        if started is None:
            self.blocked_on = op.address if missing is None else f"secret {missing}"
            return Suspend("retry"), None
        if not isinstance(started, int):
            return started  # recorded already (another writer settled it): it answers
        assert tool is not None  # begin() starts an attempt only with the tool in hand
        attempt = started
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
        if value is not None and self._answers_result_ahead(attempt, duration_ms, op):
            self.hold(functools.partial(
                JournalTransaction.settle_call_answered, place=place, attempt=attempt,
                result=value, duration_ms=duration_ms, at=finished,
            ))  # fmt: skip
            count_step("tool", Value(value), duration_ms)
            return Value(value), finished

        def end(tx: JournalTransaction) -> Answered:
            row = tx.get_step(self.run_id, "tool", op.step, op.count)
            assert row is not None
            error = None if failure is None else failure_to_json(failure)
            tx.finish_tool_call(self.run_id, key, attempt, result=value, error=error,
                                duration_ms=duration_ms)  # fmt: skip
            answer = steps.settle_call(
                tx, row, attempt=attempt, value=value, failure=failure, now=finished,
                elapsed_ms=duration_ms,
            )  # fmt: skip
            return (PARKED, None) if self._holds(tx, op.step) else answer

        answered = await self.transact(end, step=place)
        count_step("tool", answered[0], duration_ms)
        return answered

    async def _begin_call(
        self, op: StepTool, key: str, now: int, place: StepPlace, *, ready: bool
    ) -> Answered | int | None:
        """A call's attempt begun and written ahead (its number); or the answer of a call
        settled already or parked; or None: not `ready` (its tool or a secret is not in
        this process) and not recorded."""

        call = "fetch" if op.address == FETCH_ADDRESS else "tool"

        def written_ahead(tx: JournalTransaction, begun: Answered | int) -> Answered | int:
            if isinstance(begun, int):  # the call's audit row, before it is made
                tx.start_tool_call(self.run_id, key, begun, address=op.address, args=op.args,
                                   at=now)  # fmt: skip
                steps.event(tx, self.run_id, "tool_called", now, key, address=op.address)
            return begun

        def begin(tx: JournalTransaction) -> Answered | int | None:
            if self._refuses(tx, op.step, call):
                return PARKED, None
            if not ready:
                # Not bound in this process: an operator's problem, never the author's final
                # result. A recorded result still answers; otherwise the run is blocked.
                row = tx.get_step(self.run_id, "tool", op.step, op.count)
                return None if row is None else steps.settled(row)
            return written_ahead(tx, steps.begin_attempt(
                tx, self.run_id, "tool", name=op.step, count=op.count, policy=op.config, now=now,
                digest=op.digest,
            ))  # fmt: skip

        def begin_first(tx: JournalTransaction) -> Answered | int | None:
            # Presumed: the step has no row (the insert fails otherwise, and `begin` runs).
            if self._refuses(tx, op.step, call):
                return PARKED, None
            return steps.begin_first_call(tx, place, op, now)

        if not ready:
            return await self.transact(begin, step=place)
        # A call is new to the journal but after a crash or a retry: presumed so.
        return await self.transact(begin_first, step=place, careful=begin)

    def _answers_result_ahead(self, attempt: int, duration_ms: int, op: StepTool) -> bool:
        """Whether a call's value is answered at once, its write held for the drive's next
        transaction (`hold`; docs/ARCHITECTURE.md, "A tool's result is written with what
        follows it"): a first attempt begun in this drive (under its lease nothing else
        settles it), within its timeout, with no pause, spent budget or divergence seen —
        where the journal would answer the value itself."""
        return (
            attempt == 1
            and duration_ms <= op.config.timeout_ms
            and not self.pause_seen
            and self.throttle is None
            and not self.diverged
        )

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
            if op.address == WORKFLOW_ADDRESS and isinstance(args, dict):
                # The call's place in the run: an instance it creates has an id made from it,
                # so a call made again after a crash finds the instance it created.
                args = {**args, "call": f"{op.step}#{op.count}"}
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
            tx.start_tool_call(self.run_id, key, begun, address=address, args=args, at=now)
            tx.finish_tool_call(self.run_id, key, begun, result=None,
                                error=failure_to_json(failure), duration_ms=0)  # fmt: skip
            steps.event(tx, self.run_id, "call_denied", now, key, address=address)
            row = tx.get_step(self.run_id, kind, step, count)
            assert row is not None
            return steps.settle_call(
                tx, row, attempt=begun, value=None, failure=failure, now=now, elapsed_ms=0
            )

        return await self.transact(deny)

    def _builtin(self, address: str) -> ToolFn | None:
        """fetch, and the local KV, queue and R2 bindings, unless the operator bound these."""
        if address == FETCH_ADDRESS:
            return self._fetch
        if address == WORKFLOW_ADDRESS:
            return self.children
        if address == TAGS_ADDRESS:
            return functools.partial(tags_tool, self.store, self.run_id)
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
                self.run_id, "notify", op.step, op.count, status=StepStatus.running, attempt=1,
                started_at=now, detail=message,
            )  # fmt: skip
            row = tx.get_step(self.run_id, "notify", op.step, op.count)
            assert row is not None
            tx.settle_step(
                row,
                status=StepStatus.completed,
                output=None,
                error=None,
                at=now,
                event_type="notified",
            )
            return (Value(None), now), True

        # Recorded before it is sent: at most once, even if the process dies right after.
        answer, send = await self.transact(record_first)
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
                    self.run_id, "sql", op.step, op.count, status=StepStatus.running, attempt=1,
                    started_at=now, detail=dumps_text({"sql": op.sql[:500]}),
                    args_digest=op.digest,
                )  # fmt: skip
            run = tx.get_run(self.run_id)
            assert run is not None
            return _SqlCall(run.scope, run.sql_used_s)

        begun = await self.transact(begin)
        if not isinstance(begun, _SqlCall):
            return begun
        scope, used_s = begun.scope, begun.used_s
        sql_limits = self.scopes.limits
        left = sql_limits.run_budget_s - used_s
        record = functools.partial(self._record_sql, op, key, scope)
        if left <= 0:
            budget = f"{sql_limits.run_budget_s:g} s"
            message = f"the run's SQL time budget of {budget} is used up"
            return await record(SqlOutcome(None, "quota", message, 0.0))
        with tracing.call_span(self.trace, "qjsflow.db.sql", {"qjsflow.step": key}):
            deadline_s = min(sql_limits.deadline_s, left)
            read_only = self.reach.sql == "read"
            statement = SqlCall(self.run_id, self._renewed(key), op.sql, op.params, deadline_s,
                                read_only)  # fmt: skip
            return await self.scopes.call(scope, statement, record=record)

    async def _record_sql(self, op: DbSql, key: str, scope: str, outcome: SqlOutcome) -> Answered:
        """The call's outcome recorded, and for a replicated scope database its change with
        it as the scope's next version (`ChangeLost` if another writer took that version:
        nothing of this transaction is kept)."""
        METRICS.sql_seconds.observe(outcome.elapsed_s)
        self.usage.add("steps", 1)
        self.usage.add("sql_s", outcome.elapsed_s)
        # Counted once, outside the transaction below (which may run again after a fault).
        refused = None if outcome.result is None else self._over_journal_limit(key, outcome.result)
        finished = self.now()

        def end(tx: JournalTransaction) -> Answered:
            if outcome.change is not None:
                if not tx.append_scope_change(scope, outcome.version, outcome.change, finished):
                    raise ChangeLost(scope, outcome.version)
                tx.charge_usage(scope, [("journal_bytes", 0, float(len(outcome.change)))])
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
                    row, status=StepStatus.completed, output=outcome.result, error=None,
                    at=finished, event_type="sql_completed",
                )  # fmt: skip
                return Value(outcome.result), finished
            failure = refused or StepFailure(
                "SqlError", outcome.message or "the statement failed", False, code=outcome.code
            )
            if outcome.code == DENIED:  # a write where the snapshot may only read: audited
                audit = dumps_text({"sql": op.sql[:500]})
                tx.start_tool_call(self.run_id, key, 1, address=SQL_ADDRESS, args=audit,
                                   at=finished)  # fmt: skip
                tx.finish_tool_call(self.run_id, key, 1, result=None,
                                    error=failure_to_json(failure), duration_ms=0)  # fmt: skip
            tx.settle_step(
                row, status=StepStatus.failed, output=None, error=failure_to_json(failure),
                at=finished, event_type="sql_failed",
            )  # fmt: skip
            return failure, finished

        return await self.transact(end)


def _failing(error: FatalToolError) -> ToolFn:
    """A tool that fails its call with `error` (a call refused before any tool runs)."""

    async def refuse(args: Any) -> Any:
        raise error

    return refuse


# One handler for each op with an effect outside the journal; every other op is a journal op.
EffectOp = StepTool | StepNotify | DbSql
_EFFECTS: dict[type[Op], Callable[[DriveHost, Any], Awaitable[Answered]]] = {
    StepTool: DriveHost._tool,
    StepNotify: DriveHost._notify,
    DbSql: DriveHost._sql,
}
