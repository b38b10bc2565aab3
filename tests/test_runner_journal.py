"""The journal's rules seen from the runner: first writer wins, in-flight attempts, views."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

from qjsflow.bridge.limits import Limits
from qjsflow.bridge.types import OpEnvelope, RetryPolicy, StepCheck, StepRecord, Value
from qjsflow.runner import Bindings, Runner, StartRunInput
from qjsflow.runner.engine.host import DriveHost
from qjsflow.runner.tenancy.scopes import run_key
from tests.conftest import FakeClock, executor_pids, start_source


async def test_first_writer_wins(clocked_runner: Runner, clock: FakeClock) -> None:
    source = 'export default async (e, step) => { await step.sleep("s", "1 hour"); };'
    run = await start_source(clocked_runner, source)

    def now() -> int:
        return int(clock() * 1000)

    policy = RetryPolicy(0, 0, "constant", 60_000)
    lease = await clocked_runner.store.acquire_lease(
        run_key("acme", run.run_id), "test", now(), 60_000
    )
    assert lease is not None
    scopes = clocked_runner.scopes
    first = DriveHost(clocked_runner.store, lease, Bindings(), Limits(), now, scopes=scopes)
    second = DriveHost(clocked_runner.store, lease, Bindings(), Limits(), now, scopes=scopes)
    await first([OpEnvelope(1, StepCheck("shared", "do", 1, policy))])
    [won] = await first([OpEnvelope(2, StepRecord("shared", 1, 1, '"first"', None))])
    [lost] = await second([OpEnvelope(3, StepRecord("shared", 1, 1, '"second"', None))])
    assert won.result == Value(None)
    assert lost.result == Value('"first"')
    steps = [
        s for s in await clocked_runner.list_steps(run.run_id, scope="acme") if s.name == "shared"
    ]
    assert [(s.status, s.output) for s in steps] == [("completed", "first")]


IN_FLIGHT = """
export default async (event, step) => step.do("outer", { retries: { limit: 2, delay: 0 } }, async (ctx) => {
  const inner = await step.tool("inner", "crash", {});
  return { attempt: ctx.attempt, inner };
});
"""


async def test_an_attempt_in_flight_when_the_executor_died_counts_as_failed(
    clocked_runner: Runner,
) -> None:
    calls: list[int] = []

    async def crash(args: Any) -> str:
        calls.append(1)
        for pid in executor_pids():
            os.kill(pid, signal.SIGKILL)
        return "tool done"

    run = await start_source(clocked_runner, IN_FLIGHT, bindings=Bindings(tools={"crash": crash}))
    assert run.status == "completed"
    assert run.output == {"attempt": 2, "inner": "tool done"}
    assert calls == [1]  # the tool's recorded result was reused by the second attempt
    events = await clocked_runner.store.list_events(run_key("acme", run.run_id))
    retrying = [e for e in events if e.type == "step_retrying"]
    assert len(retrying) == 1
    assert retrying[0].data is not None
    assert "interrupted" in retrying[0].data


async def test_persisted_bindings_and_list_filters(clocked_runner: Runner) -> None:
    published = await clocked_runner.publish(
        "acme",
        {
            "workflows/flow.ts": "export default async (e, step, env) => env.region;",
            "workflows/other.ts": 'export default async (e, step) => step.sleep("s", "1 day");',
        },
    )
    request = StartRunInput(
        "acme", "flow", published.snapshot_id, None, "r1", "workflows/flow.ts", {"region": "eu"}
    )
    done = await clocked_runner.start(request)
    assert (done.status, done.output) == ("completed", "eu")
    await clocked_runner.start(StartRunInput("acme", "other", published.snapshot_id, run_id="r2"))
    persisted = await clocked_runner.get_persisted("r1", scope="acme")
    assert (persisted.snapshot_id, persisted.entry_path, persisted.persisted_bindings) == (
        published.snapshot_id,
        "workflows/flow.ts",
        {"region": "eu"},
    )
    assert [r.run_id for r in await clocked_runner.list(scope="acme", status="sleeping")] == ["r2"]
    assert [r.run_id for r in await clocked_runner.list(scope="acme", workflow="flow")] == ["r1"]
    assert [r.run_id for r in await clocked_runner.list(scope="acme")] == ["r1", "r2"]


SAME_NAMES = """
export default async (event, step) => {
  const a = await step.do("a", async () => step.tool("x", "echo", { n: 1 }));
  const b = await step.do("b", { retries: { limit: 2, delay: 0 } }, async () => step.tool("x", "echo", { n: 2 }));
  return [a, b];
};
"""


async def test_calls_inside_a_replayed_body_do_not_shift_the_calls_of_others(
    clocked_runner: Runner,
) -> None:
    seen: list[int] = []

    async def echo(args: Any) -> int:
        seen.append(args["n"])
        if args["n"] == 2 and seen.count(2) == 1:
            for pid in executor_pids():  # crash while b's attempt is in flight
                os.kill(pid, signal.SIGKILL)
        return int(args["n"])

    run = await start_source(clocked_runner, SAME_NAMES, bindings=Bindings(tools={"echo": echo}))
    assert (run.status, run.output) == ("completed", [1, 2])
    assert seen == [1, 2]  # a's body was replayed, not rerun; b's tool result was reused
    names = [
        s.name
        for s in await clocked_runner.list_steps(run.run_id, scope="acme")
        if s.kind == "tool"
    ]
    assert names == ["do:1:a/x", "do:1:b/x"]


async def test_a_read_sees_every_write_this_process_queued_before_it(
    clocked_runner: Runner,
) -> None:
    """Writes queued by one task (a host's results answered ahead) and a read by another made
    at once after them: the read finds them, whichever task the event loop runs first."""
    run = await start_source(clocked_runner, 'export default async () => "ok";')
    key = run_key("acme", run.run_id)
    store = clocked_runner.store

    def tagging(tag: str, n: int) -> Any:
        return lambda tx: tx.put_tags(key, {tag: str(n)})

    for n in range(3):
        queued = [store.transact_soon(tagging(tag, n)) for tag in ("a", "b", "c")]
        assert await store.tags_of(key) == {"a": str(n), "b": str(n), "c": str(n)}
        await asyncio.gather(*queued)
