"""Operators' run control through the Python API: pause, resume, terminate, restart, fork."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from qjsflow.bridge import InvalidInput
from qjsflow.bridge.limits import Limits
from qjsflow.runner import Bindings, RunClosed, Runner, RunView
from qjsflow.runner import runner as runner_module
from qjsflow.runner.config import RunnerConfig
from qjsflow.runner.errors import RunChanged
from qjsflow.runner.operations.fork_check import ForkMismatch, check_fork
from qjsflow.sandbox import PoolConfig
from tests.conftest import FakeClock, start_source


class Tools:
    """Tools that count their calls; `gate` holds the `slow` tool until the test opens it."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()
        self.fail_next: set[str] = set()

    def bindings(self) -> Bindings:
        def counted(name: str) -> Any:
            async def tool(args: Any) -> Any:
                self.calls[name] += 1
                if name in self.fail_next:
                    self.fail_next.discard(name)
                    raise RuntimeError(f"{name} failed")
                return f"{name}:{self.calls[name]}"

            return tool

        async def slow(args: Any) -> Any:
            self.calls["slow"] += 1
            self.entered.set()
            await self.gate.wait()
            return "slow done"

        names = ("a", "b", "c")
        return Bindings(tools={"slow": slow, **{name: counted(name) for name in names}})


LONG_STEP = """
export default async (event, step) => {
  const slow = await step.tool("long", "slow", {});
  const after = await step.tool("after", "a", {});
  const got = await step.waitForEvent("go", { type: "go" });
  return [slow, after, got.payload];
};
"""


async def test_a_pause_lets_the_step_under_way_finish_then_parks(
    clocked_runner: Runner, clock: FakeClock
) -> None:
    tools = Tools()
    started = asyncio.create_task(
        start_source(clocked_runner, LONG_STEP, bindings=tools.bindings())
    )
    await asyncio.wait_for(tools.entered.wait(), 30)
    run_id = (await clocked_runner.list(scope="acme"))[0].run_id
    asking = await clocked_runner.pause(run_id, scope="acme")
    assert asking.status == "running"  # the step is still under way
    tools.gate.set()
    parked = await asyncio.wait_for(started, 30)
    assert parked.status == "paused"
    steps = await clocked_runner.list_steps(run_id, scope="acme")
    assert [(s.name, s.status) for s in steps] == [("long", "completed")]  # nothing after it
    # No worker drives it; a signal is kept for later.
    await clocked_runner.signal(run_id, "go", "now", scope="acme")
    assert await clocked_runner.serve(until_idle=True, bindings=tools.bindings()) == 0
    assert (await clocked_runner.get(run_id, scope="acme")).status == "paused"
    done = await clocked_runner.resume(run_id, tools.bindings(), scope="acme")
    assert (done.status, done.output) == ("completed", ["slow done", "a:1", "now"])
    assert tools.calls == Counter({"slow": 1, "a": 1})
    types = [event.type for event in await clocked_runner.history(run_id, scope="acme")]
    assert types.index("pause_requested") < types.index("run_paused") < types.index("run_resumed")


NAP = """
export default async (event, step) => {
  await step.sleep("nap", "1 minute");
  return "rested";
};
"""


async def test_a_paused_run_keeps_its_timer_and_no_worker_wakes_it(
    clocked_runner: Runner, clock: FakeClock
) -> None:
    run = await start_source(clocked_runner, NAP)
    paused = await clocked_runner.pause(run.run_id, scope="acme")
    assert paused.status == "paused"
    assert paused.wake_at == run.wake_at  # the sleep keeps its due time
    clock.advance(120)
    assert await clocked_runner.serve(until_idle=True) == 0
    assert await clocked_runner.store.next_due() is None  # a paused run's timer wakes no one
    done = await clocked_runner.resume(run.run_id, scope="acme")
    assert (done.status, done.output) == ("completed", "rested")


async def test_pause_and_terminate_refuse_a_run_that_ended(clocked_runner: Runner) -> None:
    run = await start_source(clocked_runner, 'export default async () => "x";')
    with pytest.raises(RunClosed):
        await clocked_runner.pause(run.run_id, scope="acme")
    with pytest.raises(RunClosed):
        await clocked_runner.terminate(run.run_id, scope="acme")


async def test_terminate_stops_a_run_mid_step(clocked_runner: Runner) -> None:
    tools = Tools()  # the gate is never opened: only terminate ends this run
    started = asyncio.create_task(
        start_source(clocked_runner, LONG_STEP, bindings=tools.bindings())
    )
    await asyncio.wait_for(tools.entered.wait(), 30)
    run_id = (await clocked_runner.list(scope="acme"))[0].run_id
    ended = await clocked_runner.terminate(run_id, scope="acme", reason="stuck on a vendor")
    assert ended.status == "terminated"
    assert ended.error == "terminated by an operator: stuck on a vendor"
    stopped = await asyncio.wait_for(started, 10)  # the drive in progress stopped at once
    assert stopped.status == "terminated"
    assert tools.calls == Counter({"slow": 1})
    with pytest.raises(RunClosed):
        await clocked_runner.signal(run_id, "go", None, scope="acme")
    types = [event.type for event in await clocked_runner.history(run_id, scope="acme")]
    assert types[-1] == "run_terminated"


THREE_TOOLS = """
export default async (event, step) => {
  const a = await step.tool("first", "a", {});
  const b = await step.tool("second", "b", {});
  const c = await step.tool("third", "c", {});
  console.log("done with", a, b, c);
  return [a, b, c];
};
"""


async def test_restart_from_a_step_keeps_the_results_before_it(clocked_runner: Runner) -> None:
    tools = Tools()
    tools.fail_next = {"c"}
    run = await start_source(clocked_runner, THREE_TOOLS, bindings=tools.bindings())
    steps = await clocked_runner.list_steps(run.run_id, scope="acme")
    assert run.status == "sleeping"
    assert steps[-1].status == "retrying"
    again = await clocked_runner.restart(
        run.run_id, tools.bindings(), scope="acme", from_step="tool:second"
    )
    assert (again.status, again.output) == ("completed", ["a:1", "b:2", "c:2"])
    assert tools.calls == Counter({"a": 1, "b": 2, "c": 2})  # `first` was not called again
    assert again.run_id == run.run_id
    history = await clocked_runner.history(run.run_id, scope="acme")
    restarted = [e for e in history if e.type == "run_restarted"]
    assert restarted[0].data["fromStep"] == "tool:second:1"
    assert (restarted[0].data["kept"], restarted[0].data["again"]) == (1, 2)
    # The earlier attempt stays visible: the audit has both calls of `second`.
    calls = await clocked_runner.list_tool_calls(run.run_id, scope="acme")
    assert [c.step for c in calls].count("second") == 2
    logs = await clocked_runner.list_logs(run.run_id, scope="acme")
    assert [log.text for log in logs] == ["done with a:1 b:2 c:2"]


async def test_restart_from_the_beginning_reruns_every_step(clocked_runner: Runner) -> None:
    tools = Tools()
    run = await start_source(clocked_runner, THREE_TOOLS, bindings=tools.bindings())
    assert run.status == "completed"
    again = await clocked_runner.restart(run.run_id, tools.bindings(), scope="acme")
    assert again.output == ["a:2", "b:2", "c:2"]
    logs = await clocked_runner.list_logs(run.run_id, scope="acme")
    assert [log.text for log in logs] == ["done with a:1 b:1 c:1", "done with a:2 b:2 c:2"]


async def test_restart_names_a_step_the_run_does_not_have(clocked_runner: Runner) -> None:
    tools = Tools()
    run = await start_source(clocked_runner, THREE_TOOLS, bindings=tools.bindings())
    for wrong in ("tool:fourth", "bogus:first", "tool", "tool:first:0"):
        with pytest.raises(InvalidInput, match="step"):
            await clocked_runner.restart(run.run_id, scope="acme", from_step=wrong)
    assert (await clocked_runner.get(run.run_id, scope="acme")).output == ["a:1", "b:1", "c:1"]


WAITS_TWICE = """
export default async (event, step) => {
  const one = await step.waitForEvent("approval", { type: "approve" });
  const n = await step.tool("count", "a", {});
  return [one.payload, n];
};
"""


async def test_an_event_consumed_by_a_step_that_runs_again_is_delivered_again(
    clocked_runner: Runner,
) -> None:
    tools = Tools()
    run = await start_source(clocked_runner, WAITS_TWICE, bindings=tools.bindings())
    done = await clocked_runner.signal(run.run_id, "approve", "yes", tools.bindings(), scope="acme")
    assert done.output == ["yes", "a:1"]
    again = await clocked_runner.restart(run.run_id, tools.bindings(), scope="acme")
    assert again.output == ["yes", "a:2"]


async def _forked(runner: Runner, tools: Tools, **options: Any) -> tuple[RunView, RunView]:
    run = await start_source(runner, THREE_TOOLS, bindings=tools.bindings())
    fork = await runner.fork(run.run_id, tools.bindings(), scope="acme", **options)
    return run, fork


async def test_fork_copies_the_results_before_the_step(clocked_runner: Runner) -> None:
    tools = Tools()
    run, fork = await _forked(clocked_runner, tools, from_step="tool:third", new_run_id="the-fork")
    assert (fork.run_id, fork.output) == ("the-fork", ["a:1", "b:1", "c:2"])
    assert tools.calls == Counter({"a": 1, "b": 1, "c": 2})
    source = await clocked_runner.get(run.run_id, scope="acme")
    assert source.output == ["a:1", "b:1", "c:1"]  # the source run is untouched
    history = await clocked_runner.history(run.run_id, scope="acme")
    assert history[-1].type == "run_forked"
    assert history[-1].data["fork"] == "the-fork"


async def test_fork_onto_new_code_that_reaches_the_same_steps(clocked_runner: Runner) -> None:
    tools = Tools()
    run = await start_source(clocked_runner, THREE_TOOLS, bindings=tools.bindings())
    changed = THREE_TOOLS.replace("return [a, b, c]", "return { fixed: [a, b, c] }")
    published = await clocked_runner.publish("acme", {"workflows/flow.ts": changed})
    fork = await clocked_runner.fork(
        run.run_id, tools.bindings(), scope="acme", from_step="tool:third",
        snapshot_id=published.snapshot_id,
    )  # fmt: skip
    assert fork.output == {"fixed": ["a:1", "b:1", "c:2"]}
    assert fork.snapshot_id == published.snapshot_id


async def test_fork_refuses_new_code_that_diverges_naming_the_step(clocked_runner: Runner) -> None:
    tools = Tools()
    run = await start_source(clocked_runner, THREE_TOOLS, bindings=tools.bindings())
    renamed = THREE_TOOLS.replace('step.tool("second"', 'step.tool("renamed"')
    published = await clocked_runner.publish("acme", {"workflows/flow.ts": renamed})
    with pytest.raises(ForkMismatch, match="tool:1:renamed where the run had tool:1:second"):
        await clocked_runner.fork(
            run.run_id, tools.bindings(), scope="acme", from_step="tool:third",
            snapshot_id=published.snapshot_id, new_run_id="never",
        )  # fmt: skip
    assert [r.run_id for r in await clocked_runner.list(scope="acme")] == [run.run_id]
    assert tools.calls == Counter({"a": 1, "b": 1, "c": 1})  # the check called no tool


async def test_history_shows_a_lease_taken_over_from_a_driver_that_died(
    clocked_runner: Runner, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    run = await start_source(clocked_runner, NAP)
    key = f"acme/{run.run_id}"
    ghost = await clocked_runner.store.acquire_lease(key, "ghost-worker", int(clock() * 1000), 1)
    assert ghost is not None  # a driver that takes the run and dies without releasing it
    clock.advance(120)
    await asyncio.sleep(0.01)  # PostgreSQL judges leases by its own clock
    assert (await clocked_runner.resume(run.run_id, scope="acme")).status == "completed"
    taken = [e for e in await clocked_runner.history(run.run_id, scope="acme")
             if e.type == "lease_taken_over"]  # fmt: skip
    assert len(taken) == 1
    assert taken[0].data["from"] == "ghost-worker"
    assert taken[0].data["forced"] is False
    assert f"run acme/{run.run_id}: taken over from ghost-worker" in caplog.text  # a warning


async def test_a_limit_hit_is_logged_as_a_warning_naming_the_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = RunnerConfig(limits=Limits(compute_per_drive_s=0.3), pool=PoolConfig(size=1),
                          scope_root=tmp_path / "scopes")  # fmt: skip
    async with Runner.open(tmp_path / "j.db", config) as runner:
        run = await start_source(runner, "export default async () => { for (;;) {} };",
                                 run_id="spin")  # fmt: skip
    assert run.status == "failed"
    assert "run acme/spin hit its compute limit: compute limit per drive of 0.3 s" in caplog.text


def test_every_command_line_argument_has_help() -> None:
    from qjsflow.runner.cli.parser import build_parser  # noqa: PLC0415

    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command")
    assert isinstance(commands.choices, dict)
    missing = [
        f"{name} {action.dest}"
        for name, command in [("qjsflow", parser), *commands.choices.items()]
        for action in command._actions
        if action.dest not in ("help", "command") and not action.help
    ]
    assert missing == []


NESTED = """
export default async (event, step) => {
  const outer = await step.do("outer", async () => await step.tool("inner", "a", {}));
  const after = await step.tool("after", "b", {});
  return [outer, after];
};
"""


async def test_restart_from_a_step_reruns_the_calls_inside_it(clocked_runner: Runner) -> None:
    tools = Tools()
    run = await start_source(clocked_runner, NESTED, bindings=tools.bindings())
    assert run.output == ["a:1", "b:1"]
    again = await clocked_runner.restart(
        run.run_id, tools.bindings(), scope="acme", from_step="do:outer"
    )
    assert again.output == ["a:2", "b:2"]  # the tool inside `outer` settled before it: rerun too
    kept = await clocked_runner.restart(
        run.run_id, tools.bindings(), scope="acme", from_step="tool:after"
    )
    assert kept.output == ["a:2", "b:3"]


async def test_a_fork_checked_before_a_restart_copies_nothing(
    clocked_runner: Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fork's check reads the source outside the transaction that copies: a restart in
    between changes what would be copied, and the fork is refused, not made of other steps."""
    tools = Tools()
    run = await start_source(clocked_runner, THREE_TOOLS, bindings=tools.bindings())
    changed = THREE_TOOLS.replace("return [a, b, c]", "return { fixed: [a, b, c] }")
    published = await clocked_runner.publish("acme", {"workflows/flow.ts": changed})
    checked = check_fork

    async def check_then_restart(*args: Any) -> tuple[str, ...]:
        keys = await checked(*args)
        await clocked_runner.restart(run.run_id, scope="acme", from_step="tool:third", drive=False)
        return keys

    monkeypatch.setattr(runner_module, "check_fork", check_then_restart)
    with pytest.raises(RunChanged, match="changed while its fork was checked"):
        await clocked_runner.fork(
            run.run_id, tools.bindings(), scope="acme", from_step="tool:second",
            snapshot_id=published.snapshot_id, new_run_id="never",
        )  # fmt: skip
    assert [r.run_id for r in await clocked_runner.list(scope="acme")] == [run.run_id]
