"""OpenTelemetry traces of runs, read with the SDK's in-memory exporter: one trace per run, a
span per drive, and under each the step attempts, tool calls and statements it made."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext

from qjsflow.bridge import InvalidInput
from qjsflow.runner import Bindings, Runner, StartRunInput
from qjsflow.runner.telemetry import tracing
from tests.conftest import FakeClock

_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    # A process has one tracer provider: set once, for every test of this module.
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


FLOW = """
export default async (event, step) => {
  const n = await step.do("flaky", { retries: { limit: 2, delay: 0 } }, async (ctx) => {
    if (ctx.attempt < 2) throw new Error("not yet");
    return ctx.attempt;
  });
  const called = await step.tool("call", "echo", { n });
  await step.sleep("nap", "1 minute");
  const go = await step.waitForEvent("go", { type: "go" });
  return [n, called, go.payload];
};
"""


async def _run(runner: Runner, clock: FakeClock, traceparent: str | None = None) -> str:
    async def echo(args: Any) -> Any:
        return args

    bindings = Bindings(tools={"echo": echo})
    published = await runner.publish("acme", {"workflows/flow.ts": FLOW})
    request = StartRunInput("acme", "flow", published.snapshot_id, None, "traced",
                            traceparent=traceparent)  # fmt: skip
    run = await runner.start(request, bindings)
    assert run.status == "sleeping"
    clock.advance(61)
    assert (await runner.resume("traced", bindings, scope="acme")).status == "waiting"
    done = await runner.signal("traced", "go", "yes", bindings, scope="acme")
    assert done.output == [2, {"n": 2}, "yes"]
    return "traced"


def _attr(span: ReadableSpan, name: str) -> Any:
    return dict(span.attributes or {})[name]


def _named(finished: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return [span for span in finished if span.name.startswith(prefix)]


async def test_one_trace_per_run_with_a_span_per_drive_and_its_steps(
    clocked_runner: Runner, clock: FakeClock, spans: InMemorySpanExporter
) -> None:
    await _run(clocked_runner, clock)
    finished = spans.get_finished_spans()
    drives = _named(finished, "qjsflow.drive")
    assert len(drives) == 3  # the start, after the sleep, after the signal
    assert len({span.context.trace_id for span in finished}) == 1  # one trace
    assert len({span.parent.span_id for span in drives if span.parent}) == 1  # one root
    assert [_attr(d, "qjsflow.outcome") for d in drives] == ["suspended", "suspended",
                                                                  "completed"]  # fmt: skip
    assert _attr(drives[0], "qjsflow.run_id") == "traced"
    assert _attr(drives[1], "qjsflow.replayed_steps") >= 2
    assert [e.name for e in drives[0].events] == ["suspended"]
    first = drives[0].context.span_id
    attempts = _named(finished, "qjsflow.step flaky")
    assert [_attr(a, "qjsflow.attempt") for a in attempts] == [1, 2]
    assert attempts[0].status.status_code == trace.StatusCode.ERROR
    assert all(a.parent is not None and a.parent.span_id == first for a in attempts)
    [tool] = _named(finished, "qjsflow.tool echo")
    assert tool.parent is not None
    assert tool.parent.span_id == first


async def test_a_callers_traceparent_is_continued(
    clocked_runner: Runner, clock: FakeClock, spans: InMemorySpanExporter
) -> None:
    trace_id, span_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    await _run(clocked_runner, clock, traceparent=f"00-{trace_id}-{span_id}-01")
    drives = _named(spans.get_finished_spans(), "qjsflow.drive")
    assert {format(d.context.trace_id, "032x") for d in drives} == {trace_id}
    assert {format(d.parent.span_id, "016x") for d in drives if d.parent} == {span_id}


async def test_a_malformed_traceparent_is_refused(clocked_runner: Runner) -> None:
    published = await clocked_runner.publish("acme", {"workflows/flow.ts": FLOW})
    for bad in ("nonsense", "00-" + "0" * 32 + "-00f067aa0ba902b7-01", "01-xyz"):
        request = StartRunInput("acme", "flow", published.snapshot_id, traceparent=bad)
        with pytest.raises(InvalidInput, match="traceparent"):
            await clocked_runner.start(request)
    assert await clocked_runner.list(scope="acme") == []


def test_step_spans_are_made_only_under_a_drive_span_that_records() -> None:

    unsampled = NonRecordingSpan(SpanContext(1, 2, is_remote=False))
    assert not tracing.recording(trace.set_span_in_context(unsampled))
    assert not tracing.recording(None)
    with TracerProvider().get_tracer("t").start_as_current_span("drive") as span:
        assert tracing.recording(trace.set_span_in_context(span))


_NO_PROVIDER = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from qjsflow.runner.telemetry import tracing

parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
with tracing.drive_span(parent, lambda: {"qjsflow.run_id": "r"}) as span:
    print(span is None, tracing.current() is None, tracing.tracing())
trace.set_tracer_provider(TracerProvider())
with tracing.drive_span(parent, lambda: {"qjsflow.run_id": "r"}) as span:
    print(span.is_recording(), tracing.current() is not None, tracing.tracing())
"""


def test_no_span_is_made_until_a_tracer_provider_is_set() -> None:
    """With the API alone every span records nothing, so a drive makes none (they cost it
    ~0.05 ms); once an operator sets a provider, drives are traced (a fresh interpreter: a
    process has one provider, which this module's other tests set)."""
    shown = subprocess.run(
        [sys.executable, "-c", _NO_PROVIDER], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert shown[:2] == ["True True False", "True True True"]
