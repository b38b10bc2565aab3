"""The README's examples run as written, and the demo tells the whole story."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.conftest import PROJECT_ROOT
from tests.test_types import _tsc

pytestmark = pytest.mark.slow

README = (PROJECT_ROOT / "README.md").read_text()


def _example(name: str) -> str:
    match = re.search(rf"<!-- example: {re.escape(name)} -->\n```\w+\n(.*?)```", README, re.S)
    assert match, f"the README has no example {name!r}"
    return match.group(1)


@pytest.mark.timeout(120)
def test_the_authoring_example_runs_from_python(tmp_path: Path) -> None:
    source = tmp_path / "src" / "workflows" / "onboarding.ts"
    source.parent.mkdir(parents=True)
    source.write_text(_example("workflows/onboarding.ts"))
    namespace: dict[str, Any] = {}
    exec(compile(_example("python"), "README.md", "exec"), namespace)
    printed = io.StringIO()
    cwd = Path.cwd()
    os.chdir(tmp_path)
    try:
        with contextlib.redirect_stdout(printed):
            asyncio.run(namespace["main"](str(source.parent.parent)))
    finally:
        os.chdir(cwd)
    lines = printed.getvalue().splitlines()
    assert lines[0] == "sleeping"
    assert lines[1] == "waiting"
    assert lines[2].startswith("completed {'account': 'acct-ada@example.com', 'crm': {'synced':")


def test_the_authoring_example_type_checks(tmp_path: Path) -> None:
    source = tmp_path / "onboarding.ts"
    source.write_text(_example("workflows/onboarding.ts"))
    done = _tsc(source)
    assert done.returncode == 0, done.stdout


@pytest.mark.timeout(180)
def test_the_demo_runs_to_a_completed_run_with_a_timeline() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "qjsflow.runner.cli", "--json", "demo"],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=170, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = orjson.loads(done.stdout)
    assert result["run"]["status"] == "completed"
    assert any("SIGKILL" in line for line in result["story"])
    timeline = {row[0]: row for row in result["timeline"]}
    assert timeline["pack order"][2] == "2"  # the attempt cut short by the kill was retried
    assert timeline["price order"][4] == "drive 1"
    assert timeline["price order"][5] != "-"  # replayed by later drives, not executed again


@pytest.mark.timeout(180)
def test_the_shell_example_runs_with_a_worker(tmp_path: Path) -> None:
    """The command-line walk-through, run by bash as written: the commands record, the
    worker in the background drives."""
    shutil.copytree(PROJECT_ROOT / "fixtures", tmp_path / "fixtures")
    bin_folder = str(Path(sys.executable).parent)  # where `qjsflow` is installed
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("QJSFLOW_")},
           "PATH": f"{bin_folder}:{os.environ['PATH']}"}  # fmt: skip
    done = subprocess.run(["bash", "-e", "-c", _example("shell")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=170, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert re.search(r"^status\s+sleeping", out, re.M), out  # at rest after the worker's drive
    assert '"charge":' in out or '"orderId":"A-7"' in out, out  # the output, once it ended
    assert re.search(r"charge card\s+tool\s+1", out), out  # the timeline
