"""Step semantics as journal transactions: what each op means for the rows of one run.

Every function here is synchronous and takes the open `JournalTransaction`: the host runs it
with `JournalStore.transact`, fenced by the drive's lease, so it commits before its answer goes
back (write-ahead). Step rows settle once (`settle_step` writes only while `settled_seq` is
null); a late writer is answered with the winner's value.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

from qjsflow.bridge import dumps_text, loads
from qjsflow.bridge.failure import StepFailure, failure_from_json, failure_to_json
from qjsflow.bridge.keys import step_key
from qjsflow.bridge.types import (
    Result,
    RetryPolicy,
    StepBegin,
    StepCheck,
    StepRecord,
    StepSleep,
    StepTool,
    StepWaitForEvent,
    Suspend,
    Value,
)
from qjsflow.bridge.values import tagged_date
from qjsflow.bridge.wire import ProtocolError
from qjsflow.runner.store import JournalTransaction, SettledStep, StepRow, StepStatus
from qjsflow.runner.store.records import StepPlace

__all__ = [
    "Answered",
    "begin",
    "begin_attempt",
    "begun_settled",
    "begun_settled_together",
    "check",
    "event_value",
    "fail_attempt",
    "policy_to_json",
    "record",
    "settle_call",
    "settled",
    "sleep",
    "still_waiting",
    "wait_for_event",
]

Answered = tuple[Result, int | None]  # the result, and the time of the journal event it reflects
_OUTCOME_UNKNOWN = StepFailure(
    "ToolOutcomeUnknown",
    "the worker stopped during this call, before its result was recorded: the tool may or may"
    " not have acted; the call is made again as the next attempt",
)


@functools.lru_cache(maxsize=64)  # a run's steps mostly share a handful of policies
def policy_to_json(policy: RetryPolicy) -> str:
    return dumps_text(
        {
            "limit": policy.limit,
            "delayMs": policy.delay_ms,
            "backoff": policy.backoff,
            "timeoutMs": policy.timeout_ms,
        }
    )


def _policy_from_json(text: str | None) -> RetryPolicy:
    data = loads(text or "{}")
    return RetryPolicy(data["limit"], data["delayMs"], data["backoff"], data["timeoutMs"])


def settled(row: StepRow | None) -> Answered | None:
    """A settled step as an answer, or None while it is not settled."""
    if row is None or row.settled_seq is None or row.completed_at is None:
        return None
    if row.status == StepStatus.failed and row.error is not None:
        return failure_from_json(row.error), row.clock_at
    return Value(row.output), row.clock_at


def event(
    tx: JournalTransaction, run_id: str, kind: str, at: int, key: str, **data: object
) -> None:
    tx.append_event(run_id, kind, at, dumps_text({"key": key, **data}))


# -- attempts: step.do and step.tool --------------------------------------------------------


def begin_attempt(
    tx: JournalTransaction, run_id: str, kind: str, *, name: str, count: int,
    policy: RetryPolicy, now: int, digest: str | None = None,
) -> Answered | int:  # fmt: skip
    """Start the step's next attempt and return its number, or answer for a step that is
    settled, waiting for its retry, or out of attempts. `digest`: what a call was asked with."""
    row = tx.get_step(run_id, kind, name, count)
    key = step_key(kind, count, name)
    if row is None:
        tx.insert_step(
            run_id, kind, name, count, status=StepStatus.running, attempt=1, started_at=now,
            config=policy_to_json(policy), args_digest=digest,
        )  # fmt: skip
        event(tx, run_id, "step_started", now, key, attempt=1)
        return 1
    answer = settled(row)
    if answer is not None:
        return answer
    if row.status == StepStatus.running:
        # The attempt was in flight when its driver stopped: it counts as failed, and a tool
        # call it made may or may not have happened: the audit says so.
        if kind == "tool":
            tx.mark_tool_calls_unknown(run_id, key, row.attempt, failure_to_json(_OUTCOME_UNKNOWN))
        interrupted = StepFailure(
            "StepInterruptedError",
            f"attempt {row.attempt} of step {row.name!r} was interrupted (its driver stopped)",
        )
        final = fail_attempt(tx, row, interrupted, now)
        if not isinstance(final, int):
            return final
        refreshed = tx.get_step(run_id, kind, name, count)
        assert refreshed is not None
        row = refreshed
    due = int(loads(row.detail or "{}").get("retryAt", 0))
    if due > now:
        return Suspend("retry"), None
    attempt = row.attempt + 1
    tx.delete_timer(run_id, key)
    tx.update_step(
        run_id, kind, name, count, status=StepStatus.running, attempt=attempt, started_at=now
    )
    if kind == "do":  # the calls inside it that failed run again in this attempt
        tx.reopen_failed_steps(run_id, key + "/")
    event(tx, run_id, "step_started", now, key, attempt=attempt)
    return attempt


def begin_first_call(tx: JournalTransaction, place: StepPlace, op: StepTool, now: int) -> int:
    """Start the first attempt of a call whose step has no row (inserted: if it had one, the
    insert fails its transaction), its audit row written ahead of the call, as `begin_attempt`
    and the host's `written_ahead` write it for any attempt."""
    key = place.key
    tx.begin_first_call(
        place, config=policy_to_json(op.config), digest=op.digest, address=op.address,
        args=op.args, at=now,
        events=(dumps_text({"key": key, "attempt": 1}),
                dumps_text({"key": key, "address": op.address})),
    )  # fmt: skip
    return 1


def set_aside(tx: JournalTransaction, run_id: str, key: str, now: int) -> None:
    """Undo the attempt of step `key` under way, which its scope's budgets stopped before it
    ended (runner/tenancy/budgets.py): it has not failed, it starts again when the run is
    driven next.
    Its first attempt is forgotten; a later one is a retry due at once. Steps begun inside it
    that had not ended are forgotten too; those that ended keep their results (the attempt
    run again is answered from them)."""
    kind, count, name = key.split(":", 2)
    row = tx.get_step(run_id, kind, name, int(count))
    if row is None or row.status != StepStatus.running:
        return
    inside = [
        step for step in tx.list_steps(run_id)
        if step.status == StepStatus.running and step.key.startswith(key + "/")
    ]  # fmt: skip
    if row.attempt == 1:
        tx.delete_steps(run_id, [row, *inside])
    else:
        tx.delete_steps(run_id, inside)
        tx.update_step(
            run_id, kind, name, int(count), status=StepStatus.retrying, attempt=row.attempt - 1,
            detail=dumps_text({"retryAt": now}),
        )  # fmt: skip
        tx.set_timer(run_id, key, "retry", now)
    event(tx, run_id, "step_set_aside", now, key, attempt=row.attempt)


def begin(tx: JournalTransaction, run_id: str, op: StepBegin, now: int) -> None:
    """A step the sandbox saw no row for starts attempt 1; written ahead of anything its body
    sends in the same batch. A row that exists already is left to the step's record."""
    if tx.get_step(run_id, "do", op.step, op.count) is not None:
        return
    tx.insert_step(
        run_id, "do", op.step, op.count, status=StepStatus.running, attempt=1, started_at=now,
        config=policy_to_json(op.config),
    )  # fmt: skip
    event(tx, run_id, "step_started", now, step_key("do", op.count, op.step), attempt=1)


def begun_settled(tx: JournalTransaction, run_id: str, op: StepRecord, now: int) -> Answered:
    """A step the sandbox began and settled itself in one frame (a pure step's first attempt,
    its begin inside its record): written once, settled, with both its events. A row that
    exists already is left to the step's record, as `begin` leaves it; a result the host
    refused (a limit) is begun and then recorded as that failure."""
    assert op.begun_with is not None
    if op.value is None or tx.get_step(run_id, "do", op.step, op.count) is not None:
        begin(tx, run_id, StepBegin(op.step, "do", op.count, op.begun_with), now)
        return record(tx, run_id, op, now)
    written = begun_settled_together(tx, run_id, [op], now)
    assert written, "a step with no row is written"
    return Value(None), now


def begun_settled_together(
    tx: JournalTransaction, run_id: str, ops: Sequence[StepRecord], now: int
) -> bool:
    """Pure steps' records with their results, each begun and settled at once (the writes of
    `begun_settled` for a step with no row), all together: two statements. False, with
    nothing written, when one of them has a row or comes twice: `begun_settled` then writes
    them one by one."""
    settled = []
    for op in ops:
        assert op.begun_with is not None
        assert op.value is not None
        policy = policy_to_json(op.begun_with)
        settled.append(SettledStep(op.step, op.count, policy, op.value, now, op.settled_at))
    return tx.insert_settled_steps(run_id, settled)


def check(tx: JournalTransaction, run_id: str, op: StepCheck, now: int) -> Answered:
    begun = begin_attempt(tx, run_id, "do", name=op.step, count=op.count, policy=op.config, now=now)
    if isinstance(begun, int):
        return Value({"hit": False, "attempt": begun, "now": now}), None
    result, at = begun
    if isinstance(result, Value):
        return Value({"hit": True, "value": result.value}), at
    return result, at


def fail_attempt(
    tx: JournalTransaction, row: StepRow, failure: StepFailure, now: int
) -> Answered | int:
    """Apply the retry policy to a failed attempt: the time the retry is due when one is
    scheduled, else the step's final answer."""
    policy = _policy_from_json(row.config)
    if failure.retryable and row.attempt <= policy.limit:
        delay = failure.retry_after_ms
        if delay is None:
            delay = policy.delay_after(row.attempt)
        retry_at = now + delay
        tx.update_step(
            row.run_id, row.kind, row.name, row.count, status=StepStatus.retrying,
            error=failure_to_json(failure), detail=dumps_text({"retryAt": retry_at}),
        )  # fmt: skip
        tx.set_timer(row.run_id, row.key, "retry", retry_at)
        event(
            tx, row.run_id, "step_retrying", now, row.key, attempt=row.attempt,
            retryAt=retry_at, error=failure.message,
        )  # fmt: skip
        return retry_at
    final = dataclasses.replace(failure, retryable=False, retry_after_ms=None)
    tx.settle_step(
        row, status=StepStatus.failed, output=None, error=failure_to_json(final), at=now,
        event_type="step_failed",
    )  # fmt: skip
    return final, now


def record(
    tx: JournalTransaction,
    run_id: str,
    op: StepRecord,
    now: int,
    *,
    elapsed_ms: int | None = None,
    retry_in_drive_ms: int = 0,
) -> Answered:
    """The end of an attempt of a step.do. A retry due within `retry_in_drive_ms` is answered
    with `{"retryIn": ms}`: the sandbox waits and runs the next attempt in the same context
    (the step's closure keeps its state, as on Cloudflare); the retry is journaled as any
    other, so a drive that ends meanwhile leaves it to the next one."""
    row = tx.get_step(run_id, "do", op.step, op.count)
    if row is None:
        raise ProtocolError(f"step {op.step!r} #{op.count} was recorded without a check")
    return settle_call(
        tx, row, attempt=op.attempt, value=op.value, failure=op.error, now=now,
        elapsed_ms=elapsed_ms, retry_in_drive_ms=retry_in_drive_ms, replay_at=op.settled_at,
    )  # fmt: skip


def settle_call(
    tx: JournalTransaction,
    row: StepRow,
    *,
    attempt: int,
    value: str | None,
    failure: StepFailure | None,
    now: int,
    elapsed_ms: int | None = None,
    retry_in_drive_ms: int = 0,
    replay_at: int | None = None,
) -> Answered:
    """The end of an attempt of a step.do or step.tool: its value, or a failure that the retry
    policy turns into a retry (answered `{"retryIn": ms}` when due within `retry_in_drive_ms`,
    which only step.do passes) or the step's final error. An attempt that reports after its
    timeout has failed. `elapsed_ms` is the attempt's duration on a monotonic clock when the
    process that started it measured it (a wall-clock jump then changes nothing); otherwise
    the journal's times are compared. `replay_at`: the run's clock the sandbox settled a value
    at, kept for replays."""
    answer = settled(row)
    if answer is not None:  # another writer settled it first: its value wins
        return answer
    if row.status != StepStatus.running or row.attempt != attempt:
        return Suspend("retry"), None
    timeout_ms = _policy_from_json(row.config).timeout_ms
    elapsed = now - row.started_at if elapsed_ms is None else elapsed_ms
    if elapsed > timeout_ms:
        failure = StepFailure(
            "StepTimeoutError",
            f"attempt {attempt} of step {row.name!r} exceeded its timeout of {timeout_ms} ms",
        )
    if failure is None:
        tx.settle_step(
            row, status=StepStatus.completed, output=value, error=None, at=now,
            event_type="step_completed", replay_at=replay_at,
        )  # fmt: skip
        return (Value(None) if row.kind == "do" else Value(value)), now
    final = fail_attempt(tx, row, failure, now)
    if not isinstance(final, int):
        return final
    wait = final - now
    if retry_in_drive_ms > 0 and wait <= retry_in_drive_ms:
        return Value({"retryIn": max(0, wait)}), None
    return Suspend("retry"), None


# -- sleep and waitForEvent ---------------------------------------------------------------


def sleep(tx: JournalTransaction, run_id: str, op: StepSleep, now: int) -> Answered:
    row = tx.get_step(run_id, "sleep", op.step, op.count)
    if row is None:
        due = op.until_ms if op.until_ms is not None else now + (op.ms or 0)
        tx.insert_step(
            run_id, "sleep", op.step, op.count, status=StepStatus.waiting, attempt=1,
            started_at=now, detail=dumps_text({"dueAt": due}),
        )  # fmt: skip
        row = tx.get_step(run_id, "sleep", op.step, op.count)
        assert row is not None
        event(tx, run_id, "sleep_scheduled", now, row.key, dueAt=due)
    answer = settled(row)
    if answer is not None:
        return answer
    due = int(loads(row.detail or "{}")["dueAt"])
    if due > now:
        tx.set_timer(run_id, row.key, "sleep", due)
        return Suspend("sleep"), None
    tx.delete_timer(run_id, row.key)
    tx.settle_step(
        row,
        status=StepStatus.completed,
        output=None,
        error=None,
        at=now,
        event_type="sleep_completed",
    )
    return Value(None), now


def wait_for_event(
    tx: JournalTransaction,
    run_id: str,
    op: StepWaitForEvent,
    now: int,
    room_bytes: int | None = None,
) -> Answered:
    """The next event of the wait's type, its timeout, or a suspension. An event larger than
    `room_bytes` (what the run's journal limit has left) fails the wait, naming it, rather
    than make every later replay overflow."""
    row = tx.get_step(run_id, "waitForEvent", op.step, op.count)
    if row is None:
        tx.insert_step(
            run_id, "waitForEvent", op.step, op.count, status=StepStatus.waiting, attempt=1,
            started_at=now, detail=dumps_text({"type": op.type, "deadline": now + op.timeout_ms}),
        )  # fmt: skip
        row = tx.get_step(run_id, "waitForEvent", op.step, op.count)
        assert row is not None
        event(tx, run_id, "waiting_for_event", now, row.key, type=op.type)
    answer = settled(row)
    if answer is not None:
        return answer
    event_type, deadline = _wait_of(row)
    # Only an event received by the deadline may serve this wait; the oldest first.
    delivered = tx.oldest_unconsumed(run_id, event_type, deadline)
    if delivered is not None:
        tx.consume(delivered.seq, row.key)
        tx.delete_timer(run_id, row.key)
        value = event_value(event_type, delivered.payload, delivered.received_at)
        if room_bytes is not None and len(value) > room_bytes:
            failure = StepFailure(
                "LimitError",
                f"the event consumed by step.waitForEvent({op.step!r}) ({len(value)} bytes) would"
                " take the run's journal past its limit",
                retryable=False,
            )
            tx.settle_step(
                row, status=StepStatus.failed, output=None, error=failure_to_json(failure), at=now,
                event_type="event_refused",
            )  # fmt: skip
            return failure, now
        tx.settle_step(
            row, status=StepStatus.completed, output=value, error=None, at=now,
            event_type="event_consumed",
        )  # fmt: skip
        return Value(value), now
    if now >= deadline:
        failure = StepFailure(
            "WaitForEventTimeoutError",
            f"step.waitForEvent({op.step!r}) timed out after {op.timeout_ms} ms waiting for an "
            f"event of type {event_type!r}",
            retryable=False,
        )
        tx.delete_timer(run_id, row.key)
        tx.settle_step(
            row, status=StepStatus.failed, output=None, error=failure_to_json(failure), at=now,
            event_type="event_timed_out",
        )  # fmt: skip
        return failure, now
    tx.set_timer(run_id, row.key, "wait_timeout", deadline)
    return Suspend("event", event=event_type), None


def _wait_of(row: StepRow) -> tuple[str, int]:
    """A recorded wait's event type and deadline: what it was first called with."""
    detail = loads(row.detail or "{}")
    return str(detail["type"]), int(detail["deadline"])


def still_waiting(
    tx: JournalTransaction, rows: Sequence[StepRow], now: int
) -> tuple[tuple[str, str, int], ...]:
    """The recorded waits among `rows` that `wait_for_event` would answer only with a
    suspension now, as (key, event type, deadline): their deadline has not come and no event
    of their type received by it waits in the inbox. A drive's replay suspends on these
    without asking the host; an event that arrives after this look is seen when the drive
    ends (its end looks at the inbox again and drives the run once more)."""
    waiting = []
    for row in rows:
        if row.kind != "waitForEvent" or row.status != StepStatus.waiting:
            continue
        event_type, deadline = _wait_of(row)
        if now < deadline and tx.oldest_unconsumed(row.run_id, event_type, deadline) is None:
            waiting.append((row.key, event_type, deadline))
    return tuple(waiting)


def event_value(event_type: str, payload: str, received_at: int) -> str:
    # The payload is already encoded: splice it in rather than decode and re-encode it.
    return (
        f'{{"type":{dumps_text(event_type)},"payload":{payload},'
        f'"timestamp":{dumps_text(tagged_date(received_at))}}}'
    )
