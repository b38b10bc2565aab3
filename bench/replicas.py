"""db.sql with the scope's database replicated through the journal, against a local file,
in the same run (one SQLite journal; the replica's costs are the same on PostgreSQL but for
the server's round trips):

- per statement, a write (an INSERT) and a read (a SELECT by key), local and replicated;
- catching up 10,000 changes on a machine with an empty folder, from changes alone and
  from an image, against reading the same row on a replica already caught up.
"""

from __future__ import annotations

import tempfile
from functools import partial
from pathlib import Path
from typing import Any

from bench.common import median, timed
from qjsflow.runner import Runner, RunnerConfig, StartRunInput
from qjsflow.sandbox import PoolConfig

_STATEMENTS = 500
WRITES = """import { db } from "qjsflow";
export default async (event) => {
  await db.sql("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v TEXT)");
  for (let i = 0; i < event.payload.n; i++) {
    await db.sql("INSERT INTO t (v) VALUES (?)", ["value " + i]);
  }
};"""
READS = """import { db } from "qjsflow";
export default async (event) => {
  for (let i = 0; i < event.payload.n; i++) {
    await db.sql("SELECT v FROM t WHERE id = ?", [i + 1]);
  }
};"""
MANIFEST = '{"capabilities": {"sql": "write"}}'
TREE = {"workflows/writes.ts": WRITES, "workflows/reads.ts": READS, "qjsflow.json": MANIFEST}
_CHANGES = 10_000


def _config(root: Path, mode: str) -> RunnerConfig:
    return RunnerConfig(pool=PoolConfig(size=1), scope_root=root, scope_databases=mode)


async def statement_costs(repeats: int = 3) -> dict[str, Any]:
    """Milliseconds per statement (a run of 500, less a run of none), by mode, alternated."""
    samples: dict[str, list[float]] = {f"{m}_{k}_ms": [] for m in ("local", "replicated")
                                       for k in ("write", "read")}  # fmt: skip
    for _ in range(repeats):
        for mode in ("local", "replicated"):
            with tempfile.TemporaryDirectory(prefix="qjsflow-bench-") as folder:
                root = Path(folder)
                async with Runner.open(root / "j.db", _config(root / "scopes", mode)) as runner:
                    await runner.publish("bench", TREE)
                    for kind, workflow in (("write", "writes"), ("read", "reads")):
                        empty = await timed(partial(_run, runner, workflow, 0))
                        full = await timed(partial(_run, runner, workflow, _STATEMENTS))
                        samples[f"{mode}_{kind}_ms"].append((full - empty) / _STATEMENTS * 1000)
    found = {name: median(values) for name, values in samples.items()}
    found["write_ratio"] = found["replicated_write_ms"] / found["local_write_ms"]
    found["read_ratio"] = found["replicated_read_ms"] / found["local_read_ms"]
    return found


async def _run(runner: Runner, workflow: str, n: int) -> None:
    latest = (await runner.snapshots(scope="bench"))[0].snapshot_id
    run = await runner.start(StartRunInput("bench", workflow, latest, {"n": n}))
    assert run.status == "completed", run.error


async def catch_up() -> dict[str, Any]:
    """10,000 changes written on one machine; a second machine's first read with an empty
    folder (changes alone; then with an image at the end), and its next read."""
    with tempfile.TemporaryDirectory(prefix="qjsflow-bench-") as folder:
        root = Path(folder)
        db = root / "j.db"
        async with Runner.open(db, _config(root / "a", "replicated")) as writer:
            assert writer.scopes.replication is not None
            writer.scopes.replication.image_every = 10 * _CHANGES  # changes alone, first
            await writer.publish("bench", TREE)
            for _ in range(10):
                await _run(writer, "writes", _CHANGES // 10)
        found: dict[str, Any] = {"changes": _CHANGES}
        async with Runner.open(db, _config(root / "b", "replicated")) as reader:
            found["from_changes_s"] = await timed(lambda: _run(reader, "reads", 1))
            found["caught_up_read_s"] = await timed(lambda: _run(reader, "reads", 1))
        async with Runner.open(db, _config(root / "a", "replicated")) as writer:
            assert writer.scopes.replication is not None
            writer.scopes.replication.image_every = 1  # its next write stores an image
            await _run(writer, "writes", 1)
        async with Runner.open(db, _config(root / "c", "replicated")) as fresh:
            found["from_image_s"] = await timed(lambda: _run(fresh, "reads", 1))
    return found
