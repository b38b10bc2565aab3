"""A call cancelled while its answer is pending (a drive's lease lost, a run terminated from
elsewhere) never leaves that answer for the next call on the channel, which may be another
tenant's: scope-database processes match answers to requests by id; an executor whose drive
was cancelled is never given another."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Sequence
from pathlib import Path

from qjsflow.bridge.types import Answer, Completed, OpEnvelope
from qjsflow.bridge.values import to_python
from qjsflow.runner.scopedb import ScopeDatabases
from qjsflow.runner.scopedb.policy import SqlLimits
from qjsflow.sandbox import ExecutorPool, PoolConfig
from tests.conftest import bundle_of
from tests.memory_host import MemoryHost

SLOW = (
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 400000)"
    " SELECT count(*) AS n FROM c"
)


async def _sql(databases: ScopeDatabases, sql: str, call: str) -> object:
    outcome = await databases.execute(
        "acme", run_id=f"acme/{call}", call_key=call, sql=sql, params="[]", deadline_s=10.0
    )
    assert outcome.result is not None, outcome.message
    return to_python(outcome.result)["rows"]


async def test_an_answer_left_by_a_cancelled_call_goes_to_no_one(tmp_path: Path) -> None:
    databases = ScopeDatabases(tmp_path / "scopes")
    try:
        assert await _sql(databases, "SELECT 1 AS n", "warm") == [{"n": 1}]  # the process is up
        for round_ in range(3):
            pending = asyncio.create_task(_sql(databases, SLOW, f"slow-{round_}"))
            await asyncio.sleep(0)  # it has sent its request and waits for the answer
            pending.cancel()
            # The next calls, another run's: each gets its own answer, never the slow one's.
            for n in (42, 43):
                mine = await _sql(databases, f"SELECT {n} AS n", f"other-{round_}-{n}")
                assert mine == [{"n": n}]
    finally:
        await databases.aclose()


WAITS_FOR_A_TOOL = """
export default async function run(event, step) {
  return await step.tool("slow", "slow.tool", { n: 1 });
}
"""
QUICK = """
export default async function run(event, step) {
  return await step.do("quick", async () => "mine");
}
"""


class _NeverAnswers(MemoryHost):
    """A host whose answer to the drive's first ops never comes (until the drive is cancelled)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = asyncio.Event()

    async def __call__(self, ops: Sequence[OpEnvelope]) -> list[Answer]:
        self.asked.set()
        await asyncio.Event().wait()
        raise AssertionError("never answered")


async def test_an_executor_whose_drive_was_cancelled_serves_no_other_drive() -> None:
    async with ExecutorPool(PoolConfig(size=1)) as pool:
        stuck = _NeverAnswers()
        drive = asyncio.create_task(pool.drive(stuck.request(await bundle_of(WAITS_FOR_A_TOOL)),
                                               stuck))  # fmt: skip
        await stuck.asked.wait()
        drive.cancel()
        host = MemoryHost()
        outcome = await pool.drive(host.request(await bundle_of(QUICK)), host)
        assert isinstance(outcome, Completed)
        assert to_python(outcome.output) == "mine"
        assert pool.replaced >= 1  # the cancelled drive's executor was not kept


async def test_contention_on_a_scope_file_is_waited_for(tmp_path: Path) -> None:
    """Two workers on one machine share the scope folder: one's write lock on a scope file
    makes the other's call wait, up to its bound, then fail coded `busy` — never kill its SQL
    process; once the lock is gone the same process serves the next call."""
    root = tmp_path / "scopes"
    first = ScopeDatabases(root)
    second = ScopeDatabases(root, SqlLimits(busy_wait_s=0.5))
    try:
        assert await _sql(first, "CREATE TABLE t (n INTEGER)", "make") == []
        holder = sqlite3.connect(root / "acme.sqlite", isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # another process's write, under way throughout
        held = await second.execute(
            "acme", run_id="acme/i", call_key="insert", sql="INSERT INTO t VALUES (1)",
            params="[]", deadline_s=10.0,
        )  # fmt: skip
        assert (held.result, held.code) == (None, "busy"), held.message
        assert "held the scope database's lock for more than 0.5 s" in str(held.message)
        holder.execute("COMMIT")
        holder.close()
        assert await _sql(second, "INSERT INTO t VALUES (1)", "insert-again") == []
        assert await _sql(second, "SELECT count(*) AS n FROM t", "after") == [{"n": 1}]
    finally:
        await first.aclose()
        await second.aclose()
