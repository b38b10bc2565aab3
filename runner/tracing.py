"""OpenTelemetry traces of runs, through the OpenTelemetry API when it is installed (the `otel`
extra; the SDK and exporters are the operator's choice). Without it every call is a no-op.

One trace per run: a run keeps a W3C `traceparent` (the caller's, given to `start`, or one made
for it), and each drive is a span whose parent is that context, so every drive of a run lands
in the same trace — under the platform's request span when it passed one. Inside a drive: a
span per step attempt the drive executed (with its outcome), per tool call (fetch included) and
per `db.sql` statement, and an event when the run suspends.
"""

from __future__ import annotations

import contextlib
import re
import secrets
from collections.abc import Iterator
from typing import Any

from qjsflow.bridge import InvalidInput

__all__ = ["TRACER", "attempt_span", "call_span", "current", "drive_span", "new_traceparent"]

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, Status, StatusCode, TraceFlags
except ImportError:  # pragma: no cover - exercised where the extra is not installed
    trace = None  # type: ignore[assignment]

TRACER: Any = None if trace is None else trace.get_tracer("qjsflow")
_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


def new_traceparent(given: str | None) -> str:
    """The run's trace context: the caller's `traceparent` (checked), or a new one."""
    if given is None:
        return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
    matched = _TRACEPARENT.match(str(given))
    if matched is None or set(matched.group(1)) == {"0"} or set(matched.group(2)) == {"0"}:
        raise InvalidInput("traceparent must be a W3C trace context: 00-<32 hex>-<16 hex>-<2 hex>")
    return str(given)


def _parent(traceparent: str | None) -> Any:
    if trace is None or traceparent is None:
        return None
    matched = _TRACEPARENT.match(traceparent)
    if matched is None:
        return None
    trace_id, span_id, flags = (int(part, 16) for part in matched.groups())
    context = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags))
    return trace.set_span_in_context(NonRecordingSpan(context))


@contextlib.contextmanager
def drive_span(traceparent: str | None, attributes: dict[str, Any]) -> Iterator[Any]:
    """The span of one drive, current while it runs (None without OpenTelemetry)."""
    if TRACER is None:
        yield None
        return
    with TRACER.start_as_current_span(
        "qjsflow.drive", context=_parent(traceparent), attributes=attributes
    ) as span:
        yield span


def current() -> Any:
    """The context spans made later for this drive hang under (None without OpenTelemetry)."""
    return None if trace is None else otel_context.get_current()


def attempt_span(
    parent: Any,
    name: str,
    *,
    start_ns: int,
    end_ns: int,
    attributes: dict[str, Any],
    error: str | None,
) -> None:
    """A step attempt that has ended, with the times it ran."""
    if TRACER is None:
        return
    span = TRACER.start_span(name, context=parent, start_time=start_ns, attributes=attributes)
    if error is not None:
        span.set_status(Status(StatusCode.ERROR, error[:200]))
    span.end(end_time=end_ns)


@contextlib.contextmanager
def call_span(parent: Any, name: str, attributes: dict[str, Any]) -> Iterator[Any]:
    """A tool call or a statement, timed as it runs."""
    if TRACER is None:
        yield None
        return
    span = TRACER.start_span(name, context=parent, attributes=attributes)
    try:
        yield span
    finally:
        span.end()


def failed(span: Any, message: str) -> None:
    if span is not None and trace is not None:
        span.set_status(Status(StatusCode.ERROR, message[:200]))
