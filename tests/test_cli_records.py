"""Operator commands record, workers drive (docs/OPERATIONS.md, Who drives a run): start,
signal, resume, restart and fork write to the journal and return, with no tool module and no
env file; a worker drives the runs; `--wait` waits for the end, `--wait suspended` until
the run is at rest."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.conftest import PROJECT_ROOT
from tests.postgres import PostgresServer
from tests.test_cli import Cli

pytestmark = pytest.mark.slow  # the CLI and a worker as subprocesses

FLOW = """
export default async (event, step) => {
  const one = await step.tool("one", "append", { run: event.instanceId, step: "one" });
  const go = await step.waitForEvent("go", { type: "go" });
  return [one, go.payload];
};
"""


class Operator:
    """The operator's shell: `--db` and nothing else (no QJSFLOW_TOOLS, no env file)."""

    def __init__(self, cli: Cli) -> None:
        self.cli = cli
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("QJSFLOW_")}

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "qjsflow.runner.cli", "--db", str(self.cli.db), "--json",
             *args],
            cwd=PROJECT_ROOT, env=self.env, capture_output=True, text=True, timeout=120,
            check=False,
        )  # fmt: skip

    def ok(self, *args: str) -> Any:
        done = self.run(*args)
        assert done.returncode == 0, done.stderr
        return orjson.loads(done.stdout)

    def drives(self, run_id: str) -> int:
        history = self.ok("history", run_id, "--scope", "acme")
        return sum(event["type"] == "drive_started" for event in history)


@pytest.fixture(params=["sqlite", "postgresql"])
def operator(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Operator]:
    with Cli(tmp_path) as cli:
        if request.param == "postgresql":
            server: PostgresServer = request.getfixturevalue("postgres")
            cli.db = server.new_database()  # type: ignore[assignment]  # a URL, not a path
        tree = tmp_path / "src" / "workflows"
        tree.mkdir(parents=True)
        (tree / "flow.js").write_text(FLOW)
        cli.ok("publish", str(tree.parent), "--scope", "acme")
        yield Operator(cli)


def test_operator_commands_record_and_a_worker_drives(operator: Operator) -> None:
    start = ("start", "flow", "--scope", "acme", "--snapshot", "latest", "--run-id")
    started = operator.run(*start, "r1")
    assert started.returncode == 0, started.stderr
    assert orjson.loads(started.stdout)["status"] == "running"
    assert "no live worker serves this journal: the run is recorded" in started.stderr
    # No worker runs: a wait for the end times out (exit 1), and the run is still recorded.
    waited = operator.run(*start, "r2", "--wait", "--timeout", "0.5")
    assert waited.returncode == 1
    assert "'r2' is still running after 0.5 s" in waited.stderr
    # Each command records its change and returns: nothing of the body runs in it.
    assert operator.ok("pause", "r1", "--scope", "acme")["status"] == "paused"
    assert operator.ok("resume", "r1", "--scope", "acme")["status"] == "running"
    assert operator.ok("signal", "r1", "go", "--input", "5")["status"] == "running"
    assert operator.ok("restart", "r2")["status"] == "running"
    forked = operator.ok("fork", "r1", "--run-id", "f1")
    assert (forked["run_id"], forked["status"]) == ("f1", "running")
    assert [operator.drives(run) for run in ("r1", "r2", "f1")] == [0, 0, 0]
    assert operator.cli.tool_log.read_text() == ""  # no tool was called by a command

    operator.cli.start_worker()  # binds the tools; the commands above needed none
    assert operator.ok("result", "r1", "--wait", "--timeout", "60") == ["one", 5]
    rested = operator.ok("fork", "r1", "--run-id", "f2", "--wait", "suspended")
    assert (rested["status"], rested["waiting_for"]) == ("waiting", "go")
    signalled = operator.ok("signal", "f2", "go", "--input", '"yes"', "--wait")
    assert signalled == ["one", "yes"]  # --wait prints the output, as `result` does
    again = operator.ok("restart", "r2", "--wait", "suspended")
    assert (again["status"], again["waiting_for"]) == ("waiting", "go")
    assert operator.ok("start", *start[1:], "r3", "--wait", "suspended")["status"] == "waiting"


def test_wait_is_refused_where_it_cannot_apply(operator: Operator) -> None:
    for args, said in (
        (("start", "flow", "--scope", "acme", "--snapshot", "latest", "--wait", "ended"),
         "argument --wait: invalid choice: 'ended'"),
        (("resume", "--where", "status=paused", "--yes", "--wait"), "--wait takes one run"),
        (("signal", "r1", "go", "--timeout", "0"), "--timeout: '0' is outside"),
    ):  # fmt: skip
        refused = operator.run(*args)
        assert (refused.returncode, said in refused.stderr) == (2, True), refused.stderr
