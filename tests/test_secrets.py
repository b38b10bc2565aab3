"""A secret's value never comes back, by any path (docs/SANDBOX.md, Secrets): not through the
built-in bindings, not through a forged `[secret NAME]` text, not in what a server or a tool
echoes. After each test, every file of the journal, every CLI view and the console are
scanned for every secret's value (tests/secrets_scan.py)."""

from __future__ import annotations

import http.server
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from qjsflow.runner import Bindings, Runner, RunnerConfig, StartRunInput
from qjsflow.runner.tenancy.egress import EgressPolicy
from qjsflow.runner.tenancy.environment import ScopeEnvironment
from tests.conftest import past_short_sleeps
from tests.net import http_server
from tests.secrets_scan import assert_no_secret_anywhere

TOKEN = f"tok-{uuid.uuid4().hex}"
OTHER = f"other-{uuid.uuid4().hex}"  # a secret of the scope the snapshot does not reach
NAMES = {"API_TOKEN": TOKEN, "OTHER": OTHER}


class _Echo(http.server.BaseHTTPRequestHandler):
    """Answers with what it was sent: its headers in the body and in a header of its own."""

    seen: ClassVar[list[dict[str, str]]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        headers = {name.lower(): value for name, value in self.headers.items()}
        _Echo.seen.append(headers)
        said = headers.get("authorization", "")
        if self.path == "/binary":
            body = b"\xff\xfe" + said.encode() + b"\x00\xff"
        else:
            body = json.dumps(headers).encode()
        self.send_response(200)
        self.send_header("x-echo", said)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def echo() -> Iterator[str]:
    _Echo.seen = []
    with http_server(_Echo) as url:
        yield url


async def _echo_tool(args: Any) -> Any:
    return {"given": args}


async def _telling_tool(args: Any) -> Any:
    raise RuntimeError(f"the server refused {args}")


def _config(tmp_path: Path, server: str) -> RunnerConfig:
    environment = ScopeEnvironment(
        vars={"BASE": server}, secrets=NAMES, kv=("CACHE",), queues=("OUTBOX",),
        egress=EgressPolicy(allow=(f"{server}/",), allow_private=True),
    )  # fmt: skip
    tools = {"echo.back": _echo_tool, "tell.all": _telling_tool}
    return RunnerConfig(environments={"acme": environment}, bindings=Bindings(tools),
                        scope_root=tmp_path / "scopes")  # fmt: skip


async def _run(
    runner: Runner, body: str, bindings: list[str], run_id: str, server: str = ""
) -> Any:
    source = (
        'import { WorkflowEntrypoint } from "cloudflare:workers";\n'
        "export class Flow extends WorkflowEntrypoint {\n"
        f"  async run(event, step) {{ const env = this.env; {body} }}\n}}\n"
    )
    reach = {"bindings": bindings, "fetch": [f"{server}/"] if server else [], "tools": ["*"]}
    manifest = json.dumps({"capabilities": reach})
    tree = {"workflows/flow.ts": source, "qjsflow.json": manifest}
    published = await runner.publish("acme", tree)
    run = await runner.start(StartRunInput("acme", "Flow", published.snapshot_id, None, run_id))
    return await past_short_sleeps(runner, run)


def _scanned(tmp_path: Path, *run_ids: str) -> None:
    assert_no_secret_anywhere(
        NAMES.values(), tmp_path / "j.db", [("acme", r) for r in run_ids], tmp_path / "scopes"
    )


ATTEMPTS = {
    "kv key": 'await env.CACHE.put(env.API_TOKEN, "v"); return await env.CACHE.list();',
    "kv value": 'await env.CACHE.put("k", env.API_TOKEN); return await env.CACHE.get("k");',
    "queue body": "await env.OUTBOX.send(env.API_TOKEN); return 1;",
    "queue batch": "await env.OUTBOX.sendBatch([{ body: { t: env.API_TOKEN } }]); return 1;",
    "kv method": 'return await step.tool("t", "qjsflow.kv", '
    '{ binding: "CACHE", op: env.API_TOKEN, key: "k" });',
    "queue binding": 'return await step.tool("t", "qjsflow.queue", '
    "{ binding: env.API_TOKEN, bodies: [1] });",
}


# Refused before the binding is reached: in the sandbox (a handle is no string there), or as
# a binding the snapshot does not declare; the rest by the host's rule for bindings.
REFUSED_IN_THE_SANDBOX = {
    "kv value": "CACHE.put takes a string value",
    "queue binding": "is not among the capabilities the snapshot declares",
}


@pytest.mark.parametrize("attempt", sorted(ATTEMPTS))
async def test_a_handle_given_to_a_built_in_binding_fails_naming_the_secret(
    tmp_path: Path, echo: str, attempt: str
) -> None:
    async with Runner.open(tmp_path / "j.db", _config(tmp_path, echo)) as runner:
        body = f"try {{ {ATTEMPTS[attempt]} }} catch (e) {{ return String(e.message); }}"
        run = await _run(runner, body, ["API_TOKEN", "CACHE", "OUTBOX"], "r")
        assert run.status == "completed", run.error
        refusal = REFUSED_IN_THE_SANDBOX.get(attempt, "the secret API_TOKEN cannot be stored")
        assert refusal in run.output
    _scanned(tmp_path, "r")


async def test_forged_secret_text_is_revealed_only_for_secrets_the_run_reaches(
    tmp_path: Path, echo: str
) -> None:
    body = """
      const answer = await fetch(`${env.BASE}/h`, { headers: {
        "x-forged-other": "[secret OTHER]", "x-own": `Bearer ${env.API_TOKEN}`,
        "x-handle": env.API_TOKEN } });
      return answer.status;"""
    async with Runner.open(tmp_path / "j.db", _config(tmp_path, echo)) as runner:
        run = await _run(runner, body, ["API_TOKEN", "BASE"], "reaches", echo)
        assert (run.status, run.output) == ("completed", 200), run.error
        sent = _Echo.seen[-1]
        assert sent["x-forged-other"] == "[secret OTHER]"  # another secret: left as text
        assert (sent["x-own"], sent["x-handle"]) == (f"Bearer {TOKEN}", TOKEN)
        # A snapshot that declares no such binding reveals nothing, handle text or not.
        forged = body.replace("`Bearer ${env.API_TOKEN}`", '"Bearer [secret API_TOKEN]"')
        forged = forged.replace('"x-handle": env.API_TOKEN', '"x-handle": "none"')
        run = await _run(runner, forged, ["BASE"], "reaches-none", echo)
        assert run.status == "completed", run.error
        assert _Echo.seen[-1]["x-own"] == "Bearer [secret API_TOKEN]"
        assert _Echo.seen[-1]["x-forged-other"] == "[secret OTHER]"
    _scanned(tmp_path, "reaches", "reaches-none")


async def test_what_comes_back_carrying_a_value_is_masked(tmp_path: Path, echo: str) -> None:
    body = """
      const headers = { authorization: `Bearer ${env.API_TOKEN}` };
      const echoed = await step.do("echo", async () => {
        const answer = await fetch(`${env.BASE}/json`, { headers });
        return { body: await answer.text(), header: answer.headers.get("x-echo") };
      });
      const binary = await step.do("binary", async () => {
        const answer = await fetch(`${env.BASE}/binary`, { headers });
        return Array.from(new Uint8Array(await answer.arrayBuffer()));
      });
      const tool = await step.tool("given", "echo.back", { token: env.API_TOKEN });
      let told = null;
      try { await step.tool("tells", "tell.all", { token: env.API_TOKEN },
                            { retries: { limit: 0, delay: 0 } }); }
      catch (e) { told = e.message; }
      console.log("echoed", echoed.body);
      return { echoed, binary: String.fromCharCode(...binary), tool, told };"""
    async with Runner.open(tmp_path / "j.db", _config(tmp_path, echo)) as runner:
        run = await _run(runner, body, ["API_TOKEN", "BASE"], "echoes", echo)
        assert run.status == "completed", run.error
        assert _Echo.seen[0]["authorization"] == f"Bearer {TOKEN}"  # it did leave the host
        out = run.output
        assert "Bearer [secret API_TOKEN]" in out["echoed"]["body"]
        assert out["echoed"]["header"] == "Bearer [secret API_TOKEN]"
        assert "Bearer [secret API_TOKEN]" in out["binary"]
        assert out["tool"] == {"given": {"token": "[secret API_TOKEN]"}}
        assert out["told"] == "the server refused {'token': '[secret API_TOKEN]'}"
    _scanned(tmp_path, "echoes")


async def test_the_scan_finds_a_value_wherever_it_is(tmp_path: Path, echo: str) -> None:
    """The scan itself can fail: a value a run stored is found in the journal's files; one
    stored escaped (text past ASCII is, in the journal) in what the CLI shows."""
    marker, shown = f"marker-{uuid.uuid4().hex}", f"shown-\u00e9-{uuid.uuid4().hex}"
    async with Runner.open(tmp_path / "j.db", _config(tmp_path, echo)) as runner:
        run = await _run(runner, f'return ["{marker}", "{shown}"];', [], "plain")
        assert run.output == [marker, shown]
    journal, scopes = tmp_path / "j.db", tmp_path / "scopes"
    with pytest.raises(AssertionError, match=r"a secret.s value is in j\.db"):
        assert_no_secret_anywhere([marker], journal, [("acme", "plain")], scopes)
    assert not any(shown.encode() in p.read_bytes() for p in tmp_path.glob("j.db*"))
    with pytest.raises(AssertionError, match="shown by qjsflow status"):
        assert_no_secret_anywhere([shown], journal, [("acme", "plain")], scopes)
