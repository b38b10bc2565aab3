"""OpenTelemetry traces of runs, through the OpenTelemetry API when it is installed (the `otel`
extra; the SDK and exporters are the operator's choice). Without it, or before a tracer provider
is set, every call is a no-op.

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
from collections.abc import Callable, Iterator
from typing import Any

from qjsflow.bridge import InvalidInput

__all__ = [
    "attempt_span",
    "call_span",
    "current",
    "drive_span",
    "failed",
    "new_traceparent",
    "recording",
    "tracing",
]

_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
# OpenTelemetry is imported at the first drive, not with this module: a CLI command that
# drives nothing would pay ~30 ms for it.
_otel: dict[str, Any] = {}


def _api() -> dict[str, Any]:
    """The OpenTelemetry names this module uses; none when it is not installed."""
    if "loaded" not in _otel:
        _otel["loaded"] = True
        try:
            from opentelemetry import context, trace  # noqa: PLC0415
            from opentelemetry.trace import (  # noqa: PLC0415
                NonRecordingSpan,
                ProxyTracerProvider,
                SpanContext,
                Status,
                StatusCode,
                TraceFlags,
            )
        except ImportError:
            return _otel
        _otel.update(trace=trace, context=context, tracer=trace.get_tracer("qjsflow"),
                     NonRecordingSpan=NonRecordingSpan, SpanContext=SpanContext,
                     Status=Status, StatusCode=StatusCode, TraceFlags=TraceFlags,
                     ProxyTracerProvider=ProxyTracerProvider)  # fmt: skip
    return _otel


def tracing() -> bool:
    """Whether spans are made at all: OpenTelemetry is installed and a tracer provider (the
    SDK's, or the operator's) is set. The API alone makes spans that record nothing; making
    them cost a drive ~0.05 ms."""
    api = _api()
    return "tracer" in api and not isinstance(
        api["trace"].get_tracer_provider(), api["ProxyTracerProvider"]
    )


def new_traceparent(given: str | None) -> str:
    """The run's trace context: the caller's `traceparent` (checked), or a new one."""
    if given is None:
        return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
    matched = _TRACEPARENT.match(str(given))
    if matched is None or set(matched.group(1)) == {"0"} or set(matched.group(2)) == {"0"}:
        raise InvalidInput("traceparent must be a W3C trace context: 00-<32 hex>-<16 hex>-<2 hex>")
    return str(given)


def _parent(traceparent: str | None) -> Any:
    api = _api()
    matched = None if traceparent is None else _TRACEPARENT.match(traceparent)
    if "tracer" not in api or matched is None:
        return None
    trace_id, span_id, flags = (int(part, 16) for part in matched.groups())
    context = api["SpanContext"](
        trace_id, span_id, is_remote=True, trace_flags=api["TraceFlags"](flags)
    )
    return api["trace"].set_span_in_context(api["NonRecordingSpan"](context))


_NO_SPAN: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()


def drive_span(
    traceparent: str | None, attributes: Callable[[], dict[str, Any]]
) -> contextlib.AbstractContextManager[Any]:
    """The span of one drive, current while it runs (None without OpenTelemetry: one shared
    context that does nothing); its `attributes` are made only for a span."""
    return _drive_span(traceparent, attributes) if tracing() else _NO_SPAN


@contextlib.contextmanager
def _drive_span(traceparent: str | None, attributes: Callable[[], dict[str, Any]]) -> Iterator[Any]:
    with _api()["tracer"].start_as_current_span(
        "qjsflow.drive", context=_parent(traceparent), attributes=attributes()
    ) as span:
        yield span


def recording(parent: Any) -> bool:
    """Whether spans made under `parent` (a context from `current`) are kept: with the API
    alone, or a drive its sampler dropped, its step spans are not worth making (~9 µs each)."""
    if parent is None or not tracing():
        return False
    return bool(_api()["trace"].get_current_span(parent).is_recording())


def current() -> Any:
    """The context spans made later for this drive hang under (None without OpenTelemetry)."""
    return _api()["context"].get_current() if tracing() else None


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
    if not tracing():
        return
    span = _api()["tracer"].start_span(
        name, context=parent, start_time=start_ns, attributes=attributes
    )
    if error is not None:
        failed(span, error)
    span.end(end_time=end_ns)


@contextlib.contextmanager
def call_span(parent: Any, name: str, attributes: dict[str, Any]) -> Iterator[Any]:
    """A tool call or a statement, timed as it runs."""
    if not tracing():
        yield None
        return
    span = _api()["tracer"].start_span(name, context=parent, attributes=attributes)
    try:
        yield span
    finally:
        span.end()


def failed(span: Any, message: str) -> None:
    api = _api()
    if span is not None and "Status" in api:
        span.set_status(api["Status"](api["StatusCode"].ERROR, message[:200]))
