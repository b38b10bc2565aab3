"""The host side of the bridge: every op of one drive serviced against the journal.

Each op is serviced in its own `BEGIN IMMEDIATE` transaction, fenced by the drive's lease and
committed before its answer is returned (write-ahead). Step rows are first-writer-wins: a step
settles once, and a late writer is answered with the winner's value. Tool calls run outside
any transaction: the attempt is recorded first, the tool is called, then its result is recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import orjson

from bridge import dumps_text
from bridge.limits import Limits
from bridge.types import (
    Answer,
    DbSql,
    Log,
    OpEnvelope,
    Result,
    RetryPolicy,
    StepCheck,
    StepFailure,
    StepNotify,
    StepRecord,
    StepSleep,
    StepTool,
    StepWaitForEvent,
    Suspend,
    Value,
)
from bridge.values import from_python, to_python
from bridge.wire import ProtocolError
from runner.bindings import Bindings, Notification
from runner.errors import FatalToolError
from runner.scopedb import ScopeDatabases, SqlOutcome
from runner.store import JournalStore, JournalTransaction, Lease, StepRow

__all__ = ["CRASH_AFTER_SQL", "DriveHost", "failure_from_json", "failure_to_json"]

# Set to a piece of SQL text in a worker's environment to SIGKILL it right after a db.sql call
# holding that text was applied in the scope database and before the journal recorded it: the
# window exactly-once must survive.
CRASH_AFTER_SQL = "QJSFLOW_CRASH_AFTER_SQL_APPLY"


def failure_to_json(failure: StepFailure) -> str:
    return dumps_text(
        {
            "name": failure.name,
            "message": failure.message,
            "retryable": failure.retryable,
            "retryAfterMs": failure.retry_after_ms,
            "code": failure.code,
        }
    )


def failure_from_json(text: str) -> StepFailure:
    data = orjson.loads(text)
    return StepFailure(
        data["name"], data["message"], data["retryable"], data.get("retryAfterMs"), data.get("code")
    )


def _policy_to_json(policy: RetryPolicy) -> str:
    return dumps_text(
        {
            "limit": policy.limit,
            "delayMs": policy.delay_ms,
            "backoff": policy.backoff,
            "timeoutMs": policy.timeout_ms,
        }
    )


def _policy_from_json(text: str | None) -> RetryPolicy:
    data = orjson.loads(text or "{}")
    return RetryPolicy(data["limit"], data["delayMs"], data["backoff"], data["timeoutMs"])


@dataclass(frozen=True, slots=True)
class _Settled:
    """What a step row says when it is already settled, as an answer."""

    result: Result
    at: int


def _settled(row: StepRow) -> _Settled | None:
    if row.settled_seq is None or row.completed_at is None:
        return None
    if row.status == "failed" and row.error is not None:
        return _Settled(failure_from_json(row.error), row.completed_at)
    return _Settled(Value(row.output), row.completed_at)


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
    ) -> None:
        self.scopes = scopes
        self.store = store
        self.lease = lease
        self.run_id = lease.run_id
        self.bindings = bindings
        self.limits = limits
        self.now = clock_ms
        self.logs_count = 0

    async def __call__(self, ops: Sequence[OpEnvelope]) -> list[Answer]:
        answers: list[Answer] = []
        for envelope in ops:
            op = envelope.op
            match op:
                case Log():
                    await self._log(op)
                    continue
                case StepCheck():
                    result, at = await self._check(op)
                case StepRecord():
                    result, at = await self._record(op)
                case StepSleep():
                    result, at = await self._sleep(op)
                case StepWaitForEvent():
                    result, at = await self._wait(op)
                case StepTool():
                    result, at = await self._tool(op)
                case StepNotify():
                    result, at = await self._notify(op)
                case DbSql():
                    result, at = await self._sql(op)
            answers.append(Answer(envelope.id, result, at))
        return answers

    # -- step.do -----------------------------------------------------------------------------

    async def _check(self, op: StepCheck) -> tuple[Result, int | None]:
        now = self.now()
        async with self.store.transaction(self.lease) as tx:
            row = await tx.get_step(self.run_id, "do", op.step, op.count)
            if row is None:
                await tx.insert_step(
                    self.run_id, "do", op.step, op.count, status="running", attempt=1,
                    started_at=now, config=_policy_to_json(op.config),
                )  # fmt: skip
                await self._event(tx, "step_started", now, row_key("do", op), attempt=1)
                return Value({"hit": False, "attempt": 1, "now": now}), None
            return await self._resume_attempt(tx, row, now, "do")

    async def _resume_attempt(
        self, tx: JournalTransaction, row: StepRow, now: int, kind: str
    ) -> tuple[Result, int | None]:
        """A step met again: settled, waiting for its retry, or in flight when a driver died."""
        settled = _settled(row)
        if settled is not None:
            if kind == "do" and isinstance(settled.result, Value):
                return Value({"hit": True, "value": settled.result.value}), settled.at
            return settled.result, settled.at
        if row.status == "running":
            # The attempt was in flight when its driver stopped: it counts as failed.
            interrupted = StepFailure(
                "StepInterruptedError",
                f"attempt {row.attempt} of step {row.name!r} was interrupted (its driver stopped)",
            )
            outcome = await self._fail_attempt(tx, row, interrupted, now)
            if outcome is not None:
                return outcome
            refreshed = await tx.get_step(row.run_id, row.kind, row.name, row.count)
            assert refreshed is not None
            row = refreshed
        due = _retry_due(row)
        if due > now:
            return Suspend("retry", wake_at_ms=due), None
        attempt = row.attempt + 1
        await tx.delete_timer(self.run_id, row.key)
        await tx.update_step(
            self.run_id, row.kind, row.name, row.count, status="running", attempt=attempt,
            started_at=now,
        )  # fmt: skip
        await self._event(tx, "step_started", now, row.key, attempt=attempt)
        if kind == "do":
            return Value({"hit": False, "attempt": attempt, "now": now}), None
        return Value({"attempt": attempt}), None

    async def _fail_attempt(
        self, tx: JournalTransaction, row: StepRow, failure: StepFailure, now: int
    ) -> tuple[Result, int | None] | None:
        """Apply the retry policy to a failed attempt: None when a retry is scheduled."""
        policy = _policy_from_json(row.config)
        if failure.retryable and row.attempt <= policy.limit:
            delay = failure.retry_after_ms
            if delay is None:
                delay = policy.delay_after(row.attempt)
            retry_at = now + delay
            await tx.update_step(
                self.run_id, row.kind, row.name, row.count, status="retrying",
                error=failure_to_json(failure), detail=dumps_text({"retryAt": retry_at}),
            )  # fmt: skip
            await tx.set_timer(self.run_id, row.key, "retry", retry_at)
            await self._event(
                tx, "step_retrying", now, row.key, attempt=row.attempt,
                retryAt=retry_at, error=failure.message,
            )  # fmt: skip
            return None
        final = StepFailure(failure.name, failure.message, retryable=False)
        await tx.settle_step(
            row, status="failed", output=None, error=failure_to_json(final), at=now,
            event_type="step_failed",
        )  # fmt: skip
        return final, now

    async def _record(self, op: StepRecord) -> tuple[Result, int | None]:
        now = self.now()
        async with self.store.transaction(self.lease) as tx:
            row = await tx.get_step(self.run_id, "do", op.step, op.count)
            if row is None:
                raise ProtocolError(f"step {op.step!r} #{op.count} was recorded without a check")
            settled = _settled(row)
            if settled is not None:  # another writer settled it first: its value wins
                return settled.result, settled.at
            if row.status != "running" or row.attempt != op.attempt:
                return Suspend("retry"), None
            policy = _policy_from_json(row.config)
            failure = op.error
            if now - row.started_at > policy.timeout_ms:
                failure = StepFailure(
                    "StepTimeoutError",
                    f"attempt {op.attempt} of step {op.step!r} exceeded its timeout of "
                    f"{policy.timeout_ms} ms",
                )
            if failure is None:
                await tx.settle_step(
                    row, status="completed", output=op.value, error=None, at=now,
                    event_type="step_completed",
                )  # fmt: skip
                return Value(None), now
            outcome = await self._fail_attempt(tx, row, failure, now)
            return outcome if outcome is not None else (Suspend("retry"), None)

    # -- sleep and waitForEvent --------------------------------------------------------------

    async def _sleep(self, op: StepSleep) -> tuple[Result, int | None]:
        now = self.now()
        async with self.store.transaction(self.lease) as tx:
            row = await tx.get_step(self.run_id, "sleep", op.step, op.count)
            if row is None:
                due = op.until_ms if op.until_ms is not None else now + (op.ms or 0)
                await tx.insert_step(
                    self.run_id, "sleep", op.step, op.count, status="waiting", attempt=1,
                    started_at=now, detail=dumps_text({"dueAt": due}),
                )  # fmt: skip
                row = await tx.get_step(self.run_id, "sleep", op.step, op.count)
                assert row is not None
                await self._event(tx, "sleep_scheduled", now, row.key, dueAt=due)
            settled = _settled(row)
            if settled is not None:
                return settled.result, settled.at
            due = int(orjson.loads(row.detail or "{}")["dueAt"])
            if due > now:
                await tx.set_timer(self.run_id, row.key, "sleep", due)
                return Suspend("sleep", wake_at_ms=due), None
            await tx.delete_timer(self.run_id, row.key)
            await tx.settle_step(
                row, status="completed", output=None, error=None, at=now,
                event_type="sleep_completed",
            )  # fmt: skip
            return Value(None), now

    async def _wait(self, op: StepWaitForEvent) -> tuple[Result, int | None]:
        now = self.now()
        async with self.store.transaction(self.lease) as tx:
            row = await tx.get_step(self.run_id, "waitForEvent", op.step, op.count)
            if row is None:
                deadline = now + op.timeout_ms
                await tx.insert_step(
                    self.run_id, "waitForEvent", op.step, op.count, status="waiting",
                    attempt=1, started_at=now,
                    detail=dumps_text({"type": op.type, "deadline": deadline}),
                )  # fmt: skip
                row = await tx.get_step(self.run_id, "waitForEvent", op.step, op.count)
                assert row is not None
                await self._event(tx, "waiting_for_event", now, row.key, type=op.type)
            settled = _settled(row)
            if settled is not None:
                return settled.result, settled.at
            detail = orjson.loads(row.detail or "{}")
            deadline = int(detail["deadline"])
            # Only an event received by the deadline may serve this wait.
            event = await tx.oldest_unconsumed(self.run_id, detail["type"], deadline)
            if event is not None:
                await tx.consume(event.seq, row.key)
                await tx.delete_timer(self.run_id, row.key)
                value = _event_value(detail["type"], event.payload, event.received_at)
                await tx.settle_step(
                    row, status="completed", output=value, error=None, at=now,
                    event_type="event_consumed",
                )  # fmt: skip
                return Value(value), now
            if now >= deadline:
                failure = StepFailure(
                    "WaitForEventTimeoutError",
                    f"step.waitForEvent({op.step!r}) timed out after {op.timeout_ms} ms "
                    f"waiting for an event of type {detail['type']!r}",
                    retryable=False,
                )
                await tx.delete_timer(self.run_id, row.key)
                await tx.settle_step(
                    row, status="failed", output=None, error=failure_to_json(failure), at=now,
                    event_type="event_timed_out",
                )  # fmt: skip
                return failure, now
            await tx.set_timer(self.run_id, row.key, "wait_timeout", deadline)
            return Suspend("event", event=detail["type"], wake_at_ms=deadline), None

    # -- tools, notifications, SQL, logs -----------------------------------------------------

    async def _tool(self, op: StepTool) -> tuple[Result, int | None]:
        now = self.now()
        async with self.store.transaction(self.lease) as tx:
            row = await tx.get_step(self.run_id, "tool", op.step, op.count)
            if row is None:
                await tx.insert_step(
                    self.run_id, "tool", op.step, op.count, status="running", attempt=1,
                    started_at=now, config=_policy_to_json(op.config),
                )  # fmt: skip
                attempt = 1
                await self._event(tx, "step_started", now, tool_key(op), attempt=1)
            else:
                result, at = await self._resume_attempt(tx, row, now, "tool")
                if not (isinstance(result, Value) and isinstance(result.value, dict)):
                    return result, at
                attempt = int(result.value["attempt"])
            call_seq = await tx.start_tool_call(
                self.run_id, tool_key(op), attempt, address=op.address, args=op.args, at=now
            )
            await self._event(tx, "tool_called", now, tool_key(op), address=op.address)
        value, failure, duration_ms = await self._call_tool(op)
        finished = self.now()
        async with self.store.transaction(self.lease) as tx:
            await tx.finish_tool_call(
                call_seq, value, None if failure is None else failure_to_json(failure),
                duration_ms,
            )  # fmt: skip
            row = await tx.get_step(self.run_id, "tool", op.step, op.count)
            assert row is not None
            settled = _settled(row)
            if settled is not None:
                return settled.result, settled.at
            if failure is None:
                await tx.settle_step(
                    row, status="completed", output=value, error=None, at=finished,
                    event_type="step_completed",
                )  # fmt: skip
                return Value(value), finished
            outcome = await self._fail_attempt(tx, row, failure, finished)
            return outcome if outcome is not None else (Suspend("retry"), None)

    async def _call_tool(self, op: StepTool) -> tuple[str | None, StepFailure | None, int]:
        tool = self.bindings.tool(op.address)
        started = time.monotonic()
        if tool is None:
            failure = StepFailure(
                "ToolNotFoundError", f"no tool is bound at address {op.address!r}", False
            )
            return None, failure, 0
        try:
            result = await asyncio.wait_for(tool(to_python(op.args)), op.config.timeout_ms / 1000)
            value = from_python(result, max_bytes=self.limits.value_bytes, what="the tool result")
            return value, None, _elapsed_ms(started)
        except TimeoutError:
            message = f"tool {op.address!r} exceeded its timeout of {op.config.timeout_ms} ms"
            return None, StepFailure("StepTimeoutError", message), _elapsed_ms(started)
        except FatalToolError as error:
            return None, StepFailure("FatalError", str(error), False), _elapsed_ms(started)
        except Exception as error:  # a tool's failure is the step's, never the host's
            name = type(error).__name__
            return None, StepFailure(name, str(error)[:4000]), _elapsed_ms(started)

    async def _notify(self, op: StepNotify) -> tuple[Result, int | None]:
        now = self.now()
        message = dumps_text({"title": op.title, "body": op.body, "link": op.link})
        async with self.store.transaction(self.lease) as tx:
            row = await tx.get_step(self.run_id, "notify", op.step, op.count)
            settled = None if row is None else _settled(row)
            if settled is not None:
                return settled.result, settled.at
            await tx.insert_step(
                self.run_id, "notify", op.step, op.count, status="running", attempt=1,
                started_at=now, detail=message,
            )  # fmt: skip
            row = await tx.get_step(self.run_id, "notify", op.step, op.count)
            assert row is not None
            # Recorded before it is sent: at most once, even if the process dies right after.
            await tx.settle_step(
                row, status="completed", output=None, error=None, at=now, event_type="notified"
            )
        # Best effort by contract: a failed notification fails nothing.
        with contextlib.suppress(Exception):
            await self.bindings.notify(Notification(self.run_id, op.title, op.body, op.link))
        return Value(None), now

    async def _sql(self, op: DbSql) -> tuple[Result, int | None]:
        """Author SQL in the scope's database. The scope database records the call as applied
        in the statement's own transaction, so re-asking after a crash never applies it twice."""
        now = self.now()
        key = f"sql:{op.count}:{op.step}"
        async with self.store.transaction(self.lease) as tx:
            row = await tx.get_step(self.run_id, "sql", op.step, op.count)
            settled = None if row is None else _settled(row)
            if settled is not None:
                return settled.result, settled.at
            if row is None:
                await tx.insert_step(
                    self.run_id, "sql", op.step, op.count, status="running", attempt=1,
                    started_at=now, detail=dumps_text({"sql": op.sql[:500]}),
                )  # fmt: skip
            run = await tx.get_run(self.run_id)
            assert run is not None
        sql_limits = self.scopes.limits
        left = sql_limits.run_budget_s - run.sql_used_s
        if left <= 0:
            outcome = SqlOutcome(
                None, "quota", f"the run's SQL time budget of {sql_limits.run_budget_s:g} s is "
                "used up", 0.0,
            )  # fmt: skip
        else:
            deadline = min(sql_limits.deadline_s, left)
            outcome = await self.scopes.execute(
                run.scope, run_id=self.run_id, call_key=key, sql=op.sql, params=op.params,
                deadline_s=deadline,
            )  # fmt: skip
        crash_on = os.environ.get(CRASH_AFTER_SQL)
        if crash_on and crash_on in op.sql:  # a crash point for the exactly-once tests
            os.kill(os.getpid(), signal.SIGKILL)
        finished = self.now()
        async with self.store.transaction(self.lease) as tx:
            run = await tx.get_run(self.run_id)
            assert run is not None
            await tx.update_run(self.run_id, sql_used_s=run.sql_used_s + outcome.elapsed_s)
            row = await tx.get_step(self.run_id, "sql", op.step, op.count)
            assert row is not None
            settled = _settled(row)
            if settled is not None:
                return settled.result, settled.at
            if outcome.result is not None:
                await tx.settle_step(
                    row, status="completed", output=outcome.result, error=None, at=finished,
                    event_type="sql_completed",
                )  # fmt: skip
                return Value(outcome.result), finished
            failure = StepFailure(
                "SqlError", outcome.message or "the statement failed", False, code=outcome.code
            )
            await tx.settle_step(
                row, status="failed", output=None, error=failure_to_json(failure), at=finished,
                event_type="sql_failed",
            )  # fmt: skip
            return failure, finished

    async def _log(self, op: Log) -> None:
        async with self.store.transaction(self.lease) as tx:
            await tx.insert_log(self.run_id, op.count, op.level, op.text, self.now())
        self.logs_count = max(self.logs_count, op.count)

    async def _event(
        self, tx: JournalTransaction, event_type: str, at: int, key: str, **data: object
    ) -> None:
        await tx.append_event(self.run_id, event_type, at, dumps_text({"key": key, **data}))


def row_key(kind: str, op: StepCheck) -> str:
    return f"{kind}:{op.count}:{op.step}"


def tool_key(op: StepTool) -> str:
    return f"tool:{op.count}:{op.step}"


def _event_value(event_type: str, payload: str, received_at: int) -> str:
    # The payload is already encoded: splice it in rather than decode and re-encode it.
    return (
        f'{{"type":{dumps_text(event_type)},"payload":{payload},'
        f'"timestamp":{{"$t":"Date","v":{received_at}}}}}'
    )


def _retry_due(row: StepRow) -> int:
    return int(orjson.loads(row.detail or "{}").get("retryAt", 0))


def _elapsed_ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
