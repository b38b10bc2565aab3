"""Driving a run: load its journal, replay it in an executor, record where it ended.

Within one process a run is driven by one coroutine at a time (a lock per run). A drive that
suspends with a timer already due (a retry with no delay, a sleep that has passed) is driven
again at once, so `start`, `resume` and `signal` return at the run's next real suspension.
"""

from __future__ import annotations

import asyncio

from bridge.types import Completed, DriveOutcome, DriveRequest, Failed, JournalEntry, Suspended
from runner.bindings import Bindings
from runner.config import RunnerConfig
from runner.errors import RunNotFound
from runner.host import DriveHost, failure_from_json
from runner.store import JournalStore, JournalTransaction, RunRecord
from runner.views import TERMINAL
from sandbox import ExecutorPool

__all__ = ["RunDriver"]

_MAX_DRIVES_PER_CALL = 10_000
_CRASH_RETRIES = 2


class RunDriver:
    def __init__(self, store: JournalStore, pool: ExecutorPool, config: RunnerConfig) -> None:
        self.store = store
        self.pool = pool
        self.config = config
        self._locks: dict[str, asyncio.Lock] = {}

    def now_ms(self) -> int:
        return int(self.config.clock() * 1000)

    async def drive(self, run_id: str, bindings: Bindings) -> RunRecord:
        """Drive `run_id` until it suspends on something not yet due, or ends."""
        lock = self._locks.setdefault(run_id, asyncio.Lock())
        async with lock:
            crashes = 0
            for _ in range(_MAX_DRIVES_PER_CALL):
                run = await self.store.get_run(run_id)
                if run is None:
                    raise RunNotFound(run_id)
                if run.status in TERMINAL:
                    return run
                if run.cancel_requested:
                    return await self._cancel(run)
                outcome, host = await self._drive_once(run, bindings)
                if isinstance(outcome, Failed) and outcome.retryable and crashes < _CRASH_RETRIES:
                    crashes += 1
                    await self._charge(run, outcome, host)
                    continue
                if not await self._finish(run, outcome, host):
                    break
            final = await self.store.get_run(run_id)
            assert final is not None
            return final

    async def _drive_once(
        self, run: RunRecord, bindings: Bindings
    ) -> tuple[DriveOutcome, DriveHost]:
        bundle = await self.store.load_bundle(run.scope, run.snapshot_id, run.workflow)
        if bundle is None:  # snapshots are never deleted; this is a broken journal
            raise RuntimeError(f"run {run.run_id} names a bundle that is not stored")
        journal = tuple(
            JournalEntry(
                row.key,
                row.output,
                None if row.error is None else failure_from_json(row.error),
                row.completed_at,
            )
            for row in await self.store.load_journal(run.run_id)
        )
        now = self.now_ms()
        async with self.store.transaction() as tx:
            await tx.update_run(run.run_id, status="running", updated_at=now)
            await tx.append_event(run.run_id, "drive_started", now, None)
        host = DriveHost(self.store, run.run_id, bindings, self.config.limits, self.now_ms)
        request = DriveRequest(
            run_id=run.run_id,
            workflow=run.workflow,
            bundle=bundle.code,
            input=run.input,
            created_at_ms=run.created_at,
            journal=journal,
            env=run.persisted_bindings,
            limits=self.config.limits,
            cpu_used_s=run.cpu_used_s,
            logs_seen=run.logs_count,
        )
        return await self.pool.drive(request, host), host

    async def _charge(self, run: RunRecord, outcome: DriveOutcome, host: DriveHost) -> None:
        async with self.store.transaction() as tx:
            current = await tx.get_run(run.run_id)
            assert current is not None
            await tx.update_run(
                run.run_id,
                cpu_used_s=current.cpu_used_s + outcome.cpu_s,
                logs_count=max(current.logs_count, host.logs_count),
            )

    async def _finish(self, run: RunRecord, outcome: DriveOutcome, host: DriveHost) -> bool:
        """Record how the drive ended; True when the run should be driven again now."""
        now = self.now_ms()
        async with self.store.transaction() as tx:
            current = await tx.get_run(run.run_id)
            assert current is not None
            common: dict[str, object] = {
                "cpu_used_s": current.cpu_used_s + outcome.cpu_s,
                "logs_count": max(current.logs_count, host.logs_count),
                "updated_at": now,
            }
            match outcome:
                case Completed(output=output):
                    await tx.delete_timers(run.run_id)
                    await tx.update_run(
                        run.run_id, status="completed", output=output, wake_at=None,
                        waiting_for=None, **common,
                    )  # fmt: skip
                    await tx.append_event(run.run_id, "run_completed", now, None)
                    return False
                case Failed(message=message):
                    await tx.delete_timers(run.run_id)
                    await tx.update_run(
                        run.run_id, status="failed", error=message, wake_at=None,
                        waiting_for=None, **common,
                    )  # fmt: skip
                    await tx.append_event(run.run_id, "run_failed", now, None)
                    return False
                case Suspended(markers=markers):
                    if current.cancel_requested:
                        await self._cancel_txn(tx, run.run_id, now, common)
                        return False
                    wake_at = await tx.next_timer(run.run_id)
                    events = sorted({m.event for m in markers if m.kind == "event" and m.event})
                    status = "waiting" if events else "sleeping"
                    await tx.update_run(
                        run.run_id, status=status, wake_at=wake_at,
                        waiting_for=",".join(events) or None, **common,
                    )  # fmt: skip
                    await tx.append_event(run.run_id, "run_suspended", now, None)
                    return wake_at is not None and wake_at <= now
        raise AssertionError("unreachable")

    async def _cancel(self, run: RunRecord) -> RunRecord:
        now = self.now_ms()
        async with self.store.transaction() as tx:
            await self._cancel_txn(tx, run.run_id, now, {"updated_at": now})
        cancelled = await self.store.get_run(run.run_id)
        assert cancelled is not None
        return cancelled

    @staticmethod
    async def _cancel_txn(
        tx: JournalTransaction, run_id: str, now: int, common: dict[str, object]
    ) -> None:
        await tx.delete_timers(run_id)
        await tx.update_run(run_id, status="cancelled", wake_at=None, waiting_for=None, **common)
        await tx.append_event(run_id, "run_cancelled", now, None)
