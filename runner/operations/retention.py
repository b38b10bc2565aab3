"""Pruning ended runs: by an operator (`qjsflow prune`) or by workers on their own, under a
retention setting (`RunnerConfig.retention`).

A pruned run goes with everything recorded of it: steps, events, inbox, timers, console lines,
the tool audit, and its applied-call records in its scope's database. Those records go first:
a crash in between leaves a journal row of an ended run (pruned next time), never an applied
record that a new run reusing the id would mistake for its own. The delete checks again, in its
own transaction, that each run chosen has still ended: one restarted since it was chosen stays
(its applied records forgotten are those of its earlier generations, which it no longer uses).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial

from qjsflow.runner.scopedb import ScopeDatabases
from qjsflow.runner.store import ENDED, JournalStore, JournalTransaction

__all__ = ["Pruned", "prune"]

_BATCH = 500  # runs deleted per transaction: writers wait at most for one batch


@dataclass(frozen=True, slots=True)
class Pruned:
    runs: int
    snapshots: int
    dry_run: bool = False
    scopes: dict[str, int] = field(default_factory=dict)  # runs per scope


def _delete(
    tx: JournalTransaction,
    keys: list[str],
    before_ms: int,
    statuses: frozenset[str],
    scope: str | None,
) -> list[tuple[str, str]]:
    return tx.delete_ended_runs(keys, before_ms, statuses, scope)


async def prune(
    store: JournalStore,
    scopes: ScopeDatabases,
    *,
    before_ms: int,
    statuses: Iterable[str] = ENDED,
    snapshots: bool = False,
    scope: str | None = None,
    dry_run: bool = False,
) -> Pruned:
    """Delete runs that ended before `before_ms` (and, with `snapshots`, unused snapshots
    published before then); with `dry_run`, only count them."""
    chosen = frozenset(statuses)
    if dry_run:
        count = await store.count_ended_runs(before_ms, chosen, scope)
        unused = await store.count_unused_snapshots(before_ms / 1000, scope) if snapshots else 0
        return Pruned(count, unused, dry_run=True)
    per_scope: dict[str, int] = defaultdict(int)
    while True:
        batch = await store.ended_runs(before_ms, chosen, _BATCH, scope)
        if not batch:
            break
        by_scope: dict[str, list[str]] = defaultdict(list)
        for run_id, run_scope in batch:
            by_scope[run_scope].append(run_id)
        for run_scope, run_ids in by_scope.items():
            await scopes.forget(run_scope, run_ids)
        deleted = await store.transact(partial(
            _delete, keys=[run_id for run_id, _ in batch], before_ms=before_ms,
            statuses=chosen, scope=scope,
        ))  # fmt: skip
        for _, run_scope in deleted:
            per_scope[run_scope] += 1
        if len(batch) < _BATCH:
            break
    removed = 0
    if snapshots:
        before_s = before_ms / 1000
        removed = await store.transact(lambda tx: tx.delete_unused_snapshots(before_s, scope))
    return Pruned(sum(per_scope.values()), removed, scopes=dict(per_scope))
