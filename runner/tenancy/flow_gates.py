"""Flow control, enforced in the journal (docs/OPERATIONS.md, Flow control; what a workflow
declares is bundles/flow.py). A gated run is created `queued`; it becomes `running` only in
a transaction that holds its workflow's gate (`lock_gate`: a row lock on PostgreSQL, the
write lock on SQLite) and counts, from the journal, what its keys already have:

- concurrency: runs of the key admitted and not ended, fewer than the limit;
- singleton: no run of the key admitted and not ended;
- rate limit / throttle: runs of the key admitted within the period, fewer than the limit;
- debounce: the pending run's quiet period is over.

Queued runs leave in order — priority, then the time they were queued — and a run that
cannot leave holds back only the runs of its own keys. Admission happens in the start's own
transaction (a run with room starts at once), and on every worker at each poll interval for
gates with runs waiting (`admit_due`): one whose runs ended, or whose window opened.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from qjsflow.bridge import dumps_text
from qjsflow.bundles.flow import FlowControl
from qjsflow.runner.errors import FlowRefused
from qjsflow.runner.store import ENDED, JournalStore, JournalTransaction, RunRecord, RunStatus
from qjsflow.runner.store.flow_rows import FlowRow
from qjsflow.runner.tenancy.scopes import split_run_key

__all__ = ["Gated", "admit_due", "admit_waiting", "gate_fork", "gate_start", "requeue"]

_GATES_LOOKED_AT = 50  # gates one look admits for, at most


@dataclass(frozen=True, slots=True)
class Gated:
    """What a gated start did: the run it answers with (the new one, queued or admitted,
    or the pending run a debounced start merged into) and whether that one is new."""

    run: RunRecord
    created: bool


def gate_start(
    tx: JournalTransaction,
    record: RunRecord,
    flow: FlowControl,
    run_input: Any,
    *,
    now: int,
    created: Callable[[RunRecord], None],
) -> Gated:
    """Write a start of a gated workflow (its run not in the journal yet): refused, merged
    into a pending debounced run, or queued — and admitted at once if its gates have room.
    `created` writes what comes with a new run (its first events, its tags)."""
    scope, workflow = record.scope, record.workflow
    keys = flow.keys(run_input)
    tx.lock_gate(scope, workflow)
    rows = tx.gate_rows(scope, workflow, now)  # going on, and ended within a rate window
    live = [row for row in rows if row.status not in ENDED]
    if flow.singleton is not None:
        holders = [row for row in live if row.singleton_key == keys.singleton]
        if holders and flow.singleton.mode == "skip":
            raise FlowRefused(workflow, f"run {_shown(holders[0])} of the singleton key "
                              f"{keys.singleton} has not ended")  # fmt: skip
        for holder in holders:  # mode cancel: each ends at its next suspension point
            tx.update_run(holder.run_id, cancel_requested=1, updated_at=now)
            tx.append_event(holder.run_id, "cancel_requested", now,
                            dumps_text({"singleton": keys.singleton}))  # fmt: skip
    if flow.debounce is not None:
        pending = [row for row in live
                   if row.debounce_key == keys.debounce and row.admitted_at is None]  # fmt: skip
        if pending:
            merged = pending[0].run_id
            tx.update_run(merged, input=record.input, updated_at=now)
            tx.debounce_into(merged, now + int(flow.debounce.period_s * 1000))
            tx.append_event(merged, "run_debounced", now, dumps_text({"key": keys.debounce}))
            admit_waiting(tx, scope, workflow, now)
            found = tx.get_run(merged)
            assert found is not None
            return Gated(found, created=False)
    rate = flow.rate_limit
    if rate is not None and rate.mode == "refuse":
        window = [row for row in rows if row.rate_key == keys.rate and row.admitted_at is not None
                  and row.admitted_at > now - rate.period_s * 1000]  # fmt: skip
        if len(window) >= rate.limit:
            raise FlowRefused(workflow, f"the rate limit of {rate.limit} a {rate.period_s:g} s "
                              f"for the key {keys.rate} is reached")  # fmt: skip
    queued = replace(record, status=RunStatus.queued)
    if not tx.insert_run(queued):
        raise AssertionError("a gated start's run was looked for first")
    created(queued)
    window_gate = flow.rate_limit or flow.throttle
    tx.insert_flow(
        FlowRow(
            run_id=record.run_id, scope=scope, workflow=workflow,
            concurrency_key=keys.concurrency,
            concurrency_limit=None if flow.concurrency is None else flow.concurrency.limit,
            singleton_key=keys.singleton, rate_key=keys.rate,
            rate_limit=None if window_gate is None else window_gate.limit,
            rate_period_ms=None if window_gate is None else int(window_gate.period_s * 1000),
            debounce_key=keys.debounce,
            not_before=None if flow.debounce is None else now + int(flow.debounce.period_s * 1000),
            queued_at=now,
        )
    )  # fmt: skip
    tx.append_event(record.run_id, "run_queued", now, None)
    admit_waiting(tx, scope, workflow, now)
    found = tx.get_run(record.run_id)
    assert found is not None
    return Gated(found, created=True)


def requeue(tx: JournalTransaction, run_id: str, now: int) -> bool:
    """A gated run made live again (a restart) waits for its gate as a new start would;
    False when its workflow does not gate it."""
    row = tx.flow_of(run_id)
    if row is None:
        return False
    tx.lock_gate(row.scope, row.workflow)
    tx.requeue_flow(run_id, now)
    _wait(tx, row, run_id, now)
    return True


def gate_fork(tx: JournalTransaction, source_id: str, fork_id: str, now: int) -> bool:
    """A fork of a gated run (just inserted) is counted under the same keys and waits for
    its gate as a new start would; False when the source is not gated."""
    source = tx.flow_of(source_id)
    if source is None:
        return False
    tx.lock_gate(source.scope, source.workflow)
    tx.insert_flow(source.queued_again(fork_id, now))
    _wait(tx, source, fork_id, now)
    return True


def _wait(tx: JournalTransaction, gate: FlowRow, run_id: str, now: int) -> None:
    """A run whose flow row is written (the caller holds its gate) is queued: admitted at
    once if there is room."""
    tx.update_run(run_id, status=RunStatus.queued, updated_at=now)
    tx.append_event(run_id, "run_queued", now, None)
    admit_waiting(tx, gate.scope, gate.workflow, now)


def admit_waiting(tx: JournalTransaction, scope: str, workflow: str, now: int) -> list[str]:
    """Admit the workflow's queued runs that have room, in order (the caller holds its
    gate); record on the gate what still waits and when time alone may admit one."""
    tx.sweep_gate(scope, workflow)
    rows = tx.gate_rows(scope, workflow, now)  # going on, and ended within a rate window
    running: Counter[tuple[str, str]] = Counter()
    windows: dict[str, list[int]] = defaultdict(list)
    for row in rows:
        if row.admitted_at is None:
            continue
        if row.status not in ENDED:
            for kind, key in (("c", row.concurrency_key), ("s", row.singleton_key)):
                if key is not None:
                    running[kind, key] += 1
        if row.rate_key is not None:
            windows[row.rate_key].append(row.admitted_at)
    admitted: list[str] = []
    waiting, next_at, held_by_runs = 0, None, False
    for row in rows:
        if row.admitted_at is not None or row.status != RunStatus.queued:
            continue
        opens = _opens_at(row, running, windows, now)
        if opens is not None:
            waiting += 1
            if opens == _WHEN_ONE_ENDS:
                held_by_runs = True
            else:
                next_at = opens if next_at is None else min(next_at, opens)
            continue
        _admit(tx, row, now)
        admitted.append(row.run_id)
        if row.concurrency_key is not None:
            running["c", row.concurrency_key] += 1
        if row.singleton_key is not None:
            running["s", row.singleton_key] += 1
        if row.rate_key is not None:
            windows[row.rate_key].append(now)
    # A gate held by runs still going is looked at every poll interval (None), one held by
    # time alone once its time comes.
    tx.set_gate(scope, workflow, waiting=waiting, next_at=None if held_by_runs else next_at)
    return admitted


_WHEN_ONE_ENDS = -1


def _opens_at(
    row: FlowRow, running: Counter[tuple[str, str]], windows: dict[str, list[int]], now: int
) -> int | None:
    """None if the run may be admitted now; else when its gates may next have room
    (`_WHEN_ONE_ENDS`: when a run of its key ends)."""
    if row.concurrency_key is not None and running["c", row.concurrency_key] >= (
        row.concurrency_limit or 1
    ):
        return _WHEN_ONE_ENDS
    if row.singleton_key is not None and running["s", row.singleton_key] >= 1:
        return _WHEN_ONE_ENDS
    if row.not_before is not None and row.not_before > now:
        return row.not_before
    if row.rate_key is not None and row.rate_limit and row.rate_period_ms:
        inside = sorted(at for at in windows[row.rate_key] if at > now - row.rate_period_ms)
        if len(inside) >= row.rate_limit:
            return inside[len(inside) - row.rate_limit] + row.rate_period_ms
    return None


def _admit(tx: JournalTransaction, row: FlowRow, now: int) -> None:
    tx.mark_admitted(row.run_id, now)
    tx.update_run(row.run_id, status=RunStatus.running, updated_at=now)
    tx.append_event(row.run_id, "run_admitted", now, dumps_text({"queuedMs": now - row.queued_at}))


def _shown(row: FlowRow) -> str:
    return repr(split_run_key(row.run_id)[1])


async def admit_due(store: JournalStore, now: int) -> tuple[int, bool]:
    """A worker's look: admit what every gate with runs waiting has room for now (a gate
    another worker holds is skipped: that one admits). How many it admitted, and whether
    runs still wait."""
    gates = await store.read(lambda tx: tx.waiting_gates(now, _GATES_LOOKED_AT))
    admitted = 0
    for scope, workflow in gates:

        def look(tx: JournalTransaction, scope: str = scope, workflow: str = workflow) -> list[str]:
            if not tx.lock_gate(scope, workflow, wait=False):
                return []
            return admit_waiting(tx, scope, workflow, now)

        admitted += len(await store.transact(look))
    return admitted, bool(gates)
