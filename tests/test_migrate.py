"""Moving in-flight runs to new code, proven by replay (runner/operations/migrate.py): compatible changes
re-pin, incompatible ones are reported with the step and the new code's line, and an ordinary
replay whose calls differ from the journal stops with a divergence."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from qjsflow.runner import Bindings, Runner, RunnerConfig, StartRunInput
from qjsflow.sandbox import PoolConfig
from tests.journal_reads import execute, query

V1 = """export default async (event, step) => {
  const order = await step.do("fetch order", async () => ({ id: event.payload.id }));
  await step.tool("reserve", "inventory.reserve", { id: order.id, qty: 1 });
  const approval = await step.waitForEvent("approval", { type: "approved", timeout: "1 day" });
  const shipped = await step.do("ship", async () => `shipped ${order.id}`);
  return { shipped, approval: approval.payload };
};"""

CHANGES = {
    # compatible
    "appended": V1.replace("  return {",
                           '  await step.do("thank", async () => 1);\n  return {'),
    "new body": V1.replace("({ id: event.payload.id })", "({ id: event.payload.id, v: 2 })"),
    # incompatible
    "renamed": V1.replace('step.do("fetch order"', 'step.do("load order"'),
    "new args": V1.replace("qty: 1", "qty: 2"),
    "reordered": V1.replace(
        '  const order = await step.do("fetch order", async () => ({ id: event.payload.id }));\n'
        '  await step.tool("reserve", "inventory.reserve", { id: order.id, qty: 1 });\n',
        '  await step.tool("reserve", "inventory.reserve", { id: 7, qty: 1 });\n'
        '  const order = await step.do("fetch order", async () => ({ id: event.payload.id }));\n',
    ),
}  # fmt: skip


@pytest.fixture
def reserved() -> list[object]:
    return []


@pytest.fixture
async def runner(journal: str, tmp_path: Path, reserved: list[object]) -> AsyncIterator[Runner]:
    async def reserve(args: object) -> str:
        reserved.append(args)
        return "held"

    config = RunnerConfig(pool=PoolConfig(size=2), scope_root=tmp_path / "scopes",
                          bindings=Bindings(tools={"inventory.reserve": reserve}))  # fmt: skip
    async with Runner.open(journal, config) as opened:
        yield opened


async def _waiting_run(runner: Runner, run_id: str = "r1") -> tuple[str, Any]:
    old = await runner.publish("acme", {"workflows/flow.ts": V1})
    run = await runner.start(StartRunInput("acme", "flow", old.snapshot_id, {"id": 7}, run_id))
    assert run.status == "waiting"
    return old.snapshot_id, run


async def _publish(runner: Runner, source: str) -> str:
    return (await runner.publish("acme", {"workflows/flow.ts": source})).snapshot_id


@pytest.mark.parametrize("change", ["appended", "new body"])
async def test_a_compatible_change_moves_the_run_on(
    runner: Runner, reserved: list[object], change: str
) -> None:
    old, _ = await _waiting_run(runner)
    new = await _publish(runner, CHANGES[change])
    checked = await runner.migrate(scope="acme", run_id="r1", to_snapshot=new, dry_run=True)
    assert (checked.compatible, checked.migrated) == (1, 0)
    assert (await runner.get("r1", scope="acme")).snapshot_id == old  # a dry run writes nothing
    report = await runner.migrate(scope="acme", run_id="r1", to_snapshot=new)
    assert (report.compatible, report.incompatible, report.migrated) == (1, 0, 1)
    assert (await runner.get("r1", scope="acme")).snapshot_id == new
    done = await runner.signal("r1", "approved", {"ok": True}, scope="acme")
    assert done.output == {"shipped": "shipped 7", "approval": {"ok": True}}
    assert len(reserved) == 1  # the recorded tool call was not made again
    history = await runner.history("r1", scope="acme")
    migrated = [e for e in history if e.type == "run_migrated"]
    assert [(e.data["from"], e.data["to"]) for e in migrated] == [(old, new)]
    drives = [e.data["snapshot"] for e in history if e.type == "drive_started"]
    assert drives == [old, new]  # which code drove each drive


@pytest.mark.parametrize(
    ("change", "reason", "line"),
    [
        ("renamed", "does not reach step do:1:fetch order as the run did: it called"
                    " do:1:load order instead", 2),
        ("new args", "step tool:1:reserve was called with other arguments than the run"
                     " recorded", 3),
        ("reordered", "the code reaches step tool:1:reserve before step do:1:fetch order; the"
                      " run reached them the other way round", 2),
    ],
)  # fmt: skip
async def test_an_incompatible_change_is_reported_and_the_run_left_alone(
    runner: Runner, reserved: list[object], change: str, reason: str, line: int
) -> None:
    old, _ = await _waiting_run(runner)
    new = await _publish(runner, CHANGES[change])
    report = await runner.migrate(scope="acme", run_id="r1", to_snapshot=new)
    assert (report.compatible, report.incompatible, report.migrated) == (0, 1, 0)
    [verdict] = report.runs
    assert verdict.verdict == "incompatible"
    assert reason in (verdict.reason or ""), verdict.reason
    assert verdict.where, verdict
    assert verdict.where[0].startswith(f"at workflows/flow.ts:{line}:"), verdict.where
    assert (await runner.get("r1", scope="acme")).snapshot_id == old
    assert len(reserved) == 1  # the check called nothing


async def test_a_workflows_runs_on_a_snapshot_move_together(runner: Runner) -> None:
    old, _ = await _waiting_run(runner, "a")
    for name in ("b", "c"):
        await runner.start(StartRunInput("acme", "flow", old, {"id": 1}, name))
    await runner.cancel("c", scope="acme")  # ended: not a candidate
    new = await _publish(runner, CHANGES["appended"])
    report = await runner.migrate(scope="acme", workflow="flow", from_snapshot=old, to_snapshot=new)
    assert (report.compatible, report.migrated, report.skipped) == (2, 2, 0)
    assert {v.run_id for v in report.runs} == {"a", "b"}
    assert (await runner.get("c", scope="acme")).snapshot_id == old


async def test_an_ordinary_replay_that_diverges_stops_naming_the_step(
    runner: Runner, journal: str
) -> None:
    await _waiting_run(runner)
    # A call's recorded digest no longer matches what the code asks (a bug, or determinism
    # that escaped the sandbox): the recorded result must not answer it.
    changed = execute(journal, "UPDATE steps SET args_digest = 'abc' WHERE kind = 'tool'")
    assert changed == 1
    run = await runner.signal("r1", "approved", {"ok": True}, scope="acme")
    assert run.status == "failed"
    assert run.error is not None
    assert run.error.startswith(
        "divergence: step tool:1:reserve was called with other arguments than the run recorded"
    )
    assert run.error_stack
    assert run.error_stack[0].startswith("at workflows/flow.ts:3:")
    digests = query(journal, "SELECT kind, args_digest FROM steps WHERE kind = 'tool'")
    assert digests == [("tool", "abc")]


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_thousand_waiting_runs_migrate_in_one_command(runner: Runner) -> None:
    old = await _publish(runner, V1)
    for n in range(1000):
        await runner.start(StartRunInput("acme", "flow", old, {"id": n}, f"r{n}"))
    new = await _publish(runner, CHANGES["appended"])
    report = await runner.migrate(scope="acme", workflow="flow", from_snapshot=old, to_snapshot=new)
    assert (report.compatible, report.migrated, report.incompatible) == (1000, 1000, 0)
    on_new = [r for r in await runner.list(scope="acme", limit=2000) if r.snapshot_id == new]
    assert len(on_new) == 1000
    done = await runner.signal("r999", "approved", {"ok": 1}, scope="acme")
    assert done.output == {"shipped": "shipped 999", "approval": {"ok": 1}}
