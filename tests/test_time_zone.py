"""Local time in the sandbox is UTC whatever the host's zone files say: a run replays alike on
workers in every zone. The host's zone is changed the way an operator's machine has it, a
zone file at /etc/localtime (bound over it in a mount namespace of the test's own)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PROJECT_ROOT

LOCAL_TIME = """
export default async function tz(event: unknown, step: unknown) {
  const epoch = new Date(0);
  return {
    hours: epoch.getHours(), minutes: epoch.getMinutes(), offset: epoch.getTimezoneOffset(),
    constructed: new Date(1970, 0, 1, 0, 0, 0).getTime(), parsed: Date.parse("1970-01-01T00:00"),
    text: epoch.toString(), date: epoch.toLocaleDateString("en-US"),
    summer: new Date(Date.UTC(2026, 6, 1)).getTimezoneOffset(),
  };
}
"""
ZONES = ("Asia/Kolkata", "America/St_Johns", "Pacific/Chatham")


@pytest.mark.parametrize("zone", ZONES)
def test_local_time_in_the_sandbox_is_utc_whatever_the_host_zone(tmp_path: Path, zone: str) -> None:
    zone_file = Path("/usr/share/zoneinfo") / zone
    unshare = shutil.which("unshare")
    assert zone_file.is_file(), "tzdata comes with the machine"
    assert unshare, "util-linux comes with the machine"
    (tmp_path / "workflows").mkdir()
    (tmp_path / "workflows" / "tz.ts").write_text(LOCAL_TIME)
    command = (
        f"mount --bind {zone_file} /etc/localtime && "
        f"{sys.executable} -m qjsflow.runner.cli run {tmp_path} tz --json"
    )
    done = subprocess.run(
        [unshare, "--mount", "--propagation", "private", "sh", "-c", command], cwd=PROJECT_ROOT,
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    output = json.loads(done.stdout)["output"]
    assert output == {
        "hours": 0, "minutes": 0, "offset": 0, "constructed": 0, "parsed": 0,
        "text": "Thu Jan 01 1970 00:00:00 GMT+0000", "date": "01/01/1970", "summer": 0,
    }  # fmt: skip
    # The zone really was bound: the host's own reading in that namespace is not UTC.
    host = subprocess.run(
        [unshare, "--mount", "--propagation", "private", "sh", "-c",
         f"mount --bind {zone_file} /etc/localtime && date -d @0 +%z"],
        capture_output=True, text=True, timeout=60, check=True, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert host.stdout.strip() != "+0000"
