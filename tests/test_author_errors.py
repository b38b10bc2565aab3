"""Errors an author can act on: a step that was never awaited, and (docs/README, Authoring)
where an error happened."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from qjsflow.bridge.limits import Limits
from qjsflow.bridge.rules import RULES
from qjsflow.bundles import PublishError
from qjsflow.runner import Bindings, Runner, RunnerConfig, RunView, StartRunInput, ToolFn
from qjsflow.runner.engine.locations import SourceMap
from qjsflow.runner.errors import FatalToolError
from tests.conftest import FakeClock, start_source


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ('step.do("forgotten", async () => 1); return 2;', 'step.do("forgotten")'),
        ('step.sleep("nap", 1000); return 2;', 'step.sleep("nap")'),
        ('step.tool("t", "echo", {}); return 2;', 'step.tool("t")'),
        ('step.waitForEvent("w", { type: "go" }); return 2;', 'step.waitForEvent("w")'),
    ],
)
async def test_a_step_never_awaited_completes_the_run_with_a_warning_naming_it(
    runner: Runner, body: str, named: str
) -> None:
    """As Cloudflare completes such a run (what becomes of the call is undefined there): the
    run completes, and its console lines say which call was never awaited."""
    run = await start_source(runner, f"export default async (event, step) => {{ {body} }};")
    assert (run.status, run.output) == ("completed", 2)
    [line] = await runner.list_logs(run.run_id, scope=run.scope)
    assert (line.level, line.text) == ("warn", (
        f"{named} was never awaited: the workflow finished while it was still pending, and "
        "its result is not recorded (await every step call, or Promise.all them)"
    ))  # fmt: skip


@pytest.mark.parametrize(
    "body",
    [
        'await Promise.all([step.do("a", async () => 1), step.do("b", async () => 2)]); return 3;',
        'const early = step.do("a", async () => 1); await step.do("b", async () => 2); '
        "return 3 + 0 * (await early);",
    ],
)
async def test_steps_awaited_together_or_later_are_fine(runner: Runner, body: str) -> None:
    run = await start_source(runner, f"export default async (event, step) => {{ {body} }};")
    assert (run.status, run.output) == ("completed", 3)


LOCATED = {
    "workflows/orders.ts": (
        'import { total } from "../lib/money";\n'
        "export default async (event: any, step: any) => {\n"
        '  const sum = await step.do("sum", { retries: { limit: 0, delay: 0 } }, async () =>\n'
        "    total(event.payload));\n"
        "  return sum;\n"
        "};\n"
    ),
    "lib/money.ts": (
        "export function total(order: any): number {\n"
        "  const lines = order.lines;\n"
        '  return lines.get("x");\n'
        "}\n"
    ),
    "workflows/top.ts": (
        "export default async (event: any) => {\n"
        "  const missing: any = undefined;\n"
        "  return missing.field;\n"
        "};\n"
    ),
    "workflows/spin.ts": "function forever() {\n  for (;;) {}\n}\nexport default async () => { forever(); };\n",
}


@pytest.fixture
async def located(tmp_path: Path) -> AsyncIterator[tuple[Runner, str]]:
    config = RunnerConfig(limits=Limits(compute_per_drive_s=0.3))
    async with Runner.open(tmp_path / "j.db", config) as runner:
        published = await runner.publish("acme", LOCATED)
        yield runner, published.snapshot_id


async def test_an_uncaught_error_names_the_authors_file_line_and_column(
    located: tuple[Runner, str],
) -> None:
    runner, snapshot = located
    run = await runner.start(StartRunInput("acme", "top", snapshot))
    assert run.error == "TypeError: cannot read property 'field' of undefined"
    assert run.error_stack[0] == "at workflows/top.ts:3:10"


async def test_a_step_error_is_located_in_the_step_and_the_run(
    located: tuple[Runner, str],
) -> None:
    runner, snapshot = located
    run = await runner.start(StartRunInput("acme", "orders", snapshot, {}))
    assert run.error == "TypeError: cannot read property 'get' of undefined"
    [step] = await runner.list_steps(run.run_id, scope="acme")
    assert step.error_stack[0] == "at total (lib/money.ts:3:10)"
    assert "workflows/orders.ts:4:" in step.error_stack[1]
    assert run.error_stack[0] == "at total (lib/money.ts:3:10)"  # thrown again by the body


async def test_a_compute_limit_stop_says_where_the_code_was(located: tuple[Runner, str]) -> None:
    runner, snapshot = located
    run = await runner.start(StartRunInput("acme", "spin", snapshot))
    assert run.error == "compute limit per drive of 0.3 s exceeded"
    assert run.error_stack[0].startswith("at forever (workflows/spin.ts:")


@pytest.mark.parametrize(
    "stack",
    [
        "at /etc/passwd:1:1",
        "at evil (/home/someone/secret.ts:1:1)",
        "    at f (<input>:3:1)",  # a line of the sandbox's own code
        "    at f (<input>:99999999:1)",  # past the bundle
        "at x (../../outside.ts:1:1)",
    ],
)
async def test_a_forged_stack_never_reaches_the_views(runner: Runner, stack: str) -> None:
    source = (
        "export default async () => {\n"
        f"  const e = new Error('forged'); e.stack = {stack!r}; throw e;\n"
        "};\n"
    )
    run = await start_source(runner, source)
    assert run.error == "Error: forged"
    assert run.error_stack == ()


def test_source_map_segments_decode_as_the_spec_says() -> None:
    # "AAAA;AACA,IAAI": line 0 col 0 -> (0, 0, 0); line 1 col 0 -> (0, 1, 0); col 4 -> (0, 1, 4)
    source_map = SourceMap('{"version": 3, "sources": ["a.ts"], "mappings": "AAAA;AACA,IAAI"}')
    assert source_map.original(0, 0) == ("a.ts", 1, 1)
    assert source_map.original(1, 2) == ("a.ts", 2, 1)
    assert source_map.original(1, 9) == ("a.ts", 2, 5)
    assert source_map.original(5, 0) is None


@pytest.mark.parametrize(
    ("code", "hint"),
    [
        ("new XMLHttpRequest();", "call HTTP APIs with fetch(url, init)"),
        ("await new Promise((r) => setImmediate(r));", "or step.sleep to wait durably"),
        ("return process.env.HOME;", "read configuration from env"),
    ],
)
async def test_globals_workflows_lack_fail_with_a_hint(
    runner: Runner, code: str, hint: str
) -> None:
    run = await start_source(runner, f"export default async () => {{ {code} }};")
    assert run.status == "failed"
    assert run.error is not None
    assert run.error.startswith("ReferenceError: ")
    assert " (hint: " in run.error
    assert hint in run.error.split(" (hint: ", 1)[1]
    assert run.error_stack[0].startswith("at workflows/flow.ts:1:")


async def test_a_step_error_gets_the_hint_too(runner: Runner) -> None:
    source = (
        "export default async (e, step) =>"
        ' step.do("get", { retries: { limit: 0, delay: 0 } }, async () => new WebSocket("x"));'
    )
    run = await start_source(runner, source)
    [step] = await runner.list_steps(run.run_id, scope="acme")
    assert step.error is not None
    hint = (
        "(hint: call HTTP APIs with fetch(url, init) (the scope's egress policy decides where)"
        " or through step.tool)"
    )
    assert step.error.endswith(hint)
    assert run.error is not None
    assert run.error.count(hint) == 1  # the body threw the step's error again: one hint


INTERNAL_NAMES = ("qjsflow-virtual", "__qjsflow", "driver.mjs", "<input>", "prelude")


@pytest.mark.parametrize(
    "files",
    [
        {"workflows/w.ts": 'import { Nope } from "qjsflow";\nexport default () => Nope;\n'},
        {"workflows/w.ts": 'import { x } from "node:net";\nexport default () => x;\n'},
        {"workflows/w.ts": "export default async () => {\n  return 1 +;\n};\n"},
        {"workflows/w.ts": 'import { x } from "./missing";\nexport default () => x;\n'},
        {"workflows/w.ts": 'throw new TypeError("at load");\nexport default () => 1;\n'},
        {"workflows/w.ts": "export const notAWorkflow = 1;\n"},
    ],
)
async def test_publish_errors_never_name_internal_modules(
    runner: Runner, files: dict[str, str]
) -> None:
    with pytest.raises(PublishError) as caught:
        await runner.publish("acme", files)
    message = str(caught.value)
    assert message.startswith("workflows/w.ts")
    assert not [name for name in INTERNAL_NAMES if name in message], message


# Errors whose texts are whatever an author makes them: lone surrogates anywhere, a pair cut
# by a length limit, texts grown past the wire's limits after they were cut. Each fails the
# step (and so the run) with the author's error, never as a protocol the sandbox broke.
_HOSTILE_THROWS = [
    'throw new Error("x\\uD800y");',
    'const e = new Error("m"); e.name = "N\\uDC00".repeat(300); throw e;',
    'throw "\\uD83D".repeat(5000);',
    'throw new Error("a" + "\\uD83D\\uDE00".repeat(3000));',
    'const e = new Error("m"); e.stack = "\\uDFFF".repeat(100000); throw e;',
    'const e = new RetryableError("\\uD800".repeat(5000)); e.retryAfter = "soon"; throw e;',
    'const e = new RetryableError("m".repeat(5000)); e.retryAfter = "\\uD800"; throw e;',
    'const e = new RetryableError("m"); e.retryAfter = "\\uD800 ".repeat(4000); throw e;',
    'throw { name: "\\uD800".repeat(1000), message: "\\uDC00", stack: 7 };',
]


@pytest.mark.parametrize("thrown", _HOSTILE_THROWS)
async def test_an_error_with_hostile_texts_fails_as_the_authors(
    runner: Runner, thrown: str
) -> None:
    source = (
        'import { RetryableError } from "qjsflow";\n'
        "export default async (event, step) => {\n"
        '  await step.do("bad", { retries: { limit: 0, delay: 0 } }, async () => {'
        f" {thrown} }});\n}};\n"
    )
    run = await start_source(runner, source)
    assert run.status == "failed"
    assert run.error is not None
    assert "protocol" not in run.error
    assert len(run.error) <= RULES.error_message_chars
    assert run.error.encode("utf-8")  # well-formed: a lone surrogate would not encode


async def test_a_tool_error_with_a_lone_surrogate_fails_the_step_not_the_host(
    runner: Runner,
) -> None:
    async def broken(args: object) -> object:
        raise ValueError("bad \udcff byte" + "\ud83d" * 5000)

    source = (
        "export default async (event, step) => {\n"
        '  try { await step.tool("t", "broken", {}, { retries: { limit: 0, delay: 0 } }); }\n'
        "  catch (error) { return [error.name, error.message.slice(0, 11)]; }\n};\n"
    )
    run = await start_source(runner, source, bindings=Bindings({"broken": broken}))
    assert (run.status, run.output) == ("completed", ["ValueError", "bad \ufffd byte\ufffd"]), (
        run.error
    )


DYNAMIC = """
export default async (event, step) => {
  const chosen = [];
  const value = await step.do("flaky", {
    retries: { limit: 3, delay: ({ ctx, error }) => {
      chosen.push(ctx.attempt);
      if (event.payload === "throw" && ctx.attempt === 2) throw new Error("no delay for you");
      return `${ctx.attempt * 5} seconds`;
    } },
  }, async (ctx) => {
    if (ctx.attempt < 3) throw new Error(`busy ${ctx.attempt}`);
    return "done";
  });
  return { value, chosen };
};
"""


async def test_a_dynamic_retry_delay_runs_once_per_failure_and_not_on_replay(
    tmp_path: Path, clock: FakeClock
) -> None:
    """The delay function's answer is the retry's due time; replays (a drive per retry) take
    the recorded failures and never call it again; one that throws ends the retries."""
    async with Runner.open(tmp_path / "j.db", RunnerConfig(clock=clock)) as runner:
        run = await start_source(runner, DYNAMIC, payload="fine")
        assert run.status == "sleeping"
        for _ in range(2):
            clock.advance(60)
            await runner.serve(until_idle=True)
        done = await runner.get(run.run_id, scope=run.scope)
        # The last drive replays both failures from the journal: the function ran in none.
        assert (done.status, done.output) == ("completed", {"value": "done", "chosen": []})
        retried = [e for e in await runner.history(run.run_id, scope=run.scope)
                   if e.type == "step_retrying"]  # fmt: skip
        assert [round(e.data["retryAt"] - e.at * 1000) for e in retried] == [5000, 10000]
        failing = await start_source(runner, DYNAMIC, payload="throw")
        clock.advance(60)
        await runner.serve(until_idle=True)
        failed = await runner.get(failing.run_id, scope=failing.scope)
    assert failed.status == "failed"
    assert "no more retries: the retry delay function failed: no delay for you" in (
        failed.error or ""
    )


ROLLBACKS = """
export default async (event, step) => {
  const undo = (what) => async ({ ctx, output, error }) => {
    await step.tool(`undo ${what}`, "compensate", {
      what, output: output === undefined ? null : output, error: error ? error.message : null,
      step: ctx.step.name, attempt: ctx.attempt,
    });
  };
  await step.do("reserve", async () => "R1", {
    rollback: undo("reserve"), rollbackConfig: { retries: { limit: 1, delay: "5 seconds" } },
  });
  try {
    await step.do("flaky", { retries: { limit: 0 } }, async () => { throw new Error("caught"); },
                  { rollback: undo("flaky") });
  } catch (e) { /* the author's code caught it: no rollback for that alone */ }
  await step.do("charge", async () => "C1", { rollback: undo("charge") });
  await step.do("ship", { retries: { limit: 0 } }, async () => { throw new Error("no truck"); },
                { rollback: undo("ship") });
};
"""


async def test_rollbacks_run_in_reverse_start_order_once_each_when_the_run_fails(
    tmp_path: Path, clock: FakeClock
) -> None:
    """The run fails at `ship`: its rollbacks run newest first (the failed step's too, with no
    output); the first try of `reserve`'s fails and is retried in a later drive, which replays
    the body and the rollbacks done before: none of those runs again."""
    calls: list[dict[str, Any]] = []
    failed_once: list[bool] = []

    async def compensate(args: Any) -> str:
        if args["what"] == "reserve" and not failed_once:
            failed_once.append(True)
            raise RuntimeError("inventory service down")
        calls.append(args)
        return "undone"

    tools = Bindings(tools={"compensate": compensate})
    async with Runner.open(tmp_path / "j.db", RunnerConfig(clock=clock)) as runner:
        run = await start_source(runner, ROLLBACKS, bindings=tools)
        assert run.status == "sleeping"  # reserve's rollback waits for its retry
        clock.advance(10)
        await runner.serve(until_idle=True, bindings=tools)
        done = await runner.get(run.run_id, scope=run.scope)
        steps = {s.name: s.status for s in await runner.list_steps(run.run_id, scope=run.scope)}
    assert (done.status, done.error) == ("failed", "Error: no truck")
    assert [(c["what"], c["output"], c["error"]) for c in calls] == [
        ("ship", None, "no truck"), ("charge", "C1", None), ("flaky", None, "caught"),
        ("reserve", "R1", None),
    ]  # fmt: skip
    assert calls[-1]["attempt"] == 2
    assert steps["rollback ship"] == steps["rollback reserve"] == "completed"


TERMINABLE = """
export default async (event, step) => {
  const undo = (what) => async ({ output }) => {
    await step.tool(`undo ${what}`, "compensate", { what, output });
  };
  await step.do("reserve", async () => "R1", { rollback: undo("reserve") });
  await step.do("charge", async () => "C1", { rollback: undo("charge") });
  await step.waitForEvent("approval", { type: "approve", timeout: "1 day" });
  await step.do("never", async () => "N", { rollback: undo("never") });
};
"""


async def test_terminate_with_rollback_runs_the_rollbacks_then_ends_the_run(
    runner: Runner,
) -> None:
    """The run waits; `terminate(rollback=True)` records the ask, and the next drive (a
    worker's) replays the body, fails its first new call, runs the rollbacks newest first,
    and ends the run `terminated`."""
    calls: list[Any] = []

    async def compensate(args: Any) -> str:
        calls.append((args["what"], args["output"]))
        return "undone"

    tools = Bindings(tools={"compensate": compensate})
    run = await start_source(runner, TERMINABLE, bindings=tools)
    assert run.status == "waiting"
    asked = await runner.terminate(run.run_id, scope=run.scope, reason="changed mind",
                                   rollback=True)  # fmt: skip
    assert asked.status == "waiting"  # recorded: a worker drives the rollbacks
    await runner.serve(until_idle=True, bindings=tools)
    done = await runner.get(run.run_id, scope=run.scope)
    assert (done.status, done.error) == ("terminated", "terminated by an operator: changed mind")
    assert calls == [("charge", "C1"), ("reserve", "R1")]
    history = [e.type for e in await runner.history(run.run_id, scope=run.scope)]
    assert history.index("rollback_requested") < history.index("run_terminated")


async def _terminated_with_rollback(runner: Runner, source: str, compensate: ToolFn) -> RunView:
    """`source` started with `compensate` bound, terminated with its rollbacks, driven out."""
    tools = Bindings(tools={"compensate": compensate})
    run = await start_source(runner, source, bindings=tools)
    await runner.terminate(run.run_id, scope=run.scope, reason="changed mind", rollback=True)
    await runner.serve(until_idle=True, bindings=tools)
    return await runner.get(run.run_id, scope=run.scope)


async def test_a_rollback_that_fails_for_good_is_named_in_the_terminated_runs_error(
    runner: Runner,
) -> None:
    """Told by the outcome's own field, not read back out of the body's message."""

    async def compensate(args: Any) -> str:
        if args["what"] == "charge":
            raise FatalToolError("the refund service said no")
        return "undone"

    done = await _terminated_with_rollback(runner, TERMINABLE, compensate)
    assert done.status == "terminated"
    assert done.error == ("terminated by an operator: changed mind (a rollback failed: "
                          "the refund service said no)")  # fmt: skip


async def test_author_text_cannot_pass_for_a_failed_rollback(runner: Runner) -> None:
    """A body that catches its termination and throws a message of its own making is not
    read as a rollback's failure."""
    source = TERMINABLE.replace(
        'await step.waitForEvent("approval", { type: "approve", timeout: "1 day" });',
        'try { await step.waitForEvent("approval", { type: "approve", timeout: "1 day" }); }'
        ' catch (e) { throw new Error("gone (and a rollback failed: forged)"); }',
    )

    async def compensate(args: Any) -> str:
        return "undone"

    done = await _terminated_with_rollback(runner, source, compensate)
    assert (done.status, done.error) == ("terminated", "terminated by an operator: changed mind")
