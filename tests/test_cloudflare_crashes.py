"""Cloudflare's child workflows and rollbacks across a worker killed with SIGKILL: the child is
created once, and each compensation that completed runs once (real worker subprocesses,
SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from qjsflow.runner import Runner, StartRunInput
from tests.worker_pool import Workers

pytestmark = pytest.mark.slow

FAMILY = """
import { WorkflowEntrypoint } from "cloudflare:workers";
import { waitForInstance } from "qjsflow";
export class Parent extends WorkflowEntrypoint {
  async run(event, step) {
    const child = await this.env.CHILD.create({ params: { n: 21 } });
    await step.tool("slow", "slow", { run: event.instanceId, seconds: 2 });  // killed in here
    return { ended: await waitForInstance(step, child, { firstMs: 50 }), id: child.id };
  }
}
export class Child extends WorkflowEntrypoint {
  async run(event, step) {
    return await step.do("double", async () => event.payload.n * 2);
  }
}
"""

ROLLING_BACK = """
import { WorkflowEntrypoint } from "cloudflare:workers";
export class Order extends WorkflowEntrypoint {
  async run(event, step) {
    const run = event.instanceId;
    const undo = (what, tool) => async () => {
      await step.tool(`undo ${what}`, tool, { run, step: `undo ${what}`, seconds: 2 });
    };
    await step.do("reserve", async () => "R1", { rollback: undo("reserve", "append") });
    await step.do("charge", async () => "C1", { rollback: undo("charge", "slow") });
    await step.do("ship", { retries: { limit: 0 } }, async () => { throw new Error("no truck"); },
                  { rollback: undo("ship", "append") });
  }
}
"""


def _project(tmp_path: Path, source: str, workflows: list[dict[str, str]]) -> Path:
    root = tmp_path / "project"
    (root / "src").mkdir(parents=True)
    (root / "src" / "index.ts").write_text(source)
    (root / "wrangler.jsonc").write_text(json.dumps({"main": "src/index.ts",
                                                     "workflows": workflows}))  # fmt: skip
    return root


async def _kill_during_slow(workers: Workers) -> None:
    """A worker, killed with SIGKILL while the slow tool runs in its drive; then another."""
    first = workers.spawn()
    await workers.tool_call(lambda line: line.endswith(" slow"))
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    workers.spawn()


async def test_a_child_is_created_once_across_a_crash(workers: Workers, api: Runner) -> None:
    await api.publish("cf", _project(workers.logs.parent, FAMILY, [
        {"name": "parent", "binding": "PARENT", "class_name": "Parent"},
        {"name": "child", "binding": "CHILD", "class_name": "Child"},
    ]))  # fmt: skip
    await api.start(StartRunInput("cf", "parent", "latest", None, "p1"), drive=False)
    await _kill_during_slow(workers)
    done = await api.wait("p1", scope="cf", timeout_s=120)
    assert done.status == "completed", done.error
    assert done.output["ended"] == {"status": "complete", "output": 42, "error": None}
    children = await api.list(scope="cf", workflow="child")
    assert [run.run_id for run in children] == [done.output["id"]]  # created once


async def test_rollbacks_across_a_crash_mid_rollback(workers: Workers, api: Runner) -> None:
    await api.publish("cf", _project(workers.logs.parent, ROLLING_BACK, [
        {"name": "order", "binding": "ORDER", "class_name": "Order"},
    ]))  # fmt: skip
    await api.start(StartRunInput("cf", "order", "latest", None, "o1"), drive=False)
    await _kill_during_slow(workers)  # killed while charge's compensation runs
    done = await api.wait("o1", scope="cf", timeout_s=120)
    assert (done.status, done.error) == ("failed", "Error: no truck")
    lines = workers.tool_log.read_text().split("\n")
    # Newest first; ship's compensation completed before the crash and never ran again;
    # charge's was cut short and made again (at least once, as any tool call).
    assert [line for line in lines if line] == [
        "o1 undo ship",
        "o1 slow",
        "o1 slow",
        "o1 undo reserve",
    ]
    calls = await api.list_tool_calls("o1", scope="cf")
    assert [c.address for c in calls if c.result is not None] == ["append", "slow", "append"]
