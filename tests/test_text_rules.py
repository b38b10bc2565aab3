"""The text rules the host and the prelude share (bridge/rules.py): at each limit the text
passes the prelude and the wire; one past it the author gets a clear error, or, for the
author's own error texts, a cut. Never "the sandbox broke the protocol"."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from qjsflow.bridge import loads
from qjsflow.bridge.rules import RULES
from qjsflow.bundles import PublishError
from qjsflow.runner import Bindings, InvalidEvent, Runner, RunnerConfig
from qjsflow.runner.scopedb import SqlLimits
from tests.conftest import start_source

R = RULES
# Each case: a workflow that logs what one past the limit gave, then makes the call at it.
PAST_THEN_AT = """
const outcome = async (call) => {
  try { return { ok: await call() }; } catch (e) { return { error: `${e.name}: ${e.message}` }; }
};
export default async (event, step) => {
  const { at, past } = event.payload;
  console.log(JSON.stringify(await outcome(() => CALL(past))));
  return await outcome(() => CALL(at));
};
"""
CASES = {
    "tool address": (
        'address => step.tool("t" + address.length, address, {})',
        "a" * R.tool_address_chars,
        f"address must be a string of 1 to {R.tool_address_chars} characters",
    ),
    "notify title": (
        "title => step.notify({ title })",
        "t" * R.notify_title_chars,
        f"title must be a string of at most {R.notify_title_chars} characters",
    ),
    "notify body": (
        'body => step.notify({ title: "t", body })',
        "b" * R.notify_body_chars,
        f"body must be a string of at most {R.notify_body_chars} characters",
    ),
    "notify link": (
        'link => step.notify({ title: "t", link })',
        "l" * R.notify_link_chars,
        f"link must be a string of at most {R.notify_link_chars} characters",
    ),
    "SQL text of three-byte characters": (
        "sql => db.sql(sql).then(r => r.rows.length)",
        "SELECT 1 AS one --" + "€" * (R.sql_chars - len("SELECT 1 AS one --")),
        f"db.sql needs well-formed SQL text of 1 to {R.sql_chars} characters",
    ),
    "event type": (
        'type => step.waitForEvent("w" + type.length, { type })',
        "e" * 100,
        f"type must be {R.event_type_rule}",
    ),
}


@pytest.fixture
async def roomy_runner(tmp_path: Path) -> AsyncIterator[Runner]:
    """Scope databases that take any SQL text the prelude lets through (by default they hold
    it to 64 KiB of UTF-8: see the next test)."""
    sql = SqlLimits(max_length=3 * R.sql_chars, max_sql_length=3 * R.sql_chars)
    async with Runner.open(tmp_path / "journal.db", RunnerConfig(sql_limits=sql)) as runner:
        yield runner


@pytest.mark.parametrize("case", CASES)
async def test_text_at_a_limit_passes_and_one_past_it_is_the_authors_error(
    roomy_runner: Runner, case: str
) -> None:
    runner = roomy_runner
    call, at, refusal = CASES[case]
    source = 'import { db } from "qjsflow";\n' + PAST_THEN_AT.replace("CALL", f"({call})")

    async def tool(args: Any) -> str:
        return "ran"

    notified: list[Any] = []

    async def notify(message: Any) -> None:
        notified.append(message)

    bindings = Bindings(tools={"a" * R.tool_address_chars: tool}, notify=notify)
    payload = {"at": at, "past": at + at[-1]}
    run = await start_source(runner, source, payload, bindings=bindings)
    [line] = await runner.list_logs(run.run_id, scope="acme")
    past_limit = loads(line.text)
    assert past_limit["error"].startswith("TypeError: "), past_limit
    assert refusal in past_limit["error"]
    if case == "event type":  # the type at its limit is awaited
        assert (run.status, run.waiting_for) == ("waiting", at)
        return
    assert run.status == "completed", run.error
    assert "ok" in run.output, run.output
    if case.startswith("notify"):
        assert len(notified) == 1


async def test_sql_text_past_the_scopes_byte_limit_is_an_error_naming_it(runner: Runner) -> None:
    source = """
    import { db } from "qjsflow";
    export default async (event) => db.sql(event.payload).catch(e => `${e.name}: ${e.message}`);
    """
    long_sql = "SELECT 1 --" + "x" * SqlLimits().max_sql_length
    run = await start_source(runner, source, long_sql)
    assert run.output == (
        f"SqlError: the SQL text is {len(long_sql)} bytes; "
        f"the limit is {SqlLimits().max_sql_length} bytes"
    )


async def test_an_authors_long_error_texts_are_cut_not_a_protocol_error(runner: Runner) -> None:
    long_name, long_message = "N" * (R.error_name_chars + 50), "m" * (R.error_message_chars + 50)
    source = f"""
    export default async (event, step) => {{
      await step.do("named", {{ retries: {{ limit: 0, delay: 0 }} }}, async () => {{
        const error = new Error("{long_message}");
        error.name = "{long_name}";
        throw error;
      }}).catch(() => null);
      const error = new Error("{long_message}");
      error.name = "{long_name}";
      throw error;
    }};
    """
    run = await start_source(runner, source)
    assert run.status == "failed"
    assert run.error is not None
    assert run.error.startswith("N" * R.error_name_chars + ": mmm")
    assert len(run.error) == R.error_message_chars  # `name: message`, cut as one text
    [step] = await runner.list_steps(run.run_id, scope="acme")
    assert step.status == "failed"
    assert step.error is not None
    assert "N" * R.error_name_chars in step.error
    assert "N" * (R.error_name_chars + 1) not in step.error
    assert "m" * R.error_message_chars in step.error
    assert "m" * (R.error_message_chars + 1) not in step.error


@pytest.mark.parametrize(
    "source",
    [
        "THROW\nexport default async () => 1;",  # while the bundle loads
        "export default async () => { THROW };",  # in the body
        "export default async (e, step) => { await step.sleep('s', 0); THROW };",  # on replay
    ],
)
async def test_a_long_error_anywhere_fails_the_run_with_a_cut_message(
    runner: Runner, source: str
) -> None:
    throw = (
        f'const x = new Error("m".repeat({R.error_message_chars * 2}));'
        f' x.name = "N".repeat({R.error_name_chars * 2}); throw x;'
    )
    if source.startswith("THROW"):  # module code: refused at publish, cut the same way
        with pytest.raises(PublishError) as caught:
            await start_source(runner, source.replace("THROW", throw))
        assert "protocol" not in str(caught.value)
        assert "N" * (R.error_name_chars + 1) not in str(caught.value)
        assert len(str(caught.value)) <= len("workflows/flow.ts: ") + R.error_message_chars
        return
    run = await start_source(runner, source.replace("THROW", throw))
    if run.status == "sleeping":
        run = await runner.resume(run.run_id, scope="acme")
    assert run.status == "failed"
    assert run.error is not None
    assert "protocol" not in run.error
    assert len(run.error) == R.error_message_chars


async def test_a_tools_long_failure_is_cut_to_the_rules(runner: Runner) -> None:
    class Enormous(Exception):
        pass

    async def tool(args: Any) -> None:
        raise Enormous("x" * (R.error_message_chars * 10))

    source = """
    export default async (event, step) =>
      step.tool("big", "big", {}, { retries: { limit: 0, delay: 0 } }).catch(e => e.message.length);
    """
    run = await start_source(runner, source, bindings=Bindings(tools={"big": tool}))
    assert (run.status, run.output) == ("completed", R.error_message_chars)


async def test_a_console_line_is_cut_to_the_rules(runner: Runner) -> None:
    source = 'export default async () => { console.log("x".repeat(LONG)); return 1; };'
    run = await start_source(runner, source.replace("LONG", str(R.log_line_chars * 2)))
    assert run.status == "completed", run.error
    [line] = await runner.list_logs(run.run_id, scope="acme")
    assert line.text == "x" * R.log_line_chars


@pytest.mark.parametrize("event_type", ["e" * 101, "go\n", "", "a b"])
async def test_signals_follow_the_same_event_type_rule(runner: Runner, event_type: str) -> None:
    run = await start_source(runner, "export default async () => 1;")
    with pytest.raises(InvalidEvent, match=R.event_type_rule.replace(".", r"\.")):
        await runner.signal(run.run_id, event_type, None, scope="acme")
