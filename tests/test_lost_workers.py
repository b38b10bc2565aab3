"""A worker lost in the middle of a journal transaction (its machine gone, its process frozen)
holds its run's row locked only as long as the server's bounds on its session allow
(runner/store/backends.py, PG_SERVER_BOUNDS): then the run is taken over. Meanwhile the
surviving worker, whose claims find the row locked, tries it once a poll, not in a busy loop.
The lost worker is frozen where it matters: its journal thread stopped inside a transaction
that took the run's lease, which the server sees as a session idle in a transaction."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from functools import partial

import psycopg
import pytest

from qjsflow.runner import Runner, RunnerConfig, StartRunInput
from qjsflow.runner.store import JournalTransaction
from qjsflow.sandbox import PoolConfig
from tests.postgres import PostgresServer

QUICK = "export default async (event) => event.payload;"


def _lease_then_freeze(tx: JournalTransaction, run_id: str, frozen: threading.Event) -> None:
    tx.acquire_lease(run_id, "lost-worker", int(time.time() * 1000), 1000)
    frozen.wait()  # the thread stops here: its session holds the run's row, idle


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
    async with Runner.open(url, config) as lost, Runner.open(url, config) as survivor:
        published = await lost.publish("acme", {"workflows/flow.ts": QUICK})
        await lost.start(StartRunInput("acme", "flow", published.snapshot_id, 7, "r"), drive=False)
        stalled = asyncio.create_task(
            lost.store.transact(partial(_lease_then_freeze, run_id="acme/r", frozen=frozen))
        )
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
            frozen.set()  # the lost thread goes on: its session is gone, its commit fails
            with contextlib.suppress(Exception):
                await stalled
        assert (await survivor.get("r", scope="acme")).output == 7
    tries = [r for r in caplog.records if "its lease could not be taken" in r.getMessage()]
    # Held ~10 s by the lost session; tried once a poll (0.2 s), not hundreds of times a second.
    assert 0 < len(tries) < 150
    assert not [r for r in caplog.records if r.getMessage().startswith("drove acme/r")][:-1]
