"""The statements of a tool call's audit row (`tool_calls`) and of the step it settles. On
PostgreSQL a call's start, and a result answered ahead, are one statement each: a tool step's
transaction sends six statements, not eleven (each costs the worker and the server ~20-30 µs
of compute whether or not its answer is waited for)."""

from __future__ import annotations

import dataclasses

from qjsflow.bridge import dumps_text
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
# A result answered ahead: its audit row, its `step_completed` event, and its step settled
# at that event (once: a step settled already is left as it is).
_SETTLE_ANSWERED = (
    "WITH call AS (UPDATE tool_calls SET result = ?, error = NULL, duration_ms = ?"
    " WHERE run_id = ? AND step_key = ? AND attempt = ?),"
    " settled AS (INSERT INTO events (run_id, type, at, data, epoch)"
    " VALUES (?, 'step_completed', ?, ?, ?) RETURNING seq)"
    " UPDATE steps SET status = 'completed', output = ?, error = NULL, completed_at = ?,"
    " settled_seq = (SELECT seq FROM settled), replay_at = NULL"
    " WHERE run_id = ? AND kind = ? AND name = ? AND count = ? AND settled_seq IS NULL"
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
        """A tool step's first attempt and its call's audit row, written ahead of the call:
        its step has no row (the caller presumes so: a row there fails the insert, and so
        the transaction). `events`: the data of its `step_started` and `tool_called`."""
        run_id, key = place.run_id, place.key
        started, called = events
        if self._dialect.pipelined:
            self._db.execute(_BEGIN_FIRST_CALL, (
                run_id, place.name, place.count, config, at, digest,
                run_id, key, address, args, at,
                run_id, at, started, self._epoch, run_id, at, called, self._epoch,
            ))  # fmt: skip
            return
        self.insert_step(run_id, "tool", place.name, place.count, status=StepStatus.running,
                         attempt=1, started_at=at, config=config, args_digest=digest)  # fmt: skip
        self.append_event(run_id, "step_started", at, started)
        self.start_tool_call(run_id, key, 1, address=address, args=args, at=at)
        self.append_event(run_id, "tool_called", at, called)

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
        self._db.execute(
            "UPDATE tool_calls SET result = ?, error = ?, duration_ms = ?"
            " WHERE run_id = ? AND step_key = ? AND attempt = ?",
            (result, error, duration_ms, run_id, step_key, attempt),
        )

    def settle_call_answered(
        self, place: StepPlace, attempt: int, *, result: str, duration_ms: int, at: int
    ) -> None:
        """A tool call's result its drive answered before writing it (runner/engine/host.py):
        the audit row and the step settled, reading nothing. They change no other step's row,
        so a read of one sent ahead (`send_step_read`) still answers after them."""
        sent = self._step_read
        if self._dialect.pipelined:
            run_id = place.run_id
            self._db.execute(_SETTLE_ANSWERED, (
                result, duration_ms, run_id, place.key, attempt,
                run_id, at, f'{{"key":{dumps_text(place.key)}}}', self._epoch,
                result, at, run_id, place.kind, place.name, place.count,
            ))  # fmt: skip
        else:
            self.finish_tool_call(place.run_id, place.key, attempt, result=result, error=None,
                                  duration_ms=duration_ms)  # fmt: skip
            self.settle_step(place, status=StepStatus.completed, output=result, error=None,
                             at=at, event_type="step_completed")  # fmt: skip
        if sent is not None and sent.place != place:
            self._step_read = dataclasses.replace(sent, sent_at=self._db.statements_sent)

    def mark_tool_calls_unknown(self, run_id: str, step_key: str, attempt: int, error: str) -> None:
        """Audit rows of an attempt that never reported: their outcome is unknown."""
        self._db.execute(
            "UPDATE tool_calls SET error = ? WHERE run_id = ? AND step_key = ? AND attempt = ?"
            " AND result IS NULL AND error IS NULL",
            (error, run_id, step_key, attempt),
        )
