"""`JournalTransaction`: named statements that run inside one `BEGIN IMMEDIATE` transaction.

Its statements are in layers, each a class over the one before: runs and usage
(runner/store/run_rows.py), leases (runner/store/leases.py), steps (runner/store/step_rows.py),
flow control (runner/store/flow_rows.py), replicated scope databases
(runner/store/scope_change_rows.py), then here events, timers, inbox, tool calls, logs,
snapshots and retention.

The run lifecycle (runner/engine/host.py, runner/engine/drive/, runner/runner.py)
decides; this module only reads and writes. Its methods are synchronous: a whole transaction
runs as one job on the journal connection's thread (see `JournalStore.transact`), so a
transaction costs one thread hop however many statements it holds. Every method assumes the
caller holds the transaction (hence no `_txn` suffix on a class whose every method is one).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from qjsflow.bridge import dumps_text
from qjsflow.runner.store.lease_types import Lease, LeaseLost, lease_now
from qjsflow.runner.store.records import (
    InboxRecord,
    WorkerRecord,
)
from qjsflow.runner.store.run_rows import (
    RUN_COLUMNS,
    RUN_TABLES,
    UsageCharge,
    ended_where,
    run_record,
    write_batch_usage,
)
from qjsflow.runner.store.scope_change_rows import ScopeChangeStatements
from qjsflow.runner.store.step_rows import STEP_COLUMNS, SettledStep

__all__ = [
    "RUN_COLUMNS",
    "RUN_TABLES",
    "SCHEDULE_COLUMNS",
    "STEP_COLUMNS",
    "JournalTransaction",
    "Lease",
    "LeaseLost",
    "SettledStep",
    "UsageCharge",
    "lease_now",
    "run_record",
    "write_batch_usage",
]


# A schedule's row, as `schedule_rows` and `due_schedules` read it.
SCHEDULE_COLUMNS = (
    "scope, name, workflow, spec, next_at, last_run, buffered_at, fired, skipped, paused,"
    " created_at, updated_at"
)


class JournalTransaction(ScopeChangeStatements):
    _savepoints = 0  # parts made in this transaction (`savepoint`)

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[None]:
        """A part of the transaction undone alone when it raises (an item of a batch)."""
        self._savepoints += 1
        name = f"part_{self._savepoints}"
        self._db.execute(f"SAVEPOINT {name}")
        try:
            yield
            self.sync()
        except BaseException:
            self._db.execute(f"ROLLBACK TO {name}")
            self._db.execute(f"RELEASE {name}")
            raise
        self._db.execute(f"RELEASE {name}")

    def insert_snapshot(
        self,
        scope: str,
        snapshot_id: str,
        created_at: float,
        # files, bytes, file list, capabilities, the project's vars (JSON)
        facts: tuple[int, int, str, str | None, str | None],
        # workflow, entry, code, digest, export, source map, env binding, flow control
        bundles: list[tuple[str, str, str, str, str, str, str | None, str | None]],
    ) -> bool:
        """First writer wins: False (and no bundle written) when the snapshot exists."""
        row = self._one(
            "INSERT INTO snapshots"
            " (scope, snapshot_id, created_at, file_count, total_bytes, manifest, capabilities,"
            " vars) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING RETURNING 1",
            (scope, snapshot_id, created_at, *facts),
        )
        if row is None:
            return False
        self._db.executemany(
            "INSERT INTO bundles"
            " (scope, snapshot_id, workflow, entry_path, code, code_sha256, export_name,"
            " source_map, binding, flow) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(scope, snapshot_id, *bundle) for bundle in bundles],
        )
        return True

    def fence_out(self, run_id: str) -> None:
        """Void the run's lease: a driver holding it can write nothing more (its epoch is
        stale); its heartbeat notices and stops its executor."""
        self.runs_written = True
        self._db.execute(
            "UPDATE runs SET worker_id = NULL, lease_expires_at = NULL, epoch = epoch + 1"
            " WHERE run_id = ?",
            (run_id,),
        )
        self._holders[run_id] = None

    def ended_runs(
        self, before: int, statuses: Iterable[str], limit: int, scope: str | None = None
    ) -> list[tuple[str, str]]:
        """(run key, scope) of runs that ended (in one of `statuses`) before `before`, the
        oldest first."""
        where, args = ended_where(before, statuses, scope)
        rows = self._db.execute(
            f"SELECT run_id, scope FROM runs WHERE {where} ORDER BY updated_at LIMIT ?",
            (*args, limit),
        ).fetchall()
        return [(str(row[0]), str(row[1])) for row in rows]

    def count_ended_runs(
        self, before: int, statuses: Iterable[str], scope: str | None = None
    ) -> int:
        where, args = ended_where(before, statuses, scope)
        return int(self._one(f"SELECT count(*) FROM runs WHERE {where}", args)[0])

    def delete_ended_runs(
        self, run_ids: list[str], before: int, statuses: Iterable[str], scope: str | None = None
    ) -> list[tuple[str, str]]:
        """Of `run_ids`, delete those that still ended before `before` (chosen earlier, a run
        may have been restarted since); (run key, scope) of the runs deleted."""
        if not run_ids:
            return []
        where, args = ended_where(before, statuses, scope)
        marks = ", ".join("?" for _ in run_ids)
        rows = self._db.execute(
            f"SELECT run_id, scope FROM runs WHERE run_id IN ({marks}) AND {where}",
            (*run_ids, *args),
        ).fetchall()
        still = [(str(row[0]), str(row[1])) for row in rows]
        if still:
            self.delete_runs([run_id for run_id, _ in still])
        return still

    def delete_runs(self, run_ids: list[str]) -> None:
        """Runs and everything recorded of them."""
        self._free_journal_bytes(run_ids)
        self.runs_written = True
        for run_id in run_ids:
            self._runs.pop(run_id, None)
            self._holders.pop(run_id, None)
        marks = ", ".join("?" for _ in run_ids)
        for table in (*RUN_TABLES, "runs"):
            self._db.execute(f"DELETE FROM {table} WHERE run_id IN ({marks})", run_ids)

    def snapshot_rows(
        self,
        scope: str | None,
        *,
        snapshot_id: str | None = None,
        id_prefix: str | None = None,
        limit: int = 1000,
    ) -> list[Any]:
        """Snapshots, newest first, a row for each of their workflows: of one scope (None:
        all), with one id or ids starting with a prefix of hex digits (`snapshot_records`
        makes records of them)."""
        where: list[str] = []
        args: list[object] = []
        for clause, value in (
            ("s.scope = ?", scope),
            ("s.snapshot_id = ?", snapshot_id),
            ("substr(s.snapshot_id, 1, ?) = ?", id_prefix),
        ):
            if value is not None:
                where.append(clause)
                args += [len(value), value] if clause.startswith("substr") else [value]
        rows: list[Any] = self._db.execute(
            "SELECT s.scope, s.snapshot_id, s.created_at, b.workflow, b.entry_path, b.export_name,"
            " s.capabilities, b.binding, s.vars, b.flow"
            " FROM (SELECT * FROM snapshots s"
            + (" WHERE " + " AND ".join(where) if where else "")
            + " ORDER BY created_at DESC, snapshot_id LIMIT ?) s"
            " JOIN bundles b USING (scope, snapshot_id)"
            " ORDER BY s.created_at DESC, s.scope, s.snapshot_id, b.workflow",
            (*args, limit),
        ).fetchall()
        return rows

    def unused_snapshots(self, before: float, scope: str | None = None) -> list[tuple[str, str]]:
        """(scope, id) of snapshots published before `before` (seconds) that no run is
        pinned to."""
        in_scope = "" if scope is None else " AND s.scope = ?"
        rows = self._db.execute(
            "SELECT s.scope, s.snapshot_id FROM snapshots s WHERE s.created_at < ?"
            f"{in_scope} AND NOT EXISTS (SELECT 1 FROM runs r"
            " WHERE r.scope = s.scope AND r.snapshot_id = s.snapshot_id)",
            (before, *(() if scope is None else (scope,))),
        ).fetchall()
        return [(str(row[0]), str(row[1])) for row in rows]

    def delete_unused_snapshots(self, before: float, scope: str | None = None) -> int:
        unused = self.unused_snapshots(before, scope)
        for table in ("bundles", "snapshots"):
            self._db.executemany(f"DELETE FROM {table} WHERE scope = ? AND snapshot_id = ?", unused)
        return len(unused)

    def insert_scope_config(self, scope: str, text: str, now: int) -> tuple[int, bool]:
        """A new version of the scope's configuration (its canonical text), and True; or the
        latest version and False when that already holds this text (applying twice is one)."""
        latest = self.scope_config(scope)
        if latest is not None and latest[1] == text:
            return latest[0], False
        version = 1 if latest is None else latest[0] + 1
        self._db.execute(
            "INSERT INTO scope_configs (scope, version, config, created_at) VALUES (?, ?, ?, ?)",
            (scope, version, text, now),
        )
        return version, True

    def scope_config(self, scope: str, version: int | None = None) -> tuple[int, str, int] | None:
        """A version of the scope's configuration (the latest without `version`): (version,
        its canonical text, when it was applied), or None."""
        if version is None:
            return self.send_latest_scope_config(scope)()
        row = self._one(
            "SELECT version, config, created_at FROM scope_configs WHERE scope = ? AND version = ?",
            (scope, version),
        )
        return None if row is None else (int(row[0]), str(row[1]), int(row[2]))

    def send_latest_scope_config(self, scope: str) -> Callable[[], tuple[int, str, int] | None]:
        """`scope_config(scope)`'s read sent now, answered when called: on a pipelined journal
        a read sent before that goes in the same round trip (a start's snapshot)."""
        sent = self._db.execute(
            "SELECT version, config, created_at FROM scope_configs WHERE scope = ?"
            " ORDER BY version DESC LIMIT 1",
            (scope,),
        )

        def answer() -> tuple[int, str, int] | None:
            row = sent.fetchone()
            return None if row is None else (int(row[0]), str(row[1]), int(row[2]))

        return answer

    def assert_start_reads(
        self, scope: str, version: int | None, *, latest: str | None, prefix: str | None
    ) -> None:
        """A start's reads presumed from an earlier start (runner/operations/start_reads.py):
        a statement, not waited for, that fails the transaction (dividing by zero) unless the
        scope's latest configuration version is still `version` (None: it has none) and —
        snapshots are never changed or deleted — the snapshot it named is still the one
        found: `latest` the scope's newest, `prefix` the only one that starts so (neither:
        it was named by its full id)."""
        conditions = ["(SELECT max(version) FROM scope_configs WHERE scope = ?)"
                      " IS NOT DISTINCT FROM CAST(? AS BIGINT)"]  # fmt: skip
        args: list[object] = [scope, version]
        if latest is not None:
            conditions.append("(SELECT snapshot_id FROM snapshots WHERE scope = ?"
                              " ORDER BY created_at DESC, snapshot_id LIMIT 1) = ?")  # fmt: skip
            args += [scope, latest]
        if prefix is not None:
            conditions.append("(SELECT count(*) FROM snapshots WHERE scope = ?"
                              " AND substr(snapshot_id, 1, ?) = ?) = 1")  # fmt: skip
            args += [scope, len(prefix), prefix]
        self._db.execute(
            f"SELECT 1 / (CASE WHEN {' AND '.join(conditions)} THEN 1 ELSE 0 END)", args
        )

    def put_sealed_secret(
        self, scope: str, name: str, sealed: tuple[str, str, str], now: int
    ) -> None:
        """A secret's value sealed under its scope's key: (key id, nonce, ciphertext)."""
        self._db.execute(
            "INSERT INTO scope_secrets (scope, name, key_id, nonce, ciphertext, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (scope, name) DO UPDATE SET"
            " key_id = excluded.key_id, nonce = excluded.nonce,"
            " ciphertext = excluded.ciphertext, updated_at = excluded.updated_at",
            (scope, name, *sealed, now),
        )

    def delete_sealed_secret(self, scope: str, name: str) -> bool:
        cursor = self._db.execute(
            "DELETE FROM scope_secrets WHERE scope = ? AND name = ?", (scope, name)
        )
        return bool(cursor.rowcount)

    def register_worker(self, worker: WorkerRecord) -> None:
        """The worker as it starts (again, under the same id: its row is replaced)."""
        values = (
            worker.host, worker.pid, worker.version, dumps_text(list(worker.tools)),
            dumps_text(list(worker.scopes)), dumps_text(list(worker.secret_providers)),
            worker.started_at, worker.heartbeat_at,
        )  # fmt: skip
        self._db.execute(
            "INSERT INTO workers (worker_id, host, pid, version, tools, scopes, secret_providers,"
            " started_at, heartbeat_at, stopped_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)"
            " ON CONFLICT (worker_id) DO UPDATE SET host = excluded.host, pid = excluded.pid,"
            " version = excluded.version, tools = excluded.tools, scopes = excluded.scopes,"
            " secret_providers = excluded.secret_providers, started_at = excluded.started_at,"
            " heartbeat_at = excluded.heartbeat_at, stopped_at = NULL",
            (worker.worker_id, *values),
        )

    def worker_beat(self, worker_id: str, now: int, *, stopped: bool = False) -> None:
        """A worker's heartbeat; with `stopped`, its last (it stopped cleanly)."""
        self._db.execute(
            "UPDATE workers SET heartbeat_at = ?, stopped_at = ? WHERE worker_id = ?",
            (now, now if stopped else None, worker_id),
        )

    def forget_workers(self, before: int) -> int:
        """Drop workers not heard of since `before` (kept a while to show them gone)."""
        cursor = self._db.execute("DELETE FROM workers WHERE heartbeat_at < ?", (before,))
        return int(cursor.rowcount or 0)

    def kv_put(self, scope: str, namespace: str, key: str, value: str | None, now: int) -> None:
        if value is None:
            self._db.execute(
                "DELETE FROM kv_entries WHERE scope = ? AND namespace = ? AND key = ?",
                (scope, namespace, key),
            )
            return
        self._db.execute(
            "INSERT INTO kv_entries (scope, namespace, key, value, updated_at)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT (scope, namespace, key)"
            " DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
            (scope, namespace, key, value, now),
        )

    def queue_send(self, scope: str, queue: str, bodies: list[str], now: int) -> None:
        self._db.executemany(
            "INSERT INTO queue_messages (scope, queue, body, sent_at) VALUES (?, ?, ?, ?)",
            [(scope, queue, body, now) for body in bodies],
        )

    # -- events, timers, inbox ---------------------------------------------------------------

    def set_timer(self, run_id: str, step_key: str, kind: str, due_at: int) -> None:
        self._db.execute(
            "INSERT INTO timers (run_id, step_key, kind, due_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (run_id, step_key) DO UPDATE SET kind = excluded.kind,"
            " due_at = excluded.due_at",
            (run_id, step_key, kind, due_at),
        )
        if kind == "signal":  # due now: an event came, a rollback was asked
            self.wake_workers()

    def delete_timer(self, run_id: str, step_key: str) -> None:
        self._db.execute("DELETE FROM timers WHERE run_id = ? AND step_key = ?", (run_id, step_key))

    def delete_timers(self, run_id: str, keys: tuple[str, ...] | None = None) -> None:
        """The run's timers: all of them, or those of the given keys."""
        if keys is not None:
            marks = ", ".join("?" for _ in keys)
            self._db.execute(
                f"DELETE FROM timers WHERE run_id = ? AND step_key IN ({marks})", (run_id, *keys)
            )
            return
        self._db.execute("DELETE FROM timers WHERE run_id = ?", (run_id,))

    def next_timer(self, run_id: str) -> int | None:
        row = self._one("SELECT min(due_at) FROM timers WHERE run_id = ?", (run_id,))
        return None if row is None or row[0] is None else int(row[0])

    def insert_inbox(
        self, run_id: str, event_type: str, payload: str, at: int, event_id: str | None = None
    ) -> int | None:
        """The new inbox row's seq; None when an event with this `event_id` was delivered
        already (a caller's retry), and nothing is written."""
        row = self._one(
            "INSERT INTO inbox (run_id, type, payload, received_at, event_id)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT (run_id, event_id) WHERE event_id IS NOT NULL"
            " DO NOTHING RETURNING seq",
            (run_id, event_type, payload, at, event_id),
        )
        return None if row is None else int(row[0])

    def oldest_unconsumed(
        self, run_id: str, event_type: str, received_by: int
    ) -> InboxRecord | None:
        row = self._one(
            "SELECT seq, run_id, type, payload, received_at, consumed_by FROM inbox"
            " WHERE run_id = ? AND type = ? AND consumed_by IS NULL AND received_at <= ?"
            " ORDER BY seq LIMIT 1",
            (run_id, event_type, received_by),
        )
        return None if row is None else InboxRecord(*row)

    def waits_and_timers(
        self, run_id: str, event_types: list[str], signal_key: str
    ) -> tuple[bool, int | None, int | None]:
        """In one statement: whether an event of one of `event_types` waits unconsumed in the
        run's inbox, the run's next timer, and its next timer but the one keyed `signal_key`
        (what the next timer is once that one is set anew)."""
        marks = ", ".join("?" for _ in event_types)
        row = self._one(
            f"SELECT (SELECT 1 FROM inbox WHERE run_id = ? AND type IN ({marks})"
            " AND consumed_by IS NULL LIMIT 1), min(due_at),"
            " min(CASE WHEN step_key <> ? THEN due_at END) FROM timers WHERE run_id = ?",
            (run_id, *event_types, signal_key, run_id),
        )
        return (
            row[0] is not None,
            None if row[1] is None else int(row[1]),
            None if row[2] is None else int(row[2]),
        )

    def count_unconsumed(self, run_id: str) -> int:
        """Events delivered to the run that no wait has taken yet."""
        row = self._one(
            "SELECT count(*) FROM inbox WHERE run_id = ? AND consumed_by IS NULL", (run_id,)
        )
        return int(row[0])

    def consume(self, seq: int, step_key: str) -> None:
        self._db.execute("UPDATE inbox SET consumed_by = ? WHERE seq = ?", (step_key, seq))

    # -- logs ------------------------------------------------------------------------------

    def insert_log(
        self, run_id: str, source: str, level: str, text: str, at: int, *, max_lines: int
    ) -> bool:
        """Store a console line once (a line already stored from `source` is skipped), as the
        run's next line. A run keeps at most `max_lines`: the last one says the rest were
        dropped."""
        row = self._one("SELECT coalesce(max(count), 0) FROM logs WHERE run_id = ?", (run_id,))
        count = int(row[0]) + 1
        if count > max_lines:
            return False
        if count == max_lines:
            level, text = "warn", f"[console: the run's limit of {max_lines} lines was reached]"
        inserted = self._one(
            "INSERT INTO logs (run_id, count, level, text, at, source) VALUES (?, ?, ?, ?, ?, ?)"
            " ON CONFLICT DO NOTHING RETURNING 1",
            (run_id, count, level, text, at, source),
        )
        return inserted is not None

    # -- schedules (runner/operations/schedules.py) --------------------------------------------

    def put_schedule(
        self, scope: str, name: str, workflow: str, spec: str, *, next_at: int | None,
        paused: bool, now: int,
    ) -> None:  # fmt: skip
        """A schedule made, or its settings replaced (its counts and last run kept)."""
        self._db.execute(
            "INSERT INTO schedules (scope, name, workflow, spec, next_at, paused, created_at,"
            " updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (scope, name) DO UPDATE"
            " SET workflow = excluded.workflow, spec = excluded.spec, next_at = excluded.next_at,"
            " paused = excluded.paused, buffered_at = NULL, updated_at = excluded.updated_at",
            (scope, name, workflow, spec, next_at, int(paused), now, now),
        )

    def schedule_rows(self, scope: str | None, name: str | None = None) -> list[Any]:
        """Schedules as rows (`SCHEDULE_COLUMNS`): of one scope (None: all), or one of them."""
        where, args = [], []
        for clause, value in (("scope = ?", scope), ("name = ?", name)):
            if value is not None:
                where.append(clause)
                args.append(value)
        rows: list[Any] = self._db.execute(
            f"SELECT {SCHEDULE_COLUMNS} FROM schedules"
            + (" WHERE " + " AND ".join(where) if where else "")
            + " ORDER BY scope, name",
            args,
        ).fetchall()
        return rows

    def due_schedules(self, now: int, limit: int) -> list[Any]:
        """Schedules with a firing due, or one kept for when their last run ends (two indexed
        looks, not a scan)."""
        rows: list[Any] = self._db.execute(
            f"SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE paused = 0 AND next_at <= ?"
            f" UNION SELECT {SCHEDULE_COLUMNS} FROM schedules"
            " WHERE buffered_at IS NOT NULL AND paused = 0 LIMIT ?",
            (now, limit),
        ).fetchall()
        return rows

    def advance_schedule(
        self, scope: str, name: str, *, seen: tuple[int | None, int | None], next_at: int | None,
        last_run: str | None, buffered_at: int | None, fired: int, skipped: int, now: int,
    ) -> bool:  # fmt: skip
        """Move a schedule on, if it is still as it was `seen` (next_at, buffered_at): False
        when another worker moved it first."""
        row = self._one(
            "UPDATE schedules SET next_at = ?, last_run = coalesce(?, last_run), buffered_at = ?,"
            " fired = fired + ?, skipped = skipped + ?, updated_at = ? WHERE scope = ? AND"
            " name = ? AND coalesce(next_at, -1) = ? AND coalesce(buffered_at, -1) = ?"
            " RETURNING 1",
            (
                next_at,
                last_run,
                buffered_at,
                fired,
                skipped,
                now,
                scope,
                name,
                *(-1 if at is None else at for at in seen),
            ),
        )
        return row is not None

    def pause_schedule(self, scope: str, name: str, *, paused: bool, next_at: int | None,
                       now: int) -> bool:  # fmt: skip
        row = self._one(
            "UPDATE schedules SET paused = ?, next_at = ?, buffered_at = NULL, updated_at = ?"
            " WHERE scope = ? AND name = ? RETURNING 1",
            (int(paused), next_at, now, scope, name),
        )
        return row is not None

    def insert_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        self._db.executemany(
            "INSERT INTO run_tags (run_id, key, value) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
            [(run_id, key, value) for key, value in tags.items()],
        )

    def put_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        """Set tags of a run, replacing the values of keys it has."""
        self._db.executemany(
            "INSERT INTO run_tags (run_id, key, value) VALUES (?, ?, ?)"
            " ON CONFLICT (run_id, key) DO UPDATE SET value = excluded.value",
            [(run_id, key, value) for key, value in tags.items()],
        )

    def tags_of(self, run_id: str) -> dict[str, str]:
        rows = self._db.execute(
            "SELECT key, value FROM run_tags WHERE run_id = ? ORDER BY key", (run_id,)
        ).fetchall()
        return {str(key): str(value) for key, value in rows}

    def delete_schedule(self, scope: str, name: str) -> bool:
        row = self._one(
            "DELETE FROM schedules WHERE scope = ? AND name = ? RETURNING 1", (scope, name)
        )
        return row is not None
