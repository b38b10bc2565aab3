"""Fair scheduling across scopes: a scope with thousands of due runs does not hold back
another's few, and a scope's concurrency limit holds across a worker's drives."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from qjsflow.bridge import InvalidInput
from qjsflow.runner import Bindings, Runner, RunnerConfig, StartRunInput
from qjsflow.runner.store.journal import claim_query
from qjsflow.runner.tenancy.scope_config import parse_config
from qjsflow.sandbox import PoolConfig
from tests.conftest import FakeClock

QUICK = "export default async (event) => event.payload;"
BIG, SMALL, CONCURRENCY = 2000, 20, 4


async def _enqueue(runner: Runner, scope: str, count: int, clock: FakeClock) -> None:
    published = await runner.publish(scope, {"workflows/flow.ts": QUICK})
    for n in range(count):
        request = StartRunInput(scope, "flow", published.snapshot_id, n, f"{scope}-{n:05d}")
        await runner.start(request, drive=False)
        clock.advance(0.001)


def _picks(runner: Runner) -> list[str]:
    """The runs the worker picks, in the order it picks them (as it asks for each drive: a
    drive's journal events are written when it first writes, which for a run that ends at
    once is its end: not the scheduler's order)."""
    picked: list[str] = []
    driver = runner.driver
    claim = driver.claim

    async def picking(run_id: str, *args: Any, **named: Any) -> Any:
        picked.append(run_id)
        return await claim(run_id, *args, **named)

    driver.claim = picking  # type: ignore[method-assign]
    return picked


def _big_before_last_small(picked: list[str]) -> int:
    """When the scheduler picked the small scope's last run, how many of the big scope's had
    it picked?"""
    last_small = max(n for n, run in enumerate(picked) if run.startswith("small/"))
    return sum(1 for run in picked[:last_small] if run.startswith("big/"))


async def _serve_until(runner: Runner, done: asyncio.Event) -> None:
    serving = asyncio.create_task(runner.serve(concurrency=CONCURRENCY, stop=done))
    while not done.is_set():
        small = await runner.list(scope="small", status="completed", limit=SMALL + 1)
        if len(small) == SMALL:
            done.set()
        await asyncio.sleep(0.05)
    await serving


@pytest.mark.slow
async def test_a_scope_with_few_runs_is_not_held_back_by_one_with_thousands(
    journal: str, tmp_path: Path, clock: FakeClock
) -> None:
    config = RunnerConfig(clock=clock, pool=PoolConfig(size=2), scope_root=tmp_path / "scopes")
    async with Runner.open(journal, config) as runner:
        await _enqueue(runner, "big", BIG, clock)  # older: first in line by age
        await _enqueue(runner, "small", SMALL, clock)
        picked = _picks(runner)
        await _serve_until(runner, asyncio.Event())
    # (Picks, not completions: how long a drive takes is not the scheduler's doing.) One of the
    # big scope's runs per turn of the small one's (measured: exactly 20 of 20, on both
    # journals), with room for what a worker holds in flight.
    big_drives = _big_before_last_small(picked)
    assert big_drives <= SMALL + CONCURRENCY, big_drives


@pytest.mark.parametrize("where", ["process", "journal"])
async def test_a_scopes_weight_is_its_share(tmp_path: Path, clock: FakeClock, where: str) -> None:
    """Set in the worker's own settings, or in the scope's configuration in the journal (what
    every worker on the journal follows)."""
    weights = {"big": 3.0} if where == "process" else {}
    config = RunnerConfig(clock=clock, pool=PoolConfig(size=2), scope_root=tmp_path / "scopes",
                          scope_weights=weights)  # fmt: skip
    async with Runner.open(tmp_path / "j.db", config) as runner:
        if where == "journal":
            await runner.apply_scope_config("big", '{"scheduling": {"weight": 3}}')
        await _enqueue(runner, "big", 200, clock)
        await _enqueue(runner, "small", 10, clock)
        picked = _picks(runner)
        done = asyncio.Event()
        serving = asyncio.create_task(runner.serve(concurrency=CONCURRENCY, stop=done))
        while len(await runner.list(scope="small", status="completed")) < 10:
            await asyncio.sleep(0.05)
        done.set()
        await serving
    big_drives = _big_before_last_small(picked)
    assert 3 * 10 - CONCURRENCY <= big_drives <= 3 * 10 + CONCURRENCY, big_drives


@pytest.mark.parametrize("where", ["process", "journal"])
async def test_a_scopes_concurrency_limit_holds(
    tmp_path: Path, clock: FakeClock, where: str
) -> None:
    """In the worker's own settings, or in the journal's configuration: then it holds across
    two workers that were given no limit of their own."""
    limits = {"capped": 1} if where == "process" else {}
    config = RunnerConfig(clock=clock, pool=PoolConfig(size=2), scope_root=tmp_path / "scopes",
                          scope_concurrency=limits)  # fmt: skip
    gate = asyncio.Event()
    seen: list[int] = []
    driving = 0

    async def hold(args: object) -> str:
        nonlocal driving
        driving += 1
        seen.append(driving)
        await asyncio.wait_for(gate.wait(), 5)
        driving -= 1
        return "ok"

    source = 'export default async (e, step) => step.tool("hold", "hold", {});'
    bindings = Bindings(tools={"hold": hold})
    async with Runner.open(tmp_path / "j.db", config) as runner, \
            Runner.open(tmp_path / "j.db", config) as other:  # fmt: skip
        if where == "journal":
            await runner.apply_scope_config("capped", '{"scheduling": {"concurrency": 1}}')
        published = await runner.publish("capped", {"workflows/flow.ts": source})
        for n in range(3):
            await runner.start(StartRunInput("capped", "flow", published.snapshot_id, None,
                                             f"c{n}"), drive=False)  # fmt: skip
        stop = asyncio.Event()
        serving = [
            asyncio.create_task(worker.serve(concurrency=8, stop=stop, bindings=bindings))
            for worker in (runner, other)
        ]
        await asyncio.sleep(1.0)
        assert seen == [1]  # one at a time, though each worker could take eight
        gate.set()
        for _ in range(100):
            done = await runner.list(scope="capped", status="completed")
            if len(done) == 3:
                break
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.gather(*serving)
    assert max(seen) == 1
    assert len(seen) == 3


def test_scheduling_settings_are_checked() -> None:
    for document, said in (
        ({"scheduling": {"weight": 0}}, "scheduling.weight is a number over 0"),
        ({"scheduling": {"weight": True}}, "scheduling.weight is a number over 0"),
        ({"scheduling": {"concurrency": 1.5}}, "scheduling.concurrency is a whole number"),
        ({"scheduling": {"priority": 1}}, "scheduling holds weight and concurrency"),
    ):
        with pytest.raises(InvalidInput, match=said):
            parse_config(document, "acme")
    config = parse_config({"scheduling": {"weight": 2, "concurrency": 5}}, "acme")
    assert (config.weight, config.concurrency) == (2.0, 5)
    assert config.document()["scheduling"] == {"weight": 2.0, "concurrency": 5}


async def test_a_claim_looks_only_at_runs_that_may_be_due(tmp_path: Path) -> None:
    """A worker claims every poll: the claim must find its candidates through indexes (due
    timers, `running`, a cancel asked), never by scanning every run that has not ended (it did:
    ~25 ms per claim over 20,000 waiting runs here, 0.1 ms now)."""
    async with Runner.open(tmp_path / "j.db", RunnerConfig()):
        pass
    with sqlite3.connect(tmp_path / "j.db") as connection:
        plan = [row[3] for row in connection.execute(
            f"EXPLAIN QUERY PLAN {claim_query('?')}", (0, 0, 0, 1, 1))]  # fmt: skip
    # A scan of `runs` (even along an index) reads every run; the partial index of cancels
    # holds only runs with a cancel asked.
    scans = [step for step in plan if step == "SCAN r" or step.startswith(("SCAN r ", "SCAN runs"))]
    assert scans == ["SCAN runs USING INDEX runs_cancelling"], plan
    assert any("timers_by_due" in step for step in plan), plan
    assert any("runs_cancelling" in step for step in plan), plan
