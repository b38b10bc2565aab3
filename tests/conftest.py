"""Shared fixtures: a real journal file per test, the project's folders."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from qjsflow.bridge.codec import dumps
from qjsflow.bridge.types import Answer, DriveRequest, OpEnvelope
from qjsflow.bridge.wire import request_to_wire
from qjsflow.bundles import build_snapshot
from qjsflow.runner import Bindings, Runner, RunnerConfig, RunView, StartRunInput
from qjsflow.runner.store.backends import Backend, open_backend
from qjsflow.sandbox import ExecutorPool, PoolConfig
from qjsflow.sandbox.messages import Message, drive_message, read_message
from tests.postgres import PostgresServer, postgres_server
from tests.worker_pool import api, workers  # noqa: F401  (fixtures: the worker pool of the kill tests)

PROJECT_ROOT = Path(__file__).resolve().parent.parent
FIXTURES = PROJECT_ROOT / "fixtures"


# A run that waits for one event at once: a resume replays it to that wait (no step, no write).
WAITER = (
    'export default async (e, step) => (await step.waitForEvent("go", { type: "go" })).payload;'
)


@pytest.fixture
async def runner(tmp_path: Path) -> AsyncIterator[Runner]:
    async with Runner.open(tmp_path / "journal.db") as opened:
        yield opened


@pytest.fixture
def frames(monkeypatch: pytest.MonkeyPatch) -> list[list[OpEnvelope]]:
    """Every frame of ops the product's host (`DriveHost`) was given, in order."""
    from qjsflow.runner.engine.host import DriveHost  # noqa: PLC0415  (only the tests that count)

    seen: list[list[OpEnvelope]] = []
    original = DriveHost.__call__

    async def counting(self: DriveHost, ops: Sequence[OpEnvelope]) -> list[Answer]:
        seen.append(list(ops))
        return await original(self, ops)

    monkeypatch.setattr(DriveHost, "__call__", counting)
    return seen


@contextlib.contextmanager
def statements(runner: Runner) -> Iterator[list[tuple[bool, str]]]:
    """A SQLite journal's statements while the block runs: whether each ran on this (the
    event loop's) thread, and its text."""
    seen: list[tuple[bool, str]] = []
    here = threading.get_ident()
    runner.store.trace(lambda sql: seen.append((threading.get_ident() == here, sql)))
    try:
        yield seen
    finally:
        runner.store.trace(None)


_BUNDLES: dict[str, str] = {}


async def bundle_of(source: str, name: str = "w.ts") -> str:
    """The real esbuild bundle of one workflow source (cached per test session)."""
    key = f"{name}\0{source}"
    if key not in _BUNDLES:
        snapshot = await build_snapshot({f"workflows/{name}": source})
        _BUNDLES[key] = snapshot.bundles[0].code
    return _BUNDLES[key]


def fan_out_source(steps: int, *, then_sleep: bool = False) -> str:
    """A workflow with `steps` pure step.do calls in flight at once (one Promise.all), and
    with `then_sleep` a sleep among them: a call for the host behind them all."""
    sleep = '  all.push(step.sleep("nap", "1 hour"));\n' if then_sleep else ""
    return (
        "export default async (event, step) => {\n  const all = [];\n"
        f'  for (let i = 0; i < {steps}; i++) all.push(step.do("s", async () => i));\n'
        f"{sleep}  return (await Promise.all(all)).length;\n}};\n"
    )


@pytest.fixture
async def pool() -> AsyncIterator[ExecutorPool]:
    async with ExecutorPool(PoolConfig(size=2)) as opened:
        yield opened


class FakeClock:
    """An injectable clock: time moves only when a test says so."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    with postgres_server() as server:
        yield server


@pytest.fixture
def pg_url(postgres: PostgresServer) -> str:
    """A new database of the test server."""
    return postgres.new_database()


@pytest.fixture
async def pg_backend(pg_url: str) -> AsyncIterator[Backend]:
    """A journal backend on `pg_url`, its schema made, closed after the test."""
    opened = await open_backend(pg_url)
    yield opened
    await opened.close()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])
def journal(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a test's journal lives: the same semantics are tested on both backends. The
    fast tier (`make check`) runs them on SQLite; `make test` on both (PostgreSQL's own tests,
    leases judged by the server's clock and the like, run in both tiers)."""
    if request.param == "sqlite":
        return str(tmp_path / "journal.db")
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.new_database()


@pytest.fixture
async def clocked_runner(journal: str, tmp_path: Path, clock: FakeClock) -> AsyncIterator[Runner]:
    config = RunnerConfig(
        clock=clock, monotonic=clock, pool=PoolConfig(size=2), scope_root=tmp_path / "scopes"
    )
    async with Runner.open(journal, config) as opened:
        yield opened


def never_leased_early(runner: Runner) -> Runner:
    """A drive that goes on past `RunDriver.take_after_s` (5 ms) takes its lease, so ends in
    full, as a loaded machine's drive may: for tests of drives that end quietly
    (tests/test_quiet_end.py)."""
    runner.driver.take_after_s = 30.0
    return runner


async def start_source(
    runner: Runner,
    source: str,
    payload: object = None,
    *,
    run_id: str | None = None,
    bindings: Bindings | None = None,
    scope: str = "acme",
) -> RunView:
    """Publish one workflow file and start a run of it."""
    published = await runner.publish(scope, {"workflows/flow.ts": source})
    request = StartRunInput(scope, "flow", published.snapshot_id, payload, run_id)
    return await runner.start(request, bindings)


async def past_short_sleeps(runner: Runner, run: RunView) -> RunView:
    """The run driven on past its short sleeps, as a worker would wake it. `start` returns a
    run sleeping on a wake not yet due (a sleep of even one millisecond can still be ahead
    when the drive ends), so a test that needs the replay after a sleep waits for it here."""
    for _ in range(100):
        if run.status != "sleeping":
            return run
        await asyncio.sleep(0.005)
        run = await runner.resume(run.run_id, scope=run.scope)
    return run


def executor_pids() -> list[int]:
    """Pids of this process's QuickJS executor children (for tests that kill them)."""
    pids = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        for child in (task / "children").read_text().split():
            with contextlib.suppress(OSError):
                if b"sandbox.executor" in Path(f"/proc/{child}/cmdline").read_bytes():
                    pids.append(int(child))
    return pids


def executor_payload(message: dict[str, Any]) -> bytes:
    """A message to an executor written as the pool writes it (sandbox/messages.py): a drive's
    `request` (as `request_to_wire` makes it) after its header, any other message alone."""
    if message.get("type") != "drive":
        return dumps(message)
    fields = {key: value for key, value in message.items() if key not in ("type", "request")}
    return drive_message(message["request"], **fields)


def drive_read(request: DriveRequest) -> Message:
    """A drive message of `request`, as an executor reads it."""
    return read_message(drive_message(request_to_wire(request)))
