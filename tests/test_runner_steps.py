"""Run lifecycle semantics against a real journal file, real executors and real bundles."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from qjsflow.runner import (
    Bindings,
    FatalToolError,
    RunConflict,
    Runner,
    SnapshotNotFound,
    StartRunInput,
    ToolCall,
    UnknownWorkflow,
    current_tool_call,
)
from qjsflow.runner.tenancy.scopes import run_key
from tests.conftest import FakeClock, start_source

ALWAYS_FAILS = """
export default async (event, step) => {
  const first = await step.do("probe", async (ctx) => ctx.attempt);
  await step.do("flaky", { retries: { limit: 2, delay: 0 } }, async (ctx) => {
    throw new Error(`attempt ${ctx.attempt} failed`);
  });
  return first;
};
"""


async def test_attempts_and_exhausted_retries(clocked_runner: Runner) -> None:
    run = await start_source(clocked_runner, ALWAYS_FAILS)
    assert run.status == "failed"
    assert run.error == "Error: attempt 3 failed"
    steps = {s.name: s for s in await clocked_runner.list_steps(run.run_id, scope="acme")}
    assert steps["probe"].output == 1
    assert steps["flaky"].attempt == 3
    assert steps["flaky"].status == "failed"
    starts = [
        e
        for e in await clocked_runner.store.list_events(run_key("acme", run.run_id))
        if e.type == "step_started"
    ]
    assert len(starts) == 4  # probe once, flaky three times


REPEATED = """
export default async (event, step) => {
  const a = await step.do("repeated", async (ctx) => ({ n: 1, count: ctx.step.count, config: ctx.config }));
  const b = await step.do("repeated", { retries: { limit: 1 }, timeout: "1 minute" }, async (ctx) => ({ n: 2, count: ctx.step.count, config: ctx.config }));
  return [a, b];
};
"""


async def test_repeated_names_are_distinct_steps_with_merged_config(clocked_runner: Runner) -> None:
    run = await start_source(clocked_runner, REPEATED)
    assert run.status == "completed"
    a, b = run.output
    assert (a["n"], a["count"], b["n"], b["count"]) == (1, 1, 2, 2)
    assert a["config"] == {
        "retries": {"limit": 5, "delay": 10000, "backoff": "exponential"},
        "timeout": 600000,
    }
    assert b["config"] == {
        "retries": {"limit": 1, "delay": 10000, "backoff": "exponential"},
        "timeout": "1 minute",
    }
    steps = await clocked_runner.list_steps(run.run_id, scope="acme")
    assert [(s.name, s.count, s.output["n"]) for s in steps] == [
        ("repeated", 1, 1),
        ("repeated", 2, 2),
    ]


NON_RETRYABLE = """
import { NonRetryableError } from "cloudflare:workers";
export default async (event, step) => {
  let caught = null;
  try {
    await step.do("charge", async () => { throw new NonRetryableError("card declined"); });
  } catch (error) {
    caught = `${error.name}: ${error.message}`;
  }
  await step.sleep("wait a bit", "10 seconds");
  return caught;
};
"""


async def test_non_retryable_runs_once_and_is_not_rerun_on_replay(
    clocked_runner: Runner, clock: FakeClock
) -> None:
    run = await start_source(clocked_runner, NON_RETRYABLE)
    assert run.status == "sleeping"
    clock.advance(11)
    run = await clocked_runner.resume(run.run_id, scope="acme")
    assert run.status == "completed"
    assert run.output == "NonRetryableError: card declined"
    charge = next(
        s for s in await clocked_runner.list_steps(run.run_id, scope="acme") if s.name == "charge"
    )
    assert (charge.status, charge.attempt, charge.error) == (
        "failed",
        1,
        "NonRetryableError: card declined",
    )
    events = await clocked_runner.store.list_events(run_key("acme", run.run_id))
    assert sum(1 for e in events if e.type == "step_started") == 1


TYPES = """
export default async (event, step) => {
  const nothing = await step.do("nothing", async () => undefined);
  const when = await step.do("when", async () => new Date(Date.UTC(2024, 0, 2)));
  await step.sleep("pause", 1000);
  return { undef: nothing === undefined, date: when instanceof Date, iso: when.toISOString() };
};
"""


async def test_undefined_and_dates_replay_with_their_types(
    clocked_runner: Runner, clock: FakeClock
) -> None:
    run = await start_source(clocked_runner, TYPES)
    clock.advance(2)
    run = await clocked_runner.resume(run.run_id, scope="acme")
    assert run.output == {"undef": True, "date": True, "iso": "2024-01-02T00:00:00.000Z"}


SLEEPER = """
export default async (event, step) => {
  const before = await step.tool("before", "count", { at: "before" });
  await step.sleep("nap", "1 hour");
  const after = await step.tool("after", "count", { at: "after" });
  return { before, after };
};
"""


class Counter:
    def __init__(self) -> None:
        self.calls: list[Any] = []

    async def __call__(self, args: Any) -> int:
        self.calls.append(args)
        return len(self.calls)


async def test_sleep_survives_and_tools_run_once(clocked_runner: Runner, clock: FakeClock) -> None:
    counter = Counter()
    bindings = Bindings(tools={"count": counter})
    run = await start_source(clocked_runner, SLEEPER, bindings=bindings)
    assert run.status == "sleeping"
    assert run.wake_at == pytest.approx(clock() + 3600)
    again = await clocked_runner.resume(
        run.run_id, bindings, scope="acme"
    )  # not due yet: a replay only
    assert again.status == "sleeping"
    clock.advance(3600)
    done = await clocked_runner.resume(run.run_id, bindings, scope="acme")
    assert done.status == "completed"
    assert done.output == {"before": 1, "after": 2}
    assert counter.calls == [{"at": "before"}, {"at": "after"}]
    audit = await clocked_runner.list_tool_calls(run.run_id, scope="acme")
    assert [(a.step, a.address, a.args, a.result, a.error) for a in audit] == [
        ("before", "count", {"at": "before"}, 1, None),
        ("after", "count", {"at": "after"}, 2, None),
    ]
    await clocked_runner.resume(run.run_id, bindings, scope="acme")
    assert len(counter.calls) == 2


RETRY_AFTER = """
import { RetryableError } from "qjsflow";
export default async (event, step) => step.do("fetch", { retries: { limit: 3, delay: 0 } }, async (ctx) => {
  if (ctx.attempt === 1) throw new RetryableError("not yet", { retryAfter: "30 seconds" });
  return ctx.attempt;
});
"""


async def test_retry_after_waits_as_sleeping(clocked_runner: Runner, clock: FakeClock) -> None:
    run = await start_source(clocked_runner, RETRY_AFTER)
    assert run.status == "sleeping"
    assert run.wake_at == pytest.approx(clock() + 30)
    clock.advance(29)
    assert (await clocked_runner.resume(run.run_id, scope="acme")).status == "sleeping"
    clock.advance(1)
    done = await clocked_runner.resume(run.run_id, scope="acme")
    assert (done.status, done.output) == ("completed", 2)


TIMEOUT = """
export default async (event, step) => step.do("slow", { retries: { limit: 1, delay: 0 }, timeout: "1 second" }, async (ctx) => {
  await step.tool("wait " + ctx.attempt, "slow", { attempt: ctx.attempt });
  return ctx.attempt;
});
"""


async def test_per_attempt_timeout(clocked_runner: Runner, clock: FakeClock) -> None:
    async def slow(args: Any) -> None:
        if args["attempt"] == 1:
            clock.advance(5)

    run = await start_source(clocked_runner, TIMEOUT, bindings=Bindings(tools={"slow": slow}))
    assert (run.status, run.output) == ("completed", 2)
    events = await clocked_runner.store.list_events(run_key("acme", run.run_id))
    retry = next(e for e in events if e.type == "step_retrying")
    assert retry.data is not None
    assert "exceeded its timeout of 1000 ms" in retry.data


async def test_fatal_tool_error_is_not_retried(clocked_runner: Runner) -> None:
    async def refuse(args: Any) -> None:
        raise FatalToolError("account closed")

    source = 'export default async (e, step) => { try { await step.tool("t", "refuse", {}); } catch (err) { return err.message; } };'
    run = await start_source(clocked_runner, source, bindings=Bindings(tools={"refuse": refuse}))
    assert (run.status, run.output) == ("completed", "account closed")
    audit = await clocked_runner.list_tool_calls(run.run_id, scope="acme")
    assert [(a.attempt, a.error) for a in audit] == [(1, "FatalError: account closed")]


async def test_start_is_idempotent_with_a_caller_run_id(clocked_runner: Runner) -> None:
    source = 'export default async (e, step) => step.do("s", async () => e.payload.n);'
    first = await start_source(clocked_runner, source, {"n": 1}, run_id="order-1")
    again = await start_source(clocked_runner, source, {"n": 1}, run_id="order-1")
    assert first == again
    assert len(await clocked_runner.list(scope="acme")) == 1
    with pytest.raises(RunConflict, match="different input"):
        await start_source(clocked_runner, source, {"n": 2}, run_id="order-1")


async def test_unknown_workflow_and_snapshot(clocked_runner: Runner) -> None:
    published = await clocked_runner.publish(
        "acme", {"workflows/flow.ts": "export default async () => 1;"}
    )
    with pytest.raises(UnknownWorkflow, match="no workflow 'nope'; it has: flow"):
        await clocked_runner.start(StartRunInput("acme", "nope", published.snapshot_id))
    with pytest.raises(SnapshotNotFound):
        await clocked_runner.start(StartRunInput("other", "flow", published.snapshot_id))
    assert await clocked_runner.list(scope="acme") == []


LOGS_AND_NOTIFY = """
export default async (event, step) => {
  console.log("starting", event.payload.n);
  await step.notify({ title: "started" });
  await step.sleep("pause", 5000);
  console.warn("after the pause");
  return 1;
};
"""


async def test_console_and_notify_happen_once(clocked_runner: Runner, clock: FakeClock) -> None:
    sent: list[str] = []

    async def notify(message: Any) -> None:
        sent.append(message.title)

    bindings = Bindings(notify=notify)
    run = await start_source(clocked_runner, LOGS_AND_NOTIFY, {"n": 3}, bindings=bindings)
    await clocked_runner.resume(run.run_id, bindings, scope="acme")
    clock.advance(6)
    done = await clocked_runner.resume(run.run_id, bindings, scope="acme")
    assert done.status == "completed"
    logs = await clocked_runner.list_logs(run.run_id, scope="acme")
    assert [(log.level, log.text) for log in logs] == [
        ("log", "starting 3"),
        ("warn", "after the pause"),
    ]
    assert sent == ["started"]


async def test_a_tool_call_whose_outcome_is_unknown_is_audited_and_keyed(
    clocked_runner: Runner, clock: FakeClock
) -> None:
    """At least once: a call whose driver stopped mid-call is made again as the next attempt;
    the audit marks the first as unknown and the tool can tell the two apart by key."""
    seen: list[ToolCall | None] = []
    first_call = asyncio.Event()

    async def charge(args: Any) -> str:
        seen.append(current_tool_call())
        if len(seen) == 1:
            first_call.set()
            await asyncio.Event().wait()  # the driver dies while this call is out
        return "charged"

    source = """
    export default async (event, step) =>
      step.tool("charge", "pay.charge", { amount: 5 }, { retries: { limit: 2, delay: 0 } });
    """
    bindings = Bindings(tools={"pay.charge": charge})
    drive = asyncio.create_task(
        start_source(clocked_runner, source, run_id="pay", bindings=bindings)
    )
    await asyncio.wait_for(first_call.wait(), 30)
    drive.cancel()
    with pytest.raises(asyncio.CancelledError):
        await drive
    run = await clocked_runner.resume("pay", bindings, scope="acme")
    assert (run.status, run.output) == ("completed", "charged")
    first, second = seen
    assert first is not None
    assert second is not None
    assert (first.scope, first.run_id, first.step_key) == ("acme", "pay", "tool:1:charge")
    assert first.call_key == second.call_key
    assert (first.attempt, second.attempt) == (1, 2)
    assert first.idempotency_key != second.idempotency_key
    audit = await clocked_runner.list_tool_calls("pay", scope="acme")
    assert [(c.attempt, c.result) for c in audit] == [(1, None), (2, "charged")]
    assert audit[0].error is not None
    assert audit[0].error.startswith("ToolOutcomeUnknown:")
