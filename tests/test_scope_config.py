"""A scope's configuration is data in the journal (docs/TENANCY.md, "Scope configuration"):
applied and versioned by `qjsflow scope`, recorded by each run as it starts, and read by every
process from there. Worker processes that share nothing but the journal (their own folders,
their own environment variables) drive a run started by a command given no flag but `--db`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from qjsflow.runner import Runner, StartRunInput
from tests.config_tools import SECRET
from tests.conftest import PROJECT_ROOT
from tests.postgres import PostgresServer

pytestmark = pytest.mark.slow  # worker processes

FLOW = """
export default async (event, step, env) => {
  const checked = await step.tool("check", "check", { key: env.API_KEY });
  if (event.payload.wait) await step.waitForEvent("go", { type: "go" });
  return { region: env.REGION, resolved: checked.resolved };
};
"""


class Operator:
    """The command line over one journal, in a process with no env file, no tools and no
    secret: what an operator's shell (or a CI job) has."""

    def __init__(self, tmp_path: Path, db: str) -> None:
        self.tmp_path, self.db = tmp_path, db
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("QJSFLOW_", "ACME_"))}

    def run(self, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
            stdin: str | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
        return subprocess.run(
            [sys.executable, "-m", "qjsflow.runner.cli", "--db", self.db, *args],
            cwd=cwd or PROJECT_ROOT, env=env or self.env, capture_output=True, text=True,
            timeout=120, check=False, input=stdin,
        )  # fmt: skip

    def ok(self, *args: str) -> Any:
        done = self.run("--json", *args)
        assert done.returncode == 0, done.stderr
        return orjson.loads(done.stdout)

    def apply(self, settings: dict[str, Any], name: str = "acme.json") -> Any:
        path = self.tmp_path / name
        path.write_text(json.dumps(settings))
        return self.ok("scope", "apply", str(path), "--scope", "acme")

    def worker_until_idle(self, home: str, *, secret: bool = True, **more: str) -> None:
        """A worker 'machine': its own folder, its own environment (the secret's value, or
        not; `more` variables)."""
        folder = self.tmp_path / home
        folder.mkdir(exist_ok=True)
        env = {**self.env, "PYTHONPATH": str(PROJECT_ROOT), **more}
        if secret:
            env["ACME_API_KEY"] = SECRET
        done = self.run("--tools", "tests.config_tools:TOOLS", "worker", "--until-idle",
                        env=env, cwd=folder)  # fmt: skip
        assert done.returncode == 0, done.stderr

    def start(self, run_id: str, payload: object = None) -> Any:
        return self.ok("start", "flow", "--scope", "acme", "--snapshot", "latest", "--run-id",
                       run_id, "--input", json.dumps(payload or {}))  # fmt: skip


@pytest.fixture(params=["sqlite", pytest.param("postgresql")])
def operator(request: pytest.FixtureRequest, tmp_path: Path) -> Operator:
    if request.param == "sqlite":
        db = str(tmp_path / "journal.db")
    else:
        server: PostgresServer = request.getfixturevalue("postgres")
        db = server.new_database()
    operator = Operator(tmp_path, db)
    tree = tmp_path / "src"
    (tree / "workflows").mkdir(parents=True)
    (tree / "workflows" / "flow.js").write_text(FLOW)
    assert operator.run("publish", str(tree), "--scope", "acme").returncode == 0
    return operator


def test_runs_started_anywhere_are_driven_by_workers_with_the_scopes_configuration(
    operator: Operator,
) -> None:
    settings = {"vars": {"REGION": "eu"}, "secrets": {"API_KEY": "ACME_API_KEY"}}
    assert operator.apply(settings)["version"] == 1
    started = operator.start("r1")  # no --env, no --tools, no secret in this process
    assert started["status"] == "running"
    assert operator.start("r2", {"wait": True})["status"] == "running"
    operator.worker_until_idle("machine-a")
    assert operator.ok("result", "r1", "--scope", "acme") == {"region": "eu", "resolved": True}
    assert operator.ok("status", "r2", "--scope", "acme")["status"] == "waiting"
    # A new version reaches new runs; a running one keeps the version it started with.
    assert operator.apply({**settings, "vars": {"REGION": "us"}})["version"] == 2
    operator.start("r3")
    # Recorded only (the operator's process resolves no secret): still waiting, woken.
    assert operator.ok("signal", "r2", "go", "--scope", "acme")["status"] == "waiting"
    operator.worker_until_idle("machine-b")  # another machine: its own folder and environment
    assert operator.ok("result", "r2", "--scope", "acme") == {"region": "eu", "resolved": True}
    assert operator.ok("result", "r3", "--scope", "acme") == {"region": "us", "resolved": True}
    if not operator.db.startswith("postgresql"):
        journal = Path(operator.db)
        held = b"".join(p.read_bytes() for p in journal.parent.glob(journal.name + "*"))
        assert SECRET.encode() not in held  # only its name and where a worker finds it


def test_restart_and_fork_config_move_a_run_to_another_version(operator: Operator) -> None:
    settings = {"vars": {"REGION": "eu"}, "secrets": {"API_KEY": "ACME_API_KEY"}}
    operator.apply(settings)
    operator.start("r1")
    operator.worker_until_idle("machine-a")
    operator.apply({**settings, "vars": {"REGION": "us"}})
    # Restarted as it was, it keeps version 1; moved, its env is made again from the version.
    operator.ok("restart", "r1", "--scope", "acme")
    operator.worker_until_idle("machine-a")
    assert operator.ok("result", "r1", "--scope", "acme") == {"region": "eu", "resolved": True}
    moved = operator.ok("restart", "r1", "--scope", "acme", "--config", "latest")
    assert moved["config_version"] == 2
    operator.worker_until_idle("machine-b")
    assert operator.ok("result", "r1", "--scope", "acme") == {"region": "us", "resolved": True}
    back = operator.ok("restart", "r1", "--scope", "acme", "--config", "1")
    assert back["config_version"] == 1
    for wrong, said in (("9", "no configuration version 9"), ("soon", "latest or a version")):
        refused = operator.run("restart", "r1", "--scope", "acme", "--config", wrong)
        assert (refused.returncode, said in refused.stderr) == (2, True), refused.stderr
    history = operator.ok("history", "r1", "--scope", "acme")
    moves = [e["data"]["configVersion"] for e in history if e["type"] == "run_restarted"]
    assert moves == [1, 2, 1]
    forked = operator.ok("fork", "r1", "--scope", "acme", "--run-id", "f1",
                         "--config", "latest")  # fmt: skip
    assert forked["config_version"] == 2
    operator.worker_until_idle("machine-b")
    assert operator.ok("result", "f1", "--scope", "acme") == {"region": "us", "resolved": True}


def test_migrate_config_moves_waiting_runs_to_new_code_and_a_new_version(
    operator: Operator,
) -> None:
    settings = {"vars": {"REGION": "eu"}, "secrets": {"API_KEY": "ACME_API_KEY"}}
    operator.apply(settings)
    operator.start("w1", {"wait": True})
    operator.worker_until_idle("machine-a")
    assert operator.ok("status", "w1", "--scope", "acme")["status"] == "waiting"
    flow = operator.tmp_path / "src" / "workflows" / "flow.js"
    flow.write_text(FLOW + "// the same calls, new code\n")
    assert operator.run("publish", str(flow.parent.parent), "--scope", "acme").returncode == 0
    operator.apply({**settings, "vars": {"REGION": "us"}})
    report = operator.ok("migrate", "w1", "--scope", "acme", "--to-snapshot", "latest",
                         "--config", "latest")  # fmt: skip
    assert report["migrated"] == 1, report
    assert operator.ok("status", "w1", "--scope", "acme")["config_version"] == 2
    operator.ok("signal", "w1", "go", "--scope", "acme")
    operator.worker_until_idle("machine-b")
    assert operator.ok("result", "w1", "--scope", "acme") == {"region": "us", "resolved": True}


def test_a_versions_budgets_hold_as_a_drive_begins_on_any_worker(operator: Operator) -> None:
    """Budgets set only in the journal (no worker has them in an env file) park the scope's
    runs as their drives begin: a day's compute budget of 0 is spent before any drive."""
    operator.apply({"vars": {"REGION": "eu"}, "secrets": {"API_KEY": "ACME_API_KEY"},
                    "budgets": {"compute_s_per_day": 0}})  # fmt: skip
    operator.start("r1")
    operator.worker_until_idle("machine-a")
    parked = operator.ok("status", "r1", "--scope", "acme")
    assert (parked["status"], parked["waiting_for"]) == ("throttled", "compute_s_per_day")
    # A resume a caller waits on (read before its lease) looks at them too.
    resumed = operator.ok("resume", "r1", "--scope", "acme")
    assert resumed["status"] == "throttled"


def test_a_run_needing_a_secret_its_worker_cannot_resolve_waits_for_one_that_can(
    operator: Operator,
) -> None:
    operator.apply({"vars": {"REGION": "eu"}, "secrets": {"API_KEY": "ACME_API_KEY"}})
    operator.start("r1")
    operator.worker_until_idle("without-the-secret", secret=False)
    parked = operator.ok("status", "r1", "--scope", "acme")
    assert (parked["status"], parked["waiting_for"]) == ("blocked", "secret API_KEY")
    operator.worker_until_idle("without-it-again", secret=False)  # leaves it: it cannot help
    assert operator.ok("status", "r1", "--scope", "acme")["status"] == "blocked"
    operator.worker_until_idle("with-the-secret")
    assert operator.ok("result", "r1", "--scope", "acme") == {"region": "eu", "resolved": True}


def test_a_worker_reads_a_secret_from_a_mounted_file(operator: Operator) -> None:
    """One file per variable, as systemd credentials and Kubernetes secret volumes mount them
    (QJSFLOW_SECRETS_DIR, or systemd's CREDENTIALS_DIRECTORY)."""
    operator.apply({"vars": {"REGION": "eu"}, "secrets": {"API_KEY": "ACME_API_KEY"}})
    mounted = operator.tmp_path / "credentials"
    mounted.mkdir()
    (mounted / "ACME_API_KEY").write_text(SECRET + "\n")
    operator.start("r1")
    operator.worker_until_idle("machine-a", secret=False, CREDENTIALS_DIRECTORY=str(mounted))
    assert operator.ok("result", "r1", "--scope", "acme") == {"region": "eu", "resolved": True}


def test_secrets_sealed_in_the_journal_open_only_where_the_scopes_key_is(
    operator: Operator,
) -> None:
    keys = operator.tmp_path / "keys"
    made = operator.run("secrets", "keygen", "--scope", "acme", "--keys", str(keys))
    assert made.returncode == 0, made.stderr
    assert (keys / "acme.key").stat().st_mode & 0o077 == 0  # its owner's only
    again = operator.run("secrets", "keygen", "--scope", "acme", "--keys", str(keys))
    assert (again.returncode, "it is kept" in again.stderr) == (2, True)
    keyless = operator.run("secrets", "set", "API_KEY", "--scope", "acme", stdin=SECRET)
    assert (keyless.returncode, "secrets keygen" in keyless.stderr) == (2, True)
    sealed = operator.run("secrets", "set", "API_KEY", "--scope", "acme", "--keys", str(keys),
                          stdin=SECRET + "\n")  # fmt: skip
    assert sealed.returncode == 0, sealed.stderr
    listed = operator.ok("secrets", "list", "--scope", "acme")
    assert [entry["name"] for entry in listed] == ["API_KEY"]
    assert SECRET not in json.dumps(listed)
    operator.apply({"vars": {"REGION": "eu"}, "secrets": {"API_KEY": "@journal"}})
    operator.start("r1")
    operator.worker_until_idle("without-the-key", secret=False)
    parked = operator.ok("status", "r1", "--scope", "acme")
    assert (parked["status"], parked["waiting_for"]) == ("blocked", "secret API_KEY")
    operator.worker_until_idle("with-the-key", secret=False, QJSFLOW_SECRET_KEYS=str(keys))
    assert operator.ok("result", "r1", "--scope", "acme") == {"region": "eu", "resolved": True}
    if not operator.db.startswith("postgresql"):
        journal = Path(operator.db)
        held = b"".join(p.read_bytes() for p in journal.parent.glob(journal.name + "*"))
        assert SECRET.encode() not in held
    (keys / "acme.key").unlink()  # the scope's key destroyed: its sealed values with it
    operator.start("r2")
    operator.worker_until_idle("with-the-key", secret=False, QJSFLOW_SECRET_KEYS=str(keys))
    assert operator.ok("status", "r2", "--scope", "acme")["status"] == "blocked"


def test_apply_validates_keeps_the_last_good_version_and_rolls_back(operator: Operator) -> None:
    first = operator.apply({"vars": {"REGION": "eu"}, "egress": {"allow": ["api.example.com"]}})
    again = operator.apply({"vars": {"REGION": "eu"}, "egress": {"allow": ["api.example.com"]}})
    assert (first["version"], again["version"], again["created"]) == (1, 1, False)
    toml = operator.tmp_path / "acme.toml"
    toml.write_text('[vars]\nREGION = "us"\n')
    assert operator.ok("scope", "apply", str(toml), "--scope", "acme")["version"] == 2
    bad = operator.tmp_path / "bad.json"
    bad.write_text('{"vars": 3, "nope": 1, "egress": {"allow": "x"}, "secrets": {"K": "no way"}}')
    refused = operator.run("scope", "apply", str(bad), "--scope", "acme")
    assert refused.returncode == 2
    for problem in ("unknown key 'nope'", "vars is an object", "egress.allow is a list",
                    "secret 'K' names a host environment variable"):  # fmt: skip
        assert problem in refused.stderr
    assert "\\x0a" not in refused.stderr  # one problem a line
    assert operator.ok("scope", "show", "--scope", "acme")["version"] == 2  # the last good one
    history = operator.ok("scope", "history", "--scope", "acme")
    assert [v["version"] for v in history] == [2, 1]
    diff = operator.run("scope", "diff", "--scope", "acme").stdout
    assert '-    "REGION": "eu"' in diff
    assert '+    "REGION": "us"' in diff
    rolled = operator.ok("scope", "apply", "--version", "1", "--scope", "acme")
    assert rolled["version"] == 3
    assert rolled["config"]["vars"] == {"REGION": "eu"}
    dated = operator.tmp_path / "dated.toml"
    dated.write_text("[vars]\nWHEN = 1979-05-27\nN = nan\n")
    refused = operator.run("scope", "apply", str(dated), "--scope", "acme")
    assert refused.returncode == 2
    assert "vars.WHEN is a date, not a JSON value" in refused.stderr  # never converted
    assert "vars.N is not a finite number" in refused.stderr
    missing = operator.run("scope", "show", "--scope", "acme", "--version", "9")
    assert (missing.returncode, "no configuration version 9" in missing.stderr) == (2, True)


async def test_the_python_api_applies_and_a_start_records_the_version(tmp_path: Path) -> None:
    async with Runner.open(tmp_path / "journal.db") as runner:
        published = await runner.publish("acme", {"workflows/flow.js": FLOW})
        applied = await runner.apply_scope_config("acme", '{"vars": {"REGION": "eu"}}')
        run = await runner.start(
            StartRunInput("acme", "flow", published.snapshot_id, {}, "r1"), drive=False
        )
        record = await runner.store.get_run("acme/r1")
        assert record is not None
        assert record.config_version == applied.version == 1
        assert (run.status, run.config_version) == ("running", 1)
        assert (await runner.get("r1", scope="acme")).config_version == 1
        history = await runner.scope_config_history("acme")
        assert [v.version for v in history] == [1]
