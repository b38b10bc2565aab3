"""`qjsflow demo`: the user's four flows on a fresh database, ending with a timeline.

Publish `fixtures/` (an order-approval workflow in TypeScript over several files), start a run
and show it sleeping, let a worker process wake it, kill that worker with SIGKILL while a step
is running, start another that recovers the run, send the approval event, and print every step
with its attempts, its duration and the drives that executed or replayed it.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qjsflow.runner.bindings import Bindings
from qjsflow.runner.cli.output import render_json, table
from qjsflow.runner.config import RunnerConfig
from qjsflow.runner.engine.worker import worker_command
from qjsflow.runner.operations.timeline import timeline_rows
from qjsflow.runner.runner import Runner
from qjsflow.runner.views import StartRunInput

__all__ = ["DEMO_TOOLS", "run_demo"]

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
LEASE_TTL_S = 1.5
ORDER = {
    "orderId": "A-1042",
    "customer": "maria@example.com",
    "lines": [
        {"sku": "desk", "quantity": 2, "unitPriceCents": 34_900},
        {"sku": "lamp", "quantity": 3, "unitPriceCents": 4_500},
    ],
}


async def _reserve(args: Any) -> Any:
    return {"reservation": f"R-{args['orderId']}", "lines": len(args["lines"])}


async def _pack(args: Any) -> Any:
    await asyncio.sleep(1.5)  # long enough for the demo to kill the worker in the middle
    return {"parcel": f"P-{args['orderId']}"}


async def _charge(args: Any) -> Any:
    return {"charged": args["cents"], "receipt": f"C-{args['customer'].split('@')[0]}"}


DEMO_TOOLS = {"inventory.reserve": _reserve, "warehouse.pack": _pack, "payments.charge": _charge}


class _Story:
    def __init__(self, workdir: Path, as_json: bool) -> None:
        self.db = workdir / "demo.db"
        self.workdir = workdir
        self.as_json = as_json
        self.workers: list[subprocess.Popen[bytes]] = []
        self.said: list[str] = []

    def say(self, line: str) -> None:
        self.said.append(line)
        if not self.as_json:
            print(line, flush=True)

    def worker(self) -> subprocess.Popen[bytes]:
        log = (self.workdir / f"worker-{len(self.workers)}.log").open("wb")
        process = subprocess.Popen(
            worker_command(
                str(self.db), tools="qjsflow.runner.demo:DEMO_TOOLS", lease_ttl_s=LEASE_TTL_S
            ),
            cwd=FIXTURES.parent,
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()
        self.workers.append(process)
        return process

    def stop_workers(self) -> None:
        for process in self.workers:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.workers:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


async def _until(check: Callable[[], Any], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"the demo timed out waiting for {what}")


async def _story(story: _Story) -> dict[str, Any]:
    config = RunnerConfig(lease_ttl_s=LEASE_TTL_S)
    async with Runner.open(story.db, config) as runner:
        published = await runner.publish("demo", FIXTURES)
        story.say(f"1. published fixtures/ as snapshot {published.snapshot_id[:16]}… with "
                  f"{', '.join(w.workflow for w in published.workflows)}")  # fmt: skip
        request = StartRunInput(
            "demo", "order-approval", published.snapshot_id, ORDER, run_id="order-A-1042"
        )
        run = await runner.start(request, Bindings(tools=DEMO_TOOLS))
        wakes = "" if run.wake_at is None else f", wakes in {run.wake_at - time.time():.1f}s"
        story.say(f"2. started run {run.run_id}: it is {run.status} (cooling-off period{wakes})")

        first = story.worker()
        story.say(f"3. worker {first.pid} started; it wakes the run and starts packing")
        await _until(lambda: _packing(runner, run.run_id), "the pack step to start")
        first.send_signal(signal.SIGKILL)
        first.wait()
        story.say(f"4. killed worker {first.pid} with SIGKILL while 'pack order' was running")

        second = story.worker()
        story.say(f"5. worker {second.pid} started; it recovers the run once the dead "
                  f"worker's {LEASE_TTL_S:g}s lease lapses")  # fmt: skip
        await _until(lambda: _status_is(runner, run.run_id, "waiting"), "the approval wait")
        waiting = await runner.get(run.run_id, scope="demo")
        story.say(f"6. the run is {waiting.status} for the event {waiting.waiting_for!r}")

        await runner.signal(
            run.run_id, "approval", {"approved": True, "by": "sam"}, drive=False, scope="demo"
        )
        story.say("7. sent the approval event; the worker picks it up")
        await _until(lambda: _status_is(runner, run.run_id, "completed"), "the run to complete")
        done = await runner.get(run.run_id, scope="demo")
        story.say(f"8. the run is {done.status}: {render_json(done.output)}")
        story.stop_workers()
        timeline = await timeline_rows(runner, done)
        story.say("")
        story.say("timeline (each drive replays the journal from the top):")
        for line in table(timeline):
            story.say("  " + line)
        return {"run": done, "timeline": timeline[1:], "story": story.said}


async def _packing(runner: Runner, run_id: str) -> bool:
    calls = await runner.list_tool_calls(run_id, scope="demo")
    return any(call.address == "warehouse.pack" and call.result is None for call in calls)


async def _status_is(runner: Runner, run_id: str, status: str) -> bool:
    return (await runner.get(run_id, scope="demo")).status == status


def run_demo(*, as_json: bool = False) -> str:
    with tempfile.TemporaryDirectory(prefix="qjsflow-demo-") as workdir:
        story = _Story(Path(workdir), as_json)
        try:
            result = asyncio.run(_story(story))
        finally:
            story.stop_workers()
    if as_json:
        return render_json(result)
    return f"demo finished: run {result['run'].run_id} is {result['run'].status}"
