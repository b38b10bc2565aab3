"""Validation and conversion between the JSON frames of the bridge and its typed values.

Everything that comes out of the sandbox is untrusted: `parse_op` and `parse_outcome` check
shape, types and sizes and raise `ProtocolError` naming the problem; nothing unchecked reaches
the host.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, Literal, cast

from qjsflow.bridge.codec import loads
from qjsflow.bridge.errors import CodecError, QjsflowError
from qjsflow.bridge.failure import StepFailure, failure_to_wire
from qjsflow.bridge.limits import Limits
from qjsflow.bridge.rules import RULES, is_event_type
from qjsflow.bridge.types import (
    Answer,
    Completed,
    DbSql,
    DriveOutcome,
    DriveRequest,
    Failed,
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
    Suspended,
    Value,
)

__all__ = [
    "ProtocolError",
    "answer_to_wire",
    "parse_op",
    "parse_outcome",
    "request_to_wire",
]

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_DIGEST = re.compile(r"[0-9a-f]{1,16}")
_MAX_MS = 2**53 - 1


class ProtocolError(QjsflowError):
    """A frame from the sandbox broke the protocol; the drive fails with this message."""


def parse_op(raw: object, limits: Limits) -> OpEnvelope:
    """One `{id, op}` message from the sandbox, validated."""
    message = _object(raw, "message")
    op_id = _int(message, "id", 0, 2**31)
    body = _object(message.get("op"), "op")
    kind = body.get("op")
    parser = _PARSERS.get(kind) if isinstance(kind, str) else None
    if parser is None:
        raise ProtocolError(f"unknown op {str(kind)[:40]!r}")
    try:
        return OpEnvelope(op_id, parser(body, limits))
    except ProtocolError as error:
        raise ProtocolError(f"malformed {kind} op: {error}") from None


def parse_outcome(raw: object, limits: Limits, cpu_s: float) -> DriveOutcome:
    """A drive's outcome from the sandbox; `cpu_s` is the compute the parent measured."""
    outcome = _object(raw, "outcome")
    status = outcome.get("status")
    replayed = _int(outcome, "replayed", 0, 2**31) if "replayed" in outcome else 0
    if status == "completed":
        return Completed(_encoded(outcome, "output", limits), cpu_s, replayed)
    if status == "suspended":
        markers = outcome.get("markers")
        if not isinstance(markers, list) or not markers or len(markers) > limits.ops_per_drive:
            raise ProtocolError("a suspended outcome needs a non-empty list of markers")
        return Suspended(tuple(_suspend(_object(m, "marker")) for m in markers), cpu_s, replayed)
    if status == "failed":
        return Failed(
            retryable=_bool(outcome, "retryable"),
            message=_text(outcome, "message", RULES.error_message_chars, allow_control=True),
            cpu_s=cpu_s,
            retry_after_ms=_optional_ms(outcome, "retryAfterMs"),
            stack=_optional_text(outcome, "stack", RULES.stack_chars),
            rollback_failed=_optional_text(outcome, "rollbackFailed", RULES.error_message_chars),
        )
    raise ProtocolError(f"unknown outcome status {str(status)[:40]!r}")


def answer_to_wire(answer: Answer) -> dict[str, Any]:
    result = answer.result
    wire: dict[str, Any]
    if isinstance(result, Value):
        wire = {"value": result.value}
    elif isinstance(result, Suspend):
        wire = {"suspend": result.kind, "event": result.event}
    else:
        wire = {"error": failure_to_wire(result)}
    return {"id": answer.id, "result": wire, "at": answer.at_ms}


def request_to_wire(request: DriveRequest) -> dict[str, Any]:
    return {
        "runId": request.run_id,
        "export": request.export,
        "inspect": request.inspect,
        "workflow": request.workflow,
        "input": request.input,
        "createdAtMs": request.created_at_ms,
        "env": request.env,
        "journal": [
            {
                "key": entry.key,
                "value": entry.value,
                "error": None if entry.error is None else failure_to_wire(entry.error),
                "at": entry.at_ms,
                "digest": entry.digest,
            }
            for entry in request.journal
        ],
        "limits": _limits_to_wire(request.limits),
        "cpuUsedS": request.cpu_used_s,
        "logsSeen": request.logs_seen,
        "unsettled": list(request.unsettled),
        "waiting": [list(wait) for wait in request.waiting],
        "strict": request.strict,
        "rollBack": request.roll_back,
    }


@functools.lru_cache(maxsize=64)
def _limits_to_wire(limits: Limits) -> dict[str, Any]:
    """A drive's limits as data: the same few `Limits` for every drive, converted once each
    (`asdict` walks every field, ~0.15 ms a drive)."""
    return asdict(limits)


# -- op parsers --------------------------------------------------------------------------------


# A call inside a step body is named after its enclosing steps ("do:1:sync/push"), up to 8 deep.
_MAX_SCOPED_NAME = 8 * (3 * 256 + 40)  # eight escaped parents (a name's %2F triples it)


def _step(body: dict[str, Any], limits: Limits) -> tuple[str, int]:
    name = _text(body, "step", _MAX_SCOPED_NAME + 3 * limits.step_name_chars)
    if not name or name.endswith("/"):
        raise ProtocolError("step name is empty")
    return name, _int(body, "count", 1, limits.steps_per_run)


def _scope(body: dict[str, Any]) -> str:
    """The scope of an unnamed call (notify, sql): "" or an enclosing step's key and "/"."""
    scope = _text(body, "step", _MAX_SCOPED_NAME)
    if scope and not scope.endswith("/"):
        raise ProtocolError("step must be empty or end with '/'")
    return scope


def _check(body: dict[str, Any], limits: Limits) -> StepCheck:
    step, count = _step(body, limits)
    if body.get("kind") != "do":
        raise ProtocolError("kind must be 'do'")
    return StepCheck(step, "do", count, _policy(_object(body.get("config"), "config")))


def _begin(body: dict[str, Any], limits: Limits) -> StepBegin:
    step, count = _step(body, limits)
    if body.get("kind") != "do":
        raise ProtocolError("kind must be 'do'")
    return StepBegin(step, "do", count, _policy(_object(body.get("config"), "config")))


def _record(body: dict[str, Any], limits: Limits) -> StepRecord:
    step, count = _step(body, limits)
    attempt = _int(body, "attempt", 1, 1_000)
    has_value, has_error = "value" in body, "error" in body
    if has_value == has_error:
        raise ProtocolError("exactly one of value and error is required")
    if has_value:
        settled_at = _optional_ms(body, "at")
        begun_with = None
        if "config" in body:
            if settled_at is None or attempt != 1:
                raise ProtocolError("only a first attempt settled by the sandbox has a config")
            begun_with = _policy(_object(body["config"], "config"))
        value = _encoded(body, "value", limits)
        return StepRecord(step, count, attempt, value, None, settled_at, begun_with)
    if "at" in body or "config" in body:
        raise ProtocolError("only a value is settled by the sandbox")
    return StepRecord(step, count, attempt, None, _failure(_object(body["error"], "error")))


def _tool(body: dict[str, Any], limits: Limits) -> StepTool:
    step, count = _step(body, limits)
    address = _text(body, "address", RULES.tool_address_chars)
    if not address:
        raise ProtocolError("address is empty")
    args = _encoded(body, "args", limits)
    config = _policy(_object(body.get("config"), "config"))
    return StepTool(step, count, address, args, config, _digest(body))


def _digest(body: dict[str, Any]) -> str | None:
    """The sandbox's digest of a call's arguments (absent from older preludes)."""
    digest = body.get("digest")
    if digest is None:
        return None
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise ProtocolError("digest must be 1 to 16 lowercase hex digits")
    return digest


def _sleep(body: dict[str, Any], limits: Limits) -> StepSleep:
    step, count = _step(body, limits)
    ms, until = _optional_ms(body, "ms"), _optional_ms(body, "until")
    if (ms is None) == (until is None):
        raise ProtocolError("exactly one of ms and until is required")
    return StepSleep(step, count, ms, until)


def _wait(body: dict[str, Any], limits: Limits) -> StepWaitForEvent:
    step, count = _step(body, limits)
    event_type = _text(body, "type", 256)
    if not is_event_type(event_type):
        raise ProtocolError(f"type must be {RULES.event_type_rule}")
    return StepWaitForEvent(step, count, event_type, _int(body, "timeoutMs", 0, _MAX_MS))


def _notify(body: dict[str, Any], limits: Limits) -> StepNotify:
    count = _int(body, "count", 1, limits.notify_per_drive * 1000)
    title = _text(body, "title", RULES.notify_title_chars, allow_control=True)
    body_text = _optional_text(body, "body", RULES.notify_body_chars)
    link = _optional_text(body, "link", RULES.notify_link_chars)
    return StepNotify(_scope(body), count, title, body_text, link)


def _sql(body: dict[str, Any], limits: Limits) -> DbSql:
    count = _int(body, "count", 1, limits.steps_per_run)
    sql = _text(body, "sql", RULES.sql_chars, True)
    return DbSql(_scope(body), count, sql, _encoded(body, "params", limits), _digest(body))


def _log(body: dict[str, Any], limits: Limits) -> Log:
    level = body.get("level")
    if level not in ("log", "info", "warn", "error"):
        raise ProtocolError("level must be log, info, warn or error")
    level = cast(Literal["log", "info", "warn", "error"], level)
    text = _text(body, "text", RULES.log_line_chars, allow_control=True)
    source = body.get("source", "")
    if not isinstance(source, str) or len(source) > _MAX_SCOPED_NAME + 64:
        raise ProtocolError("source must be a string")
    return Log(level, text, _int(body, "count", 1, 2**31), source)


_PARSERS: dict[str, Callable[[dict[str, Any], Limits], Op]] = {
    "step.begin": _begin,
    "step.check": _check,
    "step.record": _record,
    "step.tool": _tool,
    "step.sleep": _sleep,
    "step.waitForEvent": _wait,
    "step.notify": _notify,
    "db.sql": _sql,
    "log": _log,
}


# -- field checks ------------------------------------------------------------------------------


def _policy(config: dict[str, Any]) -> RetryPolicy:
    # A run's steps share a few policies, and each of its step ops carries one (the default
    # as `{}`: `DEFAULT_POLICY`, below): a policy checked already is reused, when every field
    # is an exact int or str (so that no other value that compares equal, True for 1, is
    # taken for one).
    if not config:
        return DEFAULT_POLICY
    limit, delay, backoff, timeout = (config.get("limit"), config.get("delayMs"),
                                      config.get("backoff"), config.get("timeoutMs"))  # fmt: skip
    if type(limit) is int and type(delay) is int and type(backoff) is str and type(timeout) is int:
        return _known_policy(limit, delay, backoff, timeout)
    return _checked_policy(limit, delay, backoff, timeout)


@functools.lru_cache(maxsize=256)
def _known_policy(limit: object, delay: object, backoff: object, timeout: object) -> RetryPolicy:
    return _checked_policy(limit, delay, backoff, timeout)


def _checked_policy(limit: object, delay: object, backoff: object, timeout: object) -> RetryPolicy:
    if backoff not in ("constant", "linear", "exponential"):
        raise ProtocolError("config.backoff must be constant, linear or exponential")
    return RetryPolicy(
        limit=_whole(limit, "limit", 0, 1_000),
        delay_ms=_whole(delay, "delayMs", 0, _MAX_MS),
        backoff=backoff,
        timeout_ms=_whole(timeout, "timeoutMs", 1, _MAX_MS),
    )


def _failure(error: dict[str, Any]) -> StepFailure:
    return StepFailure(
        name=_text(error, "name", RULES.error_name_chars, allow_control=True),
        message=_text(error, "message", RULES.error_message_chars, allow_control=True),
        retryable=_bool(error, "retryable"),
        retry_after_ms=_optional_ms(error, "retryAfterMs"),
        stack=_optional_text(error, "stack", RULES.stack_chars),
    )


def _suspend(marker: dict[str, Any]) -> Suspend:
    kind = marker.get("suspend")
    if kind not in ("sleep", "event", "retry"):
        raise ProtocolError("a marker's suspend must be sleep, event or retry")
    event = _optional_text(marker, "event", 256)
    if event is not None and not is_event_type(event):
        raise ProtocolError(f"a marker's event must be {RULES.event_type_rule}")
    return Suspend(cast('Literal["sleep", "event", "retry"]', kind), event)


def _object(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProtocolError(f"{what} must be an object")
    return value


def _text(obj: dict[str, Any], key: str, max_chars: int, allow_control: bool = False) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise ProtocolError(f"{key} must be a string")
    if len(value) > max_chars:
        raise ProtocolError(f"{key} is longer than {max_chars} characters")
    if not allow_control and _CONTROL.search(value):
        raise ProtocolError(f"{key} contains control characters")
    return value


def _optional_text(obj: dict[str, Any], key: str, max_chars: int) -> str | None:
    return None if obj.get(key) is None else _text(obj, key, max_chars, allow_control=True)


def _int(obj: dict[str, Any], key: str, low: int, high: int) -> int:
    return _whole(obj.get(key), key, low, high)


def _whole(value: Any, key: str, low: int, high: int) -> int:
    if type(value) is int and low <= value <= high:  # the common case, first
        return value
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ProtocolError(f"{key} must be an integer from {low} to {high}")
    return value


def _optional_ms(obj: dict[str, Any], key: str) -> int | None:
    return None if obj.get(key) is None else _int(obj, key, 0, _MAX_MS)


def _bool(obj: dict[str, Any], key: str) -> bool:
    value = obj.get(key)
    if not isinstance(value, bool):
        raise ProtocolError(f"{key} must be true or false")
    return value


def _encoded(obj: dict[str, Any], key: str, limits: Limits) -> str:
    """A tagged-JSON value as text: ASCII, within the size limit, well-formed, bounded depth."""
    value = obj.get(key)
    if not isinstance(value, str):
        raise ProtocolError(f"{key} must be encoded JSON text")
    if len(value) > limits.value_bytes:
        raise ProtocolError(f"{key} is larger than the limit of {limits.value_bytes} bytes")
    if not value.isascii():
        raise ProtocolError(f"{key} must be ASCII JSON text")
    try:
        # The tagged encoding nests at most 3 levels per value level.
        loads(value, max_depth=3 * limits.value_depth + 3)
    except CodecError as error:
        raise ProtocolError(f"{key}: {error}") from None
    return value


# What an op's empty config stands for: the policy of a step whose config sets none, which
# the prelude sends as `{}` rather than in full with every step (bridge/rules.py).
DEFAULT_POLICY = _checked_policy(
    RULES.default_retry_limit,
    RULES.default_retry_delay_ms,
    RULES.default_retry_backoff,
    RULES.default_timeout_ms,
)
