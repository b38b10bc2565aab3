"""The user's four flows through the `qjsflow` command line, as subprocesses with --json."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from qjsflow.runner.cli.commands import main as cli_main
from qjsflow.runner.store import JournalStore
from tests.conftest import PROJECT_ROOT
from tests.postgres import PostgresServer

pytestmark = pytest.mark.slow  # every test here runs the CLI as subprocesses

FLOW = """
import type { WorkflowEvent, WorkflowStep } from "qjsflow";
import { greeting } from "../lib/text";
export default async function (event: WorkflowEvent<{ name: string }>, step: WorkflowStep) {
  const slow = await step.tool("slow", "slow", { run: event.instanceId, seconds: 1.5 },
                               { retries: { limit: 3, delay: 0 } });
  const go = await step.waitForEvent<{ ok: boolean }>("go", { type: "go" });
  return { hello: greeting(event.payload.name), slow, ok: go.payload.ok };
}
"""


class Cli:
    lease_ttl = "1"  # seconds: a killed driver's run is taken over soon

    def __init__(self, tmp_path: Path) -> None:
        self.db = tmp_path / "journal.db"
        self.tool_log = tmp_path / "tools.log"
        self.tool_log.touch()
        self.env = {**os.environ, "QJSFLOW_TOOL_LOG": str(self.tool_log)}
        self.background: subprocess.Popen[bytes] | None = None

    def argv(self, *args: str) -> list[str]:
        return [
            sys.executable, "-m", "qjsflow.runner.cli", "--db", str(self.db),
            "--tools", "tests.crash_tools:TOOLS", "--lease-ttl", self.lease_ttl, *args,
        ]  # fmt: skip

    def run(self, *args: str, json: bool = True) -> subprocess.CompletedProcess[str]:
        flags = ("--json",) if json else ()
        return subprocess.run(
            self.argv(*flags, *args), cwd=PROJECT_ROOT, env=self.env, capture_output=True,
            text=True, timeout=120, check=False,
        )  # fmt: skip

    def ok(self, *args: str) -> Any:
        done = self.run(*args)
        assert done.returncode == 0, done.stderr
        return orjson.loads(done.stdout)

    def start_worker(self) -> None:
        """A worker process serving the journal until the test ends (`close`): the operator
        commands only record, and a worker drives. Started once the journal exists."""
        if self.background is None:
            self.background = subprocess.Popen(
                self.argv("worker"), cwd=PROJECT_ROOT, env=self.env,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip

    def close(self) -> None:
        if self.background is not None:
            self.background.send_signal(signal.SIGTERM)  # finishes or releases what it holds
            self.background.wait(timeout=60)
            self.background = None

    def __enter__(self) -> Cli:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def counts(self) -> dict[str, int]:
        with sqlite3.connect(self.db) as connection:
            tables = [row[0] for row in connection.execute(
                "SELECT name FROM sqlite_schema WHERE type = 'table'")]  # fmt: skip
            return {
                t: connection.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables
            }


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    with Cli(tmp_path) as cli:
        yield cli


def _tree(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    (root / "workflows").mkdir(parents=True)
    (root / "lib").mkdir()
    (root / "workflows" / "greet.ts").write_text(FLOW)
    (root / "lib" / "text.ts").write_text("export const greeting = (n: string) => `hello ${n}`;\n")
    return root


@pytest.mark.timeout(180)
def test_the_four_flows_from_a_shell(cli: Cli, tmp_path: Path) -> None:
    published = cli.ok("publish", str(_tree(tmp_path)), "--scope", "acme")
    assert published["workflows"] == [
        {
            "workflow": "greet",
            "entry_path": "workflows/greet.ts",
            "export": "default",
            "binding": None,
            "flow": None,
        }
    ]
    snapshot = published["snapshot_id"]

    # Start: the command records the run and returns; a worker drives it.
    started = cli.ok("start", "greet", "--scope", "acme", "--snapshot", snapshot,
                     "--input", '{"name": "ada"}', "--run-id", "cli-1")  # fmt: skip
    assert started["status"] == "running"
    assert cli.counts()["steps"] == 0  # nothing of the body ran in the command
    # Kill that worker while the slow tool runs inside its drive.
    first = subprocess.Popen(cli.argv("worker"), cwd=PROJECT_ROOT, env=cli.env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 60
    while "slow" not in cli.tool_log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    crashed = cli.ok("status", "cli-1")
    assert crashed["status"] == "running"

    # Another worker takes the run over once the dead one's lease lapses.
    cli.start_worker()
    resumed = cli.ok("resume", "cli-1", "--scope", "acme", "--wait", "suspended")
    assert (resumed["status"], resumed["waiting_for"]) == ("waiting", "go")
    assert resumed["snapshot_id"] == snapshot

    done = cli.ok("signal", "cli-1", "go", "--input", '{"ok": true}', "--wait", "suspended")
    assert done["status"] == "completed"
    assert done["output"] == {"hello": "hello ada", "slow": "slow done", "ok": True}

    steps = cli.ok("steps", "cli-1")
    assert [(s["kind"], s["name"], s["status"], s["attempt"]) for s in steps] == [
        ("tool", "slow", "completed", 2),
        ("waitForEvent", "go", "completed", 1),
    ]
    listed = cli.ok("list", "--scope", "acme", "--status", "completed")
    assert [r["run_id"] for r in listed["runs"]] == ["cli-1"]
    assert listed["more"] is False
    assert cli.ok("cancel", "cli-1")["status"] == "completed"
    assert cli.ok("worker", "--until-idle") == {"drives": 0}


def test_human_output_is_a_table(cli: Cli, tmp_path: Path) -> None:
    tree = tmp_path / "t" / "workflows"
    tree.mkdir(parents=True)
    (tree / "nap.ts").write_text('export default async (e, step) => step.sleep("nap", "1 hour");\n')
    snapshot = cli.ok("publish", str(tree.parent), "--scope", "acme")["snapshot_id"]
    cli.start_worker()
    cli.ok("start", "nap", "--scope", "acme", "--snapshot", snapshot, "--run-id", "nap-1",
           "--wait", "suspended")  # fmt: skip
    listing = cli.run("list", json=False)
    assert listing.returncode == 0
    header, row = listing.stdout.splitlines()
    assert header.split() == ["RUN", "STATUS", "WORKFLOW", "AGE", "NEXT"]
    assert row.split()[:3] == ["nap-1", "sleeping", "nap"]
    assert "wakes in 59m" in row
    status = cli.run("status", "nap-1", json=False)
    assert "status    sleeping" in status.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("status", "no-such-run"), "no run 'no-such-run'"),
        (("status", "seed-1", "--scope", "other"), "no run 'seed-1'"),
        (("signal", "seed-1", "go", "--scope", "other"), "no run 'seed-1'"),
        (("cancel", "seed-1", "--scope", "other"), "no run 'seed-1'"),
        (
            ("start", "missing", "--scope", "acme", "--snapshot", "SNAP"),
            "has no workflow 'missing'",
        ),
        (
            ("start", "nap", "--scope", "acme", "--snapshot", "SNAP", "--input", "{"),
            "--input is not valid JSON",
        ),
        (("signal", "seed-1", "go", "--input", "{nope"), "--input is not valid JSON"),
        (("signal", "seed-1", "bad type"), "invalid event type"),
        (("start", "nap", "--scope", "Bad!", "--snapshot", "SNAP"), "invalid scope"),
        (("publish", "/no/such/folder", "--scope", "acme"), "cannot read the folder"),
        (("resume",), "resume needs a run id, or --where to select runs"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(
    cli: Cli, tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    tree = tmp_path / "t" / "workflows"
    tree.mkdir(parents=True)
    (tree / "nap.ts").write_text('export default async (e, step) => step.sleep("nap", "1 hour");\n')
    snapshot = cli.ok("publish", str(tree.parent), "--scope", "acme")["snapshot_id"]
    cli.ok("start", "nap", "--scope", "acme", "--snapshot", snapshot, "--run-id", "seed-1")
    before = cli.counts()
    done = cli.run(*(snapshot if arg == "SNAP" else arg for arg in args))
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert cli.counts() == before


def test_a_missing_database_is_refused_and_not_created(cli: Cli) -> None:
    for args in (("status", "r"), ("list",), ("worker", "--until-idle"), ("steps", "r")):
        done = cli.run(*args)
        assert done.returncode == 2
        assert "no journal database at" in done.stderr
        assert not cli.db.exists()


def test_debug_shows_the_traceback(cli: Cli) -> None:
    done = cli.run("--debug", "status", "r")
    assert done.returncode == 2
    assert "Traceback" in done.stderr


def test_the_cli_speaks_postgresql_urls(tmp_path: Path, postgres: PostgresServer) -> None:
    url = postgres.new_database()
    tree = tmp_path / "t" / "workflows"
    tree.mkdir(parents=True)
    (tree / "add.ts").write_text(
        'export default async (e, step) => step.do("add", async () => e.payload.a + 1);\n'
    )

    command = [sys.executable, "-m", "qjsflow.runner.cli", "--db", url, "--json"]

    def ok(*args: str) -> Any:
        done = subprocess.run([*command, *args], cwd=PROJECT_ROOT, capture_output=True,
                              text=True, timeout=120, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return orjson.loads(done.stdout)

    snapshot = ok("publish", str(tree.parent), "--scope", "acme")["snapshot_id"]
    recorded = ok("start", "add", "--scope", "acme", "--snapshot", snapshot, "--input", '{"a": 41}')
    assert recorded["status"] == "running"
    worker = subprocess.Popen([*command, "worker"], cwd=PROJECT_ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        assert ok("result", recorded["run_id"], "--wait", "--timeout", "60") == 42
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    run = ok("status", recorded["run_id"])
    assert [s["name"] for s in ok("steps", run["run_id"])] == ["add"]
    assert ok("status", run["run_id"], "--scope", "acme")["status"] == "completed"


def test_an_unscoped_operator_command_asks_which_scope(cli: Cli, tmp_path: Path) -> None:
    root = _tree(tmp_path)
    for scope in ("acme", "globex"):
        snapshot = cli.ok("publish", str(root), "--scope", scope)["snapshot_id"]
        started = cli.run("start", "greet", "--scope", scope, "--snapshot", snapshot,
                          "--run-id", "same", "--input", '{"name": "x"}')  # fmt: skip
        assert started.returncode == 0, started.stderr
    ambiguous = cli.run("status", "same")
    assert ambiguous.returncode == 2
    assert "exists in 2 scopes (acme, globex)" in ambiguous.stderr
    assert "--scope" in ambiguous.stderr
    assert cli.ok("status", "same", "--scope", "globex")["scope"] == "globex"
    listed = cli.ok("list")
    assert sorted(r["scope"] for r in listed["runs"]) == ["acme", "globex"]
    missing = cli.run("status", "nobody")
    assert missing.returncode == 2
    assert "no run 'nobody'" in missing.stderr


FORGER = """
export default async (event, step) => {
  await step.do("x\\u202e\\u009b2J", async () => "\\u009b31m");
  throw new Error("boom\\nstatus    completed\\u001b]0;owned\\u0007\\u202e");
};
"""


def test_human_output_escapes_what_authors_control(cli: Cli, tmp_path: Path) -> None:
    root = tmp_path / "forger"
    (root / "workflows").mkdir(parents=True)
    (root / "workflows" / "forge.ts").write_text(FORGER)
    snapshot = cli.ok("publish", str(root), "--scope", "acme")["snapshot_id"]
    cli.start_worker()
    for args in (
        (
            "start",
            "forge",
            "--scope",
            "acme",
            "--snapshot",
            snapshot,
            "--run-id",
            "f1",
            "--wait",
            "suspended",
        ),
        ("status", "f1"),
        ("steps", "f1"),
    ):
        done = cli.run(*args, json=False)
        assert done.returncode == 0, done.stderr
        assert not any(c in done.stdout for c in "\x1b\x07\u202e\x9b"), done.stdout
        assert "\\x1b" in done.stdout or "\\x9b" in done.stdout
    status = cli.run("status", "f1", json=False).stdout.splitlines()
    assert [line.split()[1] for line in status if line.startswith("status")] == ["failed"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("list", "--workflow", "\udcff"), "argument 5 (\\udcff) is not valid UTF-8"),
        (("--lease-ttl", "nan", "list"), "--lease-ttl: 'nan' is outside 0.1 to 86400"),
        (("--lease-ttl", "inf", "list"), "--lease-ttl: 'inf' is outside 0.1 to 86400"),
        (("--lease-ttl", "1e300", "list"), "--lease-ttl: '1e300' is outside 0.1 to 86400"),
        (
            ("list", "--limit", "1" + "0" * 30),
            "--limit: '1000000000000000000000000000000' is outside 1 to 10000",
        ),
        (("list", "--offset", "-1"), "--offset: '-1' is outside 0 to"),
        (("list", "--limit", "ten"), "--limit: 'ten' is not a whole number"),
        (("worker", "--concurrency", "1e9"), "--concurrency: '1e9' is not a whole number"),
        (("worker", "--concurrency", "100000"), "--concurrency: '100000' is outside 1 to 4096"),
        (("worker", "--metrics-port", "0"), "--metrics-port: '0' is outside 1 to 65535"),
        (("console", "--port", "99999"), "--port: '99999' is outside 1 to 65535"),
        (("result", "r1", "--timeout", "1e300"), "--timeout: '1e300' is outside 0.001 to"),
        (("start", "w", "--timeout", "0"), "--timeout: '0' is outside 0.001 to"),
    ],
)
def test_bad_arguments_exit_2(cli: Cli, args: tuple[str, ...], message: str) -> None:
    cli.ok("publish", str(_tree(cli.db.parent)), "--scope", "acme")
    done = subprocess.run(
        [sys.executable, "-m", "qjsflow.runner.cli", "--db", str(cli.db), *args],
        cwd=PROJECT_ROOT, capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert message in done.stderr.decode(), done.stderr


def test_global_options_after_the_command_and_from_the_environment(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    env = {
        **os.environ, "QJSFLOW_DB": str(tmp_path / "env.db"), "QJSFLOW_SCOPE": "acme",
        "QJSFLOW_TOOLS": "tests.crash_tools:TOOLS", "QJSFLOW_TOOL_LOG": str(tmp_path / "t.log"),
    }  # fmt: skip

    def qjsflow(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "qjsflow.runner.cli", *args], cwd=PROJECT_ROOT, env=env,
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    published = qjsflow("publish", str(tree), "--json")  # --json after the command
    assert published.returncode == 0, published.stderr
    assert (tmp_path / "env.db").exists()  # QJSFLOW_DB
    worker = subprocess.Popen([sys.executable, "-m", "qjsflow.runner.cli", "worker"],
                              cwd=PROJECT_ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)  # fmt: skip  # QJSFLOW_TOOLS
    try:
        started = qjsflow("start", "greet", "--snapshot", "latest", "--run-id", "r1",
                          "--input", '{"name": "ada"}', "--json", "--wait", "suspended")  # fmt: skip
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    assert started.returncode == 0, started.stderr  # QJSFLOW_SCOPE, QJSFLOW_DB
    assert orjson.loads(started.stdout)["status"] == "waiting"
    history = orjson.loads(qjsflow("history", "r1", "--json").stdout)
    types = [event["type"] for event in history]
    assert types[:2] == ["run_created", "drive_started"]
    assert "tool_called" in types
    tools = orjson.loads(qjsflow("tools", "r1", "--json").stdout)
    assert [(t["address"], t["result"]) for t in tools] == [("slow", "slow done")]
    human = qjsflow("history", "r1").stdout
    assert "run_created" in human
    assert "run_suspended" in human
    refused = qjsflow("list", "--status", "nope")
    assert refused.returncode == 2
    assert "choose from 'running', 'sleeping', 'waiting', 'blocked'" in refused.stderr
    env.pop("QJSFLOW_SCOPE")
    missing = qjsflow("start", "greet", "--snapshot", "latest")
    assert (missing.returncode, missing.stderr.strip()) == (
        2, "qjsflow: error: start needs --scope (or QJSFLOW_SCOPE)"
    )  # fmt: skip


def test_logs_shows_console_lines(cli: Cli, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "workflows").mkdir(parents=True)
    (tree / "workflows" / "chatty.ts").write_text(
        'export default async () => { console.log("hello"); console.warn("careful"); return 1; };\n'
    )
    assert cli.run("publish", str(tree), "--scope", "a").returncode == 0
    cli.start_worker()
    cli.ok("start", "chatty", "--scope", "a", "--snapshot", "latest", "--run-id", "c1", "--wait")
    assert cli.run("logs", "c1", json=False).stdout.splitlines() == [
        "log    hello",
        "warn   careful",
    ]


def test_list_pages_and_says_when_more_exist(tmp_path: Path) -> None:
    cli = Cli(tmp_path)
    tree = tmp_path / "tree"
    (tree / "workflows").mkdir(parents=True)
    (tree / "workflows" / "one.ts").write_text("export default async () => 1;\n")
    assert cli.run("publish", str(tree), "--scope", "a").returncode == 0
    for i in range(5):
        cli.ok("start", "one", "--scope", "a", "--snapshot", "latest", "--run-id", f"r{i}")
    first = cli.ok("list", "--limit", "2")
    assert ([r["run_id"] for r in first["runs"]], first["more"]) == (["r0", "r1"], True)
    last = cli.ok("list", "--limit", "2", "--offset", str(first["next_offset"] + 2))
    assert ([r["run_id"] for r in last["runs"]], last["more"]) == (["r4"], False)
    newest = cli.ok("list", "--limit", "1", "--desc")
    assert [r["run_id"] for r in newest["runs"]] == ["r4"]
    human = cli.run("list", "--limit", "3", json=False).stdout
    assert "\n… more: --cursor " in human
    refused = cli.run("list", "--limit", "0")
    assert (refused.returncode, "--limit: '0' is outside 1 to 10000" in refused.stderr) == (2, True)


def test_status_says_which_step_retries_when_and_why(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = tmp_path / "tree"
    (tree / "workflows").mkdir(parents=True)
    (tree / "workflows" / "flaky.ts").write_text(
        'export default async (e, step) => step.do("sync", { retries: { limit: 3, delay: "1 minute" } },\n'
        '  async () => { throw new Error("CRM busy"); });\n'
    )
    assert cli.run("publish", str(tree), "--scope", "a").returncode == 0
    cli.start_worker()
    cli.ok("start", "flaky", "--scope", "a", "--snapshot", "latest", "--run-id", "f1",
           "--wait", "suspended")  # fmt: skip
    status = cli.run("status", "f1", json=False).stdout
    assert "retry     step 'sync' attempt 2 in " in status
    assert status.splitlines()[6].endswith("after: Error: CRM busy")
    [step] = cli.ok("steps", "f1")
    assert step["retry_at"] > step["started_at"] > 0
    timeline = cli.ok("timeline", "f1")
    assert [(row["step"], row["kind"], row["attempt"]) for row in timeline] == [("sync", "do", "1")]
    steps = cli.run("steps", "f1", json=False).stdout
    assert "STARTED" in steps
    assert "Error: CRM busy (at workflows/flaky.ts:2:" in steps
    # The run and its retrying steps are read in one opening of the journal.
    opened: list[str] = []
    original = JournalStore.open

    async def counting(location: Any, *args: Any, **kwargs: Any) -> JournalStore:
        opened.append(str(location))
        return await original(location, *args, **kwargs)

    monkeypatch.setattr(JournalStore, "open", counting)
    assert cli_main(["--db", str(cli.db), "status", "f1"]) == 0
    assert "retry     step 'sync' attempt 2 in " in capsys.readouterr().out
    assert opened == [str(cli.db)]


def test_start_without_waiting_then_wait_for_the_result(tmp_path: Path) -> None:
    cli = Cli(tmp_path)
    tree = tmp_path / "tree"
    (tree / "workflows").mkdir(parents=True)
    (tree / "workflows" / "nap.ts").write_text(
        'export default async (e, step) => { await step.sleep("nap", "1 second"); return 7; };\n'
    )
    assert cli.run("publish", str(tree), "--scope", "a").returncode == 0
    queued = cli.run("start", "nap", "--scope", "a", "--snapshot", "latest", "--run-id", "n1",
                     "--no-wait")  # fmt: skip
    assert queued.returncode == 0, queued.stderr
    assert orjson.loads(queued.stdout)["status"] == "running"
    assert "--no-wait is deprecated: every operator command only records now" in queued.stderr
    assert "no live worker serves this journal: the run is recorded" in queued.stderr
    not_yet = cli.run("result", "n1")
    assert (not_yet.returncode, "is running: wait with --wait" in not_yet.stderr) == (1, True)
    timed_out = cli.run("result", "n1", "--wait", "--timeout", "0.3")
    assert (timed_out.returncode, "still running after 0.3 s" in timed_out.stderr) == (1, True)
    worker = subprocess.Popen(
        cli.argv("worker", "--until-idle"), cwd=PROJECT_ROOT, env=cli.env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert cli.ok("result", "n1", "--wait", "--timeout", "60") == 7
    finally:
        worker.wait(timeout=60)


# What only publishing, starting, driving and changing runs need: a command that only reads
# the journal must not pay for importing it (docs/PERFORMANCE.md, `qjsflow status`).
_NOT_FOR_READING = (
    "qjsflow.runner.runner", "qjsflow.runner.engine.drive.driver", "qjsflow.runner.engine.host",
    "qjsflow.runner.cli.host", "qjsflow.sandbox.pool", "qjsflow.bundles.esbuild",
    "qjsflow.bundles.tree", "qjsflow.bridge.types", "qjsflow.runner.tenancy.budgets",
    "qjsflow.runner.tenancy.environment", "qjsflow.bundles.toolchain", "qjsflow.sandbox.confine",
)  # fmt: skip
_PROBE = (
    "import sys; from qjsflow.runner.cli.commands import main; code = main(sys.argv[1:]); "
    f"print(sorted(m for m in {_NOT_FOR_READING!r} if m in sys.modules), file=sys.stderr); "
    "sys.exit(code)"
)


def test_reading_commands_load_neither_the_runner_nor_the_publish_path(
    cli: Cli, tmp_path: Path
) -> None:
    plain = {name: value for name, value in os.environ.items() if not name.startswith("QJSFLOW_")}
    tree = tmp_path / "tree"
    (tree / "workflows").mkdir(parents=True)
    (tree / "workflows" / "fails.ts").write_text(
        'export default async (_e: unknown, step: any) => { console.log("hi"); '
        'await step.do("boom", { retries: { limit: 0 } }, async () => { throw new Error("no"); }); };\n'
    )  # fmt: skip
    assert cli.run("publish", str(tree), "--scope", "a").returncode == 0
    cli.start_worker()
    started = cli.ok("start", "fails", "--scope", "a", "--snapshot", "latest", "--run-id", "f1",
                     "--wait", "suspended")  # fmt: skip
    assert started["status"] == "failed"
    reads = [("status", "f1"), ("steps", "f1"), ("logs", "f1"), ("tools", "f1"),
             ("history", "f1"), ("timeline", "f1"), ("list",), ("snapshots",)]  # fmt: skip
    for args in reads:
        for json in ((), ("--json",)):
            done = subprocess.run(
                [sys.executable, "-c", _PROBE, "--db", str(cli.db), *json, *args],
                cwd=PROJECT_ROOT, env=plain, capture_output=True, text=True, timeout=60,
                check=False,
            )  # fmt: skip
            assert done.returncode == 0, (args, done.stderr)
            assert done.stderr.strip() == "[]", (args, json)
            assert done.stdout.strip(), args
    status = subprocess.run(
        [sys.executable, "-c", _PROBE, "--db", str(cli.db), "status", "f1"],
        cwd=PROJECT_ROOT, env=plain, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    shown = dict(line.split(None, 1) for line in status.stdout.splitlines() if " " in line)
    assert shown["status"] == "failed"
    assert "no" in shown["error"]
    # The host's options a read does not use are still checked, without loading the runner.
    for mode, code in (("require", 0), ("bogus", 2)):
        checked = subprocess.run(
            [sys.executable, "-c", _PROBE, "--db", str(cli.db), "status", "f1"],
            cwd=PROJECT_ROOT, env={**plain, "QJSFLOW_CONFINEMENT": mode}, capture_output=True,
            text=True, timeout=60, check=False,
        )  # fmt: skip
        assert checked.returncode == code, checked.stderr
        assert checked.stderr.splitlines()[-1] == "[]"
    assert "QJSFLOW_CONFINEMENT must be one of" in checked.stderr
    # A command that changes runs still gets the whole runner.
    control = subprocess.run(
        [sys.executable, "-c", _PROBE, "--db", str(cli.db), "cancel", "f1", "--scope", "a"],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert "qjsflow.runner.runner" in control.stderr


def _publish_one(cli: Cli, folder: Path, name: str, source: str) -> None:
    """A tree of one workflow file, published into scope acme."""
    (folder / "workflows").mkdir(parents=True)
    (folder / "workflows" / f"{name}.ts").write_text(source)
    cli.ok("publish", str(folder), "--scope", "acme")


def test_a_multi_line_error_shows_as_lines(cli: Cli, tmp_path: Path) -> None:
    throws = (
        'export default async () => { throw new Error("first line\\nsecond \\u202e line"); };\n'
    )
    _publish_one(cli, tmp_path / "lines", "two", throws)
    cli.start_worker()
    cli.run("start", "two", "--scope", "acme", "--snapshot", "latest", "--run-id", "m1",
            "--wait", "suspended", json=False)  # fmt: skip
    shown = cli.run("status", "m1", "--scope", "acme", json=False).stdout.splitlines()
    error = next(n for n, line in enumerate(shown) if line.startswith("error"))
    assert shown[error].endswith("Error: first line")
    assert shown[error + 1].strip() == "second \\u202e line"  # its own line, escaped there
    assert not any("\\x0a" in line for line in shown)


def test_a_missing_extra_is_named_by_its_extra(tmp_path: Path) -> None:
    script = (
        "import sys; sys.modules['starlette'] = None\n"  # as if the extra were not installed
        "from qjsflow.runner.cli.commands import main\n"
        f"sys.exit(main(['--db', {str(tmp_path / 'j.db')!r}, 'console']))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=PROJECT_ROOT, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip() == (
        "qjsflow: error: this needs qjsflow's `console` extra: pip install 'qjsflow[console]'"
    )


def test_a_signal_of_a_type_the_run_never_waited_for_says_so(cli: Cli, tmp_path: Path) -> None:
    _publish_one(cli, tmp_path / "waits", "w",
                 "export default async (e: unknown, step: any) => "
                 '(await step.waitForEvent("approval", { type: "approve" })).payload;\n')  # fmt: skip
    cli.start_worker()
    cli.ok("start", "w", "--scope", "acme", "--snapshot", "latest", "--run-id", "s1",
           "--wait", "suspended")  # fmt: skip
    typo = cli.run("signal", "s1", "aprove", "--scope", "acme", "--wait", "suspended")
    assert typo.returncode == 0, typo.stderr  # delivered all the same
    assert "has never waited for an event of type 'aprove'" in typo.stderr
    assert "(the types it waited for: approve)" in typo.stderr
    right = cli.run("signal", "s1", "approve", "--payload", "7", "--scope", "acme", "--wait")
    assert right.returncode == 0, right.stderr
    assert "never waited" not in right.stderr
    assert orjson.loads(right.stdout) == 7  # --wait: the output, as `result` prints it


def test_an_idle_worker_waits_for_timers_within_its_window_and_says_what_it_left(
    cli: Cli, tmp_path: Path
) -> None:
    _publish_one(cli, tmp_path / "naps", "nap",
                 'export default async (e: unknown, step: any) => { await step.sleep("nap", '
                 '"2 seconds"); return "rested"; };\n')  # fmt: skip
    for run_id in ("short", "long"):
        cli.ok("start", "nap", "--scope", "acme", "--snapshot", "latest", "--run-id", run_id)
    hasty = cli.run("worker", "--until-idle", "--idle-window", "0", json=False)
    assert hasty.returncode == 0, hasty.stderr
    assert "qjsflow worker: idle; left 2 sleeping; the next timer is due in" in hasty.stderr
    patient = cli.run("worker", "--until-idle", "--idle-window", "30", json=False)
    assert patient.returncode == 0, patient.stderr
    assert "qjsflow worker: idle; left no run; no timer is due" in patient.stderr
    assert cli.ok("status", "short", "--scope", "acme")["output"] == "rested"
