"""What qjsflow is compared with: the raw cost of a durable SQLite commit, DBOS Transact, and
how fast this machine prepares a sandbox context at the moment."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from qjsflow.sandbox.bytecode import PreludeLoader
from qjsflow.sandbox.executor import PRELUDE, Prepared, planned_prelude


def raw_commit_s(transactions: int) -> float:
    """Seconds per insert+commit with the journal's own durability (WAL, synchronous=FULL)."""
    with tempfile.TemporaryDirectory() as folder:
        connection = sqlite3.connect(Path(folder) / "raw.db", isolation_level=None)
        connection.execute("PRAGMA journal_mode = WAL")
        connection.execute("PRAGMA synchronous = FULL")
        connection.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v TEXT)")
        started = time.perf_counter()
        for index in range(transactions):
            connection.execute("BEGIN IMMEDIATE")
            connection.execute("INSERT INTO t VALUES (?, ?)", (f"k{index}", '{"i":1}'))
            connection.execute("COMMIT")
        elapsed = time.perf_counter() - started
        connection.close()
    return elapsed / transactions


def contexts_per_s(seconds: float = 0.5) -> float:
    """Fresh sandbox contexts (the prelude read and run, the intrinsics frozen) prepared and
    freed per second of wall time, one after another in this process: what every drive pays
    first, and most of an executor's work with many runs in flight. A measure of this
    machine's speed at the moment, which moves by up to half here between minutes."""
    prelude = planned_prelude(PreludeLoader(PRELUDE))
    Prepared(prelude)  # (the first pays for what is made once)
    made = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        prepared = Prepared(prelude)
        del prepared  # freed here, as an executor frees each drive's
        made += 1
    return made / (time.perf_counter() - started)


# DBOS Transact's side of each workload, one script for both databases: ten-step workflows
# one after another (`sequential`) or all at once (`flight`), or a workflow's wait for a
# message until the step after it (`wake`: the median, in ms). Prints the seconds taken (or
# the median wake-up).
DBOS_SCRIPT = textwrap.dedent(
    """
    import sys, time, logging
    logging.disable(logging.CRITICAL)
    from dbos import DBOS
    url, mode, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    DBOS(config={"name": "bench", "system_database_url": url, "run_admin_server": False})

    @DBOS.step()
    def step(i):
        return {"i": i, "ok": True}

    @DBOS.workflow()
    def flow(n):
        return sum(step(i)["i"] for i in range(10))

    @DBOS.workflow()
    def waiter():
        sent = DBOS.recv("go", timeout_seconds=60)
        return step_time(sent)

    @DBOS.step()
    def step_time(sent):
        return time.time() * 1000 - sent

    DBOS.launch()
    if mode == "sequential":
        started = time.perf_counter()
        for n in range(count):
            flow(n)
        print(time.perf_counter() - started)
    elif mode == "flight":
        started = time.perf_counter()
        handles = [DBOS.start_workflow(flow, n) for n in range(count)]
        for handle in handles:
            handle.get_result()
        print(time.perf_counter() - started)
    else:
        found = []
        for n in range(count):
            handle = DBOS.start_workflow(waiter)
            time.sleep(0.2)  # the workflow reaches its recv (DBOS says nothing of it)
            DBOS.send(handle.get_workflow_id(), time.time() * 1000, "go")
            found.append(handle.get_result())
        found.sort()
        print(found[len(found) // 2])
    DBOS.destroy()
    """
)


def dbos(url: str, mode: str, count: int) -> float:
    """What `DBOS_SCRIPT` prints for a workload, in a process and folder of its own."""
    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run(
            [sys.executable, "-c", DBOS_SCRIPT, url, mode, str(count)],
            cwd=folder, capture_output=True, text=True, timeout=900, check=True,
        )  # fmt: skip
    return float(done.stdout.strip().splitlines()[-1])


def dbos_step_s(runs: int) -> float | None:
    """Seconds per step of DBOS Transact on the same workload, or None if it is not installed."""
    probe = subprocess.run([sys.executable, "-c", "import dbos"], capture_output=True, check=False)
    if probe.returncode != 0:
        return None
    return dbos("sqlite:///dbos.sqlite", "sequential", runs) / (runs * 10)
