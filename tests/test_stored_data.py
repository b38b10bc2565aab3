"""Stored code and journals are verified: damage is reported, never run or re-initialised."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from qjsflow.runner import Runner
from qjsflow.runner.errors import JournalUnavailable
from tests.conftest import PROJECT_ROOT, start_source

FLOW = """
export default async (event, step) => {
  await step.sleep("nap", "1 hour");
  return await step.do("after", async () => "ran");
};
"""


async def test_a_bundle_changed_at_rest_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    async with Runner.open(db) as runner:
        run = await start_source(runner, FLOW, run_id="r1")
        assert run.status == "sleeping"
    with sqlite3.connect(db) as connection:
        connection.execute("UPDATE bundles SET code = replace(code, '\"ran\"', '\"evil\"')")
        assert connection.total_changes == 1
        connection.execute("UPDATE timers SET due_at = 0")
    async with Runner.open(db) as runner:
        run = await runner.resume("r1", scope="acme")
        assert run.status == "failed"
        assert run.error is not None
        assert "does not match its checksum" in run.error
        assert run.snapshot_id in run.error
        steps = await runner.list_steps("r1", scope="acme")
        assert [s.name for s in steps] == ["nap"]  # the changed code never ran


def _cli(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "qjsflow.runner.cli", "--db", str(db), *args],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("command", [("status", "r1"), ("list",), ("steps", "r1")])
def test_an_emptied_journal_is_reported_not_reinitialised(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    db = tmp_path / "journal.db"
    db.write_bytes(b"")
    done = _cli(db, *command)
    assert done.returncode == 1
    assert "is empty" in done.stderr
    assert db.stat().st_size == 0
    assert not Path(f"{db}-wal").exists()


async def test_read_only_opening_writes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    async with Runner.open(db) as runner:
        await start_source(runner, FLOW, run_id="r1")
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    try:
        done = _cli(db, "--json", "status", "r1", "--scope", "acme")
        assert done.returncode == 0, done.stderr
        assert '"status":"sleeping"' in done.stdout
    finally:
        other.execute("ROLLBACK")
        other.close()
    fresh = tmp_path / "fresh.db"
    sqlite3.connect(fresh).execute("CREATE TABLE unrelated (x)").connection.close()
    with pytest.raises(JournalUnavailable, match="holds no qjsflow journal"):
        async with Runner.open(fresh, create=False):
            pass
    assert sqlite3.connect(fresh).execute("SELECT count(*) FROM sqlite_schema").fetchone() == (1,)
