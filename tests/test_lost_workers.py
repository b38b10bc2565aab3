"""A worker lost in the middle of a journal transaction (its machine gone, its process frozen)
holds its run's row locked only as long as the server's bounds on its session allow
(runner/store/backends.py, PG_SERVER_BOUNDS): then the run is taken over. Meanwhile the
surviving worker, whose claims find the row locked, tries it once a poll, not in a busy loop.
The lost worker is frozen where it matters: its event loop (on a thread of its own here, as a
process of its own would be) stopped inside a transaction that took the run's lease, which the
server sees as a session idle in a transaction."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
import sys
import threading
import time
from functools import partial

import psycopg
import pytest

from qjsflow.runner import Runner, RunnerConfig, StartRunInput
from qjsflow.runner.store import JournalTransaction
from qjsflow.sandbox import PoolConfig
from tests.conftest import PROJECT_ROOT
from tests.netns import linked_host
from tests.postgres import PostgresServer, postgres_server

QUICK = "export default async (event) => event.payload;"


def _lease_then_freeze(tx: JournalTransaction, run_id: str, frozen: threading.Event) -> None:
    tx.acquire_lease(run_id, "lost-worker", int(time.time() * 1000), 1000)
    frozen.wait()  # the worker stops here: its session holds the run's row, idle


def _lost_worker(url: str, config: RunnerConfig, frozen: threading.Event) -> threading.Thread:
    """A worker whose whole event loop freezes inside the transaction that leases the run
    (until `frozen` is set: then its session is gone, and its commit fails)."""

    async def work() -> None:
        async with Runner.open(url, config) as lost:
            await lost.store.transact(partial(_lease_then_freeze, run_id="acme/r", frozen=frozen))

    def frozen_loop() -> None:
        with contextlib.suppress(Exception):
            asyncio.run(work())

    thread = threading.Thread(target=frozen_loop, daemon=True)
    thread.start()
    return thread


async def _until(condition: object, what: str, limit_s: float = 90.0) -> None:
    deadline = time.monotonic() + limit_s
    while not await condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)  # polling a condition, not timing anything


@pytest.mark.slow
async def test_a_worker_lost_in_a_transaction_holds_its_run_only_within_its_session_bounds(
    postgres: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="qjsflow.worker")
    url = postgres.new_database()
    database = url.rsplit("/", 1)[1]
    config = RunnerConfig(pool=PoolConfig(size=1), lease_ttl_s=1.0)
    frozen = threading.Event()
    async with Runner.open(url, config) as survivor:
        published = await survivor.publish("acme", {"workflows/flow.ts": QUICK})
        request = StartRunInput("acme", "flow", published.snapshot_id, 7, "r")
        await survivor.start(request, drive=False)
        lost = _lost_worker(url, config, frozen)
        with psycopg.connect(postgres.admin_url, autocommit=True) as admin:

            async def holding() -> bool:
                idle = admin.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
                    " AND state = 'idle in transaction'", (database,),
                ).fetchone()  # fmt: skip
                return bool(idle and idle[0])

            await _until(holding, "the lost worker's session never held the run")
        stop = asyncio.Event()
        serving = asyncio.create_task(survivor.serve(stop=stop, concurrency=2))

        async def completed() -> bool:
            return (await survivor.get("r", scope="acme")).status == "completed"

        try:
            await _until(completed, "the run was never taken over from the lost worker")
        finally:
            stop.set()
            await serving
            frozen.set()  # the lost worker goes on: its session is gone, its commit fails
            await asyncio.to_thread(lost.join)
        assert (await survivor.get("r", scope="acme")).output == 7
    tries = [r for r in caplog.records if "its lease could not be taken" in r.getMessage()]
    # Held ~10 s by the lost session; tried once a poll (0.2 s), not hundreds of times a second.
    assert 0 < len(tries) < 150
    assert not [r for r in caplog.records if r.getMessage().startswith("drove acme/r")][:-1]


MANY_STEPS = """
export default async (event, step) => {
  let total = 0;
  for (let i = 0; i < 100; i++) total += await step.do(`s${i}`, async () => i);
  return total;
};
"""


@pytest.mark.slow
async def test_a_worker_whose_link_is_cut_mid_transaction_loses_its_runs() -> None:
    """The same on a test host of the test's own: the worker in a network namespace, its link
    slowed (so it spends its time inside transactions), then cut while its session holds a
    run's row in the middle of a transaction. Nothing tells the server: only its bounds on
    the session end it. A worker on this side then finishes every run."""
    with linked_host() as host, postgres_server(own=True, also_on=host.host_address) as server:
        url = server.new_database()
        database = url.rsplit("/", 1)[1]
        remote = f"postgresql://postgres@{host.host_address}:{server.port}/{database}"
        config = RunnerConfig(pool=PoolConfig(size=2), lease_ttl_s=2.0)
        async with Runner.open(url, config) as survivor:
            published = await survivor.publish("acme", {"workflows/flow.ts": MANY_STEPS})
            for n in range(3):
                request = StartRunInput("acme", "flow", published.snapshot_id, None, f"r{n}")
                await survivor.start(request, drive=False)
            host.slow("64kbit")  # from the start: its every transaction takes a while
            lost = subprocess.Popen(
                host.command(sys.executable, "-m", "qjsflow.runner.cli", "--db", remote,
                             "--lease-ttl", "2", "worker"),
                cwd=PROJECT_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            try:
                with psycopg.connect(url, autocommit=True) as admin:  # its pg_class

                    async def driving() -> bool:  # the lost worker has written, mid-way
                        found = admin.execute(
                            "SELECT count(*) FROM pg_stat_activity a JOIN pg_locks l"
                            " ON l.pid = a.pid JOIN pg_class c ON c.oid = l.relation"
                            " WHERE a.client_addr = %s AND a.state = 'idle in transaction'"
                            " AND c.relname IN ('runs', 'steps')"
                            " AND l.mode = 'RowExclusiveLock'", (host.peer_address,),
                        ).fetchone()  # fmt: skip
                        return bool(found and found[0])

                    await _until(driving, "the slowed worker never held a run's row")
                    host.cut()
                stop = asyncio.Event()
                serving = asyncio.create_task(survivor.serve(stop=stop, concurrency=3))

                async def all_done() -> bool:
                    runs = await survivor.list(scope="acme", status="completed")
                    return len(runs) == 3

                try:
                    await _until(all_done, "a run stayed with the worker whose link was cut")
                finally:
                    stop.set()
                    await serving
            finally:
                lost.kill()
                lost.wait(30)
            outputs = [(await survivor.get(f"r{n}", scope="acme")).output for n in range(3)]
            assert outputs == [sum(range(100))] * 3
