"""Budgets per scope (docs/TENANCY.md, Budgets): each kind, hit by a real run, parks the scope's
runs as `throttled` (or refuses a start) until its window allows; the scope's runs resume
where they were, nothing recorded runs again, and other scopes are unaffected."""

from __future__ import annotations

import http.server
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from qjsflow.runner import ALL_SCOPES, Bindings, Runner, RunnerConfig, StartRunInput
from qjsflow.runner.errors import BudgetExceeded, InvalidEvent
from qjsflow.runner.tenancy.budgets import Budgets
from qjsflow.runner.tenancy.egress import EgressPolicy
from qjsflow.runner.tenancy.environment import ScopeEnvironment
from qjsflow.sandbox import PoolConfig
from qjsflow.testing import MockTool
from tests.conftest import FakeClock
from tests.journal_reads import query

DAY = 86_400.0
STEPS = """export default async (event, step) => {
  const out = [];
  for (let i = 0; i < 8; i++) out.push(await step.do(`s${i}`, async () => i));
  return out;
};"""


def _config(tmp_path: Path, clock: FakeClock, **more: Any) -> RunnerConfig:
    return RunnerConfig(
        clock=clock, monotonic=clock, pool=PoolConfig(size=2), scope_root=tmp_path / "scopes",
        **more,
    )  # fmt: skip


async def _start(runner: Runner, scope: str, source: str, run_id: str, **kw: Any) -> Any:
    published = await runner.publish(scope, {"workflows/flow.ts": source})
    return await runner.start(StartRunInput(scope, "flow", published.snapshot_id, None, run_id),
                              **kw)  # fmt: skip


def _steps(journal: str | Path, run_id: str) -> list[tuple[str, int]]:
    return [
        (str(name), int(attempt))
        for name, attempt in query(journal, "SELECT name, attempt FROM steps WHERE run_id = ?"
                                   " AND status = 'completed' ORDER BY name", (run_id,))
    ]  # fmt: skip


async def _measure(runner: Runner, scope: str, measure: str) -> float:
    usage = (await runner.usage(scope=scope))[scope]
    return next(m.used for m in usage.measures if m.measure == measure)


async def test_steps_per_day_throttles_a_scope_until_the_next_day(
    journal: str, tmp_path: Path, clock: FakeClock
) -> None:
    config = _config(tmp_path, clock, scope_budgets={"capped": Budgets(steps_per_day=5)})
    async with Runner.open(journal, config) as runner:
        first = await _start(runner, "capped", STEPS, "first")
        assert first.status == "throttled"
        assert first.waiting_for == "steps_per_day"
        assert "budget of 5 steps per day is spent" in (first.error or "")
        next_day = (int(clock.now // DAY) + 1) * DAY
        assert first.wake_at == next_day
        assert len(_steps(journal, "capped/first")) == 5
        # The scope's next run does not start a step; another scope is not held to it.
        second = await _start(runner, "capped", STEPS, "second")
        assert second.status == "throttled"
        assert _steps(journal, "capped/second") == []
        free = await _start(runner, "free", STEPS, "free")
        assert free.status == "completed"
        # Nothing wakes a throttled run before its window ends: not a worker, not a due timer.
        assert await runner.serve(until_idle=True) == 0
        assert await _measure(runner, "capped", "steps") == 5
        clock.now = next_day + 1
        # One drive at a time: drives that begin together each see the room left when they
        # began (docs/TENANCY.md: a budget may be passed by what drives under way use).
        await runner.serve(until_idle=True, concurrency=1)
        first = await runner.get("first", scope="capped")
        assert first.status == "completed"
        assert first.output == list(range(8))
        # Each step ran once (attempt 1), the five before the throttle were not run again.
        assert _steps(journal, "capped/first") == [(f"s{i}", 1) for i in range(8)]
        # The new day's five: the first run's three, then two of the second's.
        second = await runner.get("second", scope="capped")
        assert second.status == "throttled"
        assert len(_steps(journal, "capped/second")) == 2
        assert await _measure(runner, "capped", "steps") == 5
        history = [e.type for e in await runner.history("first", scope="capped")]
        assert history.count("run_throttled") == 1
        # Usage is kept for the current window and the one before, no longer.
        clock.now = next_day + 2 * DAY + 1
        await _start(runner, "capped", STEPS, "third")
        kept = query(journal, "SELECT DISTINCT window_start FROM scope_usage"
                              " WHERE scope = 'capped' AND measure = 'steps'")  # fmt: skip
        assert sorted(int(start) for (start,) in kept) == [int((next_day + 2 * DAY) * 1000)]


async def test_drives_per_minute(tmp_path: Path, clock: FakeClock) -> None:
    sleeps = """export default async (event, step) => {
      for (let i = 0; i < 4; i++) await step.sleep(`nap${i}`, 10_000);
      return "rested";
    };"""
    config = _config(tmp_path, clock, scope_budgets={"capped": Budgets(drives_per_minute=2)})
    async with Runner.open(tmp_path / "j.db", config) as runner:
        clock.now = (clock.now // 60 + 1) * 60  # the start of a minute
        assert (await _start(runner, "capped", sleeps, "r")).status == "sleeping"
        clock.advance(15)
        await runner.serve(until_idle=True)
        clock.advance(15)
        await runner.serve(until_idle=True)
        run = await runner.get("r", scope="capped")
        assert (run.status, run.waiting_for) == ("throttled", "drives_per_minute")
        assert run.wake_at == clock.now - 30 + 60
        assert await _measure(runner, "capped", "drives") == 2
        for _ in range(2):  # the next minute: two more drives, then throttled again
            clock.advance(30 if _ == 0 else 15)
            await runner.serve(until_idle=True)
            assert (await runner.get("r", scope="capped")).status == "sleeping"
        clock.advance(15)
        await runner.serve(until_idle=True)
        assert (await runner.get("r", scope="capped")).status == "throttled"
        clock.advance(30)
        await runner.serve(until_idle=True)
        assert (await runner.get("r", scope="capped")).output == "rested"


async def test_compute_seconds_per_day(tmp_path: Path, clock: FakeClock) -> None:
    busy = """export default async (event, step) => {
      await step.do("spin", async () => { let x = 0; for (let i = 0; i < 3e6; i++) x += i; return x > 0; });
      await step.sleep("nap", 10_000);
      return "done";
    };"""
    budgets = {"capped": Budgets(compute_s_per_day=0.001)}
    async with Runner.open(tmp_path / "j.db", _config(tmp_path, clock, scope_budgets=budgets)) as runner:  # fmt: skip
        assert (await _start(runner, "capped", busy, "r")).status == "sleeping"
        assert await _measure(runner, "capped", "compute_s") > 0.001  # the first drive's CPU
        clock.advance(20)
        await runner.serve(until_idle=True)
        run = await runner.get("r", scope="capped")
        assert (run.status, run.waiting_for) == ("throttled", "compute_s_per_day")
        assert (await _start(runner, "free", busy, "f")).status == "sleeping"
        clock.now = (clock.now // DAY + 1) * DAY
        await runner.serve(until_idle=True)
        assert (await runner.get("r", scope="capped")).output == "done"
        assert (await runner.get("f", scope="free")).output == "done"


async def test_tool_calls_per_day_never_reach_the_tool_past_the_budget(
    tmp_path: Path, clock: FakeClock
) -> None:
    count = MockTool("counted")
    calls = count.calls

    four = """export default async (event, step) => {
      for (let i = 0; i < 4; i++) await step.tool(`t${i}`, "count", i);
      return "all four";
    };"""
    config = _config(tmp_path, clock, scope_budgets={"capped": Budgets(tool_calls_per_day=2)},
                     bindings=Bindings(tools={"count": count}))  # fmt: skip
    async with Runner.open(tmp_path / "j.db", config) as runner:
        run = await _start(runner, "capped", four, "r")
        assert (run.status, run.waiting_for) == ("throttled", "tool_calls_per_day")
        assert calls == [0, 1]
        assert (await _start(runner, "free", four, "f")).output == "all four"
        assert calls == [0, 1, 0, 1, 2, 3]
        assert await _measure(runner, "capped", "tool_calls") == 2
        assert await _measure(runner, "free", "tool_calls") == 4
        clock.now = (clock.now // DAY + 1) * DAY
        await runner.serve(until_idle=True)
        assert (await runner.get("r", scope="capped")).output == "all four"
        assert calls == [0, 1, 0, 1, 2, 3, 2, 3]  # the first two were not called again


class _Quiet(http.server.BaseHTTPRequestHandler):
    hits = 0

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        type(self).hits += 1
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


@pytest.fixture
def server() -> Iterator[str]:
    _Quiet.hits = 0
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Quiet)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
async def fetching(tmp_path: Path, clock: FakeClock, server: str) -> AsyncIterator[Runner]:
    reach = ScopeEnvironment(
        vars={"BASE": server}, egress=EgressPolicy(allow=(f"{server}/",), allow_private=True)
    )
    config = _config(
        tmp_path, clock, environments={"capped": reach, "free": reach},
        scope_budgets={"capped": Budgets(fetches_per_day=1, tool_calls_per_day=0)},
    )  # fmt: skip
    async with Runner.open(tmp_path / "j.db", config) as runner:
        yield runner


async def test_fetches_per_day_are_counted_apart_from_tool_calls(
    fetching: Runner, clock: FakeClock
) -> None:
    body = """import { WorkflowEntrypoint } from "cloudflare:workers";
export class Flow extends WorkflowEntrypoint {
  async run(event, step) {
    const texts = [];
    for (let i = 0; i < 3; i++) {
      texts.push(await step.do(`get${i}`, async () => (await fetch(`${this.env.BASE}/x`)).text()));
    }
    return texts;
  }
}"""
    for scope in ("capped", "free"):
        await fetching.publish(scope, {"workflows/flow.ts": body})
    capped = (await fetching.snapshots(scope="capped"))[0].snapshot_id
    run = await fetching.start(StartRunInput("capped", "Flow", capped, None, "r"))
    assert (run.status, run.waiting_for) == ("throttled", "fetches_per_day")
    assert _Quiet.hits == 1  # a tool-calls budget of 0 did not stop a fetch
    free = (await fetching.snapshots(scope="free"))[0].snapshot_id
    done = await fetching.start(StartRunInput("free", "Flow", free, None, "f"))
    assert done.output == ["ok", "ok", "ok"]
    assert _Quiet.hits == 4
    clock.now = (clock.now // DAY + 1) * DAY
    await fetching.serve(until_idle=True)
    assert (await fetching.get("r", scope="capped")).status == "throttled"  # one a day
    assert _Quiet.hits == 5
    # The step whose fetch was held back was set aside, not failed: it ran again as its
    # first attempt, and the step before it was not run again.
    assert _steps(fetching.store.location, "capped/r") == [
        ("do:1:get0/fetch", 1), ("do:1:get1/fetch", 1), ("get0", 1), ("get1", 1),
    ]  # fmt: skip
    history = [e.type for e in await fetching.history("r", scope="capped")]
    assert history.count("step_set_aside") == 2


async def test_sql_seconds_per_day(tmp_path: Path, clock: FakeClock) -> None:
    source = """import { db } from "qjsflow";
export default async (event, step) => {
  for (let i = 0; i < 3; i++) await db.sql("INSERT INTO hits VALUES (?)", [i]);
  return "three";
};"""
    setup = """import { db } from "qjsflow";
export default async () => { await db.sql("CREATE TABLE hits (n INTEGER)"); return 1; };"""
    config = _config(tmp_path, clock, scope_budgets={"capped": Budgets(sql_s_per_day=1e-9)})
    async with Runner.open(tmp_path / "j.db", config) as runner:
        for scope in ("capped", "free"):
            published = await runner.publish(scope, {"workflows/flow.ts": source,
                                                      "workflows/setup.ts": setup})  # fmt: skip
            await runner.start(StartRunInput(scope, "setup", published.snapshot_id, None, "s"))
            clock.now = (clock.now // DAY + 1) * DAY  # the table's creation used the day's time
            run = await runner.start(StartRunInput(scope, "flow", published.snapshot_id, None,
                                                   "r"))  # fmt: skip
            if scope == "capped":
                assert (run.status, run.waiting_for) == ("throttled", "sql_s_per_day")
                assert await _measure(runner, "capped", "sql_s") > 0
            else:
                assert run.output == "three"
        steps = query(tmp_path / "j.db", "SELECT count(*) FROM steps WHERE run_id = 'capped/r'")
        assert steps == [(1,)]  # one statement, then the run parked


async def test_journal_bytes_refuse_starts_until_runs_are_pruned(
    tmp_path: Path, clock: FakeClock
) -> None:
    big = """export default async (e, step) => {
      for (let i = 0; i < 3; i++) await step.do(`big${i}`, async () => "x".repeat(600));
      return "stored";
    };"""
    config = _config(tmp_path, clock, scope_budgets={"capped": Budgets(journal_bytes=1000)})
    async with Runner.open(tmp_path / "j.db", config) as runner:
        run = await _start(runner, "capped", big, "a")
        assert (run.status, run.waiting_for) == ("throttled", "journal_bytes")
        assert len(_steps(tmp_path / "j.db", "capped/a")) == 2  # the third would pass it
        assert await _measure(runner, "capped", "journal_bytes") >= 1200
        with pytest.raises(BudgetExceeded, match="scope 'capped' is at its budget of 1000 journal"):
            await _start(runner, "capped", big, "b")
        assert (await _start(runner, "free", big, "c")).status == "completed"
        # Bytes never free by themselves: an operator prunes (or raises the budget).
        clock.advance(3600)
        await runner.serve(until_idle=True)
        assert (await runner.get("a", scope="capped")).status == "throttled"
        await runner.cancel("a", scope="capped")
        clock.advance(10)
        pruned = await runner.prune(older_than_s=1, scope="capped")
        assert pruned.runs == 1
        assert await _measure(runner, "capped", "journal_bytes") == 0  # given back
        assert (await _start(runner, "capped", big, "b")).status == "throttled"


async def test_a_live_runs_budget_refuses_starts_past_it(tmp_path: Path, clock: FakeClock) -> None:
    config = _config(tmp_path, clock, scope_budgets={"capped": Budgets(live_runs=2)})
    waits = 'export default async (e, step) => step.waitForEvent("go", { type: "go" });'
    async with Runner.open(tmp_path / "j.db", config) as runner:
        await _start(runner, "capped", waits, "a")
        await _start(runner, "capped", waits, "b")
        with pytest.raises(BudgetExceeded, match="scope 'capped' is at its budget of 2 live runs"):
            await _start(runner, "capped", waits, "c")
        assert (await _start(runner, "capped", waits, "a")).run_id == "a"  # idempotent still
        for n in range(3):  # another scope is not held to it
            await _start(runner, "free", waits, f"f{n}")
        await runner.cancel("a", scope="capped")  # an ended run frees its place
        assert (await _start(runner, "capped", waits, "c")).status == "waiting"
        usage = await runner.usage(scope=ALL_SCOPES)
    assert (usage["capped"].runs, usage["capped"].live, usage["capped"].live_budget) == (
        {"cancelled": 1, "waiting": 2}, 2, 2,
    )  # fmt: skip
    assert (usage["free"].runs, usage["free"].live, usage["free"].live_budget) == (
        {"waiting": 3}, 3, None,
    )  # fmt: skip


def test_budgets_are_numbers() -> None:
    with pytest.raises(Exception, match="budget steps_per_day must be a number from 0 to 2"):
        Budgets(steps_per_day=-1)
    with pytest.raises(Exception, match="budget journal_bytes must be a number from 0 to 2"):
        Budgets(journal_bytes=10**30)  # past what the journal's integers hold
    with pytest.raises(Exception, match="budget compute_s_per_day must be a number from 0 to"):
        Budgets(compute_s_per_day=1e300)
    with pytest.raises(Exception, match="budget live_runs must be a number"):
        Budgets(live_runs=True)


async def test_a_retry_attempt_held_back_is_set_aside_not_failed(
    tmp_path: Path, clock: FakeClock
) -> None:
    count = MockTool(lambda args: f"{args} done")
    calls = count.calls

    source = """export default async (event, step) => step.do(
      "s", { retries: { limit: 1, delay: 5000 } }, async (ctx) => {
        await step.tool("a", "count", "a");
        if (ctx.attempt === 1) throw new Error("again");
        return await step.tool("b", "count", "b");
      });"""
    config = _config(tmp_path, clock, scope_budgets={"capped": Budgets(tool_calls_per_day=1)},
                     bindings=Bindings(tools={"count": count}))  # fmt: skip
    async with Runner.open(tmp_path / "j.db", config) as runner:
        assert (await _start(runner, "capped", source, "r")).status == "sleeping"  # the retry
        clock.advance(10)
        await runner.serve(until_idle=True)
        run = await runner.get("r", scope="capped")
        assert (run.status, run.waiting_for) == ("throttled", "tool_calls_per_day")
        [step] = [s for s in await runner.list_steps("r", scope="capped") if s.name == "s"]
        assert (step.status, step.attempt) == ("retrying", 1)  # attempt 2 undone, not failed
        clock.now = (clock.now // DAY + 1) * DAY
        await runner.serve(until_idle=True)
        run = await runner.get("r", scope="capped")
        assert (run.status, run.output) == ("completed", "b done")
        [step] = [s for s in await runner.list_steps("r", scope="capped") if s.name == "s"]
        assert step.attempt == 2  # the limit of one retry was enough: no attempt was lost
    assert calls == ["a", "b"]  # `a` succeeded once and was not called again


# -- one admission path: whatever creates a run or stores bytes is charged ---------------------

STORES = """export default async (e, step) => {
  const a = await step.do("a", async () => "x".repeat(1000));
  const b = await step.do("b", async () => "y".repeat(1000));
  return a.length + b.length;
};"""
WAITS = 'export default async (e, step) => step.waitForEvent("go", { type: "go" });'


async def test_fork_and_restart_are_held_to_the_live_runs_budget(
    tmp_path: Path, clock: FakeClock
) -> None:
    config = _config(tmp_path, clock, scope_budgets={"capped": Budgets(live_runs=2)})
    async with Runner.open(tmp_path / "j.db", config) as runner:
        await _start(runner, "capped", WAITS, "a")
        await _start(runner, "capped", WAITS, "b")
        with pytest.raises(BudgetExceeded, match="2 live runs"):
            await runner.fork("a", scope="capped", new_run_id="a2", drive=False)
        await runner.cancel("b", scope="capped")
        assert (await runner.fork("a", scope="capped", new_run_id="a2")).status == "waiting"
        with pytest.raises(BudgetExceeded, match="2 live runs"):  # b ended: live again is new
            await runner.restart("b", scope="capped", drive=False)
        assert (await runner.restart("a", scope="capped")).status == "waiting"  # live already
        assert [r.run_id for r in await runner.list(scope="capped")] == ["a", "a2", "b"]
        assert (await runner.usage(scope="capped"))["capped"].live == 2


async def test_results_a_fork_copies_are_charged_and_given_back_when_it_is_pruned(
    tmp_path: Path, clock: FakeClock
) -> None:
    config = _config(tmp_path, clock, scope_budgets={"capped": Budgets(journal_bytes=4500)})
    async with Runner.open(tmp_path / "j.db", config) as runner:
        assert (await _start(runner, "capped", STORES, "src")).output == 2000
        alone = await _measure(runner, "capped", "journal_bytes")
        assert alone >= 2000
        fork = await runner.fork("src", scope="capped", from_step="do:b", new_run_id="f1")
        assert fork.output == 2000
        with_fork = await _measure(runner, "capped", "journal_bytes")
        assert with_fork >= alone + 2000  # the copy of a, and b made again
        with pytest.raises(BudgetExceeded, match="4500 journal bytes"):  # a copy past it
            await runner.fork("src", scope="capped", from_step="do:b", new_run_id="f2")
        clock.advance(10)
        await runner.prune(older_than_s=1, scope="capped", statuses={"completed"})
        assert await _measure(runner, "capped", "journal_bytes") == 0  # what was charged, freed


async def test_signals_are_charged_and_bounded(tmp_path: Path, clock: FakeClock) -> None:
    config = _config(tmp_path, clock, scope_budgets={"capped": Budgets(journal_bytes=3000)},
                     events_pending_per_run=3)  # fmt: skip
    async with Runner.open(tmp_path / "j.db", config) as runner:
        await _start(runner, "capped", WAITS, "w")
        payload = "p" * 1000
        await runner.signal("w", "later", payload, scope="capped")
        await runner.signal("w", "later", payload, scope="capped")
        assert await _measure(runner, "capped", "journal_bytes") >= 2000
        with pytest.raises(BudgetExceeded, match="3000 journal bytes"):
            await runner.signal("w", "later", payload, scope="capped")
        await _start(runner, "free", WAITS, "w")
        for _ in range(3):
            await runner.signal("w", "later", "small", scope="free")
        with pytest.raises(InvalidEvent, match="holds 3 events no wait has taken yet"):
            await runner.signal("w", "later", "small", scope="free")
        events = query(tmp_path / "j.db", "SELECT run_id, count(*) FROM inbox GROUP BY run_id"
                       " ORDER BY run_id")  # fmt: skip
        assert events == [("capped/w", 2), ("free/w", 3)]  # nothing of the refused ones
        await _start(runner, "free", WAITS, "other")  # the cap is per run
        assert (await runner.signal("other", "go", "now", scope="free")).status == "completed"
