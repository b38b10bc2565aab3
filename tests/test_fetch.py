"""`fetch` from workflows: a journaled host call under the scope's egress policy, against a
real HTTP server on loopback (allowed explicitly, as private addresses must be)."""

from __future__ import annotations

import http.server
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from qjsflow.runner import Runner, RunnerConfig, StartRunInput
from qjsflow.runner.errors import FatalToolError
from qjsflow.runner.tenancy.egress import EgressPolicy, fetch
from qjsflow.runner.tenancy.environment import ScopeEnvironment
from qjsflow.testing import WorkflowTest
from tests.conftest import past_short_sleeps
from tests.journal_reads import query
from tests.net import http_server
from tests.secrets_scan import assert_no_secret_anywhere

SECRET = f"tok-{uuid.uuid4().hex}"


class _Handler(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[dict[str, Any]]] = []

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        _Handler.seen.append(
            {"method": self.command, "path": self.path, "body": body,
             "authorization": self.headers.get("authorization"), "host": self.headers.get("host")}
        )  # fmt: skip
        if self.path == "/redirect":
            self._send(302, b"", location="/json")
        elif self.path == "/to-metadata":
            self._send(302, b"", location="http://169.254.169.254/latest/meta-data/")
        elif self.path == "/big":
            self._send(200, b"x" * (2 * 1024 * 1024))
        elif self.path == "/drip":
            self._drip()
        else:
            self._send(200, b'{"ok": true, "greeting": "hello"}', content_type="application/json")

    def _send(
        self, status: int, body: bytes, *, location: str = "", content_type: str = ""
    ) -> None:
        self.send_response(status)
        if location:
            self.send_header("location", location)
        if content_type:
            self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _drip(self) -> None:
        """Twenty bytes, one every 0.2 s: each read is quick, the whole is not."""
        self.send_response(200)
        self.send_header("content-length", "20")
        self.end_headers()
        try:
            for _ in range(20):
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.2)
        except OSError:  # the client gave up: what the deadline is for
            pass

    do_GET = _answer
    do_POST = _answer


@pytest.fixture
def server() -> Iterator[str]:
    _Handler.seen = []
    with http_server(_Handler) as url:
        yield url


def _environment(server: str) -> ScopeEnvironment:
    return ScopeEnvironment(
        vars={"BASE": server, "API_BASE": server},
        secrets={"TOKEN": SECRET, "API_TOKEN": SECRET},
        egress=EgressPolicy(allow=(f"{server}/",), allow_private=True),
    )


@pytest.fixture
async def fetching(tmp_path: Path, server: str) -> AsyncIterator[Runner]:
    config = RunnerConfig(environments={"acme": _environment(server)})
    async with Runner.open(tmp_path / "j.db", config) as runner:
        yield runner


async def _run(runner: Runner, body: str) -> Any:
    source = (
        'import { WorkflowEntrypoint } from "cloudflare:workers";\n'
        "export class Flow extends WorkflowEntrypoint {\n"
        f"  async run(event, step) {{ const env = this.env; {body} }}\n}}\n"
    )
    published = await runner.publish("acme", {"workflows/flow.ts": source})
    run = await runner.start(StartRunInput("acme", "Flow", published.snapshot_id))
    return await past_short_sleeps(runner, run)


async def test_fetch_inside_a_step_is_done_once_with_the_secret_put_in(
    fetching: Runner, tmp_path: Path
) -> None:
    run = await _run(
        fetching,
        """
        const data = await step.do("call api", async () => {
          const response = await fetch(`${env.BASE}/json`, {
            method: "POST", body: JSON.stringify({ a: 1 }),
            headers: { authorization: `Bearer ${env.TOKEN}`, "content-type": "application/json" },
          });
          return { status: response.status, ok: response.ok, json: await response.json(),
                   type: response.headers.get("content-type") };
        });
        await step.sleep("pause", 20);  // past it, a next drive replays the step
        return data;
        """,
    )
    runs = query(
        fetching.store.location, "SELECT count(*) FROM events WHERE type = 'drive_started'"
    )
    assert runs[0][0] >= 2  # replayed, and the replay did not fetch again (seen once below)
    assert run.output == {
        "status": 200, "ok": True, "json": {"ok": True, "greeting": "hello"},
        "type": "application/json",
    }  # fmt: skip
    assert [(s["method"], s["path"], s["body"]) for s in _Handler.seen] == [
        ("POST", "/json", '{"a":1}')
    ]
    assert _Handler.seen[0]["authorization"] == f"Bearer {SECRET}"
    assert _Handler.seen[0]["host"].startswith("127.0.0.1:")
    [call] = query(fetching.store.location, "SELECT address FROM tool_calls")
    assert call == ("qjsflow.fetch",)
    assert_no_secret_anywhere([SECRET], tmp_path / "j.db", [("acme", run.run_id)],
                              tmp_path / "j.db.scopes")  # fmt: skip


async def test_fetch_takes_a_request(fetching: Runner) -> None:
    run = await _run(
        fetching,
        """
        const request = new Request(`${env.BASE}/json`, { method: "post", body: "x=1",
                                                          headers: { "x-kind": "form" } });
        const response = await fetch(request);
        return { status: response.status, method: request.method };
        """,
    )
    assert run.output == {"status": 200, "method": "POST"}
    assert [(s["method"], s["body"]) for s in _Handler.seen] == [("POST", "x=1")]


async def test_redirects_are_followed_and_checked_again(fetching: Runner) -> None:
    run = await _run(
        fetching,
        """
        const ok = await (await fetch(`${env.BASE}/redirect`)).json();
        let refused = "none";
        try { await fetch(`${env.BASE}/to-metadata`); } catch (e) { refused = e.message; }
        return { ok, refused };
        """,
    )
    assert run.output["ok"] == {"ok": True, "greeting": "hello"}
    assert run.output["refused"] == (
        "fetch to '169.254.169.254' is not allowed for scope 'acme': add it to the scope's "
        "egress allowlist (EgressPolicy.allow)"
    )


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("https://example.com/", "fetch to 'example.com' is not allowed for scope 'acme'"),
        ("file:///etc/passwd", "only http and https URLs can be fetched"),
        ("http://[::1]:1/", "fetch to '::1' is not allowed for scope 'acme'"),
    ],
)
async def test_what_the_policy_does_not_allow_is_refused_naming_it(
    fetching: Runner, url: str, problem: str
) -> None:
    run = await _run(fetching, f"return await fetch({url!r});")
    assert run.status == "failed"
    assert run.error is not None
    assert problem in run.error


async def test_private_addresses_need_allowing_explicitly(tmp_path: Path, server: str) -> None:
    by_name = server.replace("127.0.0.1", "localhost")
    policy = EgressPolicy(allow=(f"{by_name}/",))  # a name listed, private not allowed
    config = RunnerConfig(environments={"acme": ScopeEnvironment(egress=policy)})
    async with Runner.open(tmp_path / "j.db", config) as runner:
        run = await _run(runner, f"return await fetch({by_name + '/json'!r});")
    assert run.error is not None
    assert "resolves to a private, loopback, link-local or reserved address" in run.error
    assert _Handler.seen == []


async def test_a_private_address_listed_itself_is_allowed(server: str) -> None:
    """The address written in the allowlist is the operator's choice: no second switch."""
    listed = EgressPolicy(allow=(f"{server}/",))  # http://127.0.0.1:PORT/, allow_private off
    done = await fetch({"url": f"{server}/json"}, listed, "acme")
    assert done["status"] == 200
    assert [seen["path"] for seen in _Handler.seen] == ["/json"]
    by_name = EgressPolicy(allow=(server.replace("127.0.0.1", "localhost"),))
    with pytest.raises(FatalToolError, match="list the address itself"):
        await fetch({"url": server.replace("127.0.0.1", "localhost") + "/json"}, by_name, "acme")


async def test_a_response_over_the_cap_is_refused(fetching: Runner) -> None:
    run = await _run(fetching, "return await (await fetch(`${env.BASE}/big`)).text();")
    assert run.error is not None
    assert "is larger than 524288 bytes" in run.error


async def test_nothing_is_allowed_by_default(runner: Runner) -> None:
    run = await _run(runner, 'return await fetch("https://example.com/");')
    assert run.error is not None
    assert "add it to the scope's egress allowlist" in run.error


STARTER = """
import { WorkflowEntrypoint, WorkflowStep, WorkflowEvent } from "cloudflare:workers";

type Env = { MY_WORKFLOW: unknown; API_BASE: string; API_TOKEN: string };
type Params = { email: string; metadata: Record<string, string> };

export class MyWorkflow extends WorkflowEntrypoint<Env, Params> {
  async run(event: WorkflowEvent<Params>, step: WorkflowStep) {
    const files = await step.do("my first step", async () => {
      return { inputParams: event.payload, files: ["doc_7392_rev3.pdf", "report_x29_final.pdf"] };
    });

    const apiResponse = await step.do("some other step", async () => {
      const resp = await fetch(`${this.env.API_BASE}/json`, {
        headers: { Authorization: `Bearer ${this.env.API_TOKEN}` },
      });
      return await resp.json<any>();
    });

    await step.do("settle", async () => {
      await new Promise((resolve) => setTimeout(resolve, 20));
    });

    await step.sleep("wait on something", "1 second");

    await step.do(
      "make a call to write that could maybe, just might, fail",
      { retries: { limit: 5, delay: "1 second", backoff: "exponential" }, timeout: "15 minutes" },
      async () => {
        if (Math.random() > 2) throw new Error("API call to $STORAGE_SYSTEM failed");
      },
    );
    return { files: files.files, api: apiResponse };
  }
}

export default {
  async fetch(req: Request, env: Env): Promise<Response> {
    return Response.json({ status: "not run here" });
  },
};
"""


async def test_the_cloudflare_starter_shape_runs_unchanged(server: str) -> None:
    # On qjsflow.testing's virtual clock: its sleep and retry delays take no time.
    async with WorkflowTest({"src/index.ts": STARTER}, scope="acme",
                            environment=_environment(server)) as test:  # fmt: skip
        published = await test.runner.publish("acme", {"src/index.ts": STARTER}, ["src/index.ts"])
        assert [w.workflow for w in published.workflows] == ["MyWorkflow"]
        payload = {"email": "a@b.c", "metadata": {"k": "v"}}
        run = await test.runner.start(
            StartRunInput("acme", "MyWorkflow", published.snapshot_id, payload, run_id="starter")
        )
        assert run.status == "sleeping"
        done = (await test.run_until_idle("starter")).run
    assert (done.status, done.output) == (
        "completed",
        {"files": ["doc_7392_rev3.pdf", "report_x29_final.pdf"],
         "api": {"ok": True, "greeting": "hello"}},
    )  # fmt: skip
    assert [s["authorization"] for s in _Handler.seen] == [f"Bearer {SECRET}"]


@pytest.mark.parametrize(
    ("allowed", "url", "allows"),
    [
        ("https://api.example.com", "https://api.example.com.evil.test/x", False),
        ("https://api.example.com/v1/", "https://api.example.com/v2/x", False),
        ("https://api.example.com/v1/", "https://api.example.com/v1/items", True),
        ("https://api.example.com/v1/", "http://api.example.com/v1/items", False),
        ("https://api.example.com/v1/", "https://api.example.com/v1%2fitems", False),
        ("https://api.example.com/v1/", "https://api.example.com/v1/a%2fb", True),
        ("https://api.example.com/v1/", "https://api.example.com:8443/v1/items", False),
        ("*.example.com", "https://a.example.com/", True),
        ("*.example.com", "https://evilexample.com/", False),
        ("api.example.com", "ftp://api.example.com/", False),
    ],
)
def test_allowlist_entries_match_by_origin_and_path(allowed: str, url: str, allows: bool) -> None:
    assert EgressPolicy(allow=(allowed,)).allows(httpx.URL(url)) is allows


@pytest.mark.parametrize(
    "path",
    ["/v1/%2e%2e/admin", "/v1/..%2fadmin", "/v1/%2E%2E%2Fadmin", "/v1/%252e%252e/admin",
     "/v1/..;/admin", "/v1/.%2e/admin", "/v1/%5c..%5cadmin", "/v1/x/..%5c..%5cadmin"],
)  # fmt: skip
async def test_a_path_that_a_server_would_normalise_elsewhere_is_refused(
    server: str, path: str
) -> None:
    policy = EgressPolicy(allow=(f"{server}/v1/",), allow_private=True)
    with pytest.raises(FatalToolError, match="dot segment"):
        await fetch({"url": server + path}, policy, "acme")
    assert _Handler.seen == []  # nothing went on the wire
    done = await fetch({"url": f"{server}/v1/items"}, policy, "acme")
    assert done["status"] == 200
    assert [seen["path"] for seen in _Handler.seen] == ["/v1/items"]


async def test_one_deadline_bounds_the_whole_call(server: str) -> None:
    policy = EgressPolicy(allow=(server,), allow_private=True, timeout_s=1.0)
    with pytest.raises(FatalToolError, match="no whole answer within 1 s"):
        await fetch({"url": f"{server}/drip"}, policy, "acme")
    patient = EgressPolicy(allow=(server,), allow_private=True, timeout_s=60.0)
    assert (await fetch({"url": f"{server}/drip"}, patient, "acme"))["body"] == "x" * 20


async def test_a_refused_fetch_is_an_error_the_workflow_can_catch_and_is_not_retried(
    fetching: Runner,
) -> None:
    run = await _run(
        fetching,
        """
        try { await fetch("https://not-allowed.example/x"); return "fetched"; }
        catch (error) { return [error.name, error.message.slice(0, 55)]; }
        """,
    )
    assert run.status == "completed", run.error
    assert run.output == ["FatalError", "fetch to 'not-allowed.example' is not allowed for scope"]
    calls = query(fetching.store.location, "SELECT attempt FROM tool_calls")
    assert calls == [(1,)]  # refused once, never tried again
