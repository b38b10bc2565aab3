"""Pure steps settled by the sandbox itself: a step.do begun in the drive whose body made no
effect goes on without waiting for the host, its record goes with the next frame, replays reach
the run's clock it settled at, and a result the journal does not take as assumed voids all the
sandbox sent after it (docs/ARCHITECTURE.md, Pure steps)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from qjsflow.bridge import wire
from qjsflow.bridge.codec import loads
from qjsflow.bridge.limits import Limits
from qjsflow.bridge.types import Answer, OpEnvelope, RetryPolicy, StepRecord
from qjsflow.bridge.wire import ProtocolError
from qjsflow.runner import Bindings, Runner, RunnerConfig
from qjsflow.runner.engine.host import DriveHost
from qjsflow.runner.store import JournalTransaction
from qjsflow.runner.tenancy.scopes import run_key
from qjsflow.sandbox import ExecutorPool, PoolConfig
from qjsflow.sandbox import pool as pool_module
from qjsflow.testing import MockTool
from tests.conftest import FakeClock, start_source
from tests.journal_reads import query

TEN_PURE = """
export default async (event, step) => {
  let total = 0;
  for (let i = 0; i < 10; i++) total += await step.do("pure " + i, async () => i);
  return total;
};
"""


async def test_pure_steps_reach_the_host_together_in_one_frame(
    runner: Runner, frames: list[list[OpEnvelope]]
) -> None:
    run = await start_source(runner, TEN_PURE)
    assert run.output == 45
    assert len(frames) == 1  # not a round trip per step
    records = [e.op for e in frames[0] if isinstance(e.op, StepRecord)]
    assert [r.step for r in records] == [f"pure {i}" for i in range(10)]
    assert all(r.settled_at is not None for r in records)
    assert len(frames[0]) == 10  # each step's begin went inside its record
    assert all(r.begun_with is not None for r in records)
    steps = await runner.list_steps(run.run_id, scope="acme")
    assert [(s.status, s.attempt) for s in steps] == [("completed", 1)] * 10
    history = [e.type for e in await runner.history(run.run_id, scope="acme")]
    assert history.count("step_started") == history.count("step_completed") == 10


CONFIGURED = """
export default async (event, step) => {
  const a = await step.do("plain", async () => 1);
  const b = await step.do("own", { retries: { limit: 2, delay: 5, backoff: "constant" } }, async () => 2);
  return a + b;
};
"""


async def test_a_step_with_the_default_policy_carries_it_as_an_empty_config(
    runner: Runner,
    frames: list[list[OpEnvelope]],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """A frame does not repeat the default policy with every step: a step whose config sets
    none carries `{}` (the host reads the shared rules' default), one with a config of its own
    carries it in full; the journal records each step's whole policy either way."""
    sent: list[object] = []
    original = wire.parse_op

    def seen(raw: object, limits: Limits) -> OpEnvelope:
        sent.append(raw)
        return original(raw, limits)

    monkeypatch.setattr(pool_module, "parse_op", seen)
    run = await start_source(runner, CONFIGURED)
    assert run.output == 3
    configs = {op["op"]["step"]: op["op"]["config"] for op in sent}  # type: ignore[index]
    assert configs["plain"] == {}
    assert configs["own"] == {"limit": 2, "delayMs": 5, "backoff": "constant", "timeoutMs": 600000}
    records = {e.op.step: e.op.begun_with for frame in frames for e in frame
               if isinstance(e.op, StepRecord)}  # fmt: skip
    assert records["plain"] == wire.DEFAULT_POLICY
    assert records["own"] == RetryPolicy(2, 5, "constant", 600000)
    rows = query(str(tmp_path / "journal.db"), "SELECT name, config FROM steps WHERE run_id = ?",
                 (run_key("acme", run.run_id),))  # fmt: skip
    policies = {str(name): loads(config) for name, config in rows}
    assert policies["plain"] == {"limit": 5, "delayMs": 10000, "backoff": "exponential",
                                 "timeoutMs": 600000}  # fmt: skip
    assert policies["own"]["limit"] == 2


EFFECT_INSIDE = """
export default async (event, step) => {
  const a = await step.do("pure", async () => 1);
  const b = await step.do("outer", async () => await step.tool("t", "count", {}));
  return [a, b];
};
"""


async def test_a_step_whose_body_made_an_effect_waits_for_the_host(
    runner: Runner, frames: list[list[OpEnvelope]]
) -> None:
    run = await start_source(runner, EFFECT_INSIDE, bindings=Bindings(tools={"count": MockTool(7)}))
    assert run.output == [1, 7]
    records = {e.op.step: e.op for f in frames for e in f if isinstance(e.op, StepRecord)}
    assert records["pure"].settled_at is not None
    assert records["outer"].settled_at is None  # its result is answered by the journal


class TickingClock(FakeClock):
    """Time moves a millisecond at every reading, as a busy host's would."""

    def __call__(self) -> float:
        self.now += 0.001
        return self.now


SEES_THE_TIME = """
export default async (event, step) => {
  await step.do("a", async () => 1);
  const seen = Date.now();
  await step.do("at " + seen, async () => 2);
  await step.sleep("nap", 1000);
  return { seen, after: Date.now() >= seen };
};
"""


async def test_a_replay_sees_the_time_the_run_saw_after_a_pure_step(tmp_path: Path) -> None:
    clock = TickingClock()
    config = RunnerConfig(clock=clock, monotonic=clock, pool=PoolConfig(size=2))
    async with Runner.open(tmp_path / "journal.db", config) as runner:
        run = await start_source(runner, SEES_THE_TIME)
        assert run.status == "sleeping"
        clock.advance(5)
        done = await runner.resume(run.run_id, scope="acme")
        assert done.status == "completed", done.error
        steps = await runner.list_steps(run.run_id, scope="acme")
    named = [s.name for s in steps if s.name.startswith("at ")]
    # The replay computed the same Date.now() and so the same step name: one step, not two.
    assert named == [f"at {done.output['seen']}"]
    assert done.output["after"] is True


OVER_THE_JOURNAL = """
export default async (event, step) => {
  const seen = [];
  for (let i = 0; i < 5; i++) {
    try {
      await step.do("big " + i, async () => "x".repeat(40000));
      seen.push("ok " + i);
    } catch (error) {
      seen.push("failed " + i + ": " + error.name);
      break;
    }
  }
  await step.tool("report", "count", seen);
  return seen;
};
"""


async def test_nothing_sent_after_a_result_the_journal_refused_is_serviced(
    tmp_path: Path,
) -> None:
    """The sandbox settled five 40 kB results itself and went on to a tool; the journal's limit
    refuses the third: the fourth and fifth are never recorded, the tool is not called with
    what the sandbox assumed, and the run, driven again from its journal, calls it once with
    what the journal says."""
    config = RunnerConfig(limits=Limits(journal_bytes_per_run=100_000), pool=PoolConfig(size=2))
    report = MockTool(None)
    async with Runner.open(tmp_path / "journal.db", config) as runner:
        run = await start_source(
            runner, OVER_THE_JOURNAL, bindings=Bindings(tools={"count": report})
        )
        steps = await runner.list_steps(run.run_id, scope="acme")
        history = await runner.history(run.run_id, scope="acme")
    expected = ["ok 0", "ok 1", "failed 2: LimitError"]
    assert run.status == "completed", run.error
    assert run.output == expected
    assert report.calls == [expected]
    assert [s.name for s in steps if s.name.startswith("big")] == ["big 0", "big 1", "big 2"]
    assert [e.type for e in history].count("drive_started") == 2


async def test_only_ops_that_await_no_answer_may_come_with_an_outcome() -> None:
    """The drive's last ops ride with its outcome (one frame fewer each way); a tool call
    there would be made with nobody awaiting it, so a frame holding one is refused."""
    serviced: list[list[OpEnvelope]] = []

    async def host(ops: Sequence[OpEnvelope]) -> list[Answer]:
        serviced.append(list(ops))
        return []

    log = {"id": 1, "op": {"op": "log", "level": "log", "text": "hi", "count": 1}}
    tool = {
        "id": 2,
        "op": {
            "op": "step.tool",
            "step": "t",
            "count": 1,
            "address": "a",
            "args": "{}",
            "config": {"limit": 0, "delayMs": 0, "backoff": "constant", "timeoutMs": 1},
        },
    }
    async with ExecutorPool(PoolConfig(size=1)) as pool:
        await pool.last_ops(None, [log], Limits(), host)  # type: ignore[arg-type]
        assert len(serviced) == 1
        with pytest.raises(ProtocolError, match="await no answer"):
            await pool.last_ops(None, [log, tool], Limits(), host)  # type: ignore[arg-type]
    assert len(serviced) == 1


async def test_a_drives_end_waits_for_a_result_written_again_after_a_fault(
    runner: Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The drive's end is queued right behind its last results, to share their commit; when
    writing those meets a transient fault (written again later), the end is not recorded
    before them: it waits, then records. Nothing is lost, nothing recorded twice."""
    original = JournalTransaction.insert_settled_steps
    faults = 0

    def locked_once(self: JournalTransaction, *args: Any, **kwargs: Any) -> bool:
        nonlocal faults
        if faults == 0:
            faults += 1
            raise sqlite3.OperationalError("database is locked")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(JournalTransaction, "insert_settled_steps", locked_once)
    run = await start_source(runner, TEN_PURE)
    assert faults == 1
    assert run.status == "completed"
    assert run.output == 45
    steps = await runner.list_steps(run.run_id, scope="acme")
    assert [s.name for s in steps] == [f"pure {i}" for i in range(10)]
    history = [e.type for e in await runner.history(run.run_id, scope="acme")]
    assert history.count("run_completed") == 1
    assert history.count("step_completed") == 10


FAN_OUT_PURE = """
export default async (event, step) => {
  const all = [];
  for (let i = 0; i < 250; i++) all.push(step.do("s", async () => i));
  const values = await Promise.all(all);
  const go = await step.waitForEvent("go", { type: "go" });
  return values.reduce((a, b) => a + b, 0) + go.payload;
};
"""


async def test_pure_results_of_one_frame_are_written_together_in_the_order_seen(
    clocked_runner: Runner, journal: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """250 pure steps settled in one frame are written with a few statements (not four a
    step), in the order the run saw them: each step's `step_started` and `step_completed` in
    turn, the step settled at its completion's seq; the replay is answered from them."""
    together: list[int] = []
    original_many = JournalTransaction.insert_settled_batch

    def many(self: JournalTransaction, run_id: str, steps: Any) -> int:
        together.append(len(steps))
        return original_many(self, run_id, steps)

    monkeypatch.setattr(JournalTransaction, "insert_settled_batch", many)
    run = await start_source(clocked_runner, FAN_OUT_PURE)
    assert run.status == "waiting", run.error
    assert together == [100, 100, 50]  # one statement each (SQLite: two)
    done = await clocked_runner.signal(run.run_id, "go", 1000, scope="acme")
    assert done.status == "completed", done.error
    assert done.output == sum(range(250)) + 1000
    key = run_key("acme", run.run_id)
    rows = query(journal, "SELECT count, settled_seq FROM steps WHERE run_id = ? AND name = 's'"
                 " ORDER BY settled_seq", (key,))  # fmt: skip
    assert [count for count, _ in rows] == list(range(1, 251))
    events = query(journal, "SELECT seq, type, data FROM events WHERE run_id = ? AND type IN"
                   " ('step_started', 'step_completed') ORDER BY seq", (key,))  # fmt: skip
    fan = [(seq, kind, loads(data)) for seq, kind, data in events if ":s" in data]
    assert [(kind, data["key"]) for _, kind, data in fan] == [
        (kind, f"do:{n}:s") for n in range(1, 251) for kind in ("step_started", "step_completed")
    ]
    assert all(data.get("attempt") == 1 for _, kind, data in fan if kind == "step_started")
    completed = [seq for seq, kind, _ in fan if kind == "step_completed"]
    assert [settled for _, settled in rows] == completed


async def _sleeping_run_host(
    runner: Runner, clock: FakeClock
) -> tuple[Any, DriveHost, Callable[[int, str, str], OpEnvelope]]:
    """A run asleep, a host driving it under a lease of its own, and a maker of frames that
    settle a pure step (op id, name, result) as a sandbox sends them."""
    source = 'export default async (e, step) => { await step.sleep("s", "1 hour"); };'
    run = await start_source(runner, source)
    now = int(clock() * 1000)
    lease = await runner.store.acquire_lease(run_key("acme", run.run_id), "test", now, 60_000)
    assert lease is not None
    host = DriveHost(runner.store, lease, Bindings(), Limits(), lambda: now,
                     scopes=runner.scopes)  # fmt: skip
    policy = RetryPolicy(0, 0, "constant", 60_000)

    def settled(op_id: int, name: str, value: str) -> OpEnvelope:
        return OpEnvelope(op_id, StepRecord(name, 1, 1, value, None, now, policy))

    return run, host, settled


async def test_pure_results_that_cannot_be_written_together_are_written_one_by_one(
    clocked_runner: Runner, clock: FakeClock
) -> None:
    """A frame that settles the same step twice (a sandbox that lies): written together, the
    second would break the batch; written one by one, as always, the second finds the first's
    row, its result differs from what the sandbox assumed, and nothing after it is written."""
    run, host, settled = await _sleeping_run_host(clocked_runner, clock)

    answers = await host([settled(1, "a", "1"), settled(2, "a", "2"), settled(3, "b", "3")])
    assert answers == []  # results the sandbox settled await no answer
    await host.flush()  # they were answered ahead: written behind
    assert host.diverged
    steps = await clocked_runner.list_steps(run.run_id, scope="acme")
    assert [(s.name, s.output) for s in steps if s.name != "s"] == [("a", 1)]


async def test_a_drives_end_presumes_its_pure_results_new_and_writes_them_carefully_if_not(
    clocked_runner: Runner, clock: FakeClock, journal: str
) -> None:
    """The pure results a drive's end writes first are presumed new on PostgreSQL: written
    without reading how many went in, so a step with a row already (or, from a sandbox that
    lies, one settled twice) fails the end's transaction, and the careful end writes them
    one by one — the second finds the first's row, and nothing after it is written."""
    run, host, settled = await _sleeping_run_host(clocked_runner, clock)

    def presumed(tx: JournalTransaction) -> str:
        return "presumed"

    def careful(tx: JournalTransaction) -> str:
        return "careful"

    presumes = journal.startswith("postgresql://")
    assert await host([settled(1, "x", "0")]) == []
    ended = await host.transact(presumed, careful=careful, reads_fence=True)
    assert ended == ("presumed" if presumes else "careful")
    assert await host([settled(2, "a", "1"), settled(3, "a", "2"), settled(4, "b", "3")]) == []
    assert await host.transact(presumed, careful=careful, reads_fence=True) == "careful"
    assert host.diverged
    steps = await clocked_runner.list_steps(run.run_id, scope="acme")
    assert [(s.name, s.output) for s in steps if s.name != "s"] == [("x", 0), ("a", 1)]


async def test_results_awaiting_no_answer_wait_in_memory_only_while_small_and_few(
    clocked_runner: Runner, clock: FakeClock
) -> None:
    """A drive's last results await no answer and wait in the host's memory for its end's
    transaction; frame after frame of them (a sandbox that misbehaves) would grow that memory
    without bound, so past sixteen held, or a frame past 64 kB, they are written at once."""
    run, host, settled = await _sleeping_run_host(clocked_runner, clock)

    async def written() -> list[str]:
        steps = await clocked_runner.list_steps(run.run_id, scope="acme")  # waits for writes
        return [s.name for s in steps if s.name != "s"]

    for n in range(16):
        assert await host([settled(n + 1, f"small {n}", "1")]) == []
    assert await written() == []  # held for the drive's next transaction
    assert await host([settled(17, "one too many", "1")]) == []
    assert await written() == [*(f"small {n}" for n in range(16)), "one too many"]

    assert await host([settled(18, "held again", "2")]) == []
    assert await written() == [*(f"small {n}" for n in range(16)), "one too many"]
    large = '"' + "x" * (64 * 1024) + '"'
    assert await host([settled(19, "large", large)]) == []
    assert (await written())[-2:] == ["held again", "large"]
