"""Run control by operators — pause, resume, terminate, restart, fork — as journal transactions
(docs/OPERATIONS.md has the lifecycle). Each is journaled as an event of the run.

`Runner` runs these with `JournalStore.transact`; none needs the run's lease: those that take
the run away from a driver in progress (terminate, restart) void its lease, so that driver can
write nothing more and its heartbeat stops its executor.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from qjsflow.bridge import InvalidInput, dumps_text
from qjsflow.bridge.types import STEP_KINDS
from qjsflow.runner.engine.drive import SIGNAL_TIMER
from qjsflow.runner.errors import RunChanged, RunClosed, RunConflict, RunNotFound
from qjsflow.runner.store import ENDED, JournalTransaction, RunRecord, RunStatus, StepRow
from qjsflow.runner.tenancy.budgets import Budgets
from qjsflow.runner.tenancy.flow_gates import gate_fork, requeue
from qjsflow.runner.tenancy.scopes import split_run_key
from qjsflow.runner.tenancy.usage import admit

__all__ = [
    "FRESH_ATTEMPT",
    "STEP_KINDS",
    "Checked",
    "ExistingRun",
    "StepRef",
    "check_same_start",
    "checked_reason",
    "fork_run",
    "kept_steps",
    "lift_pause",
    "request_pause",
    "restart_run",
    "terminate_run",
]

# What a run starts again from when restarted or forked: no outcome, no wait, no request
# pending, and fresh budgets (compute, SQL time, executor deaths, console lines).
FRESH_ATTEMPT: dict[str, object] = {
    "status": "running", "output": None, "error": None, "error_stack": None, "wake_at": None,
    "waiting_for": None, "cancel_requested": 0, "pause_requested": 0,
    "cpu_used_s": 0.0, "sql_used_s": 0.0, "executor_deaths": 0, "logs_count": 0,
}  # fmt: skip
_COUNT = re.compile(r"^(.*):([1-9][0-9]{0,8})$")


@dataclass(frozen=True, slots=True)
class StepRef:
    """A step as operators name it: `KIND:NAME[:COUNT]` (`do:charge card`, `tool:email:2`);
    COUNT is which call of that name (1, the first, when left out)."""

    kind: str
    name: str
    count: int = 1

    @classmethod
    def parse(cls, text: str) -> StepRef:
        kind, colon, rest = text.partition(":")
        if kind not in STEP_KINDS or not colon or not rest:
            raise InvalidInput(
                f"invalid step {text[:120]!r}: use KIND:NAME[:COUNT], KIND one of "
                f"{', '.join(STEP_KINDS)}"
            )
        numbered = _COUNT.match(rest)
        if numbered is None:
            return cls(kind, rest)
        return cls(kind, numbered.group(1), int(numbered.group(2)))

    def matches(self, row: StepRow) -> bool:
        return (row.kind, row.name, row.count) == (self.kind, self.name, self.count)

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}:{self.count}"


def _open_run(tx: JournalTransaction, key: str) -> RunRecord:
    """The run, which must not have ended."""
    run = tx.get_run(key)
    if run is None:
        raise RunNotFound(split_run_key(key)[1])
    if run.status in ENDED:
        raise RunClosed(split_run_key(key)[1], run.status)
    return run


def _found(tx: JournalTransaction, key: str) -> RunRecord:
    run = tx.get_run(key)
    if run is None:
        raise RunNotFound(split_run_key(key)[1])
    return run


def request_pause(tx: JournalTransaction, key: str, now: int) -> RunRecord:
    """Ask the run to park after the steps under way (the next drive, or the one holding it
    now, parks it)."""
    run = _open_run(tx, key)
    if not run.pause_requested:
        tx.update_run(key, pause_requested=1, updated_at=now)
        tx.append_event(key, "pause_requested", now, None)
    return run


def lift_pause(tx: JournalTransaction, key: str, now: int) -> bool:
    """Make a paused run runnable again: a drive replays it to wherever it waits. A run that
    was not paused is left as it is (resume still drives it, as after a crash). True when a
    pause was lifted."""
    run = _found(tx, key)
    if not run.pause_requested or run.status in ENDED:
        return False
    status = "running" if run.status == RunStatus.paused else run.status
    tx.update_run(key, pause_requested=0, status=status, updated_at=now)
    tx.append_event(key, "run_resumed", now, None)
    return True


def checked_reason(reason: str | None) -> str | None:
    """An operator's reason for a terminate: stored and shown, so bounded."""
    if reason is not None and (not isinstance(reason, str) or len(reason) > 500):
        raise InvalidInput("--reason must be text of at most 500 characters")
    return reason


def terminate_run(tx: JournalTransaction, key: str, now: int, reason: str | None) -> None:
    """End the run now, whatever it is doing: no timer wakes it, no driver writes to it."""
    _open_run(tx, key)
    message = "terminated by an operator" + (f": {reason}" if reason else "")
    tx.fence_out(key)
    tx.delete_timers(key)
    tx.update_run(
        key, status=RunStatus.terminated, error=message, wake_at=None, waiting_for=None,
        cancel_requested=0, pause_requested=0, updated_at=now,
    )  # fmt: skip
    tx.append_event(key, "run_terminated", now, dumps_text({"reason": message}))


def request_rollback(tx: JournalTransaction, key: str, now: int, reason: str | None) -> None:
    """`terminate --rollback`: the run's next drive runs its rollbacks, then ends it
    `terminated` (sandbox/prelude/52-rollbacks.js); a paused run is woken for it."""
    _open_run(tx, key)
    message = "terminated by an operator" + (f": {reason}" if reason else "")
    tx.update_run(key, rollback_requested=message, pause_requested=0, updated_at=now)
    tx.set_timer(key, SIGNAL_TIMER, "signal", now)
    tx.append_event(key, "rollback_requested", now, dumps_text({"reason": message}))


def kept_steps(rows: Sequence[StepRow], start: StepRef | None) -> list[StepRow]:
    """The steps a restart or fork from `start` keeps, in the order they settled."""
    return _split(rows, start)[0]


def _split(rows: Sequence[StepRow], start: StepRef | None) -> tuple[list[StepRow], list[StepRow]]:
    """The steps kept (settled before `start`, not inside a step that runs again) and those
    run again. Without `start`, every step runs again."""
    if start is None:
        return [], list(rows)
    chosen = next((row for row in rows if start.matches(row)), None)
    if chosen is None:
        named = ", ".join(str(StepRef(r.kind, r.name, r.count)) for r in rows[:20])
        raise InvalidInput(f"the run has no step {str(start)!r}; its steps: {named or 'none'}")
    cut = chosen.settled_seq
    later = {
        r.key for r in rows if r.settled_seq is None or (cut is not None and r.settled_seq >= cut)
    }
    # Calls inside a step that runs again are made again with it (their names hold its key).
    inside = tuple(key + "/" for key in later)
    again = [r for r in rows if r.key in later or r.name.startswith(inside)]
    again_keys = {r.key for r in again}
    return [r for r in rows if r.key not in again_keys], again


def restart_run(
    tx: JournalTransaction,
    key: str,
    start: StepRef | None,
    now: int,
    *,
    budgets: Budgets | None = None,
    move: Callable[[JournalTransaction, RunRecord], tuple[int, str]] | None = None,
) -> tuple[int, int]:
    """Run it again, keeping its id: from the beginning, or from `start` (the steps settled
    before it keep their results). Returns (steps kept, steps that run again). An ended run
    made live again is admitted against its scope's live-runs budget. With `move`, it runs
    under another configuration version, its env made again from it."""
    run = _found(tx, key)
    moved = {}
    if move is not None:
        version, env = move(tx, run)
        moved = {"config_version": version, "persisted_bindings": env}
    kept, again = _split(tx.list_steps(key), start)
    if run.status in ENDED:
        admit(tx, run.scope, budgets, new_live_run=True)
    tx.fence_out(key)
    tx.delete_timers(key)
    tx.delete_steps(key, again)
    tx.free_journal_bytes(run.scope, sum(len(row.output or "") for row in again))
    tx.update_run(key, **FRESH_ATTEMPT, **moved, generation=run.generation + 1, updated_at=now)
    data = {"fromStep": None if start is None else str(start), "generation": run.generation + 1,
            "kept": len(kept), "again": len(again), "previousStatus": run.status,
            "configVersion": moved.get("config_version", run.config_version)}  # fmt: skip
    tx.append_event(key, "run_restarted", now, dumps_text(data))
    requeue(tx, key, now)  # a gated run waits for its gate again
    return len(kept), len(again)


@dataclass(frozen=True, slots=True)
class Checked:
    """What a check outside the acting transaction saw of a run: the transaction acts only if
    the run is still so (its generation, and the keys of the steps the check read)."""

    generation: int
    keys: tuple[str, ...]


def fork_run(
    tx: JournalTransaction,
    source_key: str,
    fork: RunRecord,
    start: StepRef | None,
    now: int,
    *,
    checked: Checked | None = None,
    budgets: Budgets | None = None,
    move: Callable[[JournalTransaction, RunRecord], tuple[int, str]] | None = None,
) -> bool:
    """Create `fork` (a new run of the same input) with the results of `source_key`'s steps
    settled before `start` copied. False when a run with the fork's id exists already;
    `RunChanged` when `checked` no longer holds. The fork is admitted as a new live run,
    and the results it copies as bytes stored, against its scope's budgets. With `move`, it
    runs under another configuration version, its env made again from it."""
    source = _found(tx, source_key)
    kept, _ = _split(tx.list_steps(source_key), start)
    if checked is not None and checked != Checked(source.generation, tuple(r.key for r in kept)):
        raise RunChanged(split_run_key(source_key)[1], "its fork was checked")
    if tx.get_run(fork.run_id) is not None:
        return False
    if move is not None:
        version, env = move(tx, fork)
        fork = replace(fork, config_version=version, persisted_bindings=env)
    copied = sum(len(row.output or "") for row in kept)
    admit(tx, fork.scope, budgets, new_live_run=True, stored_bytes=copied)
    if not tx.insert_run(fork):
        return False
    origin = split_run_key(source_key)[1]
    data = {"forkedFrom": origin, "fromStep": None if start is None else str(start)}
    tx.append_event(fork.run_id, "run_created", now, dumps_text({"scope": fork.scope, **data}))
    for row in kept:
        tx.copy_step(fork.run_id, row, now)
    gate_fork(tx, source_key, fork.run_id, now)  # under the source's gate, if it has one
    forked = {"fork": split_run_key(fork.run_id)[1], "copied": len(kept), **data}
    tx.append_event(source_key, "run_forked", now, dumps_text(forked))
    return True


class ExistingRun(Exception):
    """A start found the run it was asked to create (`wanted`): the transaction writes
    nothing."""

    def __init__(self, run: RunRecord, wanted: RunRecord) -> None:
        super().__init__(run.run_id)
        self.run = run
        self.wanted = wanted


def check_same_start(existing: RunRecord, wanted: RunRecord) -> None:
    """A start with a run id that exists: `RunConflict` unless it was asked the same."""
    differences = [
        name
        for name in ("workflow", "snapshot_id", "input", "persisted_bindings")
        if getattr(existing, name) != getattr(wanted, name)
    ]
    if differences:  # the run is the caller's own scope's: the key holds the scope
        raise RunConflict(split_run_key(wanted.run_id)[1], differences)
