"""Flow control per key, enforced in the journal: concurrency with a queue in order and
positions, rate limits that refuse, throttles that queue to the rate, debounce (the last
input wins), singletons (skip, cancel), priority; restarts and forks wait for the gate too.
In process, on both journals, on a virtual clock; real worker processes are in
test_flow_workers.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from qjsflow.bridge import InvalidInput
from qjsflow.runner import Bindings, Runner, RunnerConfig, StartRunInput
from qjsflow.runner.errors import FlowRefused
from qjsflow.sandbox import PoolConfig
from tests.conftest import FakeClock
from tests.test_cli import Cli

HOLD = """export default async (event, step) => {
  await step.waitForEvent("go", { type: "go", timeout: "1 hour" });
  return event.payload;
};"""
QUICK = "export default async (event) => event.payload;"


async def _publish(runner: Runner, flow: dict[str, Any], source: str = HOLD) -> None:
    manifest = {"workflows": {"job": {"flow_control": flow}}}
    await runner.publish(
        "acme", {"workflows/job.ts": source, "qjsflow.json": orjson.dumps(manifest).decode()}
    )


async def _start(runner: Runner, payload: Any, **options: Any) -> str:
    run = await runner.start(StartRunInput("acme", "job", "latest", payload, **options))
    return run.run_id


async def _status(runner: Runner, run_id: str) -> str:
    return str((await runner.get(run_id, scope="acme")).status)


async def test_concurrency_per_key_queues_in_order_with_positions(
    clocked_runner: Runner,
) -> None:
    runner = clocked_runner
    await _publish(runner, {"concurrency": {"limit": 2, "key": "event.payload.customer"}})
    a = [await _start(runner, {"customer": "a", "n": n}) for n in range(5)]
    b = await _start(runner, {"customer": "b"})
    assert [await _status(runner, r) for r in a] == ["waiting"] * 2 + ["queued"] * 3
    assert await _status(runner, b) == "waiting"  # its key has room: not held by a's queue
    positions = [(await runner.get(r, scope="acme")).queue_position for r in a]
    assert positions == [None, None, 1, 2, 3]
    await runner.signal(a[0], "go", scope="acme")
    assert await _status(runner, a[0]) == "completed"
    await runner.serve(until_idle=True)  # a worker's look admits the next, which is driven
    assert [await _status(runner, r) for r in a] == ["completed", "waiting", "waiting",
                                                     "queued", "queued"]  # fmt: skip
    assert [(await runner.get(r, scope="acme")).queue_position for r in a[3:]] == [1, 2]
    await runner.cancel(a[3], scope="acme")  # a queued run cancelled leaves the queue
    assert await _status(runner, a[3]) == "cancelled"
    assert (await runner.get(a[4], scope="acme")).queue_position == 1


async def test_a_rate_limit_refuses_until_its_period_has_passed(
    clocked_runner: Runner, clock: FakeClock
) -> None:
    runner = clocked_runner
    await _publish(runner, {"rateLimit": {"limit": 3, "period": "1 minute",
                                          "key": "event.payload.customer"}}, QUICK)  # fmt: skip
    made = [await _start(runner, {"customer": "a"}) for _ in range(3)]
    with pytest.raises(FlowRefused, match="rate limit of 3"):
        await _start(runner, {"customer": "a"})
    assert await _start(runner, {"customer": "b"})  # another key has its own window
    clock.advance(59)
    with pytest.raises(FlowRefused):
        await _start(runner, {"customer": "a"})
    clock.advance(2)
    again = await _start(runner, {"customer": "a"})
    assert [await _status(runner, r) for r in [*made, again]] == ["completed"] * 4
    listed = await runner.list(scope="acme", workflow="job")
    assert len(listed) == 5  # the refused starts wrote nothing


async def test_a_throttle_queues_starts_to_its_rate(
    clocked_runner: Runner, clock: FakeClock
) -> None:
    runner = clocked_runner
    await _publish(runner, {"throttle": {"limit": 3, "period": 60}}, QUICK)
    made = [await _start(runner, n) for n in range(7)]
    assert [await _status(runner, r) for r in made] == ["completed"] * 3 + ["queued"] * 4
    clock.advance(30)
    await runner.serve(until_idle=True)
    assert [await _status(runner, r) for r in made].count("completed") == 3
    clock.advance(31)
    await runner.serve(until_idle=True)
    assert [await _status(runner, r) for r in made] == ["completed"] * 6 + ["queued"]
    clock.advance(60)
    await runner.serve(until_idle=True)
    assert [await _status(runner, r) for r in made] == ["completed"] * 7
    outputs = [(await runner.get(r, scope="acme")).output for r in made]
    assert outputs == list(range(7))  # in the order they were started


async def test_debounce_keeps_the_last_input(clocked_runner: Runner, clock: FakeClock) -> None:
    runner = clocked_runner
    await _publish(runner, {"debounce": {"period": "30 seconds", "key": "event.payload.user"}},
                   QUICK)  # fmt: skip
    first = await _start(runner, {"user": "u", "v": 1})
    clock.advance(20)
    assert await _start(runner, {"user": "u", "v": 2}) == first  # merged into the pending run
    other = await _start(runner, {"user": "w", "v": 9})
    clock.advance(20)  # 40 s after the first start, 20 after the last: still pending
    items = await runner.start_batch(
        [StartRunInput("acme", "job", "latest", {"user": "u", "v": 3})]
    )
    assert (items[0].outcome, items[0].run_id) == ("debounced", first)
    await runner.serve(until_idle=True)
    assert await _status(runner, first) == "queued"
    clock.advance(31)
    await runner.serve(until_idle=True)
    assert (await runner.get(first, scope="acme")).output == {"user": "u", "v": 3}
    assert (await runner.get(other, scope="acme")).output == {"user": "w", "v": 9}
    assert len(await runner.list(scope="acme", workflow="job")) == 2


@pytest.mark.parametrize("mode", ["skip", "cancel"])
async def test_singleton_modes(clocked_runner: Runner, mode: str) -> None:
    runner = clocked_runner
    await _publish(runner, {"singleton": {"key": "event.payload.account", "mode": mode}})
    first = await _start(runner, {"account": 1})
    elsewhere = await _start(runner, {"account": 2})
    assert await _status(runner, elsewhere) == "waiting"
    if mode == "skip":
        with pytest.raises(FlowRefused, match="singleton"):
            await _start(runner, {"account": 1})
        assert await _status(runner, first) == "waiting"
        await runner.signal(first, "go", scope="acme")
        assert await _status(runner, await _start(runner, {"account": 1})) == "waiting"
        return
    second = await _start(runner, {"account": 1})
    assert await _status(runner, second) == "queued"  # until the first has ended
    await runner.serve(until_idle=True)
    assert await _status(runner, first) == "cancelled"
    assert await _status(runner, second) == "waiting"
    assert await _status(runner, elsewhere) == "waiting"


async def test_priority_orders_a_queue_and_a_scopes_claims(clocked_runner: Runner) -> None:
    runner = clocked_runner
    await _publish(runner, {"concurrency": {"limit": 1}})
    holder = await _start(runner, "holder")
    low = [await _start(runner, f"low{n}") for n in range(2)]
    high = await _start(runner, "high", priority=5)
    assert (await runner.get(high, scope="acme")).queue_position == 1
    assert [(await runner.get(r, scope="acme")).queue_position for r in low] == [2, 3]
    await runner.signal(holder, "go", scope="acme")
    await runner.serve(until_idle=True)
    assert [await _status(runner, r) for r in (high, *low)] == ["waiting", "queued", "queued"]
    # Claims: runs left for a worker with one slot, at four priorities.
    driven: list[str] = []

    async def record(args: Any) -> None:
        driven.append(str(args))

    free = await runner.publish("acme", {"workflows/free.ts": RECORD})
    for name, priority in [("p0", 0), ("p9", 9), ("m3", -3), ("p4", 4)]:
        request = StartRunInput("acme", "free", free.snapshot_id, name, run_id=name,
                                priority=priority)  # fmt: skip
        assert (await runner.start(request, drive=False)).priority == priority
    await runner.serve(until_idle=True, concurrency=1, bindings=Bindings(tools={"record": record}))
    assert driven == ["p9", "p4", "p0", "m3"]


RECORD = "export default async (event, step) => { await step.tool('r', 'record', event.payload); };"


async def test_restart_and_fork_wait_for_the_gate(clocked_runner: Runner) -> None:
    runner = clocked_runner
    await _publish(runner, {"concurrency": {"limit": 1}})
    first = await _start(runner, 1)
    await runner.signal(first, "go", scope="acme")
    holder = await _start(runner, 2)
    restarted = await runner.restart(first, scope="acme")
    assert restarted.status == "queued"
    forked = await runner.fork(holder, scope="acme")
    assert forked.status == "queued"
    assert (await runner.get(forked.run_id, scope="acme")).queue_position == 2
    await runner.signal(holder, "go", scope="acme")
    await runner.serve(until_idle=True)  # the restarted run first; once it has ended, the fork
    admitted = {run: await _admitted_at(runner, run) for run in (first, forked.run_id)}
    assert admitted[first] < admitted[forked.run_id]  # each in its turn, one at a time
    ended = [e.seq for e in await runner.history(first, scope="acme") if e.type.startswith("run_c")]
    assert ended[-1] < admitted[forked.run_id]


async def _admitted_at(runner: Runner, run_id: str) -> int:
    """Where in the journal's order the run last left its queue."""
    events = await runner.history(run_id, scope="acme")
    return [e.seq for e in events if e.type == "run_admitted"][-1]


@pytest.mark.parametrize(
    ("flow", "problem"),
    [
        ({"concurrency": {"limit": 0}}, "concurrency.limit is a whole number"),
        ({"concurrency": {"limit": 2, "key": "event.payload.a b"}}, "is a path into the input"),
        ({"throttle": {"limit": 2, "period": "soon"}}, "period is seconds or a duration"),
        ({"singleton": {"mode": "replace"}}, "singleton.mode is one of skip, cancel"),
        ({"rateLimit": {"limit": 1, "period": 1}, "throttle": {"limit": 1, "period": 1}},
         "rateLimit or throttle, not both"),
        ({"queue": {}}, "unknown key 'queue'"),
        ({"priority": 5000}, "priority is a whole number from -1000 to 1000"),
    ],
)  # fmt: skip
async def test_bad_flow_control_is_refused_naming_the_problem(
    runner: Runner, flow: dict[str, Any], problem: str
) -> None:
    with pytest.raises(InvalidInput, match=problem):
        await _publish(runner, flow)
    await runner.publish("acme", {"workflows/job.ts": HOLD})
    with pytest.raises(InvalidInput, match=problem):
        await _start(runner, 1, flow=flow)


async def test_wrangler_declares_flow_control_and_a_start_may_override_it(
    runner: Runner,
) -> None:
    source = "import { WorkflowEntrypoint } from 'cloudflare:workers';\n" \
        "export class Job extends WorkflowEntrypoint { async run(event, step) {\n" \
        "  await step.waitForEvent('go', { type: 'go', timeout: '1 hour' }); } }\n"  # fmt: skip
    wrangler = {"name": "w", "main": "src/index.ts",
                "workflows": [{"name": "job", "class_name": "Job", "binding": "JOB",
                               "flow_control": {"concurrency": {"limit": 1}}}]}  # fmt: skip
    await runner.publish(
        "acme", {"src/index.ts": source, "wrangler.json": orjson.dumps(wrangler).decode()}
    )
    first, second = await _start(runner, 1), await _start(runner, 2)
    assert [await _status(runner, r) for r in (first, second)] == ["waiting", "queued"]
    free = await _start(runner, 3, flow={"concurrency": {"limit": 5}})
    assert await _status(runner, free) == "waiting"  # its own gate, given with the start
    tree = {"src/index.ts": source, "qjsflow.json": '{"workflows": {"nope": {}}}',
            "wrangler.json": orjson.dumps(wrangler).decode()}  # fmt: skip
    with pytest.raises(InvalidInput, match="'nope', which is not a workflow here"):
        await runner.publish("acme", tree)


def test_the_command_line_gives_priority_and_flow_and_refuses_with_exit_2(
    tmp_path: Path,
) -> None:
    tree = tmp_path / "src" / "workflows"
    tree.mkdir(parents=True)
    (tree / "job.ts").write_text(HOLD)
    with Cli(tmp_path) as cli:
        cli.ok("publish", str(tree.parent), "--scope", "acme")
        start = ("start", "job", "--scope", "acme", "--snapshot", "latest")
        flow = '{"singleton": {"key": "event.payload.a"}, "concurrency": {"limit": 1}}'
        first = cli.ok(*start, "--input", '{"a": 1}', "--flow", flow, "--priority", "7")
        assert first["priority"] == 7
        refused = cli.run(*start, "--input", '{"a": 1}', "--flow", flow)
        assert refused.returncode == 2
        assert "singleton" in refused.stderr
        cli.ok(*start, "--input", '{"a": 2}', "--flow", flow)
        waiting = cli.ok(*start, "--input", '{"a": 3}', "--flow", flow)
        shown = cli.run("status", waiting["run_id"], "--scope", "acme", json=False)
        assert "2 in its queue" in shown.stdout
        for bad, said in ((("--priority", "1001"), "--priority: '1001' is outside -1000 to 1000"),
                          (("--flow", '{"concurrency": 3}'), "concurrency is an object of")):  # fmt: skip
            done = cli.run(*start, *bad)
            assert done.returncode == 2
            assert said in done.stderr, done.stderr


async def test_qjsflow_json_declares_schedules_checked_before_publishing(runner: Runner) -> None:
    manifest = {"workflows": {"job": {"schedules": [
        {"name": "nightly", "cron": "0 3 * * *", "timezone": "Europe/Paris", "input": 1},
        {"every_s": 60, "overlap": "allow_all"}]}}}  # fmt: skip
    await runner.publish(
        "acme", {"workflows/job.ts": QUICK, "qjsflow.json": orjson.dumps(manifest).decode()}
    )
    shown = {s.name: s for s in await runner.schedules(scope="acme")}
    assert sorted(shown) == ["job-2", "nightly"]
    assert shown["nightly"].spec["timezone"] == "Europe/Paris"
    bad = {"workflows": {"job": {"schedules": [{"cron": "every day"}]}}}
    with pytest.raises(InvalidInput, match=r"schedules\[0\]: cron 'every day'"):
        await runner.publish("acme", {"workflows/job.ts": QUICK + "\n// changed",
                                      "qjsflow.json": orjson.dumps(bad).decode()})  # fmt: skip
    assert len(await runner.snapshots(scope="acme")) == 1  # nothing stored


async def test_author_code_sets_its_runs_tags_once_and_list_finds_them(runner: Runner) -> None:
    source = """import { setTags } from "qjsflow";
export default async (event, step) => {
  const first = await setTags(step, { customer: event.payload.customer, stage: "start" });
  await step.sleep("pause", "1 second");
  return { first, last: await setTags(step, { stage: "done" }) };
};"""
    manifest = '{"capabilities": {"tools": ["crm.*"]}}'  # it need not declare setTags
    await runner.publish("acme", {"workflows/job.ts": source, "qjsflow.json": manifest})
    run = await runner.start(StartRunInput("acme", "job", "latest", {"customer": "c-9"}))
    assert dict(await runner.tags(run.run_id, scope="acme")) == {
        "customer": "c-9",
        "stage": "start",
    }
    await runner.serve(until_idle=True)
    done = await runner.get(run.run_id, scope="acme")
    assert done.output == {"first": {"customer": "c-9", "stage": "start"},
                           "last": {"customer": "c-9", "stage": "done"}}  # fmt: skip
    found = await runner.list(scope="acme", tags={"stage": "done"})
    assert [r.run_id for r in found] == [run.run_id]
    calls = await runner.list_tool_calls(run.run_id, scope="acme")
    assert [c.address for c in calls] == ["qjsflow.tags"] * 2  # each made once, across the replay
    bad = await runner.start(StartRunInput("acme", "job", "latest", {"customer": "x" * 300}))
    assert bad.status == "failed"
    assert "setTags: tag 'customer'" in (bad.error or "")


async def test_concurrent_starts_from_two_processes_admit_within_the_limit(
    journal: str, tmp_path: Path
) -> None:
    """Starts that race from two runners (two connections: on PostgreSQL two transactions at
    once) are counted under the workflow's gate one after the other: the limit holds."""
    config = RunnerConfig(pool=PoolConfig(size=1), scope_root=tmp_path / "scopes")
    async with Runner.open(journal, config) as one, Runner.open(journal, config) as two:
        await _publish(one, {"concurrency": {"limit": 2, "key": "event.payload.k"}})
        starts = [runner.start(StartRunInput("acme", "job", "latest", {"k": "same", "n": n}),
                               drive=False)
                  for n in range(10) for runner in (one, two)]  # fmt: skip
        made = await asyncio.gather(*starts)
        statuses = sorted(str(run.status) for run in made)
        assert statuses == ["queued"] * 18 + ["running"] * 2
        positions = sorted([(await one.get(r.run_id, scope="acme")).queue_position or 0
                            for r in made if r.status == "queued"])  # fmt: skip
        assert positions == list(range(1, 19))


async def test_a_firing_its_workflows_flow_control_refuses_is_skipped_and_the_schedule_goes_on(
    clocked_runner: Runner, clock: FakeClock
) -> None:
    """A scheduled start refused (a singleton's skip here; a spent budget alike) is counted
    skipped: neither the schedule nor the worker that fires it stops."""
    runner = clocked_runner
    await _publish(runner, {"singleton": {"mode": "skip"}})
    await runner.set_schedule("acme", "tick", "job", {"every_s": 60, "overlap": "allow_all"})
    for _ in range(3):  # the first firing's run waits for an event: the next two are refused
        clock.advance(60)
        await runner.serve(until_idle=True)
    shown = await runner.schedule("acme", "tick")
    assert (shown.fired, shown.skipped) == (1, 2)
    (only,) = await runner.list(scope="acme", workflow="job")
    await runner.signal(only.run_id, "go", scope="acme")
    clock.advance(60)
    await runner.serve(until_idle=True)
    assert (await runner.schedule("acme", "tick")).fired == 2
