"""The five measurements of the journal and runner, each a median over repeats."""

from __future__ import annotations

import asyncio
import resource
import time
from typing import Any

from bench.baselines import contexts_per_s, dbos_step_s, raw_commit_s
from bench.common import (
    TEN_STEPS,
    WAITER,
    big_waiter,
    cpu_times,
    fan_out_steps,
    fresh_runner,
    idle_percent,
    many_steps,
    median,
    publish,
    request,
    timed,
)

SEQUENTIAL_RUNS = 200


async def sequential(repeats: int = 3) -> dict[str, Any]:
    """200 runs of a 10-step workflow, one after another, each driven inline by `start`; the
    raw commit measured between them (this machine's fsync varies by half between minutes: a
    baseline measured in a round of its own once gave a third more or less than in the next)."""
    samples = []
    raws = []
    steps = SEQUENTIAL_RUNS * 10
    for repeat in range(repeats):
        async with fresh_runner() as runner:
            snapshot = await publish(runner, TEN_STEPS)
            await runner.start(request(snapshot, "warm-up"))

            async def all_runs(
                runner: Any = runner, snapshot: str = snapshot, repeat: int = repeat
            ) -> None:
                for n in range(SEQUENTIAL_RUNS):
                    run = await runner.start(request(snapshot, f"r{repeat}-{n}"))
                    assert run.status == "completed", run.error

            samples.append(await timed(all_runs))
        raws.append(raw_commit_s(steps))
    total = median(samples)
    per_step = total / steps
    raw = median(raws)
    dbos = dbos_step_s(SEQUENTIAL_RUNS)
    return {
        "qjsflow_us_per_step": per_step * 1e6,
        "steps_per_s": steps / total,
        "runs_per_s": SEQUENTIAL_RUNS / total,
        "raw_commit_us": raw * 1e6,
        "dbos_us_per_step": None if dbos is None else dbos * 1e6,
        "qjsflow_over_limit": per_step / raw,
        "qjsflow_over_dbos": None if dbos is None else per_step / dbos,
    }


async def concurrent(
    in_flight: int = 100, runs: int = 300, repeats: int = 3, pool_size: int = 4
) -> dict[str, Any]:
    """Runs driven 100 at a time through the worker loop, on a warm pool: aggregate throughput
    (300 runs, so that most of the time 100 are in flight; the median of three rounds, as one
    round on this machine varies by a fifth), the share of the CPU idle in each round (a round
    where the runner stalls shows it: docs/PERFORMANCE.md), how fast this machine prepares a
    sandbox context just after (`contexts_per_s`), and how long each run took to end
    from when the worker began (a step's own latency is no longer seen: a run's pure steps are
    recorded together, at one time)."""
    rates: list[float] = []
    idle: list[float] = []  # the share of both cores idle during each round
    latencies: list[float] = []
    async with fresh_runner(pool_size) as runner:
        snapshot = await publish(runner, TEN_STEPS)
        for n in range(pool_size * 2):  # warm every executor
            await runner.start(request(snapshot, f"warm{n}"), drive=False)
        await runner.serve(until_idle=True, concurrency=pool_size * 2)
        for round_ in range(repeats):
            keys = [f"c{round_}-{n}" for n in range(runs)]
            for key in keys:
                await runner.start(request(snapshot, key), drive=False)
            began_ms = time.time() * 1000
            cpu_before = cpu_times()
            started = time.perf_counter()
            await runner.serve(until_idle=True, concurrency=in_flight)
            rates.append(runs * 10 / (time.perf_counter() - started))
            idle.append(idle_percent(cpu_before, cpu_times()))
            for key in keys:
                run = await runner.store.get_run(f"bench/{key}")
                assert run is not None
                assert run.status == "completed", run.error
                latencies.append(run.updated_at - began_ms)
    latencies.sort()
    return {
        "steps_per_s": median(rates),
        # The machine's speed as the rounds ran (measured after them, the pool closed).
        "contexts_per_s": contexts_per_s(),
        "steps_per_s_rounds": [round(rate) for rate in rates],
        "idle_percent_rounds": [round(share, 1) for share in idle],
        "p50_run_ms": round(latencies[len(latencies) // 2], 1),
        "p99_run_ms": round(latencies[int(len(latencies) * 0.99)], 1),
    }


async def replay(steps: int = 1000, repeats: int = 5) -> dict[str, Any]:
    """Resume of a run with 1,000 completed steps: the drive replays them all and stops at
    the first new step (a wait for an event)."""
    async with fresh_runner() as runner:
        snapshot = await publish(runner, many_steps(steps))
        run = await runner.start(request(snapshot, "long"))
        assert run.status == "waiting", run.error
        samples = [
            await timed(lambda: runner.resume("long", scope="bench")) for _ in range(repeats)
        ]
    return {"replay_ms": median(samples) * 1e3}


async def cold_start(repeats: int = 5) -> dict[str, Any]:
    """Publish-to-first-step on a cold runner, and a drive's start on a warm pool."""
    cold = []
    for n in range(repeats):
        async with fresh_runner() as runner:
            source = TEN_STEPS.replace("let total = 0;", f"let total = {n} * 0;")
            started = time.perf_counter()
            snapshot = await publish(runner, source)
            await runner.start(request(snapshot, "cold"))
            first = next(s for s in await runner.store.list_steps("bench/cold"))
            assert first.completed_at is not None
            cold.append(time.perf_counter() - started)
    warm = {}
    for name, source in (("warm_drive_ms", WAITER), ("warm_drive_big_bundle_ms", big_waiter())):
        async with fresh_runner() as runner:
            snapshot = await publish(runner, source)
            await runner.start(request(snapshot, "w"))
            await runner.resume("w", scope="bench")
            samples = []
            for _ in range(repeats * 4):
                await asyncio.sleep(0.02)
                samples.append(await timed(lambda: runner.resume("w", scope="bench")))
            warm[name] = median(samples) * 1e3
    return {"publish_to_first_step_ms": median(cold) * 1e3, **warm}


async def fan_out(steps: int = 4000, repeats: int = 3) -> dict[str, Any]:
    """`Promise.all` over 4,000 new steps, then a wait; then the same run resumed (all 4,000
    replayed). CPU of the executors (as the journal counts it per run) and of this process;
    the median of `repeats` runs, each on a fresh runner (one varied by a third here)."""
    samples = [await _fan_out_once(steps) for _ in range(repeats)]
    return {
        "steps": steps,
        **{
            name: median([sample[name] for sample in samples])
            for name in ("first_drive_cpu_s", "first_drive_executor_cpu_s", "replay_cpu_s")
        },
    }


async def _fan_out_once(steps: int) -> dict[str, float]:
    async with fresh_runner() as runner:
        snapshot = await publish(runner, fan_out_steps(steps))
        host = time.process_time()
        run = await runner.start(request(snapshot, "fan"))
        first_host = time.process_time() - host
        assert run.status == "waiting", run.error
        first = await runner.store.get_run("bench/fan")
        assert first is not None
        host = time.process_time()
        await runner.resume("fan", scope="bench")
        replay_host = time.process_time() - host
        second = await runner.store.get_run("bench/fan")
        assert second is not None
    return {
        "first_drive_cpu_s": first.cpu_used_s + first_host,
        "first_drive_executor_cpu_s": first.cpu_used_s,
        "replay_cpu_s": second.cpu_used_s - first.cpu_used_s + replay_host,
    }


def _rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


async def memory(waiting: int = 10_000, checkpoint: int = 1_000) -> dict[str, Any]:
    """Resident memory of the runner with 1,000 and then 10,000 runs waiting for an event."""
    async with fresh_runner() as runner:
        snapshot = await publish(runner, WAITER)
        rss = {}
        for n in range(waiting):
            run = await runner.start(request(snapshot, f"m{n}"))
            assert run.status == "waiting"
            if n + 1 in (checkpoint, waiting):
                rss[n + 1] = _rss_bytes()
    per_run = (rss[waiting] - rss[checkpoint]) / (waiting - checkpoint)
    return {
        "rss_mib_at_1k": rss[checkpoint] / 2**20,
        "rss_mib_at_10k": rss[waiting] / 2**20,
        "bytes_per_waiting_run": per_run,
    }
