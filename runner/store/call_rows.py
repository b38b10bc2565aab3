"""The statements of a tool call's audit row (`tool_calls`) and of the step it settles. On
PostgreSQL a call's start, and a result answered ahead, are one statement each (the latter
through `settle_step`): a tool step's transaction sends six statements, not eleven (each
costs the worker and the server ~20-30 µs of compute whether or not its answer is waited
for)."""

from __future__ import annotations

import dataclasses

from qjsflow.runner.store.records import StepPlace, StepStatus
from qjsflow.runner.store.step_rows import StepStatements

__all__ = ["CallStatements"]

# A first attempt's step row, its audit row, and its `step_started` and `tool_called` events
# (numbered in that order: one insert, its rows in order).
_BEGIN_FIRST_CALL = (
    "WITH step AS (INSERT INTO steps (run_id, kind, name, count, status, attempt, config,"
    " started_at, args_digest) VALUES (?, 'tool', ?, ?, 'running', 1, ?, ?, ?)),"
    " call AS (INSERT INTO tool_calls (run_id, step_key, attempt, address, args, started_at)"
    " VALUES (?, ?, 1, ?, ?, ?))"
    " INSERT INTO events (run_id, type, at, data, epoch)"
    " VALUES (?, 'step_started', ?, ?, ?), (?, 'tool_called', ?, ?, ?)"
)
# A call's audit row given its outcome (`finish_tool_call`).
_FINISH_CALL = (
    "UPDATE tool_calls SET result = ?, error = ?, duration_ms = ?"
    " WHERE run_id = ? AND step_key = ? AND attempt = ?"
)


class CallStatements(StepStatements):
    def begin_first_call(
        self,
        place: StepPlace,
        *,
        config: str,
        digest: str | None,
        address: str,
        args: str,
        at: int,
        events: tuple[str, str],
    ) -> None:
        """A tool step's first attempt and its call's audit row, written ahead of the call, in
        one statement: its step has no row (the caller presumes so: a row there fails the
        insert, and so the transaction — only a transaction that presumes, on PostgreSQL,
        writes it so; any other begins its attempt as `steps.begin_attempt` does). `events`:
        the data of its `step_started` and `tool_called`."""
        assert self.presumes, "written so only by a transaction that presumes"
        run_id, key = place.run_id, place.key
        started, called = events
        self._db.execute(_BEGIN_FIRST_CALL, (
            run_id, place.name, place.count, config, at, digest,
            run_id, key, address, args, at,
            run_id, at, started, self._epoch, run_id, at, called, self._epoch,
        ))  # fmt: skip

    def start_tool_call(
        self, run_id: str, step_key: str, attempt: int, *, address: str, args: str, at: int
    ) -> None:
        """The audit row of a call an attempt makes (one an attempt: the step and attempt
        name it, and nothing is read back)."""
        self._db.execute(
            "INSERT INTO tool_calls (run_id, step_key, attempt, address, args, started_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (run_id, step_key, attempt, address, args, at),
        )

    def finish_tool_call(
        self,
        run_id: str,
        step_key: str,
        attempt: int,
        *,
        result: str | None,
        error: str | None,
        duration_ms: int,
    ) -> None:
        self._db.execute(_FINISH_CALL, (result, error, duration_ms, run_id, step_key, attempt))

    def settle_call_answered(
        self, place: StepPlace, attempt: int, *, result: str, duration_ms: int, at: int
    ) -> None:
        """A tool call's result its drive answered before writing it (runner/engine/host.py):
        the audit row and the step settled, reading nothing. They change no other step's row,
        so a read of one sent ahead (`send_step_read`) still answers after them."""
        sent = self._step_read
        finished = (result, None, duration_ms, place.run_id, place.key, attempt)
        self.settle_step(place, status=StepStatus.completed, output=result, error=None, at=at,
                         event_type="step_completed", also=(_FINISH_CALL, finished))  # fmt: skip
        if sent is not None and sent.place != place:
            self._step_read = dataclasses.replace(sent, sent_at=self._db.statements_sent)

    def mark_tool_calls_unknown(self, run_id: str, step_key: str, attempt: int, error: str) -> None:
        """Audit rows of an attempt that never reported: their outcome is unknown."""
        self._db.execute(
            "UPDATE tool_calls SET error = ? WHERE run_id = ? AND step_key = ? AND attempt = ?"
            " AND result IS NULL AND error IS NULL",
            (error, run_id, step_key, attempt),
        )
