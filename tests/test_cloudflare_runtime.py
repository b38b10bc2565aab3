"""Retries as Cloudflare authors expect them: a tool inside a step fails the attempt with its
own error and runs again in the next one; a tool no process has bound blocks the run until a
process that binds it drives it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qjsflow.runner import Bindings, Runner, StartRunInput
from tests.conftest import start_source

SYNC = """
export default async (event, step) =>
  step.do("sync", { retries: { limit: 2, delay: 0 } }, async (ctx) => {
    const warmed = await step.tool("warm", "cache.warm", {});
    const pushed = await step.tool("push", "crm.push", { attempt: ctx.attempt });
    return { pushed, warmed, attempt: ctx.attempt };
  });
"""


async def test_a_tool_in_a_step_fails_the_attempt_and_runs_again_in_the_next(
    runner: Runner,
) -> None:
    pushes: list[Any] = []
    warms: list[Any] = []

    async def push(args: Any) -> str:
        pushes.append(args)
        if len(pushes) == 1:
            raise RuntimeError("CRM busy")
        return "pushed"

    async def warm(args: Any) -> str:
        warms.append(args)
        return "warm"

    bindings = Bindings(tools={"crm.push": push, "cache.warm": warm})
    run = await start_source(runner, SYNC, bindings=bindings)
    assert (run.status, run.output) == (
        "completed", {"pushed": "pushed", "warmed": "warm", "attempt": 2}
    )  # fmt: skip
    assert pushes == [{"attempt": 1}, {"attempt": 2}]  # no retries of its own, no waiting
    assert len(warms) == 1  # what succeeded in attempt 1 is not done again


async def test_the_step_fails_with_the_tools_own_error(runner: Runner) -> None:
    async def down(args: Any) -> None:
        raise RuntimeError("CRM down")

    source = """
    export default async (event, step) =>
      step.do("sync", { retries: { limit: 1, delay: 0 } }, async () =>
        step.tool("push", "crm.push", {}));
    """
    run = await start_source(runner, source, bindings=Bindings(tools={"crm.push": down}))
    assert (run.status, run.error) == ("failed", "RuntimeError: CRM down")
    steps = {s.name: s for s in await runner.list_steps(run.run_id, scope="acme")}
    assert steps["sync"].attempt == 2


async def test_a_top_level_tool_keeps_its_own_retry_policy(runner: Runner) -> None:
    calls: list[Any] = []

    async def flaky(args: Any) -> str:
        calls.append(args)
        if len(calls) < 3:
            raise RuntimeError("busy")
        return "done"

    source = """
    export default async (event, step) =>
      step.tool("push", "crm.push", {}, { retries: { limit: 5, delay: 0 } });
    """
    run = await start_source(runner, source, bindings=Bindings(tools={"crm.push": flaky}))
    assert (run.status, run.output, len(calls)) == ("completed", "done", 3)


async def test_an_unbound_tool_blocks_the_run_until_a_process_binds_it(tmp_path: Path) -> None:
    source = """
    export default async (event, step) => {
      const first = await step.do("first", async () => 1);
      return first + (await step.tool("push", "crm.push", {}));
    };
    """
    async with Runner.open(tmp_path / "j.db") as runner:
        published = await runner.publish("acme", {"workflows/flow.ts": source})
        run = await runner.start(StartRunInput("acme", "flow", published.snapshot_id))
        assert (run.status, run.waiting_for, run.error) == ("blocked", "crm.push", None)
        steps = await runner.list_steps(run.run_id, scope="acme")
        assert [s.name for s in steps] == ["first"]  # nothing recorded for the missing tool
        # A worker without the tool leaves it alone; one with it continues the run.
        await runner.serve(until_idle=True)
        assert (await runner.get(run.run_id, scope="acme")).status == "blocked"

        async def push(args: Any) -> int:
            return 41

        await runner.serve(until_idle=True, bindings=Bindings(tools={"crm.push": push}))
        done = await runner.get(run.run_id, scope="acme")
        assert (done.status, done.output) == ("completed", 42)
