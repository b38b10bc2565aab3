"""The web console: a real server on loopback, real HTTP, and a real browser (Chromium from
Debian's packages, driven by Playwright) for what people do with it."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from qjsflow.runner import Runner, RunnerConfig, StartRunInput
from qjsflow.runner.console import Tokens, create_app
from qjsflow.runner.console.auth import OPERATOR, Principal
from qjsflow.sandbox import PoolConfig
from tests.conftest import PROJECT_ROOT
from tests.net import free_port
from tests.postgres import PostgresServer

OPERATOR_TOKEN = "operator-token-0123456789"
ACME_TOKEN = "acme-tenant-token-0123456789"

WAITER = """
export default async (event, step) => {
  const first = await step.do("prepare", async () => ({ n: event.payload.n }));
  console.log("prepared", first.n);
  await step.sleep("breathe", "1 second");
  const go = await step.waitForEvent("approval", { type: "approve", timeout: "1 hour" });
  return { n: first.n, approved: go.payload };
};
"""
FLAKY = """
export default async (event, step) =>
  step.do("flaky", { retries: { limit: 2, delay: 50 } }, async (ctx) => {
    if (ctx.attempt < 2) throw new Error("not yet");
    return ctx.attempt;
  });
"""
XSS = "<script>window.__xss = 1</script>"
HOSTILE = """
export default async (event, step) => {
  const names = ["<script>window.__xss = 1</script>", '"><img src=x onerror="window.__xss = 2">',
                 "javascript:window.__xss = 3", "\\u202eevil\\u202c", "x".repeat(1_000_000)];
  for (const name of names.slice(0, 4)) {
    await step.do(name, async () => '<img src=x onerror="window.__xss = 4">');
    console.log(name, '<svg onload="window.__xss = 5">');
  }
  await step.do("big", async () => names[4]);
  throw new Error('<a href="javascript:window.__xss = 6">click</a>');
};
"""


@dataclass
class Console:
    url: str
    db: Path
    server: uvicorn.Server
    thread: threading.Thread


async def _seed(db: Path | str, scope_root: Path) -> None:
    config = RunnerConfig(pool=PoolConfig(size=2), scope_root=scope_root)
    async with Runner.open(db, config) as runner:
        for scope in ("acme", "other"):
            published = await runner.publish(scope, {"workflows/flow.ts": WAITER,
                                                     "workflows/hostile.ts": HOSTILE,
                                                     "workflows/flaky.ts": FLAKY})  # fmt: skip
            for name, workflow in (("r1", "flow"), ("evil", "hostile"), ("flaky", "flaky")):
                request = StartRunInput(scope, workflow, published.snapshot_id, {"n": 7}, name,
                                        tags={"team": "red"} if name == "r1" else None)  # fmt: skip
                await runner.start(request)
        for scope in ("acme", "other"):  # a schedule each, far from firing
            await runner.set_schedule(scope, f"{scope}-nightly", "flow",
                                      {"cron": "0 3 * * *", "paused": scope == "other"})  # fmt: skip
        # A run the origin and CSRF tests pause and resume (its scope's counts are not read).
        await runner.start(StartRunInput("other", "flow", published.snapshot_id, {"n": 1},
                                         "guarded"))  # fmt: skip
        await asyncio.sleep(1.1)
        await runner.serve(until_idle=True)  # past the sleep: now waiting for approval


async def _serve_worker(db: Path, scope_root: Path) -> None:
    config = RunnerConfig(pool=PoolConfig(size=2), scope_root=scope_root)
    async with Runner.open(db, config) as runner:
        await runner.serve(until_idle=True)


def _in_thread(work: Any) -> None:
    """Run a coroutine to its end on a thread of its own (Playwright's loop holds this one)."""
    failures: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(work)
        except BaseException as error:
            failures.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(120)
    if failures:
        raise failures[0]


def _start_console(db: Path | str, scope_root: Path, tokens: Tokens | None) -> Console:
    config = RunnerConfig(pool=PoolConfig(size=1), scope_root=scope_root)

    async def factory() -> Runner:
        return await Runner.connect(db, config, create=False)

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(factory, tokens), host="127.0.0.1",
                                           port=port, log_level="warning"))  # fmt: skip
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the console did not start"
        time.sleep(0.05)
    return Console(f"http://127.0.0.1:{port}", Path(str(db)), server, thread)


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("console")
    db, scopes = folder / "journal.db", folder / "scopes"
    _in_thread(_seed(db, scopes))
    return db, scopes


@pytest.fixture(scope="module")
def console(journal: tuple[Path, Path]) -> Iterator[Console]:
    tokens = Tokens({OPERATOR_TOKEN: OPERATOR, ACME_TOKEN: Principal("acme")})
    started = _start_console(*journal, tokens)
    yield started
    started.server.should_exit = True
    started.thread.join(10)


def _client(console: Console, token: str | None = OPERATOR_TOKEN) -> httpx.Client:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    return httpx.Client(base_url=console.url, headers=headers, follow_redirects=False)


# -- HTTP ------------------------------------------------------------------------------------


def test_every_page_carries_a_strict_policy(console: Console) -> None:
    with _client(console) as client:
        response = client.get("/runs")
    assert response.status_code == 200
    policy = response.headers["content-security-policy"]
    assert "script-src 'self'" in policy
    assert "default-src 'none'" in policy
    assert "unsafe-inline" not in policy
    assert response.headers["x-frame-options"] == "DENY"


def test_without_a_token_nothing_is_shown(console: Console) -> None:
    with _client(console, token=None) as client:
        assert client.get("/api/runs").status_code == 401
        assert client.get("/runs").headers["location"] == "/login"
        assert client.get("/api/runs", headers={"Authorization": "Bearer wrong"}).status_code == 401


def test_a_scope_token_sees_its_scope_only(console: Console) -> None:
    with _client(console, ACME_TOKEN) as client:
        listed = client.get("/api/runs").json()
        assert {run["scope"] for run in listed["runs"]} == {"acme"}
        assert sum(listed["counts"].values()) == 3  # this scope's three runs only
        assert client.get("/api/runs/other/r1").status_code == 404  # as a missing run
        assert client.get("/api/runs/acme/nope").status_code == 404
        assert client.get("/api/runs?scope=other").status_code == 404
        assert client.post("/api/runs/other/r1/cancel").status_code == 404
        assert client.get("/api/runs/acme/r1").json()["run"]["status"] == "waiting"
    with _client(console) as client:
        assert {run["scope"] for run in client.get("/api/runs").json()["runs"]} == {"acme", "other"}


def test_runs_are_filtered_by_tag_and_schedule_and_the_next_page_keeps_the_filters(
    console: Console,
) -> None:
    with _client(console) as client:
        tagged = client.get("/api/runs", params={"tag": "team=red"}).json()["runs"]
        assert sorted((run["scope"], run["run_id"]) for run in tagged) == [
            ("acme", "r1"), ("other", "r1")]  # fmt: skip
        assert client.get("/api/runs", params={"tag": "team=blue"}).json()["runs"] == []
        assert client.get("/api/runs", params={"schedule": "acme-nightly"}).json()["runs"] == []
        assert client.get("/api/runs", params={"tag": "team"}).status_code == 400
        page = client.get("/runs", params={"tag": "team=red", "status": "waiting"}).text
        assert 'value="team=red"' in page
        assert "/runs/acme/r1" in page
        assert "/runs/acme/flaky" not in page
    with _client(console, ACME_TOKEN) as client:
        tagged = client.get("/api/runs", params={"tag": "team=red"}).json()["runs"]
        assert [(run["scope"], run["run_id"]) for run in tagged] == [("acme", "r1")]


def test_the_workers_page_shows_operators_the_workers_and_tenants_nothing(
    console: Console,
) -> None:
    with _client(console) as client:
        (worker,) = client.get("/api/workers").json()  # the seed's worker, stopped since
        assert worker["state"] == "stopped"
        page = client.get("/workers").text
        assert worker["worker_id"] in page
        assert 'class="worker-stopped"' in page
        assert "Scope databases (<code>db.sql</code>): local files" in page  # a SQLite journal
    with _client(console, ACME_TOKEN) as client:  # workers serve every scope: not a tenant's
        assert client.get("/api/workers").status_code == 404
        assert client.get("/workers").status_code == 404


def test_the_schedules_page_shows_each_scope_its_own(console: Console) -> None:
    with _client(console) as client:
        names = [s["name"] for s in client.get("/api/schedules").json()]
        assert names == ["acme-nightly", "other-nightly"]
        page = client.get("/schedules").text
        assert "cron 0 3 * * * UTC" in page
        assert 'class="schedule-paused"' in page
    with _client(console, ACME_TOKEN) as client:
        assert [s["name"] for s in client.get("/api/schedules").json()] == ["acme-nightly"]
        assert "other-nightly" not in client.get("/schedules").text


def test_a_scopes_configuration_is_shown_to_it_and_applied_by_operators(console: Console) -> None:
    settings = {"vars": {"REGION": "eu"}, "secrets": {"API_KEY": "ACME_API_KEY"}}
    with _client(console) as client:
        empty = client.get("/api/scopes/acme/config").json()
        assert (empty["shown"], empty["versions"]) == (None, [])
        assert "No configuration in the journal" in client.get("/scopes/acme/config").text
        applied = client.post("/api/scopes/acme/config", data={"config": json.dumps(settings)})
        assert applied.json()["version"] == 1
        bad = client.post("/api/scopes/acme/config", data={"config": '{"vars": 3}'})
        assert (bad.status_code, "vars is an object" in bad.json()["error"]) == (400, True)
        again = client.post("/api/scopes/acme/config",
                            data={"config": json.dumps({"vars": {"REGION": "us"}})})  # fmt: skip
        assert again.json()["version"] == 2
        rolled = client.post("/api/scopes/acme/config", data={"rollback": "1"}).json()
        assert (rolled["version"], rolled["config"]["vars"]) == (3, {"REGION": "eu"})
        page = client.get("/scopes/acme/config?version=2").text
        assert "Version 2" in page
        assert client.get("/scopes/acme/config?version=9").status_code == 404
        assert client.get("/api/scopes/no%20such/config").status_code == 404  # not a scope name
        huge = client.post("/api/scopes/acme/config", data={"rollback": "9" * 40})
        assert (huge.status_code, "no version" in huge.json()["error"]) == (400, True)
    with _client(console, ACME_TOKEN) as client:  # its own scope's settings: names, no values
        shown = client.get("/api/scopes/acme/config").json()["shown"]
        assert shown["config"]["secrets"] == {"API_KEY": "ACME_API_KEY"}
        assert client.get("/api/scopes/other/config").status_code == 404
        assert client.post("/api/scopes/acme/config", data={"rollback": "2"}).status_code == 404
        assert "Apply as a new version" not in client.get("/scopes/acme/config").text


def test_usage_per_scope_for_the_scope_that_may_see_it(console: Console) -> None:
    with _client(console, ACME_TOKEN) as client:
        usage = client.get("/api/usage").json()
        assert list(usage) == ["acme"]  # a scope token sees its own usage only
        assert sum(usage["acme"]["runs"].values()) == 3  # this scope's three runs
        # Every measure, each in its current window (the figures themselves depend on when
        # the windows turned: tests/test_budgets.py checks them on a fixed clock).
        assert [m["measure"] for m in usage["acme"]["measures"]] == [
            "steps", "drives", "compute_s", "tool_calls", "fetches", "sql_s", "journal_bytes",
        ]  # fmt: skip
        assert client.get("/api/usage?scope=other").json().keys() == {"acme"}
        page = client.get("/usage").text
        assert "steps_per_day" in page
        assert ">other<" not in page
    with _client(console) as client:
        assert set(client.get("/api/usage").json()) == {"acme", "other"}
        [snapshot] = client.get("/api/snapshots?scope=acme").json()
        page = client.get(f"/snapshots/acme/{snapshot['snapshot_id']}").text
        assert "Capabilities: none declared (bounded by the scope" in page


def test_the_timeline_has_a_bar_per_attempt_and_retry_delay(console: Console) -> None:
    with _client(console) as client:
        detail = client.get("/api/runs/acme/flaky").json()
    assert detail["run"]["output"] == 2
    labels = [(bar["label"], bar["status"]) for bar in detail["timeline"]["bars"]]
    assert labels == [
        ("do:1:flaky (attempt 1)", "retrying"),
        ("do:1:flaky: retry delay", "delay"),
        ("do:1:flaky (attempt 2)", "completed"),
    ]
    assert detail["timeline"]["drives"]  # a tick per drive


_ALIVE = ("waiting", "running")  # resumed runs are running until a worker drives them


def _status(client: httpx.Client, run: str) -> str:
    status: str = client.get(f"/api/runs/{run}").json()["run"]["status"]
    return status


def _csrf_of(page: str) -> str:
    import re  # noqa: PLC0415

    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None, "the page carries no CSRF token"
    return found.group(1)


def test_a_session_cookie_alone_changes_nothing_through_the_api(console: Console) -> None:
    with _client(console, token=None) as client:
        assert client.post("/login", data={"token": OPERATOR_TOKEN}).status_code == 303
        for verb in ("terminate", "cancel", "pause"):  # the cookie, no CSRF token
            refused = client.post(f"/api/runs/other/guarded/{verb}")
            assert refused.status_code == 403, verb
        assert _status(client, "other/guarded") in _ALIVE
        csrf = _csrf_of(client.get("/runs/other/guarded").text)
        paused = client.post("/api/runs/other/guarded/pause", headers={"X-CSRF-Token": csrf})
        assert paused.status_code == 200
        assert _status(client, "other/guarded") == "paused"
        resumed = client.post("/api/runs/other/guarded/resume", data={"csrf": csrf})
        assert resumed.status_code == 200
        assert _status(client, "other/guarded") in _ALIVE


def test_a_post_from_another_origin_is_refused(console: Console) -> None:
    with _client(console) as client:  # even with a bearer token, a browser's mark is checked
        for headers in ({"Origin": "https://evil.example"}, {"Origin": "null"},
                        {"Referer": "https://evil.example/page"},
                        {"Sec-Fetch-Site": "cross-site"}):  # fmt: skip
            assert client.post("/api/runs/other/guarded/pause", headers=headers).status_code == 403
        assert client.post("/login", data={"token": OPERATOR_TOKEN},
                           headers={"Origin": "https://evil.example"}).status_code == 403  # fmt: skip
        assert _status(client, "other/guarded") in _ALIVE


@pytest.fixture(scope="module")
def open_console(journal: tuple[Path, Path]) -> Iterator[Console]:
    """A console without a token file (loopback only): everyone on the machine is an operator."""
    started = _start_console(*journal, None)
    yield started
    started.server.should_exit = True
    started.thread.join(10)


def test_a_console_without_tokens_takes_no_post_from_another_site(open_console: Console) -> None:
    with httpx.Client(base_url=open_console.url) as client:
        for headers in ({"Origin": "https://evil.example"}, {"Referer": "http://evil.example/"},
                        {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "navigate"}):  # fmt: skip
            for verb in ("cancel", "terminate"):
                refused = client.post(f"/api/runs/other/guarded/{verb}", headers=headers)
                assert refused.status_code == 403, (verb, headers)
        # A page of this console with no session (a browser's marks, no CSRF token): refused.
        own = {"Origin": open_console.url}
        assert client.post("/runs/other/guarded/pause", headers=own).status_code == 403
        assert _status(client, "other/guarded") in _ALIVE
        # The browser's way: a page gives a session and its CSRF token; its form is taken.
        csrf = _csrf_of(client.get("/runs/other/guarded").text)
        done = client.post("/runs/other/guarded/pause", data={"csrf": csrf}, headers=own)
        assert done.status_code == 303
        assert _status(client, "other/guarded") == "paused"
    with httpx.Client(base_url=open_console.url) as client:  # no browser at all: curl
        assert client.post("/api/runs/other/guarded/resume").status_code == 200
        assert _status(client, "other/guarded") in _ALIVE


@pytest.mark.parametrize("host", ["rebind.evil.example", "evil.example:80", "127.0.0.2", ""])
def test_only_the_configured_host_names_are_answered(
    console: Console, open_console: Console, host: str
) -> None:
    for served in (console, open_console):
        with _client(served) as client:
            assert client.get("/api/runs", headers={"Host": host}).status_code == 421
            assert client.post("/api/runs/other/guarded/cancel",
                               headers={"Host": host}).status_code == 421  # fmt: skip
            port = served.url.rsplit(":", 1)[1]
            for name in ("localhost", "127.0.0.1", "[::1]"):
                answered = client.get("/api/runs", headers={"Host": f"{name}:{port}"})
                assert answered.status_code == 200, name
            assert _status(client, "other/guarded") in _ALIVE


def test_host_names_given_to_the_console_are_checked() -> None:
    from qjsflow.bridge import InvalidInput  # noqa: PLC0415
    from qjsflow.runner.console.guard import host_names  # noqa: PLC0415

    assert host_names("0.0.0.0", ["Flows.Example.com"]) == (
        "localhost", "127.0.0.1", "::1", "flows.example.com")  # fmt: skip
    assert "10.1.2.3" in host_names("10.1.2.3")
    for bad in ("*", "*.example.com", "evil.example:80", "http://x", "a..b", ""):
        with pytest.raises(InvalidInput, match="--allow-host"):
            host_names("127.0.0.1", [bad])


def test_forms_need_their_csrf_token(console: Console) -> None:
    with _client(console, token=None) as client:
        signed_in = client.post("/login", data={"token": OPERATOR_TOKEN})
        assert signed_in.status_code == 303
        refused = client.post("/runs/other/r1/pause", data={"csrf": "forged"})
        assert refused.status_code == 403
    with _client(console) as client:  # an API client's bearer token is not a cookie: no CSRF
        assert client.get("/api/runs/other/r1").json()["run"]["status"] == "waiting"


@pytest.mark.slow
def test_the_console_reads_a_postgresql_journal(postgres: PostgresServer, tmp_path: Path) -> None:
    url = postgres.new_database()
    _in_thread(_seed(url, tmp_path / "scopes"))
    started = _start_console(url, tmp_path / "scopes", None)  # loopback, no sign-in
    try:
        with httpx.Client(base_url=started.url) as client:
            listed = client.get("/api/runs?scope=acme").json()
            assert {run["run_id"] for run in listed["runs"]} == {"r1", "evil", "flaky"}
            page = client.get("/runs/acme/r1")
            assert page.status_code == 200
            assert "prepared 7" in page.text
            # Started with no configuration in the journal: the starting process's settings.
            assert "Configuration</dt><dd>the starting process's settings" in page.text
    finally:
        started.server.should_exit = True
        started.thread.join(10)


def test_a_console_beyond_loopback_needs_a_token_file(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "qjsflow.runner.cli", "--db", str(tmp_path / "j.db"), "console",
         "--host", "0.0.0.0"],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "needs --token-file" in done.stderr


# -- a real browser --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright  # noqa: PLC0415

    chromium = shutil.which("chromium")
    assert chromium is not None, "Chromium is missing: run make setup (it installs it)"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        yield launched
        launched.close()


def _signed_in(browser: Any, console: Console, token: str = OPERATOR_TOKEN) -> Any:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    dialogs: list[str] = []

    def dismissed(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", dismissed)
    page.dialogs = dialogs
    page.goto(console.url + "/runs")
    page.fill("input[name=token]", token)
    page.click("button[type=submit]")
    page.wait_for_url(console.url + "/runs")
    return page


@pytest.mark.slow
def test_list_to_run_to_timeline_and_logs(browser: Any, console: Console, tmp_path: Path) -> None:
    page = _signed_in(browser, console)
    page.click("a[href='/runs/acme/r1']")
    page.wait_for_url(console.url + "/runs/acme/r1")
    assert page.inner_text("#run-status") == "waiting"
    assert page.locator("svg.timeline .bar").count() == 3  # prepare, breathe, approval
    assert "prepared 7" in page.inner_text("#logs")
    page.screenshot(path=str(tmp_path / "run.png"), full_page=True)
    assert (tmp_path / "run.png").stat().st_size > 10_000
    page.close()


@pytest.mark.slow
def test_a_signal_from_the_page_wakes_the_waiting_run(browser: Any, console: Console) -> None:
    page = _signed_in(browser, console)
    page.goto(console.url + "/runs/acme/r1")
    page.fill("form[action$='/signal'] input[name=type]", "approve")
    page.fill("form[action$='/signal'] input[name=payload]", '"from the console"')
    page.click("form[action$='/signal'] button")
    page.wait_for_url(console.url + "/runs/acme/r1?done=signal")
    assert page.inner_text("#notice").startswith("Event sent")  # the page says it was sent
    # The actions come before the history; times and statuses keep to one line.
    assert page.evaluate(
        "document.querySelector('.actions').compareDocumentPosition("
        "document.querySelector('table.history')) & Node.DOCUMENT_POSITION_FOLLOWING"
    )
    assert (
        page.evaluate(
            "getComputedStyle(document.querySelector('table.history td.when')).whiteSpace"
        )
        == "nowrap"
    )
    _in_thread(_serve_worker(console.db, console.db.with_name("scopes")))
    page.reload()
    assert page.inner_text("#run-status") == "completed"
    assert "from the console" in page.inner_text("#output")
    page.close()


@pytest.mark.slow
def test_a_restart_from_a_step_from_the_page(browser: Any, console: Console) -> None:
    page = _signed_in(browser, console)
    page.goto(console.url + "/runs/other/r1")
    page.select_option("form[action$='/restart'] select", "sleep:breathe:1")
    page.check("form[action$='/restart'] input[name=confirm]")
    page.click("form[action$='/restart'] button")
    page.wait_for_url(console.url + "/runs/other/r1?done=restart")
    assert page.inner_text("#run-status") == "running"
    history = page.inner_text("table.history")
    assert "run_restarted" in history
    assert "sleep:breathe:1" in history
    page.close()


@pytest.mark.slow
def test_a_scope_token_cannot_open_another_scopes_run(browser: Any, console: Console) -> None:
    page = _signed_in(browser, console, ACME_TOKEN)
    response = page.goto(console.url + "/runs/other/r1")
    assert response.status == 404
    assert page.locator("a[href^='/runs/other/']").count() == 0
    page.goto(console.url + "/runs")
    assert page.locator("a[href^='/runs/other/']").count() == 0
    assert page.locator("a[href='/runs/acme/r1']").count() == 1
    page.close()


@pytest.mark.slow
def test_hostile_names_logs_and_outputs_stay_text(browser: Any, console: Console) -> None:
    page = _signed_in(browser, console)
    page.goto(console.url + "/runs/acme/evil")
    page.wait_for_timeout(500)  # time for anything that would run to run
    assert page.evaluate("window.__xss") is None
    assert page.dialogs == []
    assert XSS.replace("/", "%2F") in page.inner_text(
        "table.steps"
    )  # shown as text (a / in a step name is escaped)
    assert "\\u202e" in page.inner_text("table.steps")  # the override made visible
    assert page.locator("main img, main script, main a[href^='javascript']").count() == 0
    big = page.inner_text("table.results")
    assert "… (1000002 chars)" in big  # the 1 MB result is cut on the page, whole in the API
    assert len(big) < 100_000
    assert page.inner_text("#run-status") == "failed"  # the page is still usable
    page.goto(console.url + "/snapshots")
    page.click("a[href^='/snapshots/acme/']")
    assert "window.__xss = 1" in page.inner_text("main")  # the hostile source, as text
    assert page.evaluate("window.__xss") is None
    page.close()
