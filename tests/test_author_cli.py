"""The author's commands as subprocesses: `qjsflow run` (virtual time, mocks, events, exit
codes, the timeline), the TypeScript author tests of fixtures/author-tests, and `qjsflow dev`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
import pytest

from qjsflow.bundles import find_toolchain
from tests.conftest import FIXTURES, PROJECT_ROOT
from tests.net import free_port

pytestmark = pytest.mark.slow  # subprocesses, each publishing with esbuild

TREE = FIXTURES / "author-tests"
QJSFLOW = [sys.executable, "-m", "qjsflow.runner.cli"]
SIGNUP = '{"email": "ada@example.com", "plan": "pro"}'
FLAKY = """
calls = 0


async def crm_sync(args):
    global calls
    calls += 1
    if calls <= 2:
        raise RuntimeError("the CRM is down")
    return {"synced": calls}


async def send(args):
    return {"sent": True}


TOOLS = {"crm.sync": crm_sync, "mail.send": send}
"""


def _run(*args: str, cwd: Path = PROJECT_ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*QJSFLOW, "run", str(TREE), "onboarding", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


def test_a_week_a_day_and_retries_run_to_the_end_in_under_two_seconds(tmp_path: Path) -> None:
    (tmp_path / "flaky.py").write_text(FLAKY)
    began = time.monotonic()
    done = _run("--input", SIGNUP, "--tools", "flaky:TOOLS", "--fast-forward", "--json",
                "--event", 'approval={"approved": true}', cwd=tmp_path)  # fmt: skip
    took = time.monotonic() - began
    assert done.returncode == 0, done.stderr
    outcome = orjson.loads(done.stdout)
    assert outcome["output"] == {
        "account": "acct-ada@example.com", "status": "active", "crm": {"synced": 3},
    }  # fmt: skip
    rows = {row["step"]: row for row in outcome["timeline"]}
    assert rows["sync to crm"]["attempt"] == "3"  # two failures, retried an hour apart
    assert rows["trial"]["duration"] == "604800.00s"  # the week, on the virtual clock
    assert took < 2.0, took  # the whole command: publish, a week, retries, a day's wait


def test_mocks_answer_tools_and_the_timeline_is_printed() -> None:
    done = _run("--input", SIGNUP, "--fast-forward", "--mock-tool", 'crm.sync={"synced": 1}',
                "--mock-tool", 'mail.send={"sent": true}', "--event", 'approval={"approved": true}')  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["STEP", "KIND", "ATTEMPT", "DURATION", "EXECUTED", "REPLAYED"]
    assert any(line.startswith("trial ") and "604800.00s" in line for line in lines)
    assert "tool crm.sync: 1 calls" in lines
    assert lines[-1] == (
        'completed: {"account":"acct-ada@example.com","status":"active","crm":{"synced":1}}'
    )


def test_a_missing_event_is_reported_and_exits_1() -> None:
    done = _run("--input", SIGNUP, "--fast-forward", "--mock-tool", 'crm.sync={"synced": 1}')
    assert done.returncode == 1
    assert done.stdout.splitlines()[-1] == (
        "stopped (waiting): it waits for the event approval, which nobody gave"
    )
    timed_out = _run("--input", SIGNUP, "--fast-forward", "--mock-tool", 'crm.sync={"synced": 1}',
                     "--let-waits-time-out")  # fmt: skip
    assert timed_out.returncode == 1
    assert timed_out.stdout.splitlines()[-1].startswith(
        "failed: WaitForEventTimeoutError: step.waitForEvent('manager approval') timed out"
    )


def test_a_failed_run_exits_1_and_bad_input_exits_2(tmp_path: Path) -> None:
    (tmp_path / "down.py").write_text(
        "async def down(args):\n    raise RuntimeError('down for good')\n"
        "TOOLS = {'crm.sync': down}\n"
    )
    failed = _run("--input", SIGNUP, "--fast-forward", "--tools", "down:TOOLS", cwd=tmp_path)
    assert failed.returncode == 1, failed.stderr
    assert "failed: " in failed.stdout
    assert "down for good" in failed.stdout
    for bad, problem in (
        (["--event", "approval"], "--event wants NAME=VALUE"),
        (["--event", "approval={"], "--event approval is not valid JSON"),
        (["--mock-tool", "crm.sync=@/nonexistent.json"], "cannot read '/nonexistent.json'"),
    ):
        refused = _run("--input", SIGNUP, *bad)
        assert refused.returncode == 2, refused.stderr
        assert problem in refused.stderr
    missing = subprocess.run([*QJSFLOW, "run", str(tmp_path / "nope"), "x"],
                             capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert missing.returncode == 2
    assert "no folder" in missing.stderr


def test_the_typescript_author_tests_pass(tmp_path: Path) -> None:
    """The README's pattern: a test script that calls `qjsflow run --json` and asserts."""
    toolchain = find_toolchain()
    built = tmp_path / "onboarding.test.mjs"
    script = (
        f"require({str(toolchain.esbuild_package / 'lib' / 'main.js')!r}).buildSync({{"
        f"entryPoints: [{str(TREE / 'tests' / 'onboarding.test.ts')!r}],"
        f"outfile: {str(built)!r}, format: 'esm', platform: 'node', target: 'node20'}})"
    )
    subprocess.run([toolchain.node, "-e", script], check=True, timeout=60)
    source = built.read_text().replace('new URL("..", import.meta.url)',
                                       f"new URL({(TREE.as_uri() + '/')!r})")  # fmt: skip
    built.write_text(source)
    env = {**os.environ, "QJSFLOW": " ".join(QJSFLOW)}
    tested = subprocess.run([toolchain.node, "--test", str(built)], env=env, cwd=PROJECT_ROOT,
                            capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert tested.returncode == 0, tested.stdout[-3000:] + tested.stderr[-2000:]
    assert "# pass 4" in tested.stdout
    assert "# fail 0" in tested.stdout


def _line_with(process: subprocess.Popen[str], text: str, seen: list[str]) -> str:
    assert process.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        seen.append(line)
        if text in line:
            return line
    raise AssertionError(f"no line with {text!r} in {seen}")


def test_dev_republishes_on_change_shows_errors_and_serves_the_console(tmp_path: Path) -> None:
    tree = tmp_path / "tree" / "workflows"
    tree.mkdir(parents=True)
    flow = tree / "flow.ts"
    flow.write_text("export default async () => 1;\n")
    port = free_port()
    dev = subprocess.Popen([*QJSFLOW, "--db", str(tmp_path / "dev.db"), "dev", str(tree.parent),
                            "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)  # fmt: skip
    seen: list[str] = []
    try:
        first = _line_with(dev, "published snapshot", seen)
        assert "(flow)" in first
        deadline = time.monotonic() + 30
        while True:
            try:
                listed = httpx.get(f"http://127.0.0.1:{port}/api/snapshots", timeout=5).json()
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        assert [s["scope"] for s in listed] == ["dev"]
        time.sleep(0.05)
        flow.write_text("export default async () => 2;\n")
        second = _line_with(dev, "published snapshot", seen)
        assert second.split()[3] != first.split()[3]  # another snapshot id
        flow.write_text("export default async () => 1 +;\n")
        error = _line_with(dev, "error: ", seen)
        assert "workflows/flow.ts:1:" in error, error
        assert len(httpx.get(f"http://127.0.0.1:{port}/api/snapshots", timeout=5).json()) == 2
    finally:
        dev.send_signal(signal.SIGTERM)
        out, err = dev.communicate(timeout=30)
    assert dev.returncode == 0, err
    assert "stopped" in out


def test_run_honours_the_env_file_and_its_scope(tmp_path: Path) -> None:
    """`qjsflow run --env FILE`: the run sees the scope's vars and secrets (from this shell's
    variables), as a worker would; a file of several scopes needs --scope."""
    tree = tmp_path / "src"
    (tree / "workflows").mkdir(parents=True)
    (tree / "workflows" / "flow.js").write_text(
        "export default async (event, step, env) => ({ region: env.REGION, has: 'KEY' in env });\n"
    )
    env_file = tmp_path / "env.json"
    env_file.write_text('{"acme": {"vars": {"REGION": "eu"}, "secrets": {"KEY": "HOME"}}}')
    done = subprocess.run([*QJSFLOW, "--env", str(env_file), "run", str(tree), "flow", "--json"],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert orjson.loads(done.stdout)["output"] == {"region": "eu", "has": True}
    env_file.write_text('{"acme": {"vars": {"REGION": "eu"}}, "beta": {"vars": {"REGION": "us"}}}')
    which = subprocess.run([*QJSFLOW, "--env", str(env_file), "run", str(tree), "flow"],
                           capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert (which.returncode, "it has: acme, beta" in which.stderr) == (2, True)
    beta = subprocess.run([*QJSFLOW, "--env", str(env_file), "run", str(tree), "flow", "--scope",
                           "beta", "--json"], capture_output=True, text=True, timeout=120,
                          check=False)  # fmt: skip
    assert orjson.loads(beta.stdout)["output"] == {"region": "us", "has": False}
