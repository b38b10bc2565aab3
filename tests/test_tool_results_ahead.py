"""A tool's value is answered at once and its result written first in the drive's next
transaction (docs/ARCHITECTURE.md, "A tool's result is written with what follows it"). What a
worker killed in between leaves, with real worker subprocesses and SIGKILL on both journals:
the call is made again as the step's next attempt, the first marked as of unknown outcome —
as for a worker killed while the call was out."""

from __future__ import annotations

import pytest

from qjsflow.runner import Runner, StartRunInput
from tests.crash_tools import CRASH_AFTER_TOOL
from tests.worker_pool import Workers

pytestmark = pytest.mark.slow

TWO_CALLS = """
export default async (event, step) => {
  const first = await step.tool("first", "at_once", { run: event.instanceId, step: "first" });
  const second = await step.tool("second", "at_once", { run: event.instanceId, step: "second" });
  return [first, second];
};
"""


async def test_a_result_answered_but_not_written_when_its_worker_dies_is_asked_again(
    workers: Workers, api: Runner
) -> None:
    published = await api.publish("acme", {"workflows/flow.ts": TWO_CALLS})
    await api.start(StartRunInput("acme", "flow", published.snapshot_id, None, "k1"), drive=False)
    dies = workers.spawn(env={CRASH_AFTER_TOOL: "first"})  # once "first" is answered
    assert dies.wait(timeout=60) != 0
    workers.spawn()
    done = await api.wait("k1", scope="acme", timeout_s=120)
    assert (done.status, done.output) == ("completed", ["first", "second"]), done.error
    assert workers.tool_lines()[("k1", "first")] == 2
    calls = await api.list_tool_calls("k1", scope="acme")
    assert [(c.step, c.attempt, c.result, c.error is not None) for c in calls] == [
        ("first", 1, None, True),  # its outcome unknown: the worker died before writing it
        ("first", 2, "first", False),
        ("second", 1, "second", False),
    ]
