"""Everything out of the sandbox is validated before it reaches the host."""

from __future__ import annotations

import pytest

from qjsflow.bridge.limits import Limits
from qjsflow.bridge.rules import RULES
from qjsflow.bridge.types import (
    Completed,
    Failed,
    Log,
    RetryPolicy,
    StepBegin,
    StepCheck,
    StepRecord,
    StepTool,
    Suspended,
    needs_answer,
)
from qjsflow.bridge.wire import ProtocolError, parse_op, parse_outcome

LIMITS = Limits()
POLICY = {"limit": 1, "delayMs": 0, "backoff": "constant", "timeoutMs": 1000}


def test_a_valid_check_and_record() -> None:
    check = parse_op(
        {
            "id": 1,
            "op": {"op": "step.check", "step": "s", "kind": "do", "count": 1, "config": POLICY},
        },
        LIMITS,
    )
    assert isinstance(check.op, StepCheck)
    assert check.op.config.delay_after(3) == 0
    record = parse_op(
        {
            "id": 2,
            "op": {"op": "step.record", "step": "s", "count": 1, "attempt": 1, "value": '{"a":1}'},
        },
        LIMITS,
    )
    assert isinstance(record.op, StepRecord)
    assert record.op.value == '{"a":1}'
    assert record.op.settled_at is None  # answered by the host
    settled = parse_op(
        {"id": 3, "op": {"op": "step.record", "step": "s", "count": 1, "attempt": 1,
                         "value": "1", "at": 1_700_000_000_000}},
        LIMITS,
    )  # fmt: skip
    assert isinstance(settled.op, StepRecord)
    assert settled.op.settled_at == 1_700_000_000_000
    assert settled.op.begun_with is None
    assert not needs_answer(settled.op)
    begun = parse_op(
        {"id": 4, "op": {"op": "step.record", "step": "s", "count": 1, "attempt": 1,
                         "value": "1", "at": 5, "config": POLICY}},
        LIMITS,
    )  # fmt: skip
    assert isinstance(begun.op, StepRecord)
    assert begun.op.begun_with is not None
    assert begun.op.begun_with.limit == 1


@pytest.mark.parametrize(
    ("message", "problem"),
    [
        ("not an object", "message must be an object"),
        ({"id": -1, "op": {}}, "id must be an integer"),
        ({"id": 1, "op": {"op": "fs.read"}}, "unknown op 'fs.read'"),
        (
            {
                "id": 1,
                "op": {"op": "step.check", "step": "", "kind": "do", "count": 1, "config": POLICY},
            },
            "step name is empty",
        ),
        (
            {
                "id": 1,
                "op": {
                    "op": "step.check",
                    "step": "s\n",
                    "kind": "do",
                    "count": 1,
                    "config": POLICY,
                },
            },
            "control characters",
        ),
        (
            {
                "id": 1,
                "op": {
                    "op": "step.check",
                    "step": "x" * 50_000,
                    "kind": "do",
                    "count": 1,
                    "config": POLICY,
                },
            },
            "longer than",
        ),
        (
            {
                "id": 1,
                "op": {"op": "step.check", "step": "s", "kind": "do", "count": 0, "config": POLICY},
            },
            "count must be",
        ),
        (
            {
                "id": 1,
                "op": {
                    "op": "step.check",
                    "step": "s",
                    "kind": "do",
                    "count": 1,
                    "config": {**POLICY, "backoff": "x"},
                },
            },
            "backoff",
        ),
        (
            {"id": 1, "op": {"op": "step.record", "step": "s", "count": 1, "attempt": 1}},
            "exactly one of value and error",
        ),
        (
            {
                "id": 1,
                "op": {"op": "step.record", "step": "s", "count": 1, "attempt": 1, "value": "{"},
            },
            "malformed JSON",
        ),
        (
            {
                "id": 1,
                "op": {
                    "op": "step.record",
                    "step": "s",
                    "count": 1,
                    "attempt": 1,
                    "value": '"\u00e9"',
                },
            },
            "ASCII",
        ),
        (
            {
                "id": 1,
                "op": {
                    "op": "step.record",
                    "step": "s",
                    "count": 1,
                    "attempt": 1,
                    "value": "1" * (1024 * 1024 + 1),
                },
            },
            "larger than the limit",
        ),
        (
            {
                "id": 1,
                "op": {
                    "op": "step.record",
                    "step": "s",
                    "count": 1,
                    "attempt": 1,
                    "value": "[" * 300 + "]" * 300,
                },
            },
            "nested deeper",
        ),
        (
            {
                "id": 1,
                "op": {
                    "op": "step.record",
                    "step": "s",
                    "count": 1,
                    "attempt": 1,
                    "error": {"name": "E", "message": "m", "retryable": True},
                    "at": 5,
                },
            },
            "only a value is settled by the sandbox",
        ),
        (
            {
                "id": 1,
                "op": {
                    "op": "step.record",
                    "step": "s",
                    "count": 1,
                    "attempt": 1,
                    "value": "1",
                    "at": -1,
                },
            },
            "at must be an integer",
        ),
        (
            {
                "id": 1,
                "op": {
                    "op": "step.record",
                    "step": "s",
                    "count": 1,
                    "attempt": 1,
                    "value": "1",
                    "config": POLICY,
                },
            },
            "only a first attempt settled by the sandbox has a config",
        ),
        (
            {
                "id": 1,
                "op": {
                    "op": "step.record",
                    "step": "s",
                    "count": 1,
                    "attempt": 2,
                    "value": "1",
                    "at": 5,
                    "config": POLICY,
                },
            },
            "only a first attempt settled by the sandbox has a config",
        ),
        (
            {"id": 1, "op": {"op": "step.sleep", "step": "s", "count": 1, "ms": 1, "until": 2}},
            "exactly one of ms and until",
        ),
        ({"id": 1, "op": {"op": "step.sleep", "step": "s", "count": 1, "ms": -5}}, "ms must be"),
        (
            {"id": 1, "op": {"op": "log", "level": "shout", "text": "x", "count": 1}},
            "level must be",
        ),
    ],
)
def test_malformed_ops_are_refused_by_name(message: object, problem: str) -> None:
    with pytest.raises(ProtocolError, match=problem):
        parse_op(message, LIMITS)


def test_log_op() -> None:
    log = parse_op(
        {"id": 3, "op": {"op": "log", "level": "warn", "text": "careful", "count": 2}}, LIMITS
    )
    assert log.op == Log("warn", "careful", 2)


def test_outcomes() -> None:
    assert parse_outcome({"status": "completed", "output": "1"}, LIMITS, 0.5) == Completed("1", 0.5)
    suspended = parse_outcome(
        {"status": "suspended", "markers": [{"suspend": "event", "event": "go"}]}, LIMITS, 0
    )
    assert isinstance(suspended, Suspended)
    assert suspended.markers[0].event == "go"
    failed = parse_outcome({"status": "failed", "retryable": False, "message": "boom"}, LIMITS, 0)
    assert failed == Failed(False, "boom", 0.0)
    with pytest.raises(ProtocolError, match="non-empty list of markers"):
        parse_outcome({"status": "suspended", "markers": []}, LIMITS, 0)
    with pytest.raises(ProtocolError, match="unknown outcome status"):
        parse_outcome({"status": "done"}, LIMITS, 0)


@pytest.mark.parametrize(
    ("field", "value"), [("limit", True), ("limit", -1), ("delayMs", False), ("timeoutMs", 0)]
)
def test_a_policy_seen_before_is_still_checked_field_by_field(field: str, value: object) -> None:
    """Step ops repeat a handful of policies, and one checked already is reused: a value
    that merely compares equal to a good one (True to 1) is checked, and refused, as ever."""
    op = {"op": "step.check", "step": "s", "kind": "do", "count": 1}
    good = {**POLICY, "limit": 1, "delayMs": 0}
    assert (
        parse_op({"id": 1, "op": {**op, "config": good}}, LIMITS).op
        == parse_op({"id": 2, "op": {**op, "config": {**good, "limit": 1.0}}}, LIMITS).op
    )
    with pytest.raises(ProtocolError, match=f"{field} must be an integer"):
        parse_op({"id": 3, "op": {**op, "config": {**good, field: value}}}, LIMITS)


@pytest.mark.parametrize("kind", ["step.check", "step.begin", "step.record", "step.tool"])
def test_an_empty_config_stands_for_the_default_policy_and_nothing_less_does(kind: str) -> None:
    """The prelude sends the policy of a step whose config sets none as `{}` (most steps: a
    frame does not repeat it for each); the host reads it as the default of the shared rules.
    A config that leaves out only some of the fields is refused, as ever."""
    fields: dict[str, object] = {"step": "s", "count": 1}
    if kind in ("step.check", "step.begin"):
        fields["kind"] = "do"
    if kind == "step.record":
        fields.update(attempt=1, value="1", at=5)
    if kind == "step.tool":
        fields.update(address="count", args="{}")
    parsed = parse_op({"id": 1, "op": {"op": kind, **fields, "config": {}}}, LIMITS).op
    if isinstance(parsed, StepRecord):
        policy = parsed.begun_with
    else:
        assert isinstance(parsed, StepCheck | StepBegin | StepTool)
        policy = parsed.config
    assert policy == RetryPolicy(
        limit=RULES.default_retry_limit,
        delay_ms=RULES.default_retry_delay_ms,
        backoff="exponential",
        timeout_ms=RULES.default_timeout_ms,
    )
    with pytest.raises(ProtocolError, match="must be an integer"):
        parse_op({"id": 2, "op": {"op": kind, **fields, "config": {"backoff": "linear"}}}, LIMITS)
