"""The step API through the real executor: op sequences, keys, replay, determinism, values."""

from __future__ import annotations

import orjson
import pytest

from qjsflow.bridge.limits import Limits
from qjsflow.bridge.types import (
    Completed,
    Failed,
    JournalEntry,
    Log,
    StepBegin,
    StepCheck,
    StepRecord,
    StepSleep,
    StepWaitForEvent,
    Suspended,
)
from qjsflow.sandbox import ExecutorPool
from qjsflow.sandbox.bytecode import PreludeLoader
from qjsflow.sandbox.executor import PRELUDE, Drive, Prepared
from tests.conftest import bundle_of, drive_read, fan_out_source
from tests.memory_host import MemoryHost

STORY = """
export default async function run(event, step) {
  const first = await step.do("first", async (ctx) => ({ n: event.payload.n, attempt: ctx.attempt }));
  const [a, b] = await Promise.all([
    step.do("twin", async () => "left"),
    step.do("twin", async () => "right"),
  ]);
  const loop = [];
  for (let i = 0; i < 3; i++) loop.push(await step.do("item", async () => i * 10));
  console.log("before sleep", Date.now(), Math.random());
  await step.sleep("nap", "2 seconds");
  const approval = await step.waitForEvent("approval", { type: "approve", timeout: "1 hour" });
  return { first, a, b, loop, by: approval.payload.by, when: approval.timestamp instanceof Date,
           now: Date.now(), random: Math.random() };
}
"""


def _summary(host: MemoryHost) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for op in host.ops:
        match op:
            case StepBegin(step=step, count=count):
                out.append(("begin", step, str(count)))
            case StepCheck(step=step, count=count):
                out.append(("check", step, str(count)))
            case StepRecord(step=step, count=count, value=value, begun_with=begun):
                kind = "record" if begun is None else "begin+record"  # its begin inside it
                out.append((kind, step, str(count), str(value)))
            case StepSleep(step=step):
                out.append(("sleep", step))
            case StepWaitForEvent(step=step, type=event_type):
                out.append(("wait", step, event_type))
            case Log(text=text):
                out.append(("log", text.split(" ")[0]))
    return out


async def test_op_sequence_keys_and_replay(pool: ExecutorPool) -> None:
    code = await bundle_of(STORY)
    host = MemoryHost()
    outcome = await pool.drive(host.request(code, '{"n": 7}'), host)
    assert isinstance(outcome, Suspended)
    assert [m.kind for m in outcome.markers] == ["sleep"]
    # Pure steps are settled in the sandbox and reach the host with the next op that needs an
    # answer; each begin goes inside its record.
    assert _summary(host) == [
        ("begin+record", "first", "1", '{"n":7,"attempt":1}'),
        ("begin+record", "twin", "1", '"left"'),
        ("begin+record", "twin", "2", '"right"'),
        ("begin+record", "item", "1", "0"),
        ("begin+record", "item", "2", "10"),
        ("begin+record", "item", "3", "20"),
        ("log", "before"),
        ("sleep", "nap"),
    ]
    assert host.keys() == ["do:1:first", "do:1:twin", "do:2:twin"] + [
        f"do:{i}:item" for i in (1, 2, 3)
    ]
    first_log = host.logs[0]

    # Second drive: the sleep is due; no step body runs again and the log is not repeated.
    host.ops.clear()
    host.sleeps_due = True
    outcome = await pool.drive(host.request(code, '{"n": 7}'), host)
    assert isinstance(outcome, Suspended)
    assert outcome.markers[0].event == "approve"
    assert _summary(host) == [("sleep", "nap"), ("wait", "approval", "approve")]
    assert host.logs == [first_log]

    # Third drive: the event arrived; the run completes from the journal.
    host.ops.clear()
    host.events["approve"] = ['{"by": "maria"}']
    outcome = await pool.drive(host.request(code, '{"n": 7}'), host)
    assert isinstance(outcome, Completed)
    output = orjson.loads(outcome.output)
    assert output["a"] == "left"
    assert output["b"] == "right"
    assert output["loop"] == [0, 10, 20]
    assert output["by"] == "maria"
    assert output["when"] is True
    assert [type(op).__name__ for op in host.ops] == ["StepWaitForEvent"]

    # A pure replay reproduces the clock and the random numbers the first execution saw.
    host.ops.clear()
    again = await pool.drive(host.request(code, '{"n": 7}'), host)
    assert isinstance(again, Completed)
    assert orjson.loads(again.output) == output
    assert host.ops == []


DETERMINISM = """
export default async function run(event, step) {
  const seen = [Date.now(), Math.random()];
  await step.do("one", async () => Math.random());
  seen.push(Date.now(), Math.random(), new Date().getTime());
  await step.sleep("pause", 10);
  seen.push(Date.now(), Math.random());
  return { seen, weak: typeof WeakRef, fin: typeof FinalizationRegistry,
           perf: typeof performance, sab: typeof SharedArrayBuffer, atomics: typeof Atomics };
}
"""


async def test_clock_and_random_replay_identically(pool: ExecutorPool) -> None:
    code = await bundle_of(DETERMINISM)
    host = MemoryHost(sleeps_due=True)
    first = await pool.drive(host.request(code), host)
    assert isinstance(first, Completed)
    replay = await pool.drive(host.request(code), host)
    assert isinstance(replay, Completed)
    assert first.output == replay.output
    output = orjson.loads(first.output)
    seen = output["seen"]
    assert seen[0] == 999_000  # the run's creation time before any step
    assert seen[2] == host.entries[0].at_ms  # the recorded time of the step it passed
    assert seen[2] == seen[4]
    assert seen[5] == host.entries[1].at_ms
    assert len({seen[1], seen[3], seen[6]}) == 3
    assert {output[k] for k in ("weak", "fin", "perf", "sab", "atomics")} == {"undefined"}


BARE_BODY = """
export default async (event, step) =>
  step.do("this", async function () { return [this === undefined ? "undefined" : this === globalThis ? "global" : "other", arguments.length]; });
"""


async def test_a_step_body_is_called_bare_given_its_context_alone(pool: ExecutorPool) -> None:
    """Nothing of the prelude's reaches a body as `this`: it is called as a function, with the
    attempt's context its one argument."""
    host = MemoryHost()
    outcome = await pool.drive(host.request(await bundle_of(BARE_BODY)), host)
    assert isinstance(outcome, Completed), outcome
    this, arguments = orjson.loads(outcome.output)
    assert this in ("undefined", "global")  # as any bare call: the bundle's code is sloppy
    assert arguments == 1


SEEDED = """
export default async (event, step) => {
  await step.do("a", async () => 1);
  const root = Math.random();
  const inner = await step.do("b", async () => Math.random());
  return { root, inner };
};
"""


def _first_draw(text: str) -> float:
    """The first `Math.random()` of a stream seeded from `text`: cyrb128 seeding sfc32, as
    10-run-state.js draws it."""
    mask = 0xFFFFFFFF

    def imul(a: int, b: int) -> int:
        return (a * b) & mask

    h1, h2, h3, h4 = 1779033703, 3144134277, 1013904242, 2773480762
    for char in text:
        k = ord(char)
        h1 = h2 ^ imul(h1 ^ k, 597399067)
        h2 = h3 ^ imul(h2 ^ k, 2869860233)
        h3 = h4 ^ imul(h3 ^ k, 951274213)
        h4 = h1 ^ imul(h4 ^ k, 2716044179)
    h1 = imul(h3 ^ (h1 >> 18), 597399067)
    h2 = imul(h4 ^ (h2 >> 22), 2869860233)
    h3 = imul(h1 ^ (h3 >> 17), 951274213)
    h4 = imul(h2 ^ (h4 >> 19), 2716044179)
    a, b, d = h1 ^ h2 ^ h3 ^ h4, h2 ^ h1, h4 ^ h1
    return ((a + b + d) & mask) / 2**32


async def test_a_scopes_random_stream_is_seeded_from_the_same_text_in_every_version(
    pool: ExecutorPool,
) -> None:
    """A run's replays after an upgrade must draw what its first drives drew: the seed's text
    is the run, the key last reached (and an attempt's number) and the scope's clock, however
    and whenever the prelude makes it."""
    host = MemoryHost()
    outcome = await pool.drive(host.request(await bundle_of(SEEDED)), host)
    assert isinstance(outcome, Completed), outcome
    drawn = orjson.loads(outcome.output)
    assert drawn["root"] == _first_draw("run-1\u0000do:1:a\u0000999000")
    assert drawn["inner"] == _first_draw("run-1\u0000do:1:b\u00001\u0000999000")


VALUES = r"""
export default async function run(event, step) {
  const made = await step.do("values", async () => ({
    u: undefined, d: new Date(86400000), m: new Map([["k", new Set([1, 2n ** 70n])]]),
    n: [NaN, Infinity, -Infinity, -0], big: -(2n ** 65n), bytes: new Uint8Array([0, 255, 7]),
    floats: new Float64Array([1.5, -2]), re: /a+b/gi, $t: "not a tag", nul: "a\u0000b",
    lone: "x\ud800y", wide: "\u4e2d\u6587\ud83d\ude00".repeat(20000), err: new TypeError("bad"),
  }));
  const checks = {
    u: made.u === undefined && "u" in made,
    d: made.d instanceof Date && made.d.getTime() === 86400000,
    m: made.m instanceof Map && made.m.get("k") instanceof Set && made.m.get("k").has(2n ** 70n),
    n: Number.isNaN(made.n[0]) && made.n[1] === Infinity && made.n[2] === -Infinity && Object.is(made.n[3], -0),
    big: made.big === -(2n ** 65n),
    bytes: made.bytes instanceof Uint8Array && made.bytes.join() === "0,255,7",
    floats: made.floats instanceof Float64Array && made.floats.join() === "1.5,-2",
    re: made.re instanceof RegExp && made.re.flags === "gi" && made.re.source === "a+b",
    tag: made.$t === "not a tag",
    nul: made.nul === "a\u0000b" && made.nul.length === 3,
    lone: made.lone === "x\ud800y",
    wide: made.wide.length === 80000 && made.wide.startsWith("\u4e2d\u6587\ud83d\ude00"),
    err: made.err instanceof Error && made.err.name === "TypeError" && made.err.message === "bad",
  };
  return checks;
}
"""


async def test_values_round_trip_through_the_journal(pool: ExecutorPool) -> None:
    code = await bundle_of(VALUES)
    host = MemoryHost()
    outcome = await pool.drive(host.request(code), host)
    assert isinstance(outcome, Completed), outcome
    checks = orjson.loads(outcome.output)
    assert checks == dict.fromkeys(checks, True)
    recorded = host.entries[0].value
    assert recorded is not None
    assert recorded.isascii()
    replayed = await pool.drive(host.request(code), host)
    assert isinstance(replayed, Completed)
    assert replayed.output == outcome.output


ECHO = """
export default async (event, step) => {
  const again = await step.do("again", async () => event.payload.text + "\\n\\u2028" + "é");
  return { input: event.payload.text, again };
};
"""


async def test_a_request_whose_text_holds_line_breaks_reaches_the_prelude_whole(
    pool: ExecutorPool,
) -> None:
    """The executor passes a drive's request on as it came, after the header's first line
    break: line breaks in the run's input and its journal (and any non-ASCII text) are
    escaped or kept whole, never read as the header's end."""
    code = await bundle_of(ECHO)
    text = "line one\nline two\r\n\u2028 \u00e9 \U0001f600"
    host = MemoryHost()
    outcome = await pool.drive(host.request(code, orjson.dumps({"text": text}).decode()), host)
    assert isinstance(outcome, Completed), outcome
    assert host.entries[0].value is not None
    assert "\n" not in host.entries[0].value  # recorded as JSON: escaped
    replayed = await pool.drive(host.request(code, orjson.dumps({"text": text}).decode()), host)
    assert isinstance(replayed, Completed), replayed
    assert orjson.loads(replayed.output) == {"input": text, "again": text + "\n\u2028é"}
    assert replayed.output == outcome.output


WIDE = "\u00e9 \u20ac \u2028 \U0001f600"
WIDE_TEXT = """
export default async (event, step) => {
  const wide = "\\u00e9 \\u20ac \\u2028 \\u{1F600}";
  console.log(wide);
  const first = await step.do(wide, async () => wide);
  return { first, wide };
};
"""


async def test_frames_are_ascii_whatever_the_text_past_ascii_in_them() -> None:
    """Only ASCII crosses from JS to Python (DESIGN.md, Lockdown): what lies past ASCII in a
    step's name, a log line, a value or the output reaches the host escaped."""
    code = await bundle_of(WIDE_TEXT)
    drive = Drive(
        drive_read(MemoryHost().request(code)), code, -1, Prepared(PreludeLoader(PRELUDE))
    )
    payload = drive.run()
    assert payload.isascii()
    assert b"\\ud83d\\ude00" in payload  # U+1F600 as a surrogate pair
    frame = orjson.loads(payload)
    assert frame["outcome"]["status"] == "completed", frame
    assert orjson.loads(frame["outcome"]["output"]) == {"first": WIDE, "wide": WIDE}
    ops = [envelope["op"] for envelope in frame["ops"]]
    assert [op["step"] for op in ops if op["op"] == "step.record"] == [WIDE]
    assert [op["text"] for op in ops if op["op"] == "log"] == [WIDE]


@pytest.mark.parametrize("last", ["v", "\u00e9"])
async def test_a_text_near_the_value_limit_is_looked_through_and_escaped(
    pool: ExecutorPool, last: str
) -> None:
    """Every value and frame is looked through for text past ASCII before it is escaped: the
    look must hold for the longest text a value may be (a look by a regex that kept a place to
    go back to for each character ran a drive's memory out, 32 MiB, near a megabyte)."""
    source = """export default async (event, step) => {
      const big = await step.do("big", async () => "v".repeat(1048000) + "LAST");
      return big.length;
    };""".replace("LAST", "v" if last == "v" else "\\u00e9")
    host = MemoryHost()
    limits = Limits(memory_bytes=32 * 2**20)
    outcome = await pool.drive(host.request(await bundle_of(source), limits=limits), host)
    assert isinstance(outcome, Completed), outcome
    assert orjson.loads(outcome.output) == 1_048_001
    [entry] = host.entries
    assert entry.value is not None
    assert entry.value.isascii()
    assert orjson.loads(entry.value) == "v" * 1_048_000 + last


@pytest.mark.parametrize("size", [10, 600, 5_000, 200_000])
@pytest.mark.parametrize("with_ops", [False, True])
async def test_every_answer_of_the_prelude_reaches_the_executor_as_a_flat_string(
    size: int, with_ops: bool
) -> None:
    """A drive's end is made by concatenation, which QuickJS may keep as a rope past a few
    hundred characters; the binding cannot convert one. Whatever the sizes, the executor gets
    its text (and before every answer was made flat, some outputs stopped the executor)."""
    step = 'await step.do("s", async () => "v".repeat(SIZE));' if with_ops else ""
    source = f"export default async (event, step) => {{ {step} return 'o'.repeat(SIZE); }};"
    code = await bundle_of(source.replace("SIZE", str(size)))
    drive = Drive(
        drive_read(MemoryHost().request(code)), code, -1, Prepared(PreludeLoader(PRELUDE))
    )
    frame = orjson.loads(drive.run())
    assert frame["outcome"]["status"] == "completed", frame["outcome"]
    assert orjson.loads(frame["outcome"]["output"]) == "o" * size
    assert len(frame.get("ops", [])) == (1 if with_ops else 0)


@pytest.mark.parametrize(
    ("expression", "problem"),
    [
        ("() => 1", "holds a function"),
        ("Symbol('s')", "holds a symbol"),
        ("(() => { const a = {}; a.self = a; return a; })()", "holds a cycle"),
        ("Promise.resolve(1).then(() => ({ p: Promise.resolve(2) }))", "holds a Promise"),
        # Given Object.prototype, still refused (plain objects skip only the stored kinds' checks)
        ("({ p: Object.setPrototypeOf(Promise.resolve(2), Object.prototype) })", "holds a Promise"),
        (
            "({ d: Object.setPrototypeOf(new DataView(new ArrayBuffer(2)), Object.prototype) })",
            "holds a DataView",
        ),
        ("'x'.repeat(1024 * 1024 + 1)", "larger than the limit of 1048576 bytes"),
        (
            "(() => { let v = 1; for (let i = 0; i < 4000; i++) v = [v]; return v; })()",
            "nested deeper than 64 levels",
        ),
    ],
)
async def test_unstorable_results_fail_naming_the_step(
    pool: ExecutorPool, expression: str, problem: str
) -> None:
    source = f'export default async (e, step) => step.do("bad", async () => {expression});'
    host = MemoryHost()
    outcome = await pool.drive(host.request(await bundle_of(source)), host)
    assert isinstance(outcome, Failed)
    assert 'the result of step "bad" (#1)' in outcome.message
    assert problem in outcome.message
    assert not any(isinstance(op, StepRecord) for op in host.ops)


TAMPER = """
export default async function run(event, step) {
  const attempts = [];
  const tamper = [
    () => { JSON.stringify = () => '[{"id":1,"op":{"op":"step.sleep","step":"forged","count":1,"ms":1}}]'; },
    () => { JSON.parse = () => ({ forged: true }); },
    () => { Promise.prototype.then = function () { return this; }; },
    () => { Array.prototype.push = function () { return 0; }; },
    () => { step.do = async () => "forged"; },
    () => { globalThis.JSON = { stringify: () => "forged", parse: () => 1 }; },
    () => { Object.defineProperty(Object.prototype, "then", { get() { return (r) => r("x"); } }); },
    // Plain methods are not frozen (only namespaces, constructors and prototypes are): their
    // own new properties must not reach the prelude either.
    () => { JSON.stringify.call = () => "forged"; JSON.stringify.apply = () => "forged"; },
    () => { Reflect.apply.call = () => "forged"; Map.prototype.get.call = () => undefined; },
    () => { Function.prototype.call = () => "forged"; },
  ];
  for (const change of tamper) {
    try { change(); attempts.push("changed"); } catch (error) { attempts.push(error.name); }
  }
  const a = await step.do("a", async () => ({ v: 1 }));
  const b = await step.do("b", async () => [a.v, 2]);
  const list = [];
  list.push(1);
  return { attempts, b, json: JSON.stringify({ k: [1] }), list, thenable: ({}).then === undefined };
}
"""
PLAIN = """
export default async function run(event, step) {
  const a = await step.do("a", async () => ({ v: 1 }));
  const b = await step.do("b", async () => [a.v, 2]);
  return { b };
}
"""


async def test_tampering_cannot_forge_drop_or_reorder_messages(pool: ExecutorPool) -> None:
    tampered, plain = MemoryHost(), MemoryHost()
    outcome = await pool.drive(tampered.request(await bundle_of(TAMPER)), tampered)
    reference = await pool.drive(plain.request(await bundle_of(PLAIN)), plain)
    assert isinstance(outcome, Completed), outcome
    assert isinstance(reference, Completed)
    assert tampered.ops == plain.ops
    output = orjson.loads(outcome.output)
    assert output["b"] == [1, 2]
    # Sloppy-mode assignments to frozen intrinsics are ignored, defineProperty throws; either
    # way nothing changed.
    assert set(output["attempts"][:6]) <= {"changed", "TypeError"}
    assert output["attempts"][6] == "TypeError"
    assert output["attempts"][7:9] == ["changed", "changed"]  # allowed, and harmless
    assert output["attempts"][9] in {"changed", "TypeError"}  # a frozen prototype: ignored
    assert output["json"] == '{"k":[1]}'
    assert output["list"] == [1]
    assert output["thenable"] is True


CONFIG = """
export default async function run(event, step) {
  const seen = [];
  await step.do("defaults", async (ctx) => { seen.push(ctx.config, ctx.step); });
  await step.do("partial", { retries: { limit: 2 } }, async (ctx) => { seen.push(ctx.config); });
  const errors = [];
  for (const bad of [{ retries: { limit: 1, jitter: true } }, { timeout: "soon" }, { retries: { backoff: "random" } }]) {
    try { await step.do("bad", bad, async () => 1); } catch (error) { errors.push(error.message); }
  }
  for (const duration of ["5 fortnights", "-1 second", -5, "400 days", null]) {
    try { await step.sleep("s", duration); } catch (error) { errors.push(error.message); }
  }
  try { await step.do("", async () => 1); } catch (error) { errors.push(error.message); }
  return { seen, errors };
}
"""


async def test_config_defaults_merging_and_validation(pool: ExecutorPool) -> None:
    host = MemoryHost()
    outcome = await pool.drive(host.request(await bundle_of(CONFIG)), host)
    assert isinstance(outcome, Completed), outcome
    result = orjson.loads(outcome.output)
    retries = {"limit": 5, "delay": 10000, "backoff": "exponential"}
    assert result["seen"][0] == {"retries": retries, "timeout": 600000}
    assert result["seen"][1] == {"name": "defaults", "count": 1}
    assert result["seen"][2] == {"retries": {**retries, "limit": 2}, "timeout": 600000}
    errors = result["errors"]
    assert 'has an unknown key "jitter"' in errors[0]
    assert '"soon" is not a duration' in errors[1]
    assert "backoff must be" in errors[2]
    assert '"5 fortnights" is not a duration' in errors[3]
    assert '"-1 second" is not a duration' in errors[4]
    assert "from 0 ms to 365 days" in errors[5]
    assert "from 0 ms to 365 days" in errors[6]
    assert "must be a number of milliseconds" in errors[7]
    assert "name must be a string of 1 to 256 characters" in errors[8]


async def test_class_style_and_step_errors(pool: ExecutorPool) -> None:
    source = """
    import { WorkflowEntrypoint, NonRetryableError } from "cloudflare:workers";
    export class Flow extends WorkflowEntrypoint {
      async run(event, step) {
        try {
          await step.do("fatal", async () => { throw new NonRetryableError("no way"); });
        } catch (error) {
          return { caught: error.message, name: error.name, env: typeof this.env.db.sql };
        }
      }
    }
    """
    host = MemoryHost()
    outcome = await pool.drive(host.request(await bundle_of(source, "flow.js")), host)
    assert isinstance(outcome, Completed), outcome
    assert orjson.loads(outcome.output) == {
        "caught": "no way",
        "name": "NonRetryableError",
        "env": "function",
    }
    record = next(op for op in host.ops if isinstance(op, StepRecord))
    assert record.error is not None
    assert record.error.retryable is False


async def test_awaiting_nothing_fails_clearly(pool: ExecutorPool) -> None:
    source = "export default async () => { await new Promise(() => {}); };"
    host = MemoryHost()
    outcome = await pool.drive(host.request(await bundle_of(source)), host)
    assert isinstance(outcome, Failed)
    assert "awaited something that can never resolve" in outcome.message


FIFTY_THEN_WAIT = """
export default async (event, step) => {
  let total = 0;
  for (let i = 0; i < 50; i++) total += await step.do("s" + i, async () => i);
  await step.waitForEvent("go", { type: "go" });
  return total;
};
"""


async def test_each_turn_of_a_drive_is_one_call_into_the_prelude(pool: ExecutorPool) -> None:
    """A turn (a replayed step settled, pure steps settled, ops for the host, the outcome)
    costs the executor one call into the prelude, as much as a step's own work: a replay of
    50 steps makes about 50 calls, not three a step."""
    host = MemoryHost()
    code = await bundle_of(FIFTY_THEN_WAIT)
    first = await pool.drive(host.request(code), host)
    assert isinstance(first, Suspended)
    assert len(host.entries) == 50
    drive, calls = _counted_drive(code, host)
    answered: list[str] = []

    def exchange(ops: str) -> list[object]:  # the wait, answered as the host would
        [wait] = orjson.loads(ops)
        answered.append(wait["op"]["op"])
        return [{"id": wait["id"], "result": {"suspend": "event", "event": "go"}, "at": None}]

    drive.exchange = exchange  # type: ignore[method-assign]
    outcome = orjson.loads(drive.run())
    assert outcome["outcome"]["status"] == "suspended"
    assert outcome["outcome"]["replayed"] == 50
    assert answered == ["step.waitForEvent"]
    assert len(calls) <= 50 + 8, calls


def _counted_drive(code: str, host: MemoryHost) -> tuple[Drive, list[str]]:
    """A drive run in this process, its calls into the prelude counted."""
    drive = Drive(drive_read(host.request(code)), code, -1, Prepared(PreludeLoader(PRELUDE)))
    calls: list[str] = []
    original = drive.call

    def counted(command: str, argument: str = "", what: str = "") -> str:
        calls.append(command)
        return original(command, argument, what)

    drive.call = counted  # type: ignore[method-assign]
    return drive, calls


async def test_new_pure_steps_one_after_another_settle_within_one_turn() -> None:
    """A pure step settles as its result is recorded (nothing before it waits for the host):
    the body goes on in the same run of jobs, so fifty steps in a row cost the executor one
    turn, not one call into the prelude a step."""
    host = MemoryHost()
    code = await bundle_of(
        FIFTY_THEN_WAIT.replace('await step.waitForEvent("go", { type: "go" });', "")
    )
    drive, calls = _counted_drive(code, host)
    outcome = orjson.loads(drive.run())
    assert outcome["outcome"] == {"status": "completed", "output": "1225", "replayed": 0}
    records = [op for op in outcome["ops"] if op["op"]["op"] == "step.record"]
    assert [r["op"]["step"] for r in records] == [f"s{i}" for i in range(50)]
    assert calls.count("next") == 1, calls


async def test_pure_steps_ahead_of_a_call_for_the_host_settle_in_linear_time(
    pool: ExecutorPool,
) -> None:
    """Each pure result, as it is recorded, asks whether the outbox can be settled here; with
    a call for the host at its end it cannot, and the question must not walk the whole outbox
    each time: eight thousand steps ahead of a sleep suspend well within the drive's compute
    limit (walking it for each result took ~5 s for half as many)."""
    host = MemoryHost()
    outcome = await pool.drive(
        host.request(await bundle_of(fan_out_source(8000, then_sleep=True))), host
    )
    assert isinstance(outcome, Suspended), outcome
    assert len(host.entries) == 8000


PURE_BESIDE_REPLAYED = """
export default async (event, step) => {
  const seen = [];
  await Promise.all([
    step.do("old", async () => "old").then(() => seen.push("old")),
    step.do("new", async () => "new").then(() => seen.push("new")),
  ]);
  return seen;
};
"""


async def test_a_new_pure_step_settles_after_the_replayed_steps_waiting_for_their_turn(
    pool: ExecutorPool,
) -> None:
    """Replayed steps come first in the journal, so they settle first: a new pure step beside
    one waits for it (settling at once would let the run see them the other way round, and a
    later replay, in journal order, see them as this drive did not)."""
    host = MemoryHost(entries=[JournalEntry("do:1:old", '"old"', None, 999_500)])
    code = await bundle_of(PURE_BESIDE_REPLAYED)
    outcome = await pool.drive(host.request(code), host)
    assert isinstance(outcome, Completed), outcome
    assert orjson.loads(outcome.output) == ["old", "new"]
    assert host.keys() == ["do:1:old", "do:1:new"]
    replayed = await pool.drive(host.request(code), host)
    assert isinstance(replayed, Completed)
    assert orjson.loads(replayed.output) == ["old", "new"]


TRACES = """
export default async (event, step) => {
  let traces = 0;
  Error.stackTraceLimit = { valueOf() { traces += 1; return 5; } };
  const value = await step.do("plain", async () =>
    ({ a: 1, b: { c: [1, 2] }, d: new Date(0), m: new Map([[1, 2]]), r: /x/g }));
  const during = traces;
  const deep = (n) => (n === 0 ? new Error("x").stack : deep(n - 1));
  const frames = deep(10).split("\\n").filter(Boolean).length;
  return { during, frames, kept: typeof Error.stackTraceLimit, date: value.d instanceof Date,
           map: value.m instanceof Map, regexp: value.r instanceof RegExp };
};
"""


async def test_encoding_a_value_writes_no_stack_traces_and_keeps_the_authors_limit(
    pool: ExecutorPool,
) -> None:
    """Telling a Date or a Map from a plain object takes checks that throw when they fail;
    each thrown error had the engine write a stack trace (reading the author's
    `Error.stackTraceLimit`, and running their code when it is an object). They are made with
    no trace now, and the author's setting is theirs again after."""
    host = MemoryHost()
    outcome = await pool.drive(host.request(await bundle_of(TRACES)), host)
    assert isinstance(outcome, Completed), outcome
    assert orjson.loads(outcome.output) == {
        "during": 0, "frames": 5, "kept": "object", "date": True, "map": True, "regexp": True
    }  # fmt: skip
