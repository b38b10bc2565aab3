"""A SQLite journal file that changes under a worker: read-only when the worker (re)starts
(a read-only bind mount in a mount namespace of the test's own, as root cannot be kept out by
file modes), replaced by a backup renamed over it, or emptied. The worker writes nothing the
journal would not hold, and says why."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from qjsflow.runner import Bindings, Runner, RunnerConfig, StartRunInput
from qjsflow.runner.errors import JournalUnavailable
from tests.conftest import PROJECT_ROOT

QUICK = "export default async (event) => event.payload;"
CALLS = 'export default async (e, step) => step.tool("call", "count.calls", {});'

_READ_ONLY_RESTART = """
import asyncio, sqlite3, subprocess, sys
from qjsflow.runner import Runner, StartRunInput
from qjsflow.runner.errors import JournalUnavailable

folder = sys.argv[1]
db = folder + "/j.db"

async def main():
    async with Runner.open(db) as runner:
        published = await runner.publish("acme", {"workflows/flow.ts": sys.argv[2]})
        await runner.start(StartRunInput("acme", "flow", published.snapshot_id, 5, "r"),
                           drive=False)
    keeper = sqlite3.connect(db)  # another worker has it open (its -wal and -shm are there)
    keeper.execute("SELECT count(*) FROM runs").fetchall()
    subprocess.run(["mount", "--bind", folder, folder], check=True)
    subprocess.run(["mount", "-o", "remount,bind,ro", folder], check=True)
    try:
        async with Runner.open(db) as runner:
            print("opened while read-only")
    except JournalUnavailable as refused:
        print("refused:", refused)
    subprocess.run(["umount", "--lazy", folder], check=True)  # writable again
    keeper.close()
    async with Runner.open(db) as runner:
        done = await runner.resume("r", scope="acme")
        print("then:", done.status, done.output)

asyncio.run(main())
"""


def test_a_worker_never_opens_its_journal_read_only(tmp_path: Path) -> None:
    unshare = shutil.which("unshare")
    assert unshare, "util-linux comes with the machine"
    done = subprocess.run(
        [unshare, "--mount", "--propagation", "private", sys.executable, "-c",
         _READ_ONLY_RESTART, str(tmp_path), QUICK],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("refused: "), lines
    assert "cannot be written by this process (the file or its folder is read-only)" in lines[0]
    assert lines[1] == "then: completed 5"


@pytest.mark.parametrize("change", ["replaced", "emptied", "removed"])
async def test_a_journal_file_changed_under_a_worker_stops_its_writes(
    tmp_path: Path, change: str
) -> None:
    calls: Counter[str] = Counter()

    async def count(args: Any) -> int:
        calls["count.calls"] += 1
        return calls["count.calls"]

    journal = tmp_path / "j.db"
    config = RunnerConfig(bindings=Bindings({"count.calls": count}))
    async with Runner.open(journal, config) as runner:
        published = await runner.publish("acme", {"workflows/flow.ts": CALLS})
        first = await runner.start(StartRunInput("acme", "flow", published.snapshot_id))
        assert first.output == 1
        if change == "replaced":  # an older copy renamed over it, as a restore would
            backup = tmp_path / "backup.db"
            with sqlite3.connect(journal) as source, sqlite3.connect(backup) as copy:
                source.backup(copy)
            os.replace(backup, journal)
        elif change == "emptied":
            os.truncate(journal, 0)
        else:
            journal.unlink()
        with pytest.raises(JournalUnavailable, match="since this process opened it"):
            await runner.start(StartRunInput("acme", "flow", published.snapshot_id, None, "b"))
    assert calls == Counter({"count.calls": 1})  # nothing called that no journal records
