"""Before a fork runs on other code: replay that code against the results it would copy.

The new snapshot's bundle is driven once in an executor with the copied steps as its journal
and a host that answers nothing: every call the code makes that the journal does not hold is
noted and left waiting. The fork may go ahead only if the code answered every copied step from
the journal (the same steps, reached before anything new); otherwise `ForkMismatch` names the
first difference. Nothing is written, and no tool, notification or SQL is called.
"""

from __future__ import annotations

from collections.abc import Sequence

from qjsflow.bridge import InvalidInput
from qjsflow.bridge.keys import step_key
from qjsflow.bridge.types import (
    STEP_KIND_OF,
    Answer,
    DriveOutcome,
    Failed,
    OpEnvelope,
    Suspend,
    needs_answer,
)
from qjsflow.runner.engine.drive import RunDriver
from qjsflow.runner.engine.requests import journal_of, run_request
from qjsflow.runner.operations.control import StepRef, kept_steps
from qjsflow.runner.store import BundleRecord, RunRecord, StepRow

__all__ = ["ForkMismatch", "NoAnswers", "check_fork", "replay_without_calls"]


class ForkMismatch(InvalidInput):
    """The new code does not reach the copied steps as the recorded run did."""


class NoAnswers:
    """A host that notes the calls the journal could not answer and leaves them waiting."""

    def __init__(self) -> None:
        self.keys: list[str] = []

    async def __call__(self, ops: Sequence[OpEnvelope]) -> list[Answer]:
        answers = []
        for envelope in ops:
            op = envelope.op
            kind = STEP_KIND_OF.get(type(op))
            if kind is not None:
                self.keys.append(step_key(kind, op.count, op.step))  # type: ignore[union-attr]
            if needs_answer(op):
                answers.append(Answer(envelope.id, Suspend("retry"), None))
        return answers


async def replay_without_calls(
    driver: RunDriver,
    run: RunRecord,
    bundle: BundleRecord,
    rows: Sequence[StepRow],
    *,
    digests: bool,
    strict: bool = False,
) -> tuple[DriveOutcome, NoAnswers]:
    """Drive `run`'s code in `bundle` once, with the settled `rows` as its journal (their call
    digests checked when `digests`) and a host that answers nothing; `strict`: every recorded
    step must be reached, in order (a migration's check)."""
    journal = journal_of(rows, digests=digests)
    request = run_request(run, bundle, journal, driver.config.limits, strict=strict)
    host = NoAnswers()
    return await driver.pool.drive(request, host), host


async def check_fork(
    driver: RunDriver, source: RunRecord, fork: RunRecord, start: StepRef | None
) -> tuple[str, ...]:
    """Raise `ForkMismatch` unless `fork`'s code reaches `source`'s steps before `start`;
    the keys of the steps checked (the fork copies them only if they are still the same)."""
    rows = kept_steps(await driver.store.list_steps(source.run_id), start)
    # No digests: the fork reuses the results whatever its own calls ask (its instance id).
    outcome, host = await replay_without_calls(
        driver, fork, await driver.bundle_of(fork), rows, digests=False
    )
    if isinstance(outcome, Failed):
        raise ForkMismatch(f"the new code fails before the fork point: {outcome.message[:300]}")
    replayed = outcome.replayed
    if replayed >= len(rows):
        return tuple(row.key for row in rows)
    expected = rows[replayed].key
    found = host.keys[0] if host.keys else "no further step (it ends)"
    raise ForkMismatch(
        f"the new code does not reach the recorded steps in order: it reached {replayed} of "
        f"the {len(rows)} copied, then called {found} where the run had {expected}"
    )
