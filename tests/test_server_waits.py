"""How many times a run's journal transactions wait for the PostgreSQL server: each wait is a
round trip on the run's critical path (docs/ARCHITECTURE.md, "A PostgreSQL transaction is
pipelined"). Counted as the connection's syncs: every answer read and every commit is one."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from qjsflow.runner import Bindings, RunConflict, Runner, RunnerConfig, StartRunInput
from qjsflow.runner.store import committer
from qjsflow.sandbox import PoolConfig
from tests.journal_reads import table_counts
from tests.postgres import PostgresServer

pytestmark = pytest.mark.slow

PURE = """
export default async (event, step) => {
  let total = 0;
  for (let i = 0; i < 10; i++) total += await step.do("pure " + i, async () => i);
  return total;
};
"""


@pytest.fixture
async def runner(postgres: PostgresServer, tmp_path: Path) -> AsyncIterator[Runner]:
    config = RunnerConfig(pool=PoolConfig(size=1), scope_root=tmp_path / "scopes")
    async with Runner.open(postgres.new_database(), config) as opened:
        yield opened


def _per_transaction(monkeypatch: pytest.MonkeyPatch, counter: str) -> list[int]:
    """For each journal transaction committed from now on, how much its connection's
    `counter` (`PgConnection.waits` or `statements_sent`) grew."""
    counted: list[int] = []
    original_batch = committer.run_batch

    def batch(connection: Any, batch: list[Any], backend: Any) -> Any:
        before = getattr(connection, counter)
        try:
            return original_batch(connection, batch, backend)
        finally:
            counted.append(getattr(connection, counter) - before)

    monkeypatch.setattr(committer, "run_batch", batch)
    return counted


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """For each journal transaction committed from now on, how many times it waited."""
    return _per_transaction(monkeypatch, "waits")


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """For each journal transaction committed from now on, how many statements it sent."""
    return _per_transaction(monkeypatch, "statements_sent")


async def test_a_run_of_pure_steps_waits_for_the_server_three_times(
    runner: Runner, waits: list[int]
) -> None:
    """Its start (the run created, its lease taken, its drive begun) waits for its commit
    alone: not for its reads (the scope's settings and the snapshot, as the start before it
    read them), nor for the run's insert (presumed new), nor for the lease of the run it has
    just inserted, whose answers it knows. Its end waits for its fence, with which it reads
    its run, and for its commit: its ten steps are written presumed new."""
    snapshot = (await runner.publish("acme", {"workflows/flow.ts": PURE})).snapshot_id
    await runner.start(StartRunInput("acme", "flow", snapshot, None, "r0"))  # (what a process
    waits.clear()  # reads once, and the executor's first context, before it)
    run = await runner.start(StartRunInput("acme", "flow", snapshot, None, "r1"))
    assert run.status == "completed", run.error
    assert run.output == 45
    assert waits == [1, 2]
    steps = await runner.list_steps(run.run_id, scope="acme")
    assert [(s.name, s.output) for s in steps] == [(f"pure {n}", n) for n in range(10)]


async def test_a_start_presumes_its_run_is_new_and_is_careful_where_it_is_not(
    runner: Runner, waits: list[int]
) -> None:
    """The run's insert is not read: a run with the id already there fails it, so the whole
    transaction (nothing of it is written), and the careful start, which reads, answers with
    the run that is there — or says how the start differs from it."""
    snapshot = (await runner.publish("acme", {"workflows/flow.ts": PURE})).snapshot_id
    first = await runner.start(StartRunInput("acme", "flow", snapshot, {"n": 1}, "r1"))
    counts = table_counts(runner.store)
    waits.clear()
    again = await runner.start(StartRunInput("acme", "flow", snapshot, {"n": 1}, "r1"))
    assert again == first
    # Presumed: its commit, refused. Careful: its reads, the run's insert, the run there.
    assert waits == [1, 3]
    with pytest.raises(RunConflict, match="different input"):
        await runner.start(StartRunInput("acme", "flow", snapshot, {"n": 2}, "r1"))
    assert table_counts(runner.store) == counts


TOOLS = """
export default async (event, step) => {
  let total = 0;
  for (let i = 0; i < 10; i++) total += (await step.tool("call " + i, "echo", { i })).i;
  return total;
};
"""


async def test_a_tool_steps_transaction_sends_six_statements(
    postgres: PostgresServer, tmp_path: Path, statements: list[int]
) -> None:
    """Each call's transaction, in which the result before it is written: BEGIN, the fence's
    assertion, that result (its audit row, event and step in one statement), the call's start
    (its step, audit row and events in one), the commit's mark, COMMIT — each statement costs
    the worker and the server compute whether or not its answer is waited for."""

    async def echo(args: Any) -> Any:
        return args

    config = RunnerConfig(pool=PoolConfig(size=1), scope_root=tmp_path / "scopes",
                          bindings=Bindings(tools={"echo": echo}))  # fmt: skip
    async with Runner.open(postgres.new_database(), config) as runner:
        snapshot = (await runner.publish("acme", {"workflows/flow.ts": TOOLS})).snapshot_id
        await runner.start(StartRunInput("acme", "flow", snapshot, None, "r0"))
        statements.clear()
        run = await runner.start(StartRunInput("acme", "flow", snapshot, None, "r1"))
        assert (run.status, run.output) == ("completed", 45)
        calls = await runner.list_tool_calls(run.run_id, scope="acme")
        steps = await runner.list_steps(run.run_id, scope="acme")
    # the start, the first call's (no result before it), nine more, the end
    assert len(statements) == 12
    assert statements[2:11] == [6] * 9
    assert [(c.attempt, c.result) for c in calls] == [(1, {"i": n}) for n in range(10)]
    assert [(s.name, s.status, s.output) for s in steps] == [
        (f"call {n}", "completed", {"i": n}) for n in range(10)
    ]


async def test_a_start_presumes_what_the_start_before_read_and_reads_again_what_changed(
    runner: Runner, waits: list[int]
) -> None:
    """A start takes the scope's settings version and the snapshot its reference finds as
    the start before it read them, asserting with its commit that they still hold: a
    snapshot published or settings applied since fail that start, which is made again
    reading them, so every start runs what the journal holds as it is made."""
    await runner.publish("acme", {"workflows/flow.ts": PURE})
    first = await runner.start(StartRunInput("acme", "flow", "latest", None, "r1"))
    assert (first.output, first.config_version) == (45, None)
    doubled = PURE.replace("async () => i)", "async () => 2 * i)")
    newer = (await runner.publish("acme", {"workflows/flow.ts": doubled})).snapshot_id
    waits.clear()
    second = await runner.start(StartRunInput("acme", "flow", "latest", None, "r2"))
    assert (second.snapshot_id, second.output) == (newer, 90)
    assert len(waits) == 3  # presumed (refused), careful, the end
    applied = await runner.apply_scope_config("acme", '{"vars": {"REGION": "eu"}}')
    third = await runner.start(StartRunInput("acme", "flow", newer[:12], None, "r3"))
    assert third.config_version == applied.version
    waits.clear()
    fourth = await runner.start(StartRunInput("acme", "flow", newer[:12], None, "r4"))
    assert (fourth.snapshot_id, fourth.config_version) == (newer, applied.version)
    assert waits == [1, 2]  # as the start before read them: presumed, and so


async def test_a_runs_statements_go_to_libpq_not_through_psycopgs_cursors(
    runner: Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A statement goes to psycopg's libpq wrapper at once (runner/store/pg_connection.py):
    a cursor made for each cost the worker 17-21 µs a statement."""
    cursors: list[int] = []
    made = psycopg.RawCursor.__init__

    def counting(self: Any, *args: Any, **kwargs: Any) -> None:
        cursors.append(1)
        made(self, *args, **kwargs)

    monkeypatch.setattr(psycopg.RawCursor, "__init__", counting)
    snapshot = (await runner.publish("acme", {"workflows/flow.ts": PURE})).snapshot_id
    run = await runner.start(StartRunInput("acme", "flow", snapshot, None, "r1"))
    assert (run.status, run.output) == ("completed", 45)
    assert cursors == []
