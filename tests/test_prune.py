"""Pruning ended runs: by an operator and under a retention setting, other runs left intact."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from qjsflow.bridge import InvalidInput
from qjsflow.runner import ALL_SCOPES, Runner, RunNotFound, SnapshotNotFound, StartRunInput
from qjsflow.runner.config import Retention, RunnerConfig
from qjsflow.sandbox import PoolConfig
from tests.conftest import FakeClock, start_source
from tests.journal_reads import query, table_counts

RECORDS = """
import { db } from "qjsflow";
export default async (event, step) => {
  console.log("working on", event.payload);
  await db.sql("CREATE TABLE IF NOT EXISTS seen (n INTEGER)");
  await db.sql("INSERT INTO seen VALUES (?)", [event.payload]);
  const n = await step.do("count", async () => event.payload);
  if (n < 0) throw new Error("negative");
  if (n === 0) await step.waitForEvent("never", { type: "never" });
  return n;
};
"""


async def _start(runner: Runner, snapshot: str, payload: int, run_id: str) -> None:
    await runner.start(StartRunInput("acme", "flow", snapshot, payload, run_id))


def _applied(scope_root: Path) -> list[str]:
    with sqlite3.connect(scope_root / "acme.sqlite") as db:
        return sorted({row[0] for row in db.execute("SELECT run_id FROM _qjsflow_applied")})


async def test_prune_deletes_old_ended_runs_with_their_records_and_nothing_else(
    clocked_runner: Runner, clock: FakeClock, tmp_path: Path
) -> None:
    published = await clocked_runner.publish("acme", {"workflows/flow.ts": RECORDS})
    snapshot = published.snapshot_id
    await _start(clocked_runner, snapshot, 1, "old-done")
    await _start(clocked_runner, snapshot, -1, "old-failed")
    await _start(clocked_runner, snapshot, 0, "old-waiting")  # not ended: never pruned
    clock.advance(40 * 86400)
    await _start(clocked_runner, snapshot, 2, "new-done")
    before = table_counts(clocked_runner.store)

    counted = await clocked_runner.prune(older_than_s=30 * 86400, scope="acme", dry_run=True)
    assert (counted.runs, counted.dry_run) == (2, True)
    assert table_counts(clocked_runner.store) == before  # a dry run deletes nothing

    only_failed = await clocked_runner.prune(
        older_than_s=30 * 86400, scope=ALL_SCOPES, statuses={"failed"}
    )
    assert only_failed.runs == 1
    pruned = await clocked_runner.prune(older_than_s=30 * 86400, scope=ALL_SCOPES)
    assert pruned.runs == 1
    assert pruned.scopes == {"acme": 1}
    left = sorted(run.run_id for run in await clocked_runner.list(scope="acme"))
    assert left == ["new-done", "old-waiting"]
    for gone in ("old-done", "old-failed"):
        with pytest.raises(RunNotFound):
            await clocked_runner.get(gone, scope="acme")
    # No table holds a row of a pruned run; the remaining runs' steps and logs are intact.
    for table in ("runs", "steps", "events", "inbox", "timers", "tool_calls", "logs"):
        rows = query(clocked_runner.store.location,
                     f"SELECT count(*) FROM {table} WHERE run_id LIKE 'acme/old-%'"
                     " AND run_id <> 'acme/old-waiting'")  # fmt: skip
        assert rows[0][0] == 0, table
    assert len(await clocked_runner.list_steps("new-done", scope="acme")) == 3
    assert len(await clocked_runner.list_logs("new-done", scope="acme")) == 1
    assert _applied(tmp_path / "scopes") == ["acme/new-done", "acme/old-waiting"]
    # The id of a pruned run can be used again: its SQL runs anew.
    await _start(clocked_runner, snapshot, 3, "old-done")
    assert (await clocked_runner.get("old-done", scope="acme")).output == 3


async def test_prune_of_unused_snapshots_keeps_those_runs_are_pinned_to(
    clocked_runner: Runner, clock: FakeClock
) -> None:
    used = await start_source(clocked_runner, 'export default async () => "kept";')
    await clocked_runner.publish("acme", {"workflows/flow.ts": "export default async () => 1;"})
    clock.advance(10 * 86400)
    pruned = await clocked_runner.prune(older_than_s=86400, scope="acme", snapshots=True,
                                        statuses={"failed"})  # fmt: skip
    assert (pruned.runs, pruned.snapshots) == (0, 1)
    assert [s.snapshot_id for s in await clocked_runner.snapshots(scope="acme")] == [
        used.snapshot_id
    ]


async def test_prune_refuses_runs_that_have_not_ended(clocked_runner: Runner) -> None:
    for statuses in ({"waiting"}, set(), {"running", "completed"}):
        with pytest.raises(InvalidInput, match="only ended runs"):
            await clocked_runner.prune(older_than_s=0, scope="acme", statuses=statuses)
    with pytest.raises(InvalidInput, match="0 seconds or more"):
        await clocked_runner.prune(older_than_s=-1, scope="acme")


async def test_a_worker_prunes_under_the_retention_setting(
    journal: str, tmp_path: Path, clock: FakeClock
) -> None:
    config = RunnerConfig(
        clock=clock, pool=PoolConfig(size=1), scope_root=tmp_path / "scopes",
        retention=Retention(older_than_s=7 * 86400),
    )  # fmt: skip
    async with Runner.open(journal, config) as runner:
        old = await start_source(runner, 'export default async () => "old";', run_id="old")
        clock.advance(8 * 86400)
        new = await start_source(runner, 'export default async () => "new";', run_id="new")
        await runner.serve(until_idle=True)
        assert [run.run_id for run in await runner.list(scope="acme")] == [new.run_id]
        with pytest.raises(RunNotFound):
            await runner.get(old.run_id, scope="acme")


async def test_a_pruned_snapshot_is_not_found_by_a_runner_that_started_runs_of_it(
    clocked_runner: Runner, clock: FakeClock
) -> None:
    """Snapshots are deleted by prune (once no run is pinned to them): a later start of one
    is refused by name, whether or not this runner found it before."""
    done = await start_source(clocked_runner, 'export default async () => "gone";')
    clock.advance(10 * 86400)
    pruned = await clocked_runner.prune(older_than_s=86400, scope="acme", snapshots=True)
    assert (pruned.runs, pruned.snapshots) == (1, 1)
    with pytest.raises(SnapshotNotFound):
        await _start(clocked_runner, done.snapshot_id, 1, "after-prune")


async def test_a_run_restarted_after_prune_chose_it_is_not_deleted(
    clocked_runner: Runner, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    published = await clocked_runner.publish("acme", {"workflows/flow.ts": RECORDS})
    for n, run_id in ((1, "done-1"), (2, "done-2")):
        await _start(clocked_runner, published.snapshot_id, n, run_id)
    clock.advance(40 * 86400)
    forget = clocked_runner.scopes.forget

    async def restart_then_forget(scope: str, run_ids: list[str]) -> None:
        # Between choosing its batch and deleting it, an operator restarts one of the runs.
        await clocked_runner.restart("done-1", scope="acme", drive=False)
        await forget(scope, run_ids)

    monkeypatch.setattr(clocked_runner.scopes, "forget", restart_then_forget)
    pruned = await clocked_runner.prune(older_than_s=30 * 86400, scope="acme")
    assert (pruned.runs, pruned.scopes) == (1, {"acme": 1})
    assert (await clocked_runner.get("done-1", scope="acme")).status == "running"
    with pytest.raises(RunNotFound):
        await clocked_runner.get("done-2", scope="acme")
    monkeypatch.undo()
    finished = await clocked_runner.resume("done-1", scope="acme")
    assert (finished.status, finished.output) == ("completed", 1)
