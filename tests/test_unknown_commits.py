"""A commit whose outcome is unknown (docs/OPERATIONS.md): PostgreSQL commits a transaction
and its answer is lost. Made real with a synchronous standby that never answers (the commit
is made locally, then waits for the standby) and `pg_terminate_backend` on the waiting
session: the client sees its connection cut in the middle of COMMIT. The retried write must
find its own commit, never take it for someone else's, nor apply it twice."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest

from qjsflow.runner import Bindings, Runner, RunnerConfig, StartRunInput
from qjsflow.sandbox import PoolConfig
from tests.journal_reads import query
from tests.postgres import PostgresServer, postgres_server


@pytest.fixture(scope="module")
def server() -> Iterator[PostgresServer]:
    with postgres_server(own=True) as started:  # its settings are changed: never a shared one
        yield started


class _LostAnswers:
    """Makes the next durable commits of a database wait for a standby that never answers, and
    cuts the sessions that wait."""

    def __init__(self, server: PostgresServer) -> None:
        self.admin = psycopg.connect(server.admin_url, autocommit=True)

    def database(self, server: PostgresServer) -> str:
        url = server.new_database()
        name = url.rsplit("/", 1)[1]
        self.admin.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = on')
        return url

    def arm(self) -> None:
        self.admin.execute("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
        self.admin.execute("SELECT pg_reload_conf()")

    async def cut_the_waiting_commit(self) -> None:
        """Wait for a session held in its COMMIT by the standby, cut it, and disarm."""
        deadline = time.monotonic() + 60
        while True:
            waiting = self.admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
            ).fetchall()
            if waiting:
                break
            assert time.monotonic() < deadline, "no commit waited for the standby"
            await asyncio.sleep(0.01)  # polling the server's view, not timing anything
        for (pid,) in waiting:
            self.admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        self.admin.execute("ALTER SYSTEM RESET synchronous_standby_names")
        self.admin.execute("SELECT pg_reload_conf()")


@pytest.fixture
async def lost(server: PostgresServer) -> AsyncIterator[_LostAnswers]:
    answers = _LostAnswers(server)
    try:
        yield answers
    finally:
        answers.admin.execute("ALTER SYSTEM RESET synchronous_standby_names")
        answers.admin.execute("SELECT pg_reload_conf()")
        answers.admin.close()


WAITS = 'export default async (e, step) => step.waitForEvent("go", { type: "go" });'
CALLS = 'export default async (e, step) => step.tool("once", "count.calls", {});'


async def test_a_signal_whose_commit_answer_was_lost_is_delivered_once(
    server: PostgresServer, lost: _LostAnswers
) -> None:
    url = lost.database(server)
    async with Runner.open(url, RunnerConfig(pool=PoolConfig(size=1))) as runner:
        published = await runner.publish("acme", {"workflows/flow.ts": WAITS})
        await runner.start(StartRunInput("acme", "flow", published.snapshot_id, None, "w"))
        lost.arm()
        delivered = asyncio.create_task(runner.signal("w", "later", "p", scope="acme", drive=False))
        await lost.cut_the_waiting_commit()
        await delivered
    inbox = query(url, "SELECT type, payload FROM inbox WHERE run_id = 'acme/w'")
    assert len(inbox) == 1


async def test_a_tool_start_whose_commit_answer_was_lost_is_taken_for_its_own(
    server: PostgresServer, lost: _LostAnswers
) -> None:
    calls: Counter[str] = Counter()

    async def count(args: Any) -> int:
        calls["count.calls"] += 1
        return calls["count.calls"]

    url = lost.database(server)
    config = RunnerConfig(pool=PoolConfig(size=1), bindings=Bindings({"count.calls": count}))
    async with Runner.open(url, config) as runner:
        published = await runner.publish("acme", {"workflows/flow.ts": CALLS})
        lost.arm()
        started = asyncio.create_task(
            runner.start(StartRunInput("acme", "flow", published.snapshot_id, None, "t"))
        )
        await lost.cut_the_waiting_commit()
        run = await started
    assert (run.status, run.output, run.error) == ("completed", 1, None)
    assert calls == Counter({"count.calls": 1})
    audit = query(url, "SELECT count(*) FROM tool_calls WHERE run_id = 'acme/t'")
    assert audit == [(1,)]


async def test_a_read_only_spell_keeps_a_tools_result_for_when_it_ends(
    server: PostgresServer,
) -> None:
    """What a demoted primary answers during a failover (the server read-only for a while): a
    tool's result write is refused, kept and written once writes are taken again, and the tool
    is not called again."""
    calls: Counter[str] = Counter()
    admin = psycopg.connect(server.admin_url, autocommit=True)

    def read_only(on: bool) -> None:
        setting = (
            "SET default_transaction_read_only = on"
            if on
            else "RESET default_transaction_read_only"
        )
        admin.execute(f"ALTER SYSTEM {setting}")
        admin.execute("SELECT pg_reload_conf()")
        # The reload is the server's own, later: once a new session (forked from the server's
        # main process, which signals every session after it reloads) sees it, every session
        # applies it before its next statement.
        wanted, deadline = ("on" if on else "off"), time.monotonic() + 60
        while True:
            with psycopg.connect(server.admin_url) as fresh:
                shown = fresh.execute("SHOW default_transaction_read_only").fetchone()
            if shown == (wanted,):
                break
            assert time.monotonic() < deadline, "the server did not reload its settings"

    async def demotes(args: Any) -> int:
        calls["demotes"] += 1
        read_only(True)  # the server turns read-only while the tool runs
        return 42

    url = server.new_database()
    config = RunnerConfig(pool=PoolConfig(size=1), bindings=Bindings({"demotes": demotes}))
    try:
        async with Runner.open(url, config) as runner:
            published = await runner.publish("acme", {"workflows/flow.ts": CALLS.replace(
                "count.calls", "demotes")})  # fmt: skip
            started = asyncio.create_task(
                runner.start(StartRunInput("acme", "flow", published.snapshot_id, None, "ro"))
            )
            faulted = asyncio.ensure_future(runner.store.transient_fault())
            done, _ = await asyncio.wait({faulted, started}, return_when=asyncio.FIRST_COMPLETED)
            assert faulted in done, started.result()  # the result's write was refused first
            read_only(False)  # the failover is over
            run = await started
    finally:
        read_only(False)
        admin.close()
    assert (run.status, run.output) == ("completed", 42)
    assert calls == Counter({"demotes": 1})
