"""A start's first drive begun while its start's transaction commits (docs/ARCHITECTURE.md,
"A start's drive, begun ahead"): nothing of the drive is serviced or written before that
transaction is found written as foreseen; a start written otherwise drops the drive unwritten
and answers as it would have."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from qjsflow.bridge.types import Answer, OpEnvelope
from qjsflow.runner import Bindings, Runner, RunnerConfig, StartRunInput
from qjsflow.runner.tenancy.budgets import Budgets
from qjsflow.sandbox import ExecutorPool, PoolConfig
from qjsflow.sandbox.pool import Host
from tests.journal_reads import query

FLOW = """
export default async (event, step, env) => {
  const seen = await step.tool("probe", "probe", {});
  return { region: env.REGION ?? null, seen };
};
"""


class Drives:
    """Every drive the pool is asked for, and an event set as the first op of one reaches
    the host the drive was given (before anything of the host's own runs)."""

    def __init__(self) -> None:
        self.count = 0
        self.asked = asyncio.Event()

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        original = ExecutorPool.drive
        drives = self

        async def counted(pool: ExecutorPool, request: Any, host: Host) -> Any:
            drives.count += 1

            async def asking(ops: Sequence[OpEnvelope]) -> Sequence[Answer]:
                drives.asked.set()
                return await host(ops)

            return await original(pool, request, asking)

        monkeypatch.setattr(ExecutorPool, "drive", counted)


@pytest.fixture
def drives(monkeypatch: pytest.MonkeyPatch) -> Drives:
    found = Drives()
    found.install(monkeypatch)
    return found


def _runner(journal: str | Path, tmp_path: Path, **more: Any) -> Any:
    config = RunnerConfig(pool=PoolConfig(size=2), scope_root=tmp_path / "scopes", **more)
    return Runner.open(journal, config)


@contextlib.asynccontextmanager
async def _published(
    journal: str, tmp_path: Path, calls: list[int], **more: Any
) -> AsyncIterator[tuple[Runner, str]]:
    """A runner binding the probe (its answers in `calls`), and FLOW's snapshot."""
    async with _runner(journal, tmp_path, bindings=_probe(journal, calls), **more) as runner:
        snapshot = (await runner.publish("acme", {"workflows/flow.ts": FLOW})).snapshot_id
        yield runner, snapshot


def _probe(journal: str | Path, calls: list[int]) -> Bindings:
    """A tool that says how many rows its own run has in the journal, read on a connection of
    its own: 1 once the start's transaction is committed."""

    async def probe(args: Any) -> int:
        rows = query(journal, "SELECT count(*) FROM runs WHERE run_id = ?", ("acme/r2",))
        calls.append(int(rows[0][0]))
        return calls[-1]

    return Bindings(tools={"probe": probe})


async def test_a_plain_starts_drive_begins_before_its_transaction_commits_and_waits_for_it(
    pg_url: str, tmp_path: Path, drives: Drives
) -> None:
    calls: list[int] = []
    async with _published(pg_url, tmp_path, calls) as (runner, snapshot):
        first = await runner.start(StartRunInput("acme", "flow", snapshot, {}, "r1"))
        assert first.status == "completed", first.error
        drives.asked.clear()
        # The next start's insert waits for the snapshot's row, which this test locks.
        with psycopg.connect(pg_url) as locker:
            locker.execute("SELECT 1 FROM snapshots WHERE scope = 'acme' FOR UPDATE")
            start = asyncio.create_task(
                runner.start(StartRunInput("acme", "flow", snapshot, {}, "r2"))
            )
            # The drive asks for its tool while the start is not committed...
            await asyncio.wait_for(drives.asked.wait(), 60)
            assert query(pg_url, "SELECT count(*) FROM runs WHERE run_id = 'acme/r2'") == [(0,)]
            assert calls == [0]  # ...and the tool is not called: only r1's call so far
        run = await asyncio.wait_for(start, 60)
    assert run.status == "completed", run.error
    assert calls == [0, 1]  # r2's tool saw its run committed
    assert drives.count == 3  # publish's look at the exports, r1, r2: each driven once


async def test_a_start_of_a_run_already_there_answers_it_and_calls_nothing_again(
    pg_url: str, tmp_path: Path, drives: Drives
) -> None:
    calls: list[int] = []
    async with _published(pg_url, tmp_path, calls) as (runner, snapshot):
        for run_id in ("r1", "r2", "r2"):
            run = await runner.start(StartRunInput("acme", "flow", snapshot, {}, run_id))
            assert run.status == "completed", run.error
        # The third start's drive, begun ahead, was dropped: its tool never called, its
        # executor not killed (its op was answered as a lost lease's), nothing written twice.
        assert calls == [0, 1]
        assert runner.driver.pool.replaced == 0
        assert runner.driver.pool.stats()["live"] == runner.driver.pool.stats()["idle"]
    created = query(pg_url, "SELECT count(*) FROM events WHERE run_id = ? AND type = ?",
                    ("acme/r2", "run_created"))  # fmt: skip
    assert created == [(1,)]
    assert drives.count == 4  # the exports, r1, r2, and r2's start again (driven ahead)


async def test_a_start_not_written_as_foreseen_is_driven_as_written(
    pg_url: str, tmp_path: Path, drives: Drives
) -> None:
    """A configuration applied since the last start (here by another runner on the journal):
    the start's presumption fails, it writes the run with the new settings, and the drive
    begun from the old ones is dropped before its tool is called."""
    calls: list[int] = []
    async with _published(pg_url, tmp_path, calls) as (runner, snapshot):
        run = await runner.start(StartRunInput("acme", "flow", snapshot, {}, "r1"))
        assert run.output == {"region": None, "seen": 0}
        async with _runner(pg_url, tmp_path / "other") as other:
            await other.apply_scope_config("acme", '{"vars": {"REGION": "eu"}}')
        before = drives.count
        run = await runner.start(StartRunInput("acme", "flow", snapshot, {}, "r2"))
    assert run.status == "completed", run.error
    assert run.output == {"region": "eu", "seen": 1}
    assert calls == [0, 1]  # r2's tool, once
    assert drives.count == before + 2  # the drive from what was foreseen, dropped; then r2's


_PLAIN: dict[str, Any] = {}
_BUDGETED: dict[str, Any] = {"scope_budgets": {"acme": Budgets(steps_per_day=1000)}}
_LIMITED: dict[str, Any] = {"scope_concurrency": {"acme": 5}}


@pytest.mark.parametrize(
    ("journal", "settings"),
    [
        ("sqlite", _PLAIN), ("sqlite", _BUDGETED),
        pytest.param("postgresql", _BUDGETED, marks=pytest.mark.slow),
        pytest.param("postgresql", _LIMITED, marks=pytest.mark.slow),
    ],
    indirect=["journal"],
)  # fmt: skip
async def test_no_start_is_driven_ahead_on_sqlite_nor_in_a_budgeted_or_limited_scope(
    journal: str, tmp_path: Path, drives: Drives, settings: dict[str, Any]
) -> None:
    """A budgeted scope's drive is charged and admitted under its lease; a scope whose runs at
    once are limited counts drives by their leases; and a SQLite start's commit is over before
    a drive could be sent: a start that finds its run there already drives nothing (a plain
    scope's on PostgreSQL would have driven it ahead)."""
    calls: list[int] = []
    async with _published(journal, tmp_path, calls, **settings) as (runner, snapshot):
        for run_id in ("r1", "r1", "r1"):
            run = await runner.start(StartRunInput("acme", "flow", snapshot, {}, run_id))
            assert run.status == "completed", run.error
    assert calls == [0]
    assert drives.count == 2  # the exports, and r1 once


async def test_a_start_cancelled_by_its_caller_mid_drive_gives_its_lease_up(
    pg_url: str, tmp_path: Path, drives: Drives
) -> None:
    """The caller leaves while the drive begun ahead waits for its tool: the start's
    transaction (committed: the tool had begun) keeps the run, and its lease is given up at
    once, so that a worker can take the run now rather than once the lease lapses (and call
    the tool again: its outcome is unknown)."""
    entered, release = asyncio.Event(), asyncio.Event()

    async def probe(args: Any) -> int:
        entered.set()
        await release.wait()
        return 1

    async with _runner(pg_url, tmp_path, bindings=Bindings(tools={"probe": probe})) as runner:
        snapshot = (await runner.publish("acme", {"workflows/flow.ts": FLOW})).snapshot_id
        release.set()
        assert (await runner.start(StartRunInput("acme", "flow", snapshot, {}, "r1"))).output
        entered.clear()
        release.clear()
        start = asyncio.create_task(runner.start(StartRunInput("acme", "flow", snapshot, {}, "r2")))
        await asyncio.wait_for(entered.wait(), 60)
        start.cancel()
        with pytest.raises(asyncio.CancelledError):
            await start
        release.set()
    rows = query(pg_url, "SELECT status, worker_id FROM runs WHERE run_id = 'acme/r2'")
    assert rows == [("running", None)]
