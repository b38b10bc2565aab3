"""Testing workflows before publishing them (`qjsflow.testing`, `qjsflow run`): the real sandbox
and a real journal in a temporary folder, on a virtual clock — sleeps, retry delays and wait
timeouts pass at once — with tools answered by mocks that record their calls, events given
ahead, and steps mocked.

    async with WorkflowTest("my-workflows", tools={"crm.sync": {"synced": 3}}) as test:
        run = await test.start("onboarding", {"email": "ada@example.com"},
                               events={"approval": [{"ok": True}]})
        idle = await test.run_until_idle(run.run_id)
        assert idle.run.status == RunStatus.completed
        assert test.calls("crm.sync") == [{"email": "ada@example.com"}]
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qjsflow.bridge import InvalidInput, dumps_text
from qjsflow.bridge.limits import Limits
from qjsflow.bridge.values import from_python
from qjsflow.runner.bindings import Bindings, ToolFn
from qjsflow.runner.config import RunnerConfig, system_clock
from qjsflow.runner.operations.timeline import timeline_rows
from qjsflow.runner.runner import Runner, Source
from qjsflow.runner.store import JournalTransaction, RunStatus, StepStatus
from qjsflow.runner.tenancy.environment import ScopeEnvironment
from qjsflow.runner.tenancy.scopes import run_key
from qjsflow.runner.views import TERMINAL, RunView, StartRunInput, StepView
from qjsflow.sandbox import PoolConfig

__all__ = ["Idle", "MockTool", "VirtualClock", "WorkflowTest"]

_START = 1_800_000_000.0  # 2027-01-15: a fixed start, so runs are reproducible
_MAX_TURNS = 10_000  # drives a run gets in `run_until_idle` before it gives up


class VirtualClock:
    """Time that moves only when told: the runner's wall clock and its monotonic clock."""

    def __init__(self, start: float = _START) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise InvalidInput("a virtual clock only moves forward")
        self.now += seconds


@dataclass
class MockTool:
    """A tool that answers with `result` (or what `result(args)` returns or raises) and
    records the arguments of every call."""

    result: Any = None
    calls: list[Any] = field(default_factory=list)

    async def __call__(self, args: Any) -> Any:
        self.calls.append(args)
        if callable(self.result):
            answer = self.result(args)
            return await answer if isinstance(answer, Awaitable) else answer
        return self.result


@dataclass(frozen=True, slots=True)
class Idle:
    """Where `run_until_idle` left a run: ended, or stopped where nothing given can move it."""

    run: RunView
    stopped: str | None = None  # why it could go no further: the event or tool it lacks


class WorkflowTest:
    """A workflow tree published into a temporary journal, run on a virtual clock."""

    def __init__(
        self,
        source: Source,
        *,
        tools: Mapping[str, Any] | None = None,
        scope: str = "test",
        start: float = _START,
        limits: Limits | None = None,
        real_time: bool = False,
        environment: ScopeEnvironment | None = None,
    ) -> None:
        # `real_time`: sleeps and delays take as long as they say (`qjsflow run` without
        # --fast-forward); the virtual clock is then not used.
        self.real_time = real_time
        self.environment = environment  # the runs' env: vars, secrets, egress for fetch
        self.clock = VirtualClock(start)
        self.now: Callable[[], float] = system_clock if real_time else self.clock
        self.scope = scope
        self.source = source
        self.tools: dict[str, MockTool | ToolFn] = {
            address: tool if callable(tool) else MockTool(tool)
            for address, tool in (tools or {}).items()
        }
        # Every retry is a journaled timer (none is waited inside a drive in real time), so
        # the virtual clock skips its delay too.
        self.limits = limits or (Limits() if real_time else Limits(retry_in_drive_ms=0))
        self.events: dict[str, dict[str, list[Any]]] = {}  # run -> type -> payloads to give
        self._stack = contextlib.AsyncExitStack()
        self._runner: Runner | None = None
        self._snapshot: str | None = None

    @property
    def runner(self) -> Runner:
        if self._runner is None:
            raise RuntimeError("use WorkflowTest in `async with`")
        return self._runner

    async def __aenter__(self) -> WorkflowTest:
        folder = Path(self._stack.enter_context(tempfile.TemporaryDirectory(prefix="qjsflow-")))
        config = RunnerConfig(
            clock=self.now, monotonic=time.monotonic if self.real_time else self.clock,
            limits=self.limits,
            pool=PoolConfig(size=2), scope_root=folder / "scopes",
            bindings=Bindings(tools=dict(self.tools)),
            environments={} if self.environment is None else {self.scope: self.environment},
        )  # fmt: skip
        self._runner = await self._stack.enter_async_context(
            Runner.open(folder / "journal.db", config)
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()
        self._runner = None

    async def snapshot(self) -> str:
        """The tree, published once (a publish error names the file and line)."""
        if self._snapshot is None:
            self._snapshot = (await self.runner.publish(self.scope, self.source)).snapshot_id
        return self._snapshot

    def calls(self, address: str) -> list[Any]:
        """The arguments of each call of a mocked tool, in order."""
        tool = self.tools.get(address)
        if not isinstance(tool, MockTool):
            raise InvalidInput(f"{address!r} is not a mocked tool of this test")
        return tool.calls

    async def start(
        self,
        workflow: str,
        payload: Any = None,
        *,
        run_id: str | None = None,
        events: Mapping[str, Sequence[Any]] | None = None,
        mock_steps: Mapping[str, Any] | None = None,
    ) -> RunView:
        """Start a run (driven to its first suspension). `events`: payloads by event type, each
        given when the run waits for that type; `mock_steps`: step.do results by name
        (`NAME` or `NAME:COUNT`, the first call when no count), whose bodies never run."""
        request = StartRunInput(self.scope, workflow, await self.snapshot(), payload, run_id)
        run = await self.runner.start(request, drive=False)
        self.events[run.run_id] = {kind: list(given) for kind, given in (events or {}).items()}
        if mock_steps:
            mocked = [(*_step_of(name), from_python(value)) for name, value in mock_steps.items()]
            key, now = run_key(self.scope, run.run_id), int(self.now() * 1000)
            await self.runner.store.transact(lambda tx: _mock_steps(tx, key, mocked, now))
        await self._drive_due()
        return await self.runner.get(run.run_id, scope=self.scope)

    async def advance(self, seconds: float) -> None:
        """Move the virtual clock and drive what is due."""
        if self.real_time:
            raise InvalidInput("advance moves virtual time: this test runs in real time")
        self.clock.advance(seconds)
        await self._drive_due()

    async def send_event(self, run_id: str, event_type: str, payload: Any = None) -> RunView:
        return await self.runner.signal(run_id, event_type, payload, scope=self.scope)

    async def run_until_idle(self, run_id: str, *, waits_time_out: bool = False) -> Idle:
        """Drive the run to its end: each wait gets the next event given for its type; sleeps,
        retry delays and timeouts pass on the virtual clock. Stops early, saying which type,
        when the run waits for an event nobody gave — or, with `waits_time_out`, lets that
        wait time out (to test the path a timeout takes)."""
        for _ in range(_MAX_TURNS):
            run = await self.runner.get(run_id, scope=self.scope)
            if run.status in TERMINAL:
                return Idle(run)
            if run.status == RunStatus.blocked:
                return Idle(run, f"it calls the tool {run.waiting_for}, which nothing answers")
            if run.status == RunStatus.paused:
                return Idle(run, "it is paused")
            queued = self.events.get(run_id, {})
            waits = [kind for kind in (run.waiting_for or "").split(",") if kind]
            given = next((kind for kind in waits if queued.get(kind)), None)
            if run.status == RunStatus.waiting and given is not None:
                await self.send_event(run_id, given, queued[given].pop(0))
            elif run.status == RunStatus.waiting and not (
                waits_time_out and run.wake_at is not None
            ):
                return Idle(run, f"it waits for the event {run.waiting_for}, which nobody gave")
            elif run.wake_at is not None and run.status in ("sleeping", "throttled", "waiting"):
                if self.real_time:
                    await asyncio.sleep(max(0.0, run.wake_at - time.time()))
                else:
                    self.clock.now = max(self.clock.now, run.wake_at)
                await self._drive_due()
            else:
                await self._drive_due()
        raise RuntimeError(f"run {run_id!r} was driven {_MAX_TURNS} times without ending")

    async def _drive_due(self) -> None:
        """Drive every run that is due now (on the virtual clock, a timer due a moment later
        is not waited for: time moves only when the test says)."""
        await self.runner.serve(until_idle=True, idle_horizon_s=1.0 if self.real_time else 0.0)

    async def steps(self, run_id: str) -> list[StepView]:
        return await self.runner.list_steps(run_id, scope=self.scope)

    async def step(self, run_id: str, name: str, *, kind: str = "do", count: int = 1) -> StepView:
        """One step of a run, to assert on (its status, attempts, output, error); a step the
        run never reached raises, naming the steps it did reach."""
        steps = await self.steps(run_id)
        for found in steps:
            if (found.kind, found.name, found.count) == (kind, name, count):
                return found
        reached = ", ".join(f"{s.kind}:{s.name}" for s in steps) or "none"
        raise AssertionError(f"run {run_id!r} has no step {kind}:{name}:{count} (it has {reached})")

    async def timeline(self, run_id: str) -> list[tuple[str, ...]]:
        """The run's steps with their attempts and durations, a header row first."""
        return await timeline_rows(self.runner, await self.runner.get(run_id, scope=self.scope))


def _step_of(text: str) -> tuple[str, int]:
    """`NAME` or `NAME:COUNT` as the journal names the step (escaped as the sandbox does)."""
    name, colon, count = text.rpartition(":")
    if not (colon and count.isdigit() and int(count) > 0):
        name, count = text, "1"
    return name.replace("%", "%25").replace("/", "%2F"), int(count)


def _mock_steps(
    tx: JournalTransaction, run_id: str, mocked: list[tuple[str, int, str]], now: int
) -> None:
    """Record mocked step results as settled, before the run's first drive: a replay answers
    them, and their bodies never run."""
    for name, count, value in mocked:
        tx.insert_step(run_id, "do", name, count, status=StepStatus.running, attempt=1,
                       started_at=now, detail=dumps_text({"mocked": True}))  # fmt: skip
        row = tx.get_step(run_id, "do", name, count)
        assert row is not None
        tx.settle_step(row, status=StepStatus.completed, output=value, error=None, at=now,
                       event_type="step_mocked")  # fmt: skip
