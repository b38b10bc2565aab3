"""The executor's second layer: after it starts, a forbidden system call gets it killed by the
kernel, the run fails naming that, and the pool replaces the executor."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from qjsflow.bridge import QjsflowError
from qjsflow.bridge.types import Completed, Failed
from qjsflow.bundles import find_toolchain
from qjsflow.bundles.esbuild import confined_command
from qjsflow.runner.scopedb import ScopeDatabases
from qjsflow.sandbox import ExecutorPool, PoolConfig
from qjsflow.sandbox.confine import ALLOWED
from qjsflow.sandbox.pool import FORBIDDEN_CALL
from tests.conftest import bundle_of
from tests.memory_host import MemoryHost

WELL_BEHAVED = 'export default async (e, step) => step.do("a", async () => 1);'
FORBIDDEN = ("open", "socket", "connect", "execve", "fork", "write-file", "kill")


def _probe(call: str, confinement: str = "require") -> PoolConfig:
    return PoolConfig(size=1, confinement=confinement,
                      entry="qjsflow.sandbox.confinement_probe", entry_args=(call,))  # fmt: skip


@pytest.mark.parametrize("call", FORBIDDEN)
async def test_a_forbidden_call_is_killed_and_the_run_fails_cleanly(call: str) -> None:
    code = await bundle_of(WELL_BEHAVED)
    async with ExecutorPool(_probe(call)) as pool:
        host = MemoryHost()
        outcome = await pool.drive(host.request(code), host)
        assert isinstance(outcome, Failed)
        assert (outcome.message, outcome.retryable) == (FORBIDDEN_CALL, False)
        assert pool.replaced == 1
        assert pool.layers["seccomp"] is True


async def test_without_the_filter_the_same_calls_get_through() -> None:
    # The probe is honest: with confinement off its forbidden call is made (and answered),
    # so the test above fails without the filter.
    code = await bundle_of(WELL_BEHAVED)
    async with ExecutorPool(_probe("open", confinement="off")) as pool:
        host = MemoryHost()
        outcome = await pool.drive(host.request(code), host)
        assert isinstance(outcome, Completed)
        assert pool.layers["seccomp"] is False


async def test_drives_of_every_kind_run_under_the_filter(pool: ExecutorPool) -> None:
    # The rest of the suite drives every kind of op through confined executors; here the
    # executors say they are confined.
    host = MemoryHost()
    assert isinstance(await pool.drive(host.request(await bundle_of(WELL_BEHAVED)), host),
                      Completed)  # fmt: skip
    assert pool.layers == {"seccomp": True, "landlockAbi": pool.layers["landlockAbi"],
                           "noNewPrivs": True, "missing": []}  # fmt: skip
    assert pool.layers["landlockAbi"] >= 1


def test_an_executor_exits_cleanly_under_the_filter() -> None:
    # At the end of its input the interpreter shuts down inside the filter: no call it makes
    # then is missing from the table.
    done = subprocess.run(
        [sys.executable, "-I", "-m", "qjsflow.sandbox.executor", str(2**30), "100", "require"],
        stdin=subprocess.DEVNULL, capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert b'"seccomp":true' in done.stdout


def test_the_allowlist_holds_no_call_that_opens_runs_or_connects() -> None:
    dangerous = {"open", "openat", "openat2", "socket", "connect", "execve", "execveat", "fork",
                 "vfork", "clone", "clone3", "ptrace", "mount", "kill", "tgkill", "bind",
                 "sendto", "sendmsg", "unlink", "unlinkat", "ioctl", "prctl", "seccomp"}  # fmt: skip
    assert not dangerous & set(ALLOWED)


async def test_the_require_setting_refuses_an_executor_missing_a_layer() -> None:
    code = await bundle_of(WELL_BEHAVED)
    async with ExecutorPool(_probe("no-seccomp", confinement="require")) as pool:
        host = MemoryHost()
        with pytest.raises(QjsflowError, match="refused to start: confinement required but "
                           "missing: seccomp withheld"):  # fmt: skip
            await pool.drive(host.request(code), host)


async def test_best_effort_runs_without_the_layer_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    code = await bundle_of(WELL_BEHAVED)
    async with ExecutorPool(_probe("no-seccomp", confinement="best-effort")) as pool:
        host = MemoryHost()
        assert isinstance(await pool.drive(host.request(code), host), Completed)
        assert pool.layers["seccomp"] is False
    assert "without part of their confinement: seccomp withheld" in caplog.text


def test_doctor_reports_the_layers_of_this_machine(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "qjsflow.runner.cli", "doctor", "--json"], cwd=tmp_path,
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = orjson.loads(done.stdout)
    assert report["executor"]["seccomp"] is True
    assert report["executor"]["landlockAbi"] >= 1
    assert report["confinement"] == "best-effort"
    assert report["scope_database"]["landlockAbi"] >= 1
    assert report["scope_databases"] == "local"  # a SQLite journal's default
    for journal, said in (("postgresql://h/db", "replicated through the journal"),
                          ("./j.db", "local files, one machine")):  # fmt: skip
        shown = subprocess.run(
            [sys.executable, "-m", "qjsflow.runner.cli", "doctor", "--db", journal],
            cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert f"scope databases: {said}" in shown.stdout, shown.stderr
        assert ("2 a worker" in shown.stdout) == journal.startswith("postgresql:")


FOLDER_PROBE = """
import socket, sys
from qjsflow.sandbox.confine import confine_paths
layers = confine_paths([(sys.argv[1], "write"), *((path, "read") for path in sys.path)])
seen = [layers.landlock_abi > 0]
with open(sys.argv[1] + "/inside.txt", "w") as inside:
    seen.append(inside.write("ok") == 2)
for attempt in (lambda: open("/etc/hostname").read(), lambda: open(sys.argv[2], "w"),
                lambda: socket.create_connection(("127.0.0.1", 9), timeout=1)):
    try:
        attempt()
        seen.append("allowed")
    except PermissionError:
        seen.append("denied")
    except OSError as error:
        seen.append(type(error).__name__)
print(seen)
"""


def test_the_scope_database_process_reaches_its_folder_only(tmp_path: Path) -> None:
    root = tmp_path / "scopes"
    root.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", FOLDER_PROBE, str(root), str(tmp_path / "outside.txt")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[True, True, 'denied', 'denied', 'denied']"
    assert not (tmp_path / "outside.txt").exists()


async def test_the_scope_database_process_says_it_is_confined(tmp_path: Path) -> None:
    databases = ScopeDatabases(tmp_path / "scopes")
    try:
        outcome = await databases.execute(
            "acme", run_id="acme/r", call_key="sql:1:", sql="SELECT 1 AS one", params="[]",
            deadline_s=5,
        )  # fmt: skip
        assert outcome.result is not None
        assert databases.layers["landlockAbi"] >= 1
        assert databases.layers["noNewPrivs"] is True
    finally:
        await databases.aclose()


BUNDLER_PROBE = """
const fs = require("fs");
const seen = [];
for (const attempt of [() => fs.readFileSync(process.argv[1]), () => fs.readFileSync(process.argv[2]),
                       () => fs.writeFileSync(process.argv[3], "x")]) {
  try { attempt(); seen.push("allowed"); } catch (error) { seen.push(error.code); }
}
console.log(JSON.stringify(seen));
"""


@pytest.mark.parametrize("mode", ["best-effort", "off"])
def test_the_bundler_reads_its_tree_only(tmp_path: Path, mode: str) -> None:
    tree, outside = tmp_path / "tree", tmp_path / "secret.txt"
    tree.mkdir()
    (tree / "inside.ts").write_text("export {};")
    outside.write_text("host secret")
    toolchain = find_toolchain()
    command = [*confined_command(toolchain, str(tree), mode), toolchain.node, "-e", BUNDLER_PROBE,
               str(tree / "inside.ts"), str(outside), str(tree / "written.txt")]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    expected = ["allowed", "EACCES", "EACCES"] if mode != "off" else ["allowed"] * 3
    assert orjson.loads(done.stdout) == expected
