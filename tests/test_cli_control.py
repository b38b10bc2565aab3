"""Run control and inspection from the command line, as an operator uses it (subprocesses)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.conftest import PROJECT_ROOT
from tests.postgres import PostgresServer
from tests.test_cli import Cli

pytestmark = pytest.mark.slow  # every test here runs the CLI as subprocesses

STEPS = """
export default async (event, step) => {
  const one = await step.tool("one", "append", { run: event.instanceId, step: "one" });
  const two = await step.tool("two", "append", { run: event.instanceId, step: "two" });
  await step.sleep("nap", event.payload.nap);
  return [one, two];
};
"""


def _published(cli: Cli, tmp_path: Path, source: str = STEPS) -> str:
    tree = tmp_path / "src" / "workflows"
    tree.mkdir(parents=True, exist_ok=True)
    (tree / "flow.js").write_text(source)
    published = cli.ok("publish", str(tree.parent), "--scope", "acme")
    return str(published["snapshot_id"])


def _start(cli: Cli, snapshot: str, run_id: str, nap: str = "1 second") -> dict[str, object]:
    """The run once a worker has driven it to its first suspension."""
    cli.start_worker()
    payload = orjson.dumps({"nap": nap}).decode()
    return dict(cli.ok("start", "flow", "--scope", "acme", "--snapshot", snapshot,
                       "--run-id", run_id, "--input", payload, "--wait", "suspended"))  # fmt: skip


def _calls(cli: Cli) -> list[str]:
    return cli.tool_log.read_text().splitlines()


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    with Cli(tmp_path) as cli:
        yield cli


@pytest.fixture(params=["sqlite", "postgresql"])
def any_cli(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cli]:
    with Cli(tmp_path) as cli:
        if request.param == "postgresql":
            server: PostgresServer = request.getfixturevalue("postgres")
            cli.db = server.new_database()  # type: ignore[assignment]  # a URL, not a path
        yield cli


def test_pause_resume_terminate_from_the_command_line(any_cli: Cli, tmp_path: Path) -> None:
    cli = any_cli
    snapshot = _published(cli, tmp_path)
    assert _start(cli, snapshot, "r1", nap="1 hour")["status"] == "sleeping"
    paused = cli.ok("pause", "r1")
    assert paused["status"] == "paused"
    assert cli.ok("worker", "--until-idle") == {"drives": 0}
    assert cli.ok("resume", "r1", "--wait", "suspended")["status"] == "sleeping"
    ended = cli.ok("terminate", "r1", "--reason", "not needed")
    assert (ended["status"], ended["error"]) == (
        "terminated",
        "terminated by an operator: not needed",
    )
    refused = cli.run("pause", "r1")
    assert refused.returncode == 2
    assert "is terminated" in refused.stderr
    history = [event["type"] for event in cli.ok("history", "r1")]
    for kind in ("pause_requested", "run_paused", "run_resumed", "run_terminated"):
        assert kind in history


def test_restart_from_a_step_and_fork(any_cli: Cli, tmp_path: Path) -> None:
    cli = any_cli
    snapshot = _published(cli, tmp_path)
    assert _start(cli, snapshot, "r1", nap="1 second")["status"] == "sleeping"
    assert _calls(cli) == ["r1 one", "r1 two"]
    restarted = cli.ok("restart", "r1", "--from-step", "tool:two", "--wait")
    assert restarted == ["one", "two"]  # --wait: the output once a worker has driven it
    assert _calls(cli) == ["r1 one", "r1 two", "r1 two"]  # `one` was not called again
    fork = cli.ok("fork", "r1", "--from-step", "sleep:nap", "--run-id", "f1", "--wait",
                  "suspended")  # fmt: skip
    assert (fork["run_id"], fork["status"]) == ("f1", "sleeping")
    assert _calls(cli) == ["r1 one", "r1 two", "r1 two"]  # the fork called no tool
    wrong = cli.run("restart", "r1", "--from-step", "tool:three")
    assert wrong.returncode == 2
    assert "has no step 'tool:three:1'" in wrong.stderr


def test_bulk_verbs_count_then_act_with_yes(cli: Cli, tmp_path: Path) -> None:
    snapshot = _published(cli, tmp_path)
    for run_id in ("a", "b", "c"):
        _start(cli, snapshot, run_id, nap="1 hour")
    cli.ok("terminate", "c")
    asked = cli.run("cancel", "--where", "status=sleeping")
    assert asked.returncode == 2
    assert "2 runs match; nothing was done: add --yes" in asked.stderr
    preview = cli.ok("cancel", "--where", "status=sleeping", "--dry-run")  # as migrate's, prune's
    assert (preview["matched"], sorted(preview["would"]), preview["done"]) == (
        2, ["acme/a", "acme/b"], [],
    )  # fmt: skip
    assert {run["status"] for run in cli.ok("list")["runs"]} == {"sleeping", "terminated"}
    done = cli.ok("cancel", "--where", "status=sleeping,workflow=flow", "--yes")
    assert (done["matched"], sorted(done["done"]), done["failed"]) == (2, ["acme/a", "acme/b"], [])
    assert [run["status"] for run in cli.ok("list")["runs"]] == ["cancelled", "cancelled",
                                                                  "terminated"]  # fmt: skip
    restarted = cli.ok("restart", "--where", "status=cancelled", "--since", "1h", "--yes")
    assert (restarted["matched"], sorted(restarted["done"])) == (2, ["acme/a", "acme/b"])
    for run_id in ("a", "b"):  # each made runnable, for the worker (which drives it to its nap)
        assert cli.ok("status", run_id)["status"] in ("running", "sleeping")
    for bad, message in (
        (("cancel", "a", "--where", "status=failed"), "not both"),
        (("cancel", "--where", "colour=red"), "--where wants"),
        (("cancel", "--where", "status=odd"), "status must be one of"),
        (("cancel", "a", "--yes"), "only with --where"),
        (("cancel", "a", "--dry-run"), "only with --where"),
        (("cancel", "--where", "status=failed", "--yes", "--dry-run"), "say one"),
        (("cancel", "--where", "status=failed", "--since", "yesterday"), "--since wants"),
        (("resume", "--where", "status=paused", "--yes", "--wait"), "--wait takes one run"),
    ):
        refused = cli.run(*bad)
        assert refused.returncode == 2, bad
        assert message in refused.stderr, refused.stderr


def test_prune_from_the_command_line(cli: Cli, tmp_path: Path) -> None:
    snapshot = _published(cli, tmp_path, 'export default async () => "done";')
    cli.start_worker()
    for run_id in ("a", "b"):
        cli.ok("start", "flow", "--scope", "acme", "--snapshot", snapshot, "--run-id", run_id,
               "--wait")  # fmt: skip
    time.sleep(0.01)
    counted = cli.ok("prune", "--older-than", "0s", "--dry-run")
    assert (counted["runs"], counted["dry_run"]) == (2, True)
    assert len(cli.ok("list")["runs"]) == 2
    assert cli.ok("prune", "--older-than", "30d")["runs"] == 0
    pruned = cli.ok("prune", "--older-than", "0s", "--snapshots")
    assert (pruned["runs"], pruned["snapshots"]) == (2, 1)
    assert cli.ok("list")["runs"] == []
    for bad, message in (
        (("prune", "--older-than", "soon"), "--older-than wants a duration"),
        (("prune", "--older-than", "1d", "--status", "waiting"), "only ended runs"),
    ):
        refused = cli.run(*bad)
        assert refused.returncode == 2
        assert message in refused.stderr


LOGS = """
export default async (event, step) => {
  console.log("before the slow step");
  await step.tool("slow", "slow", { run: event.instanceId, seconds: 1.5 });
  console.log("after it");
  return "ok";
};
"""


def test_logs_follow_prints_lines_until_the_run_ends(cli: Cli, tmp_path: Path) -> None:
    snapshot = _published(cli, tmp_path, LOGS)
    cli.ok("start", "flow", "--scope", "acme", "--snapshot", snapshot, "--run-id", "r1")
    follower = subprocess.Popen(
        cli.argv("logs", "r1", "--follow"), cwd=PROJECT_ROOT, env=cli.env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    worker = cli.run("worker", "--until-idle", "-v", json=False)
    assert worker.returncode == 0
    assert re.search(r"drove acme/r1 in [0-9.]+ s: completed", worker.stderr), worker.stderr
    out, err = follower.communicate(timeout=30)
    assert follower.returncode == 0, err
    assert out.splitlines() == ["log    before the slow step", "log    after it"]


def test_start_wait_utc_and_tools_and_notify_from_the_current_folder(tmp_path: Path) -> None:
    here = tmp_path / "ops"
    here.mkdir()
    (here / "mytools.py").write_text(
        "import pathlib\n"
        "async def shout(args):\n    return args.upper()\n"
        "TOOLS = {'shout': shout}\n"
        "async def notify(message):\n"
        "    pathlib.Path('notified.txt').write_text(message.title)\n"
    )
    (here / "workflows").mkdir()
    (here / "workflows" / "flow.js").write_text(
        "export default async (event, step) => {\n"
        '  await step.notify({ title: "heads up" });\n'
        '  return await step.tool("loud", "shout", event.payload);\n};\n'
    )
    script = Path(sys.executable).with_name("qjsflow")  # the installed command, as users run it
    env = {**os.environ, "QJSFLOW_DB": str(tmp_path / "j.db"), "QJSFLOW_SCOPE": "acme"}
    # The worker loads the tools and the notifier from its folder; the operator's commands
    # need neither.
    hosting = {**env, "QJSFLOW_TOOLS": "mytools:TOOLS", "QJSFLOW_NOTIFY": "mytools:notify"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(script), *args], cwd=here, env=env, capture_output=True,
                              text=True, timeout=120, check=False)  # fmt: skip

    assert run("publish", ".").returncode == 0
    worker = subprocess.Popen([str(script), "worker"], cwd=here, env=hosting,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        waited = run("start", "flow", "--snapshot", "latest", "--input", '"hi"', "--wait",
                     "--run-id", "r1")  # fmt: skip
        assert (waited.returncode, waited.stdout.strip()) == (0, '"HI"'), waited.stderr
        assert (here / "notified.txt").read_text() == "heads up"
        shown = run("status", "r1", "--utc").stdout
        assert re.search(r"created\s+20\d\d-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", shown), shown
        (here / "workflows" / "flow.js").write_text(
            'export default async (e, step) => { await step.sleep("nap", "1 hour"); };\n'
        )
        assert run("publish", ".").returncode == 0
        late = run("start", "flow", "--snapshot", "latest", "--wait", "--timeout", "0.5")
        assert late.returncode == 1
        assert re.search(r"is still (running|sleeping) after 0.5 s", late.stderr), late.stderr
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)


def test_list_pages_by_cursor_and_since(cli: Cli, tmp_path: Path) -> None:
    snapshot = _published(cli, tmp_path, 'export default async () => "done";')
    for run_id in ("a", "b", "c"):
        cli.ok("start", "flow", "--scope", "acme", "--snapshot", snapshot, "--run-id", run_id)
    first = cli.ok("list", "--limit", "2")
    assert [run["run_id"] for run in first["runs"]] == ["a", "b"]
    rest = cli.ok("list", "--limit", "2", "--cursor", first["next_cursor"])
    assert ([run["run_id"] for run in rest["runs"]], rest["more"]) == (["c"], False)
    assert cli.ok("list", "--since", "1h")["runs"][0]["run_id"] == "a"
    assert cli.ok("list", "--since", "2999-01-01T00:00:00")["runs"] == []
    for cursor in ("nonsense", "9" * 40 + ".YS9h", "1.%%%", "-5.YS9h"):
        bad = cli.run("list", f"--cursor={cursor}")
        assert bad.returncode == 2, cursor
        assert "invalid cursor" in bad.stderr


def test_terminate_stops_a_drive_in_another_process(cli: Cli, tmp_path: Path) -> None:
    snapshot = _published(cli, tmp_path, """
export default async (event, step) =>
  step.tool("stuck", "slow", { run: event.instanceId, seconds: 60 });
""")  # fmt: skip
    cli.ok("start", "flow", "--scope", "acme", "--snapshot", snapshot, "--run-id", "r1")
    worker = subprocess.Popen(
        cli.argv("worker", "--until-idle"), cwd=PROJECT_ROOT, env=cli.env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while _calls(cli) != ["r1 slow"]:  # the worker is inside the 60-second tool call
        assert time.monotonic() < deadline
        time.sleep(0.05)
    began = time.monotonic()
    assert cli.ok("terminate", "r1")["status"] == "terminated"
    worker.communicate(timeout=30)
    assert worker.returncode == 0
    assert time.monotonic() - began < 10  # its heartbeat (a third of the 1 s lease) stopped it
    run = cli.ok("status", "r1")
    assert (run["status"], run["output"]) == ("terminated", None)
    assert [event["type"] for event in cli.ok("history", "r1")][-1] == "run_terminated"


def test_usage_counts_runs_per_scope(cli: Cli, tmp_path: Path) -> None:
    snapshot = _published(cli, tmp_path)
    env = tmp_path / "env.json"
    env.write_text('{"acme": {"budgets": {"steps_per_day": 500, "live_runs": 9}}}')
    _start(cli, snapshot, "r1", nap="1 hour")
    found = cli.ok("usage", "--env", str(env))["acme"]
    assert (found["runs"], found["live"], found["live_budget"]) == ({"sleeping": 1}, 1, 9)
    steps = next(m for m in found["measures"] if m["measure"] == "steps")
    assert (steps["budget_name"], steps["budget"]) == ("steps_per_day", 500)
    assert cli.ok("usage", "--scope", "nobody") == {}
    shown = cli.run("usage", "--env", str(env), json=False).stdout
    assert "acme: 1 of 9 live runs (sleeping 1)" in shown
    assert re.search(r"steps_per_day\s+\d+\s+500\s+in ", shown), shown
    env.write_text('{"acme": {"budgets": {"steps_per_day": -5}}}')
    refused = cli.run("usage", "--env", str(env), json=False)
    assert refused.returncode == 2
    assert "scope 'acme' of the env file: budget steps_per_day must be a number" in refused.stderr


def test_migrate_moves_compatible_runs_and_reports_the_rest(cli: Cli, tmp_path: Path) -> None:
    old = _published(cli, tmp_path)
    for run in ("r1", "r2"):
        _start(cli, old, run, nap="1 hour")
    appended = STEPS.replace("  return [one, two];", '  await step.sleep("more", 1);\n'
                             "  return [one, two];")  # fmt: skip
    new = _published(cli, tmp_path, appended)
    dry = cli.run("migrate", "--scope", "acme", "--workflow", "flow", "--from-snapshot", old,
                  "--to-snapshot", new, "--dry-run", json=False)  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    assert "(dry run: nothing moved): 2 compatible (0 moved), 0 incompatible" in dry.stdout
    moved = cli.ok("migrate", "r1", "--to-snapshot", new)
    assert (moved["compatible"], moved["migrated"]) == (1, 1)
    assert cli.ok("status", "r1")["snapshot_id"] == new
    renamed = STEPS.replace('step.tool("two"', 'step.tool("second"')
    newer = _published(cli, tmp_path, renamed)
    refused = cli.run("migrate", "r2", "--to-snapshot", newer, json=False)
    assert refused.returncode == 1
    assert "0 compatible (0 moved), 1 incompatible" in refused.stdout
    assert (
        "r2: incompatible: divergence: the code does not reach step tool:1:two as the run did:"
        " it called tool:1:second instead" in refused.stdout
    )
    assert re.search(r"at workflows/flow\.js:4:\d+", refused.stdout), refused.stdout
    assert cli.ok("status", "r2")["snapshot_id"] == old
    both = cli.run("migrate", "r2", "--workflow", "flow", "--to-snapshot", new, json=False)
    assert both.returncode == 2
    assert "one of the two" in both.stderr
