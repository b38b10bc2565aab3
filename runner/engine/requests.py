"""The one builder of what an executor is asked to drive (`DriveRequest`): a run's drive, a
replay that calls nothing (a fork's or a migration's check), or a bundle's exports looked at
when it is published. Every field a drive depends on is set here, once."""

from __future__ import annotations

from collections.abc import Sequence

from qjsflow.bridge.failure import failure_from_json
from qjsflow.bridge.limits import Limits
from qjsflow.bridge.types import DriveRequest, JournalEntry
from qjsflow.runner.engine.drive.kept import OpenSteps
from qjsflow.runner.store import BundleRecord, RunRecord, StepRow
from qjsflow.runner.tenancy.scopes import split_run_key

__all__ = ["exports_request", "journal_of", "run_request"]


def run_request(
    run: RunRecord,
    bundle: BundleRecord,
    journal: tuple[JournalEntry, ...],
    limits: Limits,
    *,
    open_steps: OpenSteps | None = None,
    strict: bool = False,
) -> DriveRequest:
    """A drive of `run` on `bundle` with `journal` answered from memory. `open_steps`: its
    step rows not settled (a real drive, which goes on from them); without them a replay that
    reaches past the journal meets a host that answers nothing. `strict`: every entry must be
    reached, in order (a migration's check)."""
    return DriveRequest(
        run_id=split_run_key(run.run_id)[1],  # the author's event.instanceId
        workflow=run.workflow,
        bundle=bundle.code,
        input=run.input,
        created_at_ms=run.created_at,
        journal=journal,
        env=run.persisted_bindings,
        limits=limits,
        cpu_used_s=run.cpu_used_s if open_steps is not None else 0.0,
        logs_seen=run.logs_count if open_steps is not None else 0,
        unsettled=open_steps.keys if open_steps is not None else (),
        waiting=open_steps.waiting if open_steps is not None else (),
        export=bundle.export,
        strict=strict,
        bundle_key=bundle.digest,
        roll_back=run.rollback_requested if open_steps is not None else None,
    )


def journal_of(rows: Sequence[StepRow], *, digests: bool) -> tuple[JournalEntry, ...]:
    """Settled step rows as a drive's journal (their call digests checked when `digests`)."""
    return tuple(
        JournalEntry(
            row.key, row.output, None if row.error is None else failure_from_json(row.error),
            row.clock_at or row.started_at, row.args_digest if digests else None,
        )
        for row in rows
    )  # fmt: skip


def exports_request(code: str, workflow: str, limits: Limits, now_ms: int) -> DriveRequest:
    """What a bundle's module exports, asked at publish: the module is evaluated, no body
    runs."""
    return DriveRequest(
        run_id="publish", workflow=workflow, bundle=code, input="null", created_at_ms=now_ms,
        limits=limits, inspect=True,
    )  # fmt: skip
