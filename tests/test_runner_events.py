"""waitForEvent, signal, cancel, scopes and the history a run leaves."""

from __future__ import annotations

import pytest

from qjsflow.bridge import InvalidInput
from qjsflow.runner import (
    ALL_SCOPES,
    Bindings,
    InvalidEvent,
    RunClosed,
    RunConflict,
    Runner,
    RunNotFound,
    StartRunInput,
)
from qjsflow.runner.tenancy.scopes import run_key
from tests.conftest import FakeClock, start_source
from tests.journal_reads import table_counts

BUFFERED = """
export default async (event, step) => {
  await step.sleep("first a nap", "1 minute");
  const one = await step.waitForEvent("first", { type: "item" });
  const two = await step.waitForEvent("second", { type: "item" });
  return [one.payload, two.payload, one.type, one.timestamp instanceof Date];
};
"""


async def test_events_sent_before_the_wait_are_buffered_fifo(
    clocked_runner: Runner, clock: FakeClock
) -> None:
    run = await start_source(clocked_runner, BUFFERED)
    assert run.status == "sleeping"
    await clocked_runner.signal(run.run_id, "item", {"n": 1}, scope="acme")
    await clocked_runner.signal(run.run_id, "item", {"n": 2}, scope="acme")
    clock.advance(60)
    done = await clocked_runner.resume(run.run_id, scope="acme")
    assert done.status == "completed"
    assert done.output == [{"n": 1}, {"n": 2}, "item", True]


THREE_WAITS = """
export default async (event, step) => {
  const seen = [];
  for (let i = 0; i < 3; i++) {
    try {
      const got = await step.waitForEvent("tick", { type: "tick", timeout: "1 minute" });
      seen.push(got.payload);
    } catch (error) {
      seen.push(error.name);
    }
  }
  return seen;
};
"""


async def test_a_timed_out_wait_does_not_swallow_the_next_event(
    clocked_runner: Runner, clock: FakeClock
) -> None:
    run = await start_source(clocked_runner, THREE_WAITS)
    assert (run.status, run.waiting_for) == ("waiting", "tick")
    run = await clocked_runner.signal(run.run_id, "tick", "one", scope="acme")
    assert run.status == "waiting"
    clock.advance(61)  # the second wait's deadline passes with no event...
    run = await clocked_runner.signal(
        run.run_id, "tick", "two", scope="acme"
    )  # ...then one arrives
    assert run.status == "completed"
    assert run.output == ["one", "WaitForEventTimeoutError", "two"]
    steps = await clocked_runner.list_steps(run.run_id, scope="acme")
    assert [s.status for s in steps] == ["completed", "failed", "completed"]


async def test_default_wait_timeout_is_a_day_and_catchable(
    clocked_runner: Runner, clock: FakeClock
) -> None:
    source = """
    export default async (event, step) => {
      try { await step.waitForEvent("approval", { type: "approve" }); }
      catch (error) { return error.message; }
    };
    """
    run = await start_source(clocked_runner, source)
    assert run.wake_at == pytest.approx(clock() + 86400)
    clock.advance(86399)
    assert (await clocked_runner.resume(run.run_id, scope="acme")).status == "waiting"
    clock.advance(1)
    done = await clocked_runner.resume(run.run_id, scope="acme")
    assert done.status == "completed"
    assert "timed out after 86400000 ms" in done.output
    replayed = await clocked_runner.resume(done.run_id, scope="acme")
    assert replayed.output == done.output


async def test_cancel_stops_a_waiting_run_and_refuses_signals(clocked_runner: Runner) -> None:
    run = await start_source(clocked_runner, THREE_WAITS)
    cancelled = await clocked_runner.cancel(run.run_id, scope="acme")
    assert cancelled.status == "cancelled"
    with pytest.raises(RunClosed, match="is cancelled and accepts no more events"):
        await clocked_runner.signal(run.run_id, "tick", "late", scope="acme")
    assert (await clocked_runner.resume(run.run_id, scope="acme")).status == "cancelled"


async def test_another_scope_sees_no_run(clocked_runner: Runner) -> None:
    run = await start_source(clocked_runner, THREE_WAITS)
    for call in (
        clocked_runner.get(run.run_id, scope="other"),
        clocked_runner.signal(run.run_id, "tick", 1, scope="other"),
        clocked_runner.cancel(run.run_id, scope="other"),
        clocked_runner.list_steps(run.run_id, scope="other"),
    ):
        with pytest.raises(RunNotFound) as caught:
            await call
        assert str(caught.value) == f"no run {run.run_id!r} (check the run id and the scope)"
    with pytest.raises(RunNotFound) as missing:
        await clocked_runner.get("0" * 32, scope="acme")
    assert "check the run id and the scope" in str(missing.value)
    assert (await clocked_runner.get(run.run_id, scope="acme")).status == "waiting"
    assert await clocked_runner.list(scope="other") == []


async def test_bad_signals_are_refused_and_record_nothing(clocked_runner: Runner) -> None:
    run = await start_source(clocked_runner, THREE_WAITS)
    counts = table_counts(clocked_runner.store)
    with pytest.raises(InvalidEvent, match="invalid event type"):
        await clocked_runner.signal(run.run_id, "bad type!", 1, scope="acme")
    with pytest.raises(InvalidInput, match="the event payload is larger than the limit"):
        await clocked_runner.signal(run.run_id, "tick", "x" * (1024 * 1024 + 1), scope="acme")
    assert table_counts(clocked_runner.store) == counts


HISTORY = """
export default async (event, step) => {
  const a = await step.do("a", async () => 1);
  await step.sleep("s", 0);
  const b = await step.waitForEvent("w", { type: "go" });
  return a + b.payload;
};
"""


async def test_steps_and_events_hold_the_whole_history(clocked_runner: Runner) -> None:
    run = await start_source(clocked_runner, HISTORY)
    done = await clocked_runner.signal(run.run_id, "go", 41, scope="acme")
    assert (done.status, done.output) == ("completed", 42)
    steps = await clocked_runner.list_steps(run.run_id, scope="acme")
    assert [(s.kind, s.name, s.status, s.attempt, s.output) for s in steps] == [
        ("do", "a", "completed", 1, 1),
        ("sleep", "s", "completed", 1, None),
        (
            "waitForEvent",
            "w",
            "completed",
            1,
            {"type": "go", "payload": 41, "timestamp": steps[2].output["timestamp"]},
        ),
    ]
    events = [e.type for e in await clocked_runner.store.list_events(run_key("acme", run.run_id))]
    assert events == [
        "run_created",
        "drive_started",
        "step_started",
        "step_completed",
        "sleep_scheduled",
        "sleep_completed",
        "waiting_for_event",
        "run_suspended",
        "event_received",
        "drive_started",
        "event_consumed",
        "run_completed",
    ]
    seqs = [e.seq for e in await clocked_runner.store.list_events(run_key("acme", run.run_id))]
    assert seqs == sorted(seqs)


async def test_run_ids_belong_to_their_scope(clocked_runner: Runner) -> None:
    """Another scope can neither squat an id, nor learn that it exists, nor probe its input."""
    squat = await clocked_runner.publish("mallory", {"workflows/flow.ts": THREE_WAITS})
    await clocked_runner.start(
        StartRunInput("mallory", "flow", squat.snapshot_id, {"guess": 1}, "order-44")
    )
    owner = await start_source(clocked_runner, THREE_WAITS, {"real": 2}, run_id="order-44")
    assert owner.status == "waiting"
    assert owner.input == {"real": 2}
    # The same id, two runs: each scope sees only its own.
    assert (await clocked_runner.get("order-44", scope="acme")).input == {"real": 2}
    assert (await clocked_runner.get("order-44", scope="mallory")).input == {"guess": 1}
    # A conflicting start names only what differs within the caller's own scope.
    with pytest.raises(RunConflict) as conflict:
        await clocked_runner.start(
            StartRunInput("mallory", "flow", squat.snapshot_id, {"guess": 2}, "order-44")
        )
    assert "scope" not in str(conflict.value)
    assert "input" in str(conflict.value)
    await clocked_runner.signal("order-44", "tick", 1, scope="mallory")
    steps = await clocked_runner.list_steps("order-44", scope="acme")
    assert [s.status for s in steps] == ["waiting"]  # the owner's run got no event
    assert sorted(await clocked_runner.scopes_of("order-44")) == ["acme", "mallory"]
    listed = await clocked_runner.list(scope=ALL_SCOPES)
    assert sorted((r.scope, r.run_id) for r in listed) == [
        ("acme", "order-44"),
        ("mallory", "order-44"),
    ]


async def test_the_python_api_has_no_unscoped_default(clocked_runner: Runner) -> None:
    run = await start_source(clocked_runner, THREE_WAITS)
    for method in ("get", "cancel", "list_steps", "list_tool_calls", "list_logs", "resume"):
        with pytest.raises(TypeError, match="scope"):
            await getattr(clocked_runner, method)(run.run_id)
    with pytest.raises(TypeError, match="scope"):
        await clocked_runner.list()  # type: ignore[call-arg]
    with pytest.raises(InvalidInput, match="invalid scope"):
        await clocked_runner.get(run.run_id, scope=None)  # type: ignore[arg-type]


MID_DRIVE = """
export default async (event, step) => {
  const [got] = await Promise.all([
    step.waitForEvent("w", { type: "go" }),
    step.tool("signal me", "deliver", {}),
  ]);
  return got.payload;
};
"""


async def test_an_event_delivered_during_the_drive_is_not_stranded(
    clocked_runner: Runner,
) -> None:
    """The wait looks at the inbox first; the event arrives (from a tool) later in the same
    drive. The run must take it now, not sleep until the wait's 24 h timeout."""

    async def deliver(args: object) -> None:
        del args
        await clocked_runner.signal("mid", "go", "hello", scope="acme", drive=False)

    bindings = Bindings(tools={"deliver": deliver})
    run = await start_source(clocked_runner, MID_DRIVE, run_id="mid", bindings=bindings)
    assert (run.status, run.output) == ("completed", "hello")


async def test_a_signal_retried_with_its_event_id_is_delivered_once(
    clocked_runner: Runner, clock: FakeClock
) -> None:
    run = await start_source(clocked_runner, BUFFERED)
    for _ in range(3):
        await clocked_runner.signal(run.run_id, "item", {"n": 1}, scope="acme", event_id="e-1")
    await clocked_runner.signal(run.run_id, "item", {"n": 2}, scope="acme", event_id="e-2")
    with pytest.raises(InvalidEvent, match="invalid event id"):
        await clocked_runner.signal(run.run_id, "item", 3, scope="acme", event_id="bad id!")
    clock.advance(60)
    done = await clocked_runner.resume(run.run_id, scope="acme")
    assert done.output == [{"n": 1}, {"n": 2}, "item", True]
    received = [
        e for e in await clocked_runner.store.list_events(run_key("acme", run.run_id))
        if e.type == "event_received"
    ]  # fmt: skip
    assert len(received) == 2
