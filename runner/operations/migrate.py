"""Moving runs that have not ended to new code, proven by replay (`qjsflow migrate`; README,
"Changing a workflow while runs are in flight").

For each run, its journal is replayed against the new snapshot's bundle in the sandbox, in
strict mode, with a host that answers nothing (no tool, notification or SQL is called): the new
code must make the same calls — kind, name, occurrence, and for tools, fetch and db.sql the
same arguments (the digest recorded with each call) — reaching every recorded step before the
drive ends. A compatible run is re-pinned to the new snapshot in one journal transaction under
its lease (fenced like a drive, one `run_migrated` event); an incompatible one is left alone
and reported with the first divergence and where the new code made it (file:line).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Literal

from qjsflow.bridge import dumps_text
from qjsflow.bridge.types import Failed
from qjsflow.runner.engine.drive import RunDriver
from qjsflow.runner.operations.control import Checked
from qjsflow.runner.operations.fork_check import replay_without_calls
from qjsflow.runner.store import ENDED, BundleRecord, JournalTransaction, RunRecord, StepRow
from qjsflow.runner.tenancy.scopes import split_run_key

__all__ = ["MigrationReport", "RunVerdict", "check_run", "migrate_runs", "settled_steps"]

Verdict = Literal["compatible", "incompatible", "failed", "skipped"]
_CHECKS_AT_ONCE = 4


@dataclass(frozen=True, slots=True)
class RunVerdict:
    run_id: str
    verdict: Verdict
    migrated: bool = False
    reason: str | None = None  # the divergence, why it could not be replayed, or skipped
    where: tuple[str, ...] = ()  # the new code's frames at the divergence: file:line:column


@dataclass(frozen=True, slots=True)
class MigrationReport:
    scope: str
    to_snapshot: str
    dry_run: bool
    compatible: int
    incompatible: int
    failed: int  # could not be replayed (the new code threw, or hit a limit)
    skipped: int  # ended, already on the snapshot, or changed while it was checked
    migrated: int
    runs: tuple[RunVerdict, ...]


async def settled_steps(driver: RunDriver, run: RunRecord) -> list[StepRow]:
    """The run's settled steps, in the order it reached them: its journal."""
    rows = [row for row in await driver.store.list_steps(run.run_id) if row.settled_seq]
    return sorted(rows, key=lambda row: row.settled_seq or 0)


async def check_run(
    driver: RunDriver, run: RunRecord, bundle: BundleRecord, rows: list[StepRow]
) -> RunVerdict:
    """Replay `run`'s journal (`rows`) against `bundle`: nothing is called, nothing written."""
    name = split_run_key(run.run_id)[1]
    outcome, _ = await replay_without_calls(driver, run, bundle, rows, digests=True, strict=True)
    if not isinstance(outcome, Failed):
        return RunVerdict(name, "compatible")
    where = tuple((driver.locate(bundle, outcome.stack) or "").splitlines())
    if outcome.message.startswith("divergence: "):
        return RunVerdict(name, "incompatible", reason=outcome.message, where=where)
    return RunVerdict(name, "failed", reason=f"the new code fails: {outcome.message}", where=where)


async def migrate_runs(
    driver: RunDriver,
    scope: str,
    runs: list[RunRecord],
    bundles: dict[str, BundleRecord],
    *,
    to_snapshot: str,
    dry_run: bool,
    move: Callable[[JournalTransaction, RunRecord], tuple[int, str]] | None = None,
) -> MigrationReport:
    """Check each run against the bundle of its workflow in `bundles`, and re-pin those that
    pass (unless `dry_run`); with `move`, under another configuration version too."""
    gate = asyncio.Semaphore(_CHECKS_AT_ONCE)

    async def one(run: RunRecord) -> RunVerdict:
        name = split_run_key(run.run_id)[1]
        if run.status in ENDED:
            return RunVerdict(name, "skipped", reason=f"it is {run.status}")
        if run.snapshot_id == to_snapshot:
            return RunVerdict(name, "skipped", reason="it is on that snapshot already")
        bundle = bundles[run.workflow]
        rows = await settled_steps(driver, run)
        async with gate:
            verdict = await check_run(driver, run, bundle, rows)
        if verdict.verdict != "compatible" or dry_run:
            return verdict
        refused = await driver.store.transact(
            partial(
                repin, run_id=run.run_id, old=run.snapshot_id, bundle=bundle,
                checked=Checked(run.generation, tuple(row.key for row in rows)),
                worker=driver.worker_id, now=driver.now_ms(),
                ttl_ms=int(driver.config.lease_ttl_s * 1000), move=move,
            )
        )  # fmt: skip
        if refused is not None:
            return RunVerdict(name, "skipped", reason=refused)
        return RunVerdict(name, "compatible", migrated=True)

    verdicts = tuple(await asyncio.gather(*(one(run) for run in runs)))
    count = {kind: sum(1 for v in verdicts if v.verdict == kind) for kind in
             ("compatible", "incompatible", "failed", "skipped")}  # fmt: skip
    return MigrationReport(
        scope, to_snapshot, dry_run, count["compatible"], count["incompatible"],
        count["failed"], count["skipped"], sum(1 for v in verdicts if v.migrated), verdicts,
    )  # fmt: skip


def repin(
    tx: JournalTransaction,
    *,
    run_id: str,
    old: str,
    bundle: BundleRecord,
    checked: Checked,
    worker: str,
    now: int,
    ttl_ms: int,
    move: Callable[[JournalTransaction, RunRecord], tuple[int, str]] | None = None,
) -> str | None:
    """Pin a checked run to the new snapshot, under its lease (a driver holding a live one
    keeps the run; one holding a lapsed one is fenced out). None when done, else why not."""
    run = tx.get_run(run_id)
    if run is None or run.status in ENDED:
        return "it ended while it was checked"
    if run.snapshot_id != old:
        return "it was moved to another snapshot while it was checked"
    if run.generation != checked.generation:
        return "it was restarted while it was checked: migrate it again"
    if tx.count_settled(run_id) != len(checked.keys):
        return "it went on while it was checked: migrate it again"
    lease = tx.acquire_lease(run_id, worker, now, ttl_ms)
    if lease is None:
        return "a worker is driving it: migrate it again"
    tx.adopt(lease)
    moved_to: dict[str, object] = {}
    if move is not None:  # its env made again from the version, on the new snapshot's reach
        version, env = move(tx, replace(run, snapshot_id=bundle.snapshot_id))
        moved_to = {"config_version": version, "persisted_bindings": env}
    tx.update_run(run_id, snapshot_id=bundle.snapshot_id, entry_path=bundle.entry_path,
                  updated_at=now, **moved_to)  # fmt: skip
    moved = {"from": old, "to": bundle.snapshot_id,
             "configVersion": moved_to.get("config_version", run.config_version)}  # fmt: skip
    tx.append_event(run_id, "run_migrated", now, dumps_text(moved))
    tx.release_lease(lease)
    return None
