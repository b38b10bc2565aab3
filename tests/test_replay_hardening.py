"""Replay never diverges and step identities never collide (hardening, class G)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from qjsflow.bridge.limits import Limits
from qjsflow.bundles import PublishError
from qjsflow.runner import Bindings, Runner, RunnerConfig
from tests.conftest import FakeClock, start_source

RANDOM_STREAMS = """
export default async (event, step) => {
  // The body starts at once and draws from its own stream; the workflow's own draw after it
  // must be the same when a replay skips the body.
  const body = step.do("draws", async () => [Math.random(), Math.random()]);
  const mine = Math.random();
  const inBody = await body;
  const recorded = await step.do("record", async () => mine);
  await step.sleep("replay", 1000);
  return { recorded, mine, inBody, again: Math.random() };
};
"""


async def test_step_bodies_draw_from_their_own_random_streams(
    clocked_runner: Runner, clock: FakeClock
) -> None:
    run = await start_source(clocked_runner, RANDOM_STREAMS, run_id="rand")
    assert run.status == "sleeping", run.error
    clock.advance(2)
    done = await clocked_runner.resume("rand", scope="acme")
    assert done.status == "completed", done.error
    assert done.output["recorded"] == done.output["mine"]
    assert done.output["inBody"][0] != done.output["inBody"][1]


class Counter:
    def __init__(self) -> None:
        self.calls: list[Any] = []

    async def __call__(self, args: Any) -> str:
        self.calls.append(args)
        return f"call {len(self.calls)}"


COLLIDING = """
export default async (event, step) => {
  const top = await step.tool("do:1:a/b", "count", { who: "top" });
  const nested = await step.do("a", async () => step.tool("b", "count", { who: "nested" }));
  const percent = await step.tool("do:1:a%2Fb", "count", { who: "percent" });
  return [top, nested, percent];
};
"""


async def test_names_with_colons_and_slashes_never_share_a_key(clocked_runner: Runner) -> None:
    counter = Counter()
    bindings = Bindings(tools={"count": counter})
    run = await start_source(clocked_runner, COLLIDING, bindings=bindings)
    assert run.status == "completed", run.error
    assert [c["who"] for c in counter.calls] == ["top", "nested", "percent"]
    assert run.output == ["call 1", "call 2", "call 3"]


LOGS_AFTER_REPLAY = """
export default async (event, step) => {
  await step.do("a", async () => { console.log("in body 1"); console.log("in body 2"); return 1; });
  console.log("after a");
  await step.sleep("nap", 1000);
  console.log("after nap");
  return 0;
};
"""


async def test_every_console_line_is_stored_once_across_replays(
    clocked_runner: Runner, clock: FakeClock
) -> None:
    run = await start_source(clocked_runner, LOGS_AFTER_REPLAY, run_id="logs")
    assert run.status == "sleeping"
    clock.advance(2)
    await clocked_runner.resume("logs", scope="acme")
    clock.advance(2)
    await clocked_runner.resume("logs", scope="acme")
    logs = await clocked_runner.list_logs("logs", scope="acme")
    assert [log.text for log in logs] == ["in body 1", "in body 2", "after a", "after nap"]


GETTER = """
export default async (event, step) => {
  let reads = 0;
  const config = { retries: { get limit() { reads += 1; return reads === 1 ? 0 : "x"; } } };
  const done = await step.do("d", config, async () => "fine");
  try {
    await step.waitForEvent("w", { ...{}, get type() { reads += 1; return reads === 2 ? "go" : "!"; },
                                   timeout: 1000 });
  } catch (error) {
    return [done, String(error.name), reads];
  }
  return [done, "no timeout", reads];
};
"""


async def test_options_are_read_once_then_validated(
    clocked_runner: Runner, clock: FakeClock
) -> None:
    run = await start_source(clocked_runner, GETTER, run_id="getter")
    assert run.status == "waiting", run.error
    assert run.waiting_for == "go"
    clock.advance(2)
    done = await clocked_runner.resume("getter", scope="acme")
    assert done.output == ["fine", "WaitForEventTimeoutError", 2]


TIMEZONE = """
export default async (event, step) => {
  const d = new Date(Date.UTC(2026, 0, 1, 12, 0, 0));
  return [d.getTimezoneOffset(), d.getHours(), d.toString(), new Date(2026, 0, 1).getTime()];
};
"""


async def test_local_time_reads_are_utc(clocked_runner: Runner) -> None:
    """What authors see. On a host whose own zone is UTC this passes without the fix too:
    `test_executors_run_with_no_environment_an_empty_folder_and_rlimits` is what fails if
    an executor is started without TZ=UTC0."""
    run = await start_source(clocked_runner, TIMEZONE)
    offset, hours, text, local_midnight = run.output
    assert (offset, hours) == (0, 12)
    assert "GMT+0000" in text
    assert local_midnight == 1767225600000  # 2026-01-01T00:00:00Z


TOP_LEVEL_THROW = """
throw { name: "Boom\\ud800", message: "at the top \\udfff" };
export default async () => 1;
"""


async def test_a_module_that_throws_at_load_is_refused_with_the_authors_error(
    clocked_runner: Runner,
) -> None:
    """Module code runs when publishing asks what the file exports: a module that throws
    there is refused at publish (as Cloudflare refuses a deploy), with the author's error."""
    with pytest.raises(PublishError) as caught:
        await start_source(clocked_runner, TOP_LEVEL_THROW)
    assert "workflows/flow.ts: loading the workflow: " in str(caught.value)
    assert "Boom\ufffd" in str(caught.value)
    assert "executor" not in str(caught.value)


@pytest.mark.parametrize(
    "call",
    [
        'step.sleep("nap", 10)',
        'step.sleepUntil("nap", Date.now() + 10)',
        'step.waitForEvent("w", { type: "go" })',
    ],
)
async def test_suspending_inside_a_step_body_is_refused_at_the_call(
    clocked_runner: Runner, call: str
) -> None:
    source = f"""
    export default async (event, step) => {{
      try {{
        await step.do("outer", {{ retries: {{ limit: 0 }} }}, async () => {{ await {call}; }});
      }} catch (error) {{
        return [error.name, error.message];
      }}
      return "no error";
    }};
    """
    run = await start_source(clocked_runner, source)
    assert run.status == "completed", run.error
    name, message = run.output
    assert name == "TypeError"
    assert "cannot be called inside a step.do body" in message


LOG_FLOOD = """
export default async (event, step) => {
  for (let drive = 0; drive < 3; drive++) {
    await step.do("flood " + drive, async () => { for (let i = 0; i < 5000; i++) console.log(); });
    for (let i = 0; i < 5000; i++) console.log("");
    await step.sleep("nap " + drive, 1000);
  }
  return "done";
};
"""


async def test_console_lines_are_bounded_per_drive_and_per_run(
    tmp_path: Path, clock: FakeClock
) -> None:
    limits = Limits(log_lines_per_drive=100, log_lines_per_run=250)
    config = RunnerConfig(clock=clock, limits=limits, scope_root=tmp_path / "scopes")
    async with Runner.open(tmp_path / "journal.db", config) as runner:
        run = await start_source(runner, LOG_FLOOD, run_id="flood")
        first = await runner.list_logs("flood", scope="acme")
        assert len(first) == 101  # the limit, and one line that says the rest were dropped
        assert "more than 100 lines in one drive" in first[-1].text
        for _ in range(3):
            clock.advance(2)
            run = await runner.resume("flood", scope="acme")
        assert run.status == "completed", run.error
        logs = await runner.list_logs("flood", scope="acme")
        assert len(logs) == 250
        assert "limit of 250 lines was reached" in logs[-1].text
        assert [log.count for log in logs] == list(range(1, 251))


BIG_RESULTS = """
export default async (event, step) => {
  for (let i = 0; i < event.payload.steps; i++) {
    await step.do("big " + i, async () => "x".repeat(900 * 1024));
  }
  await step.sleep("then replay", 1000);
  return "replayed";
};
"""


@pytest.mark.slow  # in `make test`; heavy for the fast tier
async def test_a_run_that_ran_once_can_always_be_replayed(
    clocked_runner: Runner, clock: FakeClock
) -> None:
    """The journal's size is bounded when a result is recorded, not discovered on replay."""
    over = await start_source(clocked_runner, BIG_RESULTS, {"steps": 60}, run_id="over")
    assert over.status == "failed"
    assert over.error is not None
    assert "LimitError: the result of step 'big 18'" in over.error
    assert "limit of 16777216 bytes" in over.error
    under = await start_source(clocked_runner, BIG_RESULTS, {"steps": 15}, run_id="under")
    assert under.status == "sleeping", under.error
    clock.advance(2)
    done = await clocked_runner.resume("under", scope="acme")
    assert (done.status, done.output) == ("completed", "replayed")


def test_limits_keep_the_journal_within_replay_memory() -> None:
    with pytest.raises(ValueError, match="a quarter of memory_bytes"):
        Limits(memory_bytes=32 * 1024 * 1024, journal_bytes_per_run=16 * 1024 * 1024)
    assert Limits(memory_bytes=32 * 1024 * 1024).journal_bytes_per_run == 8 * 1024 * 1024


AWAIT_IN_BODY = """
async function compute() { return 1; }
async function* numbers() { yield 1; yield 2; }
export default async (event, step) => {
  const [nested, root] = await Promise.all([
    step.do("a", async () => {
      await compute();
      await null;
      let sum = 0;
      for await (const n of numbers()) sum += n;
      return step.tool("t", "count", { who: "nested", sum });
    }),
    step.tool("t", "count", { who: "root" }),
  ]);
  await step.sleep("replay", 1000);
  const later = await step.tool("t", "count", { who: "later" });
  return [nested, root, later];
};
"""


async def test_a_call_after_any_await_in_a_body_stays_in_that_body(
    clocked_runner: Runner, clock: FakeClock
) -> None:
    """Awaiting something that is not a step inside a body must not move the body's later
    calls to the workflow's scope, where a replay would answer another call with them."""
    counter = Counter()
    bindings = Bindings(tools={"count": counter})
    run = await start_source(clocked_runner, AWAIT_IN_BODY, run_id="aw", bindings=bindings)
    assert run.status == "sleeping", run.error
    clock.advance(2)
    done = await clocked_runner.resume("aw", bindings, scope="acme")
    assert done.status == "completed", done.error
    assert [c["who"] for c in counter.calls] == ["root", "nested", "later"]
    assert counter.calls[1]["sum"] == 3
    assert done.output == ["call 2", "call 1", "call 3"]
    names = {(s.kind, s.name) for s in await clocked_runner.list_steps("aw", scope="acme")}
    assert ("tool", "do:1:a/t") in names


EVENTS = """
export default async (event, step) => {
  const sizes = [];
  for (let i = 0; i < 6; i++) {
    try {
      const got = await step.waitForEvent("w" + i, { type: "blob" });
      sizes.push(got.payload.length);
    } catch (error) {
      sizes.push(error.name + ": " + error.message);
    }
  }
  await step.sleep("then replay", 1000);
  return sizes;
};
"""


async def test_events_count_against_the_journal_limit_when_consumed(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A caller cannot grow a run's journal past what a replay can load by sending events."""
    limits = Limits(memory_bytes=16 * 1024 * 1024)  # a journal limit of 4 MiB
    config = RunnerConfig(clock=clock, limits=limits, scope_root=tmp_path / "scopes")
    async with Runner.open(tmp_path / "journal.db", config) as runner:
        run = await start_source(runner, EVENTS, run_id="ev")
        for _ in range(6):
            await runner.signal("ev", "blob", "x" * 1_000_000, scope="acme")
        run = await runner.get("ev", scope="acme")
        assert run.status == "sleeping", run.error
        clock.advance(2)
        done = await runner.resume("ev", scope="acme")
        assert done.status == "completed", done.error
        sizes = done.output
        assert sizes[:4] == [1_000_000] * 4
        assert all(str(size).startswith("LimitError: the event consumed by") for size in sizes[4:])
