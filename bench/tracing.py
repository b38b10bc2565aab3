"""What tracing costs: 10-step runs one after another, with OpenTelemetry's API alone (no
provider: spans are no-ops, as for an operator who installs no SDK) and with the SDK recording
every span to an in-memory exporter. Run with `python -m bench.tracing`; prints a markdown
table and writes bench/results/tracing.json."""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

import orjson
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bench.common import TEN_STEPS, fresh_runner, publish, request

RUNS = 100


async def _per_step_us(label: str) -> float:
    samples = []
    for repeat in range(3):
        async with fresh_runner() as runner:
            snapshot = await publish(runner, TEN_STEPS)
            await runner.start(request(snapshot, "warm"))
            began = time.perf_counter()
            for n in range(RUNS):
                await runner.start(request(snapshot, f"{label}{repeat}-{n}"))
            samples.append((time.perf_counter() - began) / (RUNS * 10))
    return statistics.median(samples) * 1e6


def main() -> None:
    off = asyncio.run(_per_step_us("off"))
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    on = asyncio.run(_per_step_us("on"))
    spans = len(exporter.get_finished_spans())
    print("| per step, sequential | µs | note |")
    print("|---|---:|---|")
    print(f"| tracing off (API, no SDK) | {off:.0f} | baseline |")
    print(f"| tracing on (SDK, in-memory exporter) | {on:.0f} | {on / off:.2f} x, {spans} spans |")
    results = Path(__file__).with_name("results")
    results.mkdir(exist_ok=True)
    out = {"off_us_per_step": off, "on_us_per_step": on, "ratio": on / off}
    (results / "tracing.json").write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
