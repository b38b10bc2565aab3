"""Retries as Cloudflare authors expect them: a tool inside a step fails the attempt with its
own error and runs again in the next one; a tool no process has bound blocks the run until a
process that binds it drives it."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from qjsflow.bridge import InvalidInput
from qjsflow.bridge.limits import Limits
from qjsflow.bridge.values import SecretRef
from qjsflow.runner import Bindings, Runner, RunnerConfig, StartRunInput
from qjsflow.runner.tenancy.egress import EgressPolicy
from qjsflow.runner.tenancy.environment import ScopeEnvironment, load_environments
from qjsflow.sandbox import pool as pool_module
from tests.conftest import PROJECT_ROOT, FakeClock, past_short_sleeps, start_source
from tests.journal_reads import query
from tests.secrets_scan import assert_no_secret_anywhere

SYNC = """
export default async (event, step) =>
  step.do("sync", { retries: { limit: 2, delay: 0 } }, async (ctx) => {
    const warmed = await step.tool("warm", "cache.warm", {});
    const pushed = await step.tool("push", "crm.push", { attempt: ctx.attempt });
    return { pushed, warmed, attempt: ctx.attempt };
  });
"""


async def test_a_tool_in_a_step_fails_the_attempt_and_runs_again_in_the_next(
    runner: Runner,
) -> None:
    pushes: list[Any] = []
    warms: list[Any] = []

    async def push(args: Any) -> str:
        pushes.append(args)
        if len(pushes) == 1:
            raise RuntimeError("CRM busy")
        return "pushed"

    async def warm(args: Any) -> str:
        warms.append(args)
        return "warm"

    bindings = Bindings(tools={"crm.push": push, "cache.warm": warm})
    run = await start_source(runner, SYNC, bindings=bindings)
    assert (run.status, run.output) == (
        "completed", {"pushed": "pushed", "warmed": "warm", "attempt": 2}
    )  # fmt: skip
    assert pushes == [{"attempt": 1}, {"attempt": 2}]  # no retries of its own, no waiting
    assert len(warms) == 1  # what succeeded in attempt 1 is not done again


async def test_the_step_fails_with_the_tools_own_error(runner: Runner) -> None:
    async def down(args: Any) -> None:
        raise RuntimeError("CRM down")

    source = """
    export default async (event, step) =>
      step.do("sync", { retries: { limit: 1, delay: 0 } }, async () =>
        step.tool("push", "crm.push", {}));
    """
    run = await start_source(runner, source, bindings=Bindings(tools={"crm.push": down}))
    assert (run.status, run.error) == ("failed", "RuntimeError: CRM down")
    steps = {s.name: s for s in await runner.list_steps(run.run_id, scope="acme")}
    assert steps["sync"].attempt == 2


async def test_a_top_level_tool_keeps_its_own_retry_policy(runner: Runner) -> None:
    calls: list[Any] = []

    async def flaky(args: Any) -> str:
        calls.append(args)
        if len(calls) < 3:
            raise RuntimeError("busy")
        return "done"

    source = """
    export default async (event, step) =>
      step.tool("push", "crm.push", {}, { retries: { limit: 5, delay: 0 } });
    """
    run = await start_source(runner, source, bindings=Bindings(tools={"crm.push": flaky}))
    assert (run.status, run.output, len(calls)) == ("completed", "done", 3)


async def test_an_unbound_tool_blocks_the_run_until_a_process_binds_it(tmp_path: Path) -> None:
    source = """
    export default async (event, step) => {
      const first = await step.do("first", async () => 1);
      return first + (await step.tool("push", "crm.push", {}));
    };
    """
    async with Runner.open(tmp_path / "j.db") as runner:
        published = await runner.publish("acme", {"workflows/flow.ts": source})
        run = await runner.start(StartRunInput("acme", "flow", published.snapshot_id))
        assert (run.status, run.waiting_for, run.error) == ("blocked", "crm.push", None)
        steps = await runner.list_steps(run.run_id, scope="acme")
        assert [s.name for s in steps] == ["first"]  # nothing recorded for the missing tool
        # A worker without the tool leaves it alone; one with it continues the run.
        await runner.serve(until_idle=True)
        assert (await runner.get(run.run_id, scope="acme")).status == "blocked"

        async def push(args: Any) -> int:
            return 41

        await runner.serve(until_idle=True, bindings=Bindings(tools={"crm.push": push}))
        done = await runner.get(run.run_id, scope="acme")
        assert (done.status, done.output) == ("completed", 42)


# -- env: vars and secrets -----------------------------------------------------------------------

SECRET_VALUE = f"s3cr3t-{uuid.uuid4().hex}"
GREETER = """
import { WorkflowEntrypoint } from "cloudflare:workers";
import { env as shared } from "qjsflow";
export class Greeter extends WorkflowEntrypoint {
  async run(event, step) {
    console.log("key is", String(this.env.API_KEY), this.env.API_KEY, `${this.env.API_KEY}`);
    this.ctx.waitUntil(Promise.resolve(1));
    const called = await step.tool("call", "api.call", {
      headers: { authorization: this.env.API_KEY }, greeting: this.env.GREETING,
    });
    const typo = [this.env.GREETNG === undefined, "GREETNG" in this.env, Object.keys(this.env)];
    let json = "none";
    try { JSON.stringify({ key: this.env.API_KEY }); } catch (e) { json = e.message; }
    return { called, same: shared === this.env, limit: this.env.LIMIT, typo, json };
  }
}
"""


def _environment() -> RunnerConfig:
    environment = ScopeEnvironment(
        vars={"GREETING": "hi", "LIMIT": 3}, secrets={"API_KEY": SECRET_VALUE}
    )
    return RunnerConfig(environments={"acme": environment})


async def test_env_holds_vars_and_secret_handles_that_only_tools_see(tmp_path: Path) -> None:
    received: list[Any] = []

    async def call(args: Any) -> str:
        received.append(args)
        return "called"

    journal = tmp_path / "j.db"
    async with Runner.open(journal, _environment()) as runner:
        published = await runner.publish("acme", {"workflows/greeter.ts": GREETER})
        run = await runner.start(
            StartRunInput("acme", "Greeter", published.snapshot_id),
            Bindings(tools={"api.call": call}),
        )
        assert run.status == "completed", run.error
        assert run.output == {
            "called": "called", "same": True, "limit": 3,
            "typo": [True, False, ["GREETING", "LIMIT", "API_KEY", "db"]],  # as on Cloudflare
            "json": "the secret API_KEY cannot be turned into JSON",
        }  # fmt: skip
        assert received == [{"headers": {"authorization": SECRET_VALUE}, "greeting": "hi"}]
        [line] = await runner.list_logs(run.run_id, scope="acme")
        assert line.text == "key is [secret API_KEY] [secret API_KEY] [secret API_KEY]"
        [audit] = await runner.list_tool_calls(run.run_id, scope="acme")
        assert audit.args["headers"]["authorization"] == SecretRef("API_KEY")
    # The value is nowhere in the journal's files.
    for path in tmp_path.glob("j.db*"):
        assert SECRET_VALUE.encode() not in path.read_bytes(), path


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ("return { key: this.env.API_KEY };", "the workflow's result"),
        ('await db.sql("SELECT ?", [this.env.API_KEY]);', "the params of db.sql"),
    ],
)
async def test_a_secret_never_becomes_a_stored_value(tmp_path: Path, body: str, where: str) -> None:
    source = (
        'import { WorkflowEntrypoint } from "cloudflare:workers";\nimport { db } from "qjsflow";\n'
        "export class Leak extends WorkflowEntrypoint {\n"
        f"  async run(event, step) {{ {body} }}\n}}\n"
    )
    async with Runner.open(tmp_path / "j.db", _environment()) as runner:
        published = await runner.publish("acme", {"workflows/leak.ts": source})
        run = await runner.start(StartRunInput("acme", "Leak", published.snapshot_id))
        assert run.status == "failed"
        assert run.error == f"{where} holds the secret API_KEY, which can only be passed to a tool"
    assert_no_secret_anywhere([SECRET_VALUE], tmp_path / "j.db", [("acme", run.run_id)],
                              tmp_path / "j.db.scopes")  # fmt: skip


async def test_a_secret_this_process_lacks_blocks_the_run_until_one_has_it(
    tmp_path: Path,
) -> None:
    async with Runner.open(tmp_path / "j.db", _environment()) as runner:
        published = await runner.publish("acme", {"workflows/greeter.ts": GREETER})
        started = await runner.start(
            StartRunInput("acme", "Greeter", published.snapshot_id), drive=False
        )

    async def call(args: Any) -> str:
        return "called"

    tools = Bindings(tools={"api.call": call})
    # Another process, with the tool but without the scope's secrets, drives it: blocked.
    async with Runner.open(tmp_path / "j.db") as other:
        run = await other.resume(started.run_id, tools, scope="acme")
        assert (run.status, run.waiting_for, run.error) == ("blocked", "secret API_KEY", None)
        await other.serve(until_idle=True, bindings=tools)  # its worker leaves it alone
        assert (await other.get(run.run_id, scope="acme")).status == "blocked"
    # A worker configured with the secret continues it.
    async with Runner.open(tmp_path / "j.db", _environment()) as configured:
        await configured.serve(until_idle=True, bindings=tools)
        done = await configured.get(run.run_id, scope="acme")
        assert done.status == "completed"
        assert done.output["called"] == "called"


def test_binding_names_are_checked() -> None:
    with pytest.raises(InvalidInput, match="invalid binding name 'bad name'"):
        ScopeEnvironment(vars={"bad name": 1})
    with pytest.raises(InvalidInput, match="'KEY' is declared as two bindings"):
        ScopeEnvironment(vars={"KEY": 1}, secrets={"KEY": "x"})
    with pytest.raises(InvalidInput, match="db is taken"):
        ScopeEnvironment(vars={"db": 1})


@pytest.mark.slow
def test_the_cli_takes_an_env_file_whose_secrets_come_from_the_host(tmp_path: Path) -> None:
    tree = tmp_path / "tree" / "workflows"
    tree.mkdir(parents=True)
    (tree / "w.ts").write_text(
        "export default async (event, step, env) =>\n"
        '  step.tool("send", "receive", { run: env.GREETING, secret: env.API_KEY });\n'
    )
    env_file = tmp_path / "env.json"
    env_file.write_text(
        '{"acme": {"vars": {"GREETING": "hi"}, "secrets": {"API_KEY": "ACME_API_KEY"}}}'
    )
    tool_log = tmp_path / "tools.log"
    environ = {**os.environ, "ACME_API_KEY": SECRET_VALUE, "QJSFLOW_TOOL_LOG": str(tool_log)}

    def qjsflow(*args: str, env: dict[str, str] = environ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "qjsflow.runner.cli", "--db", str(tmp_path / "j.db"),
             "--env", str(env_file), "--tools", "tests.crash_tools:TOOLS", "--json", *args],
            cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    assert qjsflow("publish", str(tree.parent), "--scope", "acme").returncode == 0
    started = qjsflow("start", "w", "--scope", "acme", "--snapshot", "latest")
    assert started.returncode == 0, started.stderr
    driven = qjsflow("worker", "--until-idle")  # the worker resolves the secret from its host
    assert driven.returncode == 0, driven.stderr
    assert tool_log.read_text() == f"hi {SECRET_VALUE}\n"
    for path in tmp_path.glob("j.db*"):
        assert SECRET_VALUE.encode() not in path.read_bytes()
    without = {k: v for k, v in environ.items() if k != "ACME_API_KEY"}
    refused = qjsflow("list", env=without)
    assert refused.returncode == 2
    assert "the host environment variable 'ACME_API_KEY' is not set" in refused.stderr


# -- timers inside a drive -------------------------------------------------------------------


async def test_timers_fire_in_a_deterministic_order_and_clear(runner: Runner) -> None:
    source = """
    export default async (event, step) => {
      const order = [];
      setTimeout(() => order.push("second"), 20);
      setTimeout(() => order.push("first"), 10);
      setTimeout(() => order.push("tie-1"), 30);
      setTimeout(() => order.push("tie-2"), 30);
      clearTimeout(setTimeout(() => order.push("cleared"), 5));
      await new Promise((resolve) => setTimeout(resolve, 40));
      const polled = await step.do("poll", async () => {
        let n = 0;
        await new Promise((resolve) => {
          const every = setInterval(() => { n += 1; if (n === 3) { clearInterval(every); resolve(); } }, 5);
        });
        return n;
      });
      return { order, polled };
    };
    """
    run = await start_source(runner, source)
    assert run.output == {"order": ["first", "second", "tie-1", "tie-2"], "polled": 3}


async def test_the_functions_the_prelude_provides_are_methods_as_the_engines_are(
    runner: Runner,
) -> None:
    """fetch, the timers, Math.random, db.sql and Promise.prototype.then are the prelude's
    own; like the Web's and the engine's they are named for what they are and are not
    constructors (no `prototype` of their own, which the lockdown would make and freeze)."""
    source = """
    import { db } from "qjsflow";
    export default async () => {
      const given = { fetch, setTimeout, setInterval, clearTimeout, clearInterval,
        random: Math.random, sql: db.sql, then: Promise.prototype.then };
      const seen = {};
      for (const [key, value] of Object.entries(given)) {
        let constructs;
        try { new value(); constructs = true; } catch (error) { constructs = error.name; }
        seen[key] = [value.name, Object.hasOwn(value, "prototype"), constructs];
      }
      return seen;
    };
    """
    run = await start_source(runner, source)
    assert run.status == "completed", run.error
    assert run.output == {
        key: [key, False, "TypeError"]
        for key in ("fetch", "setTimeout", "setInterval", "clearTimeout", "clearInterval",
                    "random", "sql", "then")
    }  # fmt: skip


async def test_a_timer_past_the_drives_wall_budget_points_to_step_sleep(tmp_path: Path) -> None:
    config = RunnerConfig(limits=Limits(drive_wall_s=1.0))
    async with Runner.open(tmp_path / "j.db", config) as runner:
        started = time.monotonic()
        source = "export default async () => new Promise((r) => setTimeout(r, 60_000));"
        run = await start_source(runner, source)
    assert run.error == (
        "a timer of 60000 ms would outlive the drive's wall-clock budget of 1 s: wait with "
        "step.sleep instead"
    )
    assert time.monotonic() - started < 30  # refused at once, not after waiting


async def test_waiting_on_a_timer_costs_no_compute(tmp_path: Path) -> None:
    config = RunnerConfig(limits=Limits(compute_per_drive_s=0.2, drive_wall_s=5.0))
    async with Runner.open(tmp_path / "j.db", config) as runner:
        source = "export default async () => { await new Promise((r) => setTimeout(r, 600)); return 1; };"
        run = await start_source(runner, source)
    assert (run.status, run.output) == ("completed", 1)


# -- the Web APIs Cloudflare code uses ------------------------------------------------------


async def test_crypto_text_and_url_apis(runner: Runner) -> None:
    source = """
    export default async (event, step) => {
      const bytes = new TextEncoder().encode("h\\u00e9llo \\u20ac");
      const url = new URL("/v1/items?x=1", "https://api.example.com/base/");
      url.searchParams.set("page", "2");
      const rel = new URL("../up?q=1#frag", "https://a.example:8443/one/two/three");
      const uuid = crypto.randomUUID();
      return {
        bytes: Array.from(bytes), back: new TextDecoder().decode(bytes),
        href: url.href, host: url.host, page: url.searchParams.get("page"),
        rel: rel.href, origin: rel.origin,
        form: new URLSearchParams({ a: "1", b: "x y" }).toString(),
        parsed: new URLSearchParams("?a=1&a=2&b=x+y").getAll("a"),
        uuid: /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/.test(uuid),
        filled: crypto.getRandomValues(new Uint8Array(4)).length,
        canParse: [URL.canParse("nope"), URL.canParse("https://x.y")],
      };
    };
    """
    run = await start_source(runner, source)
    assert run.output == {
        "bytes": [104, 195, 169, 108, 108, 111, 32, 226, 130, 172], "back": "h\u00e9llo \u20ac",
        "href": "https://api.example.com/v1/items?x=1&page=2", "host": "api.example.com",
        "page": "2", "rel": "https://a.example:8443/one/up?q=1#frag",
        "origin": "https://a.example:8443", "form": "a=1&b=x+y", "parsed": ["1", "2"],
        "uuid": True, "filled": 4, "canParse": [False, True],
    }  # fmt: skip


async def test_random_uuids_replay_as_they_were(runner: Runner) -> None:
    """crypto is seeded like Math.random: the body's ids survive a replay unchanged."""
    source = """
    export default async (event, step) => {
      const id = crypto.randomUUID();
      console.log(id);
      await step.sleep("pause", 20);
      return id;
    };
    """
    run = await past_short_sleeps(runner, await start_source(runner, source))
    [line] = await runner.list_logs(run.run_id, scope="acme")
    assert run.status == "completed"
    assert run.output == line.text  # replayed after the sleep, the same id


# -- binding objects: KV and queues --------------------------------------------------------------

SIGNUP = """
import { WorkflowEntrypoint } from "cloudflare:workers";
export class Signup extends WorkflowEntrypoint {
  async run(event, step) {
    const before = await this.env.CACHE.get("user:1");
    await step.do("store", async () => {
      await this.env.CACHE.put("user:1", JSON.stringify({ n: 1 }));
      return 1;
    });
    const after = await this.env.CACHE.get("user:1", "json");
    const listed = await this.env.CACHE.list({ prefix: "user:" });
    await this.env.EMAILS.send({ to: "a@b.c" });
    await this.env.EMAILS.sendBatch([{ body: 1 }, { body: 2 }]);
    await this.env.CACHE.delete("user:1");
    return { before, after, listed, gone: await this.env.CACHE.get("user:1") };
  }
}
"""


def _with_bindings() -> RunnerConfig:
    environment = ScopeEnvironment(kv=("CACHE",), queues=("EMAILS",))
    return RunnerConfig(environments={"acme": environment})


async def test_kv_and_queue_bindings_work_with_no_operator_code(tmp_path: Path) -> None:
    async with Runner.open(tmp_path / "j.db", _with_bindings()) as runner:
        published = await runner.publish("acme", {"workflows/signup.ts": SIGNUP})
        run = await runner.start(StartRunInput("acme", "Signup", published.snapshot_id))
        assert run.output == {
            "before": None, "after": {"n": 1},
            "listed": {"keys": [{"name": "user:1"}], "list_complete": True}, "gone": None,
        }  # fmt: skip
        assert await runner.store.queue_messages("acme", "EMAILS") == ['{"to":"a@b.c"}', "1", "2"]
        assert await runner.store.queue_messages("other", "EMAILS") == []
        calls = await runner.list_tool_calls(run.run_id, scope="acme")
        assert [c.step for c in calls][:3] == ["CACHE.get", "do:1:store/CACHE.put", "CACHE.get"]


async def test_an_operator_can_replace_a_local_binding(tmp_path: Path) -> None:
    seen: list[Any] = []

    async def own_kv(args: Any) -> Any:
        seen.append((args["op"], args.get("key")))
        return '{"n": 7}' if args["op"] == "get" else None

    async def own_queue(args: Any) -> None:
        seen.append(("send", args["bodies"]))

    tools = Bindings(tools={"qjsflow.kv": own_kv, "qjsflow.queue": own_queue})
    async with Runner.open(tmp_path / "j.db", _with_bindings()) as runner:
        published = await runner.publish("acme", {"workflows/signup.ts": SIGNUP})
        run = await runner.start(StartRunInput("acme", "Signup", published.snapshot_id), tools)
        assert run.output["after"] == {"n": 7}
        assert ("put", "user:1") in seen
        assert await runner.store.queue_messages("acme", "EMAILS") == []


# -- short retries inside the drive --------------------------------------------------------------

CLOSURE_RETRY = """
export default async (event, step) => {
  let calls = 0; // state in the step's closure, as Cloudflare keeps it between quick retries
  const value = await step.do("flaky", { retries: { limit: 3, delay: DELAY, backoff: "constant" } },
    async () => {
      calls += 1;
      if (calls < 3) throw new Error(`busy (call ${calls})`);
      return calls;
    });
  return value;
};
"""


async def test_a_short_retry_runs_in_the_same_context(runner: Runner) -> None:
    run = await start_source(runner, CLOSURE_RETRY.replace("DELAY", "50"))
    assert (run.status, run.output) == ("completed", 3)
    drives = query(
        runner.store.location, "SELECT count(*) FROM events WHERE type = 'drive_started'"
    )
    assert drives == [(1,)]  # all three attempts in one drive
    [step] = await runner.list_steps(run.run_id, scope="acme")
    assert step.attempt == 3


async def test_a_long_retry_suspends_and_replays_as_before(runner: Runner) -> None:
    run = await start_source(runner, CLOSURE_RETRY.replace("DELAY", '"5 seconds"'))
    assert run.status == "sleeping"  # the retry is due in 5 s: the run waits for it, parked
    [step] = await runner.list_steps(run.run_id, scope="acme")
    assert (step.status, step.error) == ("retrying", "Error: busy (call 1)")


async def test_no_frame_sent_to_an_executor_holds_a_secret_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The executor's whole input is these frames: the request (with the run's env), the
    bundle and the answers to its ops. The secret's value is in none of them."""
    sent: list[bytes] = []
    original = pool_module.ExecutorProcess.send

    async def recording(self: Any, payload: bytes) -> None:
        sent.append(payload)
        await original(self, payload)

    monkeypatch.setattr(pool_module.ExecutorProcess, "send", recording)

    async def call(args: Any) -> str:
        assert args["headers"]["authorization"] == SECRET_VALUE  # the tool did get it
        return "called"

    async with Runner.open(tmp_path / "j.db", _environment()) as runner:
        published = await runner.publish("acme", {"workflows/greeter.ts": GREETER})
        run = await runner.start(
            StartRunInput("acme", "Greeter", published.snapshot_id),
            Bindings(tools={"api.call": call}),
        )
    assert run.status == "completed"
    assert len(sent) >= 2
    assert not [frame for frame in sent if SECRET_VALUE.encode() in frame]
    assert any(b"secret" in frame and b"API_KEY" in frame for frame in sent)  # by name


async def test_r2_buckets_and_durable_object_stubs(tmp_path: Path) -> None:
    source = """
    import { WorkflowEntrypoint } from "cloudflare:workers";
    export class Files extends WorkflowEntrypoint {
      async run(event, step) {
        await this.env.BUCKET.put("reports/1.json", JSON.stringify({ total: 3 }));
        const object = await this.env.BUCKET.get("reports/1.json");
        const listed = await this.env.BUCKET.list({ prefix: "reports/" });
        const missing = await this.env.BUCKET.get("nope");
        const counter = this.env.COUNTER.get(this.env.COUNTER.idFromName("team-a"));
        const count = await counter.increment(2);
        return { total: (await object.json()).total, size: object.size, keys: listed.objects,
                 missing, count };
      }
    }
    """
    environment = ScopeEnvironment(r2=("BUCKET",), durable_objects=("COUNTER",))
    config = RunnerConfig(environments={"acme": environment})
    calls: list[Any] = []

    async def durable_object(args: Any) -> int:
        calls.append(args)
        return 40 + int(args["args"][0])

    async with Runner.open(tmp_path / "j.db", config) as runner:
        published = await runner.publish("acme", {"workflows/files.ts": source})
        run = await runner.start(StartRunInput("acme", "Files", published.snapshot_id))
        # No process binds Durable Objects here: the run waits for one that does.
        assert (run.status, run.waiting_for) == ("blocked", "qjsflow.durable_object")
        tools = Bindings(tools={"qjsflow.durable_object": durable_object})
        done = await runner.resume(run.run_id, tools, scope="acme")
    assert done.output == {
        "total": 3, "size": 11, "keys": [{"key": "reports/1.json"}], "missing": None, "count": 42,
    }  # fmt: skip
    assert calls == [{"binding": "COUNTER", "op": "increment", "id": "team-a", "args": [2]}]


def test_an_env_file_declares_every_kind_of_binding(tmp_path: Path) -> None:
    env_file = tmp_path / "env.json"
    env_file.write_text(
        '{"acme": {"vars": {"A": 1}, "secrets": {"K": "HOST_K"}, "kv": ["CACHE"],'
        ' "queues": ["Q"], "r2": ["B"], "durable_objects": ["D"],'
        ' "egress": {"allow": ["api.example.com"], "allow_private": false}}}'
    )
    [(scope, environment)] = load_environments(env_file, {"HOST_K": "v"}).items()
    assert scope == "acme"
    assert (environment.vars, environment.secrets) == ({"A": 1}, {"K": "v"})
    assert (environment.kv, environment.queues, environment.r2) == (("CACHE",), ("Q",), ("B",))
    assert environment.durable_objects == ("D",)
    assert environment.egress == EgressPolicy(allow=("api.example.com",))
    env_file.write_text('{"acme": {"kvs": []}}')
    with pytest.raises(
        InvalidInput, match="use the keys budgets, capabilities, durable_objects, egress, kv"
    ):
        load_environments(env_file, {})
    env_file.write_text('{"acme": {"egress": {"allow": "api.example.com"}}}')
    with pytest.raises(InvalidInput, match=r"egress\.allow is a list of names"):
        load_environments(env_file, {})


HANDLE_KEPT = """
import { WorkflowEntrypoint } from "cloudflare:workers";
export class Keeps extends WorkflowEntrypoint {
  async run(event, step) {
    const kept = await step.do("pick", async () => ({ key: this.env.API_KEY, n: 1 }));
    await step.sleep("nap", "1 second");
    const sent = await step.tool("send", "api.call", { authorization: kept.key });
    return { sent, shown: String(kept.key), same: kept.key === this.env.API_KEY };
  }
}
"""


async def test_a_step_result_keeps_a_secret_handle_not_its_value(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Recorded as the handle (its name); the replay after the sleep gets a handle back, which
    a tool call still receives as the value."""
    received: list[Any] = []

    async def call(args: Any) -> str:
        received.append(args)
        return "sent"

    config = dataclasses.replace(_environment(), clock=clock)
    tools = Bindings(tools={"api.call": call})
    async with Runner.open(tmp_path / "j.db", config) as runner:
        published = await runner.publish("acme", {"workflows/keeps.ts": HANDLE_KEPT})
        run = await runner.start(StartRunInput("acme", "Keeps", published.snapshot_id), tools)
        assert run.status == "sleeping", run.error
        step = (await runner.list_steps(run.run_id, scope="acme"))[0]
        assert step.output == {"key": SecretRef("API_KEY"), "n": 1}
        clock.advance(2)
        await runner.serve(until_idle=True, bindings=tools)
        done = await runner.get(run.run_id, scope="acme")
        assert (done.status, done.output) == (
            "completed", {"sent": "sent", "shown": "[secret API_KEY]", "same": False},
        )  # fmt: skip
    assert received == [{"authorization": SECRET_VALUE}]
    assert_no_secret_anywhere([SECRET_VALUE], tmp_path / "j.db", [("acme", run.run_id)],
                              tmp_path / "j.db.scopes")  # fmt: skip


TOOL_BACKED = """
import { WorkflowEntrypoint } from "cloudflare:workers";
export class Asks extends WorkflowEntrypoint {
  async run(event, step) {
    const answer = await this.env.AI.run("@cf/meta/llama", { prompt: event.payload });
    await step.sleep("nap", "1 second");
    const again = await step.do("ask again", async () => this.env.AI.run("@cf/x", {}));
    return { answer, again };
  }
}
"""


async def test_a_binding_object_backed_by_the_operators_tools(tmp_path: Path) -> None:
    """`tool_bindings` in the scope's configuration: `env.AI.run(model, input)` is a journaled
    call to the tool `AI.run`; unbound, the run waits blocked; replays do not call again."""
    asked: list[Any] = []

    async def ai_run(args: Any) -> str:
        asked.append(args)
        return f"answer {len(asked)}"

    async with Runner.open(tmp_path / "j.db") as runner:
        await runner.apply_scope_config("acme", '{"tool_bindings": ["AI"]}')
        published = await runner.publish("acme", {"workflows/asks.ts": TOOL_BACKED})
        run = await runner.start(StartRunInput("acme", "Asks", published.snapshot_id, "hi"))
        assert (run.status, run.waiting_for) == ("blocked", "AI.run")
        # A worker that binds it drives the run on, past its sleep (within its idle window).
        await runner.serve(until_idle=True, bindings=Bindings(tools={"AI.run": ai_run}))
        done = await runner.get(run.run_id, scope="acme")
    assert (done.status, done.output) == ("completed", {"answer": "answer 1", "again": "answer 2"})
    assert asked == [["@cf/meta/llama", {"prompt": "hi"}], ["@cf/x", {}]]
