"""The journal store: every SQL statement of the journal lives in this package, behind named
methods. Rows leave it only as frozen dataclasses.

Writes go through `JournalStore.transact(work, fence)`: `work` is a synchronous function of a
`JournalTransaction`, run on the connection's thread inside `BEGIN IMMEDIATE`, so a transaction
costs one thread hop however many statements it holds. Work queued while a commit is in flight
is committed with the next one (group commit), each piece in its own savepoint so that one
failing piece rolls back alone; every caller is answered only after the commit that holds its
writes (write-ahead). Reads are single statements outside any write transaction.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from qjsflow.bridge import dumps_text, loads
from qjsflow.bridge.digest import bundle_digest
from qjsflow.bundles.manifest import Capabilities, WorkflowSettings, capabilities_from_json
from qjsflow.runner.errors import StoredCodeDamaged
from qjsflow.runner.store.lease_types import LeaseMode
from qjsflow.runner.store.records import (
    ENDED_SQL,
    WAKING_TIMER_SQL,
    EventRecord,
    LogRecord,
    RunRecord,
    StepRow,
    ToolCallRecord,
    WorkerRecord,
)
from qjsflow.runner.store.tx import (
    RUN_COLUMNS,
    JournalTransaction,
    Lease,
    lease_now,
    run_record,
)

if TYPE_CHECKING:  # only publishing builds one: reading the journal loads no esbuild driver
    from qjsflow.bundles import Snapshot
from qjsflow.runner.store.committer import DEFAULT_RETRY_S, BatchJob, JournalCore, run_batch

__all__ = [
    "DEFAULT_RETRY_S",
    "BatchJob",
    "BundleRecord",
    "JournalStore",
    "SnapshotRecord",
    "WorkflowRecord",
    "run_batch",
    "snapshot_records",
]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class WorkflowRecord:
    workflow: str
    entry_path: str
    export: str = "default"  # the export of the entry file that is this workflow
    binding: str | None = None  # its name in env (`env.MY_WORKFLOW`), from the wrangler file
    flow: str | None = None  # its flow control as declared (bundles/flow.py), JSON


@dataclass(frozen=True, slots=True)
class SnapshotRecord:
    scope: str
    snapshot_id: str
    created_at: float
    workflows: tuple[WorkflowRecord, ...]
    capabilities: Capabilities | None = None  # what its manifest declares; None: nothing
    vars: Mapping[str, Any] | None = None  # its project's wrangler vars: its runs' env defaults


@dataclass(frozen=True, slots=True)
class BundleRecord:
    scope: str
    snapshot_id: str
    workflow: str
    entry_path: str
    code: str
    export: str = "default"
    source_map: str = ""
    capabilities: Capabilities | None = None  # its snapshot's (see SnapshotRecord)
    digest: str = ""  # `bundle_digest(code)`, as stored and checked


class JournalStore(JournalCore):
    """The journal database of one runner process: its named reads and writes."""

    # -- leases --------------------------------------------------------------------------------

    async def acquire_lease(
        self, run_id: str, worker_id: str, now: int, ttl_ms: int
    ) -> Lease | None:
        """Take the run for one driver, or None while another live driver holds it."""
        return await self.transact(
            lambda tx: tx.acquire_lease(run_id, worker_id, now, ttl_ms), durable=False
        )

    async def force_lease(self, run_id: str, worker_id: str, now: int, ttl_ms: int) -> Lease | None:
        """Take a live run from whatever driver holds it: that driver can write nothing more
        (its epoch is stale). For operators, and for tests of fencing."""
        return await self.transact(
            lambda tx: tx.acquire_lease(run_id, worker_id, now, ttl_ms, mode=LeaseMode.FORCED),
            durable=False,
        )

    async def renew_lease(self, lease: Lease, now: int, ttl_ms: int) -> bool:
        return await self.transact(lambda tx: tx.renew_lease(lease, now, ttl_ms), durable=False)

    async def release_lease(self, lease: Lease) -> None:
        await self.transact(lambda tx: tx.release_lease(lease), durable=False)

    async def claimable_runs(self, now: int, limit: int) -> list[str]:
        """Runs a worker should drive now: a timer is due, a cancel is pending, or the run is
        `running` with no live lease (its driver died, or it was started without a drive).

        Fair across scopes: each scope's due runs are numbered oldest first, and the runs are
        taken by that turn (every scope's first, then every scope's second, …), so a scope
        with thousands due delays another's by at most one run per turn."""
        return [run_id for run_id, _, _ in await self.claimable_turns(now, limit)]

    async def claimable_turns(self, now: int, limit: int) -> list[tuple[str, str, int]]:
        """(run key, scope, turn) of claimable runs, by turn then age (`claimable_runs`)."""
        clock, at = lease_now(self._backend.dialect.lease_clock, now)
        rows = await self._all(claim_query(clock), (now, *at, now, limit, limit))
        return [(str(row[0]), str(row[1]), int(row[2])) for row in rows]

    async def driving_by_scope(self, now: int) -> dict[str, int]:
        """Runs each scope has a live lease on now (being driven somewhere)."""
        clock, at = lease_now(self._backend.dialect.lease_clock, now)
        rows = await self._all(
            "SELECT scope, count(*) FROM runs WHERE worker_id IS NOT NULL"
            f" AND lease_expires_at > {clock} GROUP BY scope",
            at,
        )
        return {str(row[0]): int(row[1]) for row in rows}

    # -- the local Cloudflare bindings (runner/tenancy/cloudflare_bindings.py) ------------------

    async def kv_get(self, scope: str, namespace: str, key: str) -> str | None:
        rows = await self._all(
            "SELECT value FROM kv_entries WHERE scope = ? AND namespace = ? AND key = ?",
            (scope, namespace, key),
        )
        return str(rows[0][0]) if rows else None

    async def kv_list(self, scope: str, namespace: str, prefix: str, limit: int) -> list[str]:
        rows = await self._all(
            "SELECT key FROM kv_entries WHERE scope = ? AND namespace = ?"
            " AND substr(key, 1, ?) = ? ORDER BY key LIMIT ?",
            (scope, namespace, len(prefix), prefix, limit),
        )
        return [str(row[0]) for row in rows]

    async def kv_put(
        self, scope: str, namespace: str, key: str, value: str | None, now: int
    ) -> None:
        """Set a key (None deletes it)."""

        def write(tx: JournalTransaction) -> None:
            tx.kv_put(scope, namespace, key, value, now)

        await self.transact(write)

    async def queue_send(self, scope: str, queue: str, bodies: list[str], now: int) -> None:
        await self.transact(lambda tx: tx.queue_send(scope, queue, bodies, now))

    async def queue_messages(self, scope: str, queue: str, limit: int = 1000) -> list[str]:
        rows = await self._all(
            "SELECT body FROM queue_messages WHERE scope = ? AND queue = ? ORDER BY seq LIMIT ?",
            (scope, queue, limit),
        )
        return [str(row[0]) for row in rows]

    async def blocked_runs(self, now: int, limit: int) -> list[tuple[str, str, int | None]]:
        """Blocked runs no live driver holds, with what each is missing (a tool address, or
        "secret NAME") and the configuration version it started with."""
        clock, at = lease_now(self._backend.dialect.lease_clock, now)
        rows = await self._all(
            "SELECT run_id, waiting_for, config_version FROM runs WHERE status = 'blocked'"
            f" AND (worker_id IS NULL OR lease_expires_at IS NULL OR lease_expires_at <= {clock})"
            " ORDER BY updated_at LIMIT ?",
            (*at, limit),
        )
        return [(str(row[0]), str(row[1]), None if row[2] is None else int(row[2])) for row in rows]

    async def next_due(self) -> int | None:
        """The earliest timer of any unfinished run."""
        rows = await self._all(
            "SELECT min(t.due_at) FROM timers t JOIN runs r USING (run_id)"
            f" WHERE r.status NOT IN {ENDED_SQL} AND r.status <> 'paused' AND {WAKING_TIMER_SQL}"
        )
        return None if rows[0][0] is None else int(rows[0][0])

    # -- snapshots -----------------------------------------------------------------------------

    async def find_snapshot(self, scope: str, snapshot_id: str) -> SnapshotRecord | None:
        found = await self.list_snapshots(scope, snapshot_id=snapshot_id)
        return found[0] if found else None

    async def list_snapshots(
        self,
        scope: str | None,
        *,
        snapshot_id: str | None = None,
        id_prefix: str | None = None,
        limit: int = 1000,
    ) -> list[SnapshotRecord]:
        """Snapshots, newest first, each with its workflows: of one scope (None: all), with
        one id or ids starting with a prefix of hex digits."""
        rows = await self.read(
            lambda tx: tx.snapshot_rows(
                scope, snapshot_id=snapshot_id, id_prefix=id_prefix, limit=limit
            )
        )
        return snapshot_records(rows)

    async def insert_snapshot(self, scope: str, snapshot: Snapshot, created_at: float) -> bool:
        """Store a snapshot and its bundles; False (and nothing written) if it already exists."""
        manifest = dumps_text(
            [
                [file.path, hashlib.sha256(file.content).hexdigest(), len(file.content)]
                for file in snapshot.tree.files
            ]
        )
        bundles = [
            (
                b.workflow,
                b.entry_path,
                b.code,
                bundle_digest(b.code),
                b.export,
                b.source_map,
                b.binding,
                _flow_text(snapshot.settings.get(b.workflow)),
            )
            for b in snapshot.bundles
        ]
        declared = None if snapshot.capabilities is None else snapshot.capabilities.to_json()
        vars_ = None if snapshot.vars is None else dumps_text(snapshot.vars)
        facts = (len(snapshot.tree.files), snapshot.tree.total_bytes, manifest, declared, vars_)
        snapshot_id = snapshot.snapshot_id
        return await self.transact(
            lambda tx: tx.insert_snapshot(scope, snapshot_id, created_at, facts, bundles)
        )

    async def load_bundle(self, scope: str, snapshot_id: str, workflow: str) -> BundleRecord | None:
        """The bundle, verified against the checksum stored when it was published: code
        changed at rest raises `StoredCodeDamaged` and never reaches an executor."""
        rows = await self._all(
            "SELECT b.entry_path, b.code, b.code_sha256, b.export_name, b.source_map,"
            " s.capabilities FROM bundles b JOIN snapshots s USING (scope, snapshot_id)"
            " WHERE b.scope = ? AND b.snapshot_id = ? AND b.workflow = ?",
            (scope, snapshot_id, workflow),
        )
        if not rows:
            return None
        entry_path, code, checksum = str(rows[0][0]), str(rows[0][1]), str(rows[0][2])
        if bundle_digest(code) != checksum:
            raise StoredCodeDamaged(scope, snapshot_id, workflow)
        return BundleRecord(
            scope,
            snapshot_id,
            workflow,
            entry_path,
            code,
            str(rows[0][3]),
            str(rows[0][4]),
            _capabilities(rows[0][5]),
            checksum,
        )

    # -- runs: reads outside any write transaction --------------------------------------------

    async def get_run(self, run_id: str) -> RunRecord | None:
        return await self.read(lambda tx: tx.get_run(run_id))

    async def scopes_of_run(self, run_id: str) -> list[str]:
        """Scopes holding a run with this id (an operator's look-up across scopes): one
        primary-key look-up per scope that has published, never a scan of the runs."""
        rows = await self._all(
            "SELECT r.scope FROM (SELECT DISTINCT scope FROM snapshots) s"
            " JOIN runs r ON r.run_id = s.scope || '/' || ? ORDER BY r.scope",
            (run_id,),
        )
        return [str(row[0]) for row in rows]

    async def list_runs(
        self,
        scope: str | None,
        workflow: str | None,
        status: str | None,
        limit: int,
        *,
        offset: int = 0,
        newest_first: bool = False,
        since_ms: int | None = None,
        after: tuple[int, str] | None = None,
        tags: Mapping[str, str] | None = None,
        until_ms: int | None = None,
    ) -> list[RunRecord]:
        """A page of runs by when they were created; `after` is the (created_at, key) of
        the last run of the page before (a cursor: stable while runs are added); `tags`:
        runs with each of these (found through the tags' index)."""
        clauses: list[str] = []
        args: list[object] = []
        for clause, value in (("scope = ?", scope), ("workflow = ?", workflow),
                              ("status = ?", status), ("created_at >= ?", since_ms),
                              ("created_at <= ?", until_ms)):  # fmt: skip
            if value is not None:
                clauses.append(clause)
                args.append(value)
        if after is not None:
            clauses.append(f"(created_at, run_id) {'<' if newest_first else '>'} (?, ?)")
            args += after
        for key, value in (tags or {}).items():
            clauses.append("run_id IN (SELECT run_id FROM run_tags WHERE key = ? AND value = ?)")
            args += [key, value]
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        order = "created_at DESC, run_id DESC" if newest_first else "created_at, run_id"
        rows = await self._all(
            f"SELECT {RUN_COLUMNS} FROM runs{where} ORDER BY {order} LIMIT ? OFFSET ?",
            (*args, limit, offset),
        )
        return [run_record(row) for row in rows]

    async def runs_on_snapshot(
        self, scope: str, workflow: str, snapshot_id: str, limit: int
    ) -> list[RunRecord]:
        """Runs of a workflow pinned to a snapshot that have not ended, oldest first."""
        rows = await self._all(
            f"SELECT {RUN_COLUMNS} FROM runs WHERE scope = ? AND workflow = ?"
            f" AND snapshot_id = ? AND status NOT IN {ENDED_SQL} ORDER BY created_at, run_id"
            " LIMIT ?",
            (scope, workflow, snapshot_id, limit),
        )
        return [run_record(row) for row in rows]

    async def ended_runs(
        self, before: int, statuses: Iterable[str], limit: int, scope: str | None = None
    ) -> list[tuple[str, str]]:
        return await self.read(lambda tx: tx.ended_runs(before, statuses, limit, scope))

    async def count_ended_runs(
        self, before: int, statuses: Iterable[str], scope: str | None = None
    ) -> int:
        return await self.read(lambda tx: tx.count_ended_runs(before, statuses, scope))

    async def count_unused_snapshots(self, before: float, scope: str | None = None) -> int:
        return len(await self.read(lambda tx: tx.unused_snapshots(before, scope)))

    async def count_runs_by_status(self, scope: str | None) -> dict[str, int]:
        """How many runs of a scope (None: every scope) have each status."""
        where, args = ("WHERE scope = ?", (scope,)) if scope is not None else ("", ())
        rows = await self._all(f"SELECT status, count(*) FROM runs {where} GROUP BY status", args)
        return {str(row[0]): int(row[1]) for row in rows}

    async def count_runs_by_scope(self) -> dict[tuple[str, str], int]:
        """How many runs each scope has in each status."""
        rows = await self._all("SELECT scope, status, count(*) FROM runs GROUP BY scope, status")
        return {(str(row[0]), str(row[1])): int(row[2]) for row in rows}

    async def usage_by_scope(self, windows: dict[str, int]) -> dict[str, dict[str, float]]:
        """What each scope used of each measure in the window given for it."""
        rows = await self._all("SELECT scope, measure, window_start, amount FROM scope_usage")
        found: dict[str, dict[str, float]] = {}
        for scope, measure, start, amount in rows:
            if windows.get(str(measure)) == int(start):
                found.setdefault(str(scope), {})[str(measure)] = float(amount)
        return found

    async def list_steps(self, run_id: str) -> list[StepRow]:
        return await self.read(lambda tx: tx.list_steps(run_id))

    async def timer_due(self, run_id: str, by: int) -> bool:
        """Whether a timer of the run is due by `by` (ms): a worker drives it then."""
        rows = await self._all(
            "SELECT 1 FROM timers WHERE run_id = ? AND due_at <= ? LIMIT 1", (run_id, by)
        )
        return bool(rows)

    async def tags_of(self, run_id: str) -> dict[str, str]:
        return await self.read(lambda tx: tx.tags_of(run_id))

    async def list_events(self, run_id: str) -> list[EventRecord]:
        rows = await self._all(
            "SELECT seq, run_id, type, at, data FROM events WHERE run_id = ? ORDER BY seq",
            (run_id,),
        )
        return [EventRecord(*row) for row in rows]

    async def list_tool_calls(self, run_id: str) -> list[ToolCallRecord]:
        rows = await self._all(
            "SELECT seq, run_id, step_key, attempt, address, args, result, error, started_at,"
            " duration_ms FROM tool_calls WHERE run_id = ? ORDER BY seq",
            (run_id,),
        )
        return [ToolCallRecord(*row) for row in rows]

    async def list_logs(self, run_id: str) -> list[LogRecord]:
        rows = await self._all(
            "SELECT run_id, count, level, text, at FROM logs WHERE run_id = ? ORDER BY count",
            (run_id,),
        )
        return [LogRecord(*row) for row in rows]

    async def scope_config(
        self, scope: str, version: int | None = None
    ) -> tuple[int, str, int] | None:
        """A version of the scope's configuration (`JournalTransaction.scope_config`)."""
        return await self.read(partial(_scope_config, scope=scope, version=version))

    async def latest_scope_configs(self) -> dict[str, int]:
        """Each configured scope's latest configuration version."""
        rows = await self._all("SELECT scope, max(version) FROM scope_configs GROUP BY scope")
        return {str(row[0]): int(row[1]) for row in rows}

    async def scope_config_history(self, scope: str) -> list[tuple[int, str, int]]:
        """Every version of the scope's configuration, the newest first."""
        rows = await self._all(
            "SELECT version, config, created_at FROM scope_configs WHERE scope = ?"
            " ORDER BY version DESC",
            (scope,),
        )
        return [(int(row[0]), str(row[1]), int(row[2])) for row in rows]

    async def sealed_secrets(self, scope: str) -> dict[str, tuple[str, str, str, int]]:
        """The scope's sealed secrets by name: (key id, nonce, ciphertext, when set)."""
        rows = await self._all(
            "SELECT name, key_id, nonce, ciphertext, updated_at FROM scope_secrets"
            " WHERE scope = ? ORDER BY name",
            (scope,),
        )
        return {str(r[0]): (str(r[1]), str(r[2]), str(r[3]), int(r[4])) for r in rows}

    async def list_workers(self) -> list[WorkerRecord]:
        """Every worker registered, the most recently heard of first."""
        rows = await self._all(
            "SELECT worker_id, host, pid, version, tools, scopes, secret_providers, started_at,"
            " heartbeat_at, stopped_at FROM workers ORDER BY heartbeat_at DESC, worker_id"
        )
        return [_worker_record(row) for row in rows]


def _scope_config(
    tx: JournalTransaction, *, scope: str, version: int | None
) -> tuple[int, str, int] | None:
    return tx.scope_config(scope, version)


def _worker_record(row: Any) -> WorkerRecord:
    lists = [tuple(str(item) for item in loads(row[n])) for n in (4, 5, 6)]
    return WorkerRecord(
        worker_id=row[0], host=row[1], pid=int(row[2]), version=row[3], tools=lists[0],
        scopes=lists[1], secret_providers=lists[2], started_at=int(row[7]),
        heartbeat_at=int(row[8]), stopped_at=None if row[9] is None else int(row[9]),
    )  # fmt: skip


def claim_query(clock: str) -> str:
    """`claimable_turns`'s statement; its parameters: now, the lease clock's, now, the turn
    limit, the row limit."""
    return (
        "SELECT run_id, scope, turn FROM (SELECT run_id, scope, updated_at,"
        " priority, row_number() OVER (PARTITION BY scope"
        "  ORDER BY priority DESC, updated_at, run_id) AS turn"
        " FROM runs r"
        # Only runs that can be claimable are looked at, each found through an index (a due
        # timer, `running`, a cancel asked): not every run that has not ended.
        " WHERE run_id IN (SELECT t.run_id FROM timers t WHERE t.due_at <= ?"
        "  UNION SELECT run_id FROM runs WHERE status = 'running'"
        "  UNION SELECT run_id FROM runs WHERE cancel_requested = 1)"
        f" AND status NOT IN {ENDED_SQL}"
        f" AND (worker_id IS NULL OR lease_expires_at IS NULL OR lease_expires_at <= {clock})"
        " AND (cancel_requested = 1 OR status <> 'paused' AND (status = 'running'"
        "  OR EXISTS (SELECT 1 FROM timers t WHERE t.run_id = r.run_id AND t.due_at <= ?"
        f"   AND {WAKING_TIMER_SQL})))"
        ") due WHERE turn <= ? ORDER BY turn, priority DESC, updated_at, run_id LIMIT ?"
    )


def snapshot_records(rows: Iterable[Any]) -> list[SnapshotRecord]:
    """Snapshots with their workflows, from `JournalTransaction.snapshot_rows`."""
    grouped: dict[tuple[str, str], list[Any]] = {}
    for row in rows:
        grouped.setdefault((str(row[0]), str(row[1])), []).append(row)
    return [
        SnapshotRecord(
            scope_id, snapshot, float(group[0][2]),
            tuple(WorkflowRecord(str(r[3]), str(r[4]), str(r[5]), r[7], r[9]) for r in group),
            _capabilities(group[0][6]), None if group[0][8] is None else loads(str(group[0][8])),
        )
        for (scope_id, snapshot), group in grouped.items()
    ]  # fmt: skip


def _capabilities(stored: object) -> Capabilities | None:
    """A snapshot's capabilities as stored (checked when it was published)."""
    if stored is None:
        return None
    return capabilities_from_json(loads(str(stored)), "the stored capabilities")


def _flow_text(settings: WorkflowSettings | None) -> str | None:
    return None if settings is None or settings.flow is None else settings.flow.to_json()
