"""A run's timeline: one row per step, with its attempts, how long it took, and the drive that
executed it and those that replayed it (what `qjsflow timeline` and the demo print)."""

from __future__ import annotations

from qjsflow.runner.reads import RunReads
from qjsflow.runner.store import EventRecord, StepRow
from qjsflow.runner.tenancy.scopes import run_key
from qjsflow.runner.views import RunView

__all__ = ["rows_of", "timeline_rows"]


async def timeline_rows(reads: RunReads, run: RunView) -> list[tuple[str, ...]]:
    """One row per step: attempts, duration, and in which drives it ran or was replayed."""
    key = run_key(run.scope, run.run_id)
    return rows_of(await reads.store.list_events(key), await reads.store.list_steps(key))


def rows_of(events: list[EventRecord], steps: list[StepRow]) -> list[tuple[str, ...]]:
    """`timeline_rows` from a run's events and steps already read."""
    drive_of = _drive_numbers(events)
    rows: list[tuple[str, ...]] = [("STEP", "KIND", "ATTEMPT", "DURATION", "EXECUTED", "REPLAYED")]
    total_drives = max(drive_of.values(), default=0)
    for step in steps:
        settled = next((e for e in events if e.seq == step.settled_seq), None)
        executed_in = drive_of.get(step.settled_seq or 0, 0)
        replayed = [str(n) for n in range(executed_in + 1, total_drives + 1)]
        duration = (
            ""
            if step.completed_at is None
            else f"{(step.completed_at - step.started_at) / 1000:.2f}s"
        )
        rows.append((
            step.name or step.kind, step.kind, str(step.attempt), duration,
            f"drive {executed_in}" if settled else "-",
            ", ".join(replayed) if replayed else "-",
        ))  # fmt: skip
    return rows


def _drive_numbers(events: list[EventRecord]) -> dict[int, int]:
    """For each event, the number of the drive it happened in (1-based)."""
    numbers: dict[int, int] = {}
    drive = 0
    for event in events:
        if event.type == "drive_started":
            drive += 1
        numbers[event.seq] = drive
    return numbers
