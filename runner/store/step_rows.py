"""The statements on a run's steps: its journal as a drive replays it, the steps it settles,
and what an operator changes of them (restart, fork)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from qjsflow.bridge import dumps_text
from qjsflow.bridge.keys import step_key
from qjsflow.runner.store.leases import STEP_SQL, LeaseStatements
from qjsflow.runner.store.records import (
    STEP_COLUMNS,
    JournalRow,
    StepPlace,
    StepRow,
    step_row,
)
from qjsflow.runner.store.run_rows import EVENT_SQL

__all__ = ["STEP_COLUMNS", "SettledStep", "StepStatements"]

_STEP_UPDATABLE = {"status", "attempt", "config", "detail", "output", "error", "started_at"}


@dataclass(frozen=True, slots=True)
class SettledStep:
    """A step.do completed by its first attempt, written at once (`insert_settled_steps`)."""

    name: str
    count: int
    config: str
    output: str
    at: int
    replay_at: int | None


# A step settled at an event (`settle_step`): the row's update naming the event's seq.
_SETTLE_SQL = (
    "UPDATE steps SET status = ?, output = ?, error = ?, completed_at = ?, replay_at = ?,"
    " settled_seq ="
)
_SETTLE_WHERE = " WHERE run_id = ? AND kind = ? AND name = ? AND count = ? AND settled_seq IS NULL"
_STEPS_PER_STATEMENT = 100  # 1,000 arguments a statement: within both databases' limits


class StepStatements(LeaseStatements):
    # -- steps -------------------------------------------------------------------------------

    def get_step(self, run_id: str, kind: str, name: str, count: int) -> StepRow | None:
        place = StepPlace(run_id, kind, name, count)
        sent, self._step_read = self._step_read, None
        if sent is not None and sent.place == place and sent.sent_at == self._db.statements_sent:
            row = sent.statement.fetchone()  # sent with the fence, nothing since (`check_fence`)
        else:
            row = self._one(STEP_SQL, (run_id, kind, name, count))
        return None if row is None else step_row(row)

    def insert_step(
        self,
        run_id: str,
        kind: str,
        name: str,
        count: int,
        *,
        status: str,
        attempt: int,
        started_at: int,
        config: str | None = None,
        detail: str | None = None,
        args_digest: str | None = None,
    ) -> None:
        """A new step row (the caller read that there was none)."""
        self._db.execute(
            "INSERT INTO steps (run_id, kind, name, count, status, attempt, config, detail,"
            " started_at, args_digest) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, kind, name, count, status, attempt, config, detail, started_at, args_digest),
        )

    def insert_settled_steps(self, run_id: str, steps: Sequence[SettledStep]) -> bool:
        """Steps completed by their first attempt, begun and settled at once (a pure step's
        record): for each, in order, its `step_started` and `step_completed` events and its row
        settled at the latter — every event in one statement, every row in another (on
        PostgreSQL both in one). False, with nothing written, when one of them has a row
        already or comes twice. A transaction that `presumes` (only ever on PostgreSQL)
        reads nothing: such a step fails it, and its careful transaction writes them here
        again."""
        if self.presumes:
            for at in range(0, len(steps), _STEPS_PER_STATEMENT):
                self.insert_settled_batch(run_id, steps[at : at + _STEPS_PER_STATEMENT])
            return True
        self._db.execute("SAVEPOINT settled_steps")
        try:
            written = 0
            for at in range(0, len(steps), _STEPS_PER_STATEMENT):
                written += self.insert_settled_batch(run_id, steps[at : at + _STEPS_PER_STATEMENT])
            self.sync()
        except BaseException:
            self._db.execute("ROLLBACK TO settled_steps")
            self._db.execute("RELEASE settled_steps")
            raise
        if written != len(steps):
            self._db.execute("ROLLBACK TO settled_steps")
        self._db.execute("RELEASE settled_steps")
        return written == len(steps)

    def insert_settled_batch(self, run_id: str, steps: Sequence[SettledStep]) -> int:
        """Write `steps` (at most `_STEPS_PER_STATEMENT`): how many rows were inserted (in a
        transaction that presumes, not read: all of them, or the transaction fails)."""
        events: list[Any] = []
        completions = []
        for step in steps:
            key = dumps_text(step_key("do", step.count, step.name))
            completions.append(f'{{"key":{key}}}')
            events += (run_id, "step_started", step.at, f'{{"key":{key},"attempt":1}}', self._epoch)
            events += (run_id, "step_completed", step.at, completions[-1], self._epoch)
        insert_events = (
            "INSERT INTO events (run_id, type, at, data, epoch)"
            f" VALUES {', '.join(['(?, ?, ?, ?, ?)'] * (2 * len(steps)))}"
        )
        columns = (
            "run_id, kind, name, count, status, attempt, config, output, started_at,"
            " completed_at, settled_seq, replay_at"
        )
        if self._dialect.pipelined:
            # One statement (one round trip): each row settled at its completion's event,
            # found by its data (the step's key: one a step). Presumed, it fails (dividing
            # by zero) unless every row was inserted, and is not read.
            values: list[Any] = []
            for step, completed in zip(steps, completions, strict=True):
                values += (step.name, step.count, step.config, step.output, step.at,
                           step.replay_at, completed)  # fmt: skip
            typed = "(?::text, ?::bigint, ?::text, ?::text, ?::bigint, ?::bigint, ?::text)"
            rest = ", (?, ?, ?, ?, ?, ?, ?)" * (len(steps) - 1)
            statement = self._db.execute(
                f"WITH written AS ({insert_events} RETURNING seq, type, data),"
                f" inserted AS (INSERT INTO steps ({columns})"
                " SELECT ?, 'do', v.name, v.count, 'completed', 1, v.config, v.output, v.at,"
                " v.at, written.seq, v.replay_at"
                f" FROM (VALUES {typed}{rest})"
                " AS v (name, count, config, output, at, replay_at, data)"
                " JOIN written ON written.type = 'step_completed' AND written.data = v.data"
                " ON CONFLICT DO NOTHING RETURNING 1)"
                " SELECT count(*), 1 / (CASE WHEN count(*) = ? OR NOT ? THEN 1 ELSE 0 END)"
                " FROM inserted",
                (*events, run_id, *values, len(steps), self.presumes),
            )
            if self.presumes:
                return len(steps)
            return int(statement.fetchone()[0])
        rows = self._db.execute(f"{insert_events} RETURNING seq", events).fetchall()
        # Sequence numbers are given in the order of the rows inserted: the second of each
        # step's pair is its completion's, which it settles at.
        seqs = sorted(int(row[0]) for row in rows)
        values = []
        for step, seq in zip(steps, seqs[1::2], strict=True):
            values += (run_id, step.name, step.count, step.config, step.output, step.at,
                       step.at, seq, step.replay_at)  # fmt: skip
        marks = ", ".join(["(?, 'do', ?, ?, 'completed', 1, ?, ?, ?, ?, ?, ?)"] * len(steps))
        inserted = self._db.execute(
            f"INSERT INTO steps ({columns}) VALUES {marks} ON CONFLICT DO NOTHING RETURNING 1",
            values,
        ).fetchall()
        return len(inserted)

    def update_step(self, run_id: str, kind: str, name: str, count: int, **fields: Any) -> None:
        unknown = set(fields) - _STEP_UPDATABLE
        if unknown:
            raise ValueError(f"steps has no updatable columns {sorted(unknown)}")
        assignments = ", ".join(f"{name} = ?" for name in fields)
        self._db.execute(
            f"UPDATE steps SET {assignments}"
            " WHERE run_id = ? AND kind = ? AND name = ? AND count = ?",
            (*fields.values(), run_id, kind, name, count),
        )

    def list_steps(self, run_id: str) -> list[StepRow]:
        """Every step row of a run: settled ones in the order they settled, then the rest."""
        rows = self._db.execute(
            f"SELECT {STEP_COLUMNS} FROM steps WHERE run_id = ?"
            " ORDER BY settled_seq IS NULL, settled_seq, started_at",
            (run_id,),
        ).fetchall()
        return [step_row(row) for row in rows]

    def delete_steps(self, run_id: str, rows: Iterable[StepRow]) -> None:
        """Forget these steps (an operator's restart runs them again); an event they consumed
        is delivered again, to the step that waits for it next."""
        doomed = [(row.kind, row.name, row.count) for row in rows]
        self._db.executemany(
            "DELETE FROM steps WHERE run_id = ? AND kind = ? AND name = ? AND count = ?",
            [(run_id, *step) for step in doomed],
        )
        self._db.executemany(
            "UPDATE inbox SET consumed_by = NULL WHERE run_id = ? AND consumed_by = ?",
            [(run_id, step_key(kind, count, name)) for kind, name, count in doomed],
        )

    def copy_step(self, run_id: str, row: StepRow, at: int) -> None:
        """A settled step of another run, recorded as this run's next settled step (a fork).
        Without its call's digest: the operator chose to reuse the result, and the fork's own
        call may differ in what only the new run has (its instance id)."""
        self.append_event(run_id, "step_copied", at, dumps_text({"key": row.key}))
        self._db.execute(
            f"INSERT INTO steps ({STEP_COLUMNS})"
            f" VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, {self._dialect.last_seq}, ?, ?)",
            (
                run_id, row.kind, row.name, row.count, row.status, row.attempt, row.config,
                row.detail, row.output, row.error, row.started_at, row.completed_at, None,
                row.replay_at,
            ),
        )  # fmt: skip

    def reopen_failed_steps(self, run_id: str, prefix: str) -> None:
        """Failed calls named under `prefix` (those inside a step whose next attempt begins)
        become due again: they run anew in that attempt, as they would on Cloudflare."""
        self._db.execute(
            "UPDATE steps SET status = 'retrying', detail = NULL, settled_seq = NULL,"
            " completed_at = NULL WHERE run_id = ? AND status = 'failed'"
            " AND substr(name, 1, ?) = ?",
            (run_id, len(prefix), prefix),
        )

    def settle_step(
        self,
        step: StepRow | StepPlace,
        *,
        status: str,
        output: str | None,
        error: str | None,
        at: int,
        event_type: str,
        replay_at: int | None = None,
        also: tuple[str, tuple[Any, ...]] | None = None,
    ) -> None:
        """Record a step's final result, settled at the event written with it (once: a step
        settled already is left as it is). `replay_at`: the run's clock a replay reaches at
        it, when not `at` (StepRow). `also`: a statement written with it (a call's audit
        row). On PostgreSQL all of it is one statement; elsewhere, one each, in turn."""
        event = (step.run_id, event_type, at, f'{{"key":{dumps_text(step.key)}}}', self._epoch)
        settle = (status, output, error, at, replay_at, step.run_id, step.kind, step.name,
                  step.count)  # fmt: skip
        if self._dialect.pipelined:
            first, first_args = ("", ()) if also is None else (f"also AS ({also[0]}), ", also[1])
            self._db.execute(
                f"WITH {first}settled AS ({EVENT_SQL} RETURNING seq) {_SETTLE_SQL}"
                " (SELECT seq FROM settled)" + _SETTLE_WHERE,
                (*first_args, *event, *settle),
            )
            return
        if also is not None:
            self._db.execute(*also)
        self._db.execute(EVENT_SQL, event)
        self._db.execute(f"{_SETTLE_SQL} {self._dialect.last_seq}{_SETTLE_WHERE}", settle)

    def load_journal(self, run_id: str) -> list[JournalRow]:
        """Every settled step of a run in the order it was reached: one query per drive."""
        rows = self._db.execute(
            "SELECT kind, name, count, output, error, coalesce(replay_at, completed_at),"
            " args_digest FROM steps"
            " WHERE run_id = ? AND settled_seq IS NOT NULL ORDER BY settled_seq",
            (run_id,),
        ).fetchall()
        return [JournalRow(step_key(r[0], r[2], r[1]), r[3], r[4], int(r[5]), r[6]) for r in rows]

    def count_settled(self, run_id: str) -> int:
        """How many steps of the run have settled (its journal's length)."""
        row = self._one(
            "SELECT count(*) FROM steps WHERE run_id = ? AND settled_seq IS NOT NULL", (run_id,)
        )
        return int(row[0])

    def unsettled_steps(self, run_id: str) -> list[StepRow]:
        """The run's step rows that exist but have not settled (retrying, waiting, in flight)."""
        rows = self._db.execute(
            f"SELECT {STEP_COLUMNS} FROM steps WHERE run_id = ? AND settled_seq IS NULL",
            (run_id,),
        ).fetchall()
        return [step_row(row) for row in rows]
