"""What a bundle exports, asked at publish time: the module is evaluated in an executor with
the run limits (no workflow body runs), and the prelude describes each export. Publishing
names a file's workflows from the answer (bundles/snapshot.py, `name_workflows`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from qjsflow.bridge.failure import StepFailure
from qjsflow.bridge.limits import Limits
from qjsflow.bridge.types import (
    Answer,
    Completed,
    Log,
    OpEnvelope,
    StepBegin,
)
from qjsflow.bridge.values import to_python
from qjsflow.bundles import SourceTreeError, WorkflowBundle
from qjsflow.runner.engine.requests import exports_request
from qjsflow.sandbox import ExecutorPool

__all__ = ["describe_exports"]

_REFUSED = StepFailure(
    "Error", "steps and db.sql are not available while a module loads", retryable=False
)


async def describe_exports(
    pool: ExecutorPool, bundle: WorkflowBundle, limits: Limits, now_ms: int
) -> list[dict[str, Any]]:
    """One `{export, kind, className}` per export of the bundle's module; a module that fails
    to load is a publish error naming its file."""
    request = exports_request(bundle.code, bundle.workflow, limits, now_ms)
    outcome = await pool.drive(request, _refuse_ops)
    if not isinstance(outcome, Completed):
        message = getattr(outcome, "message", "the module did not load")
        raise SourceTreeError(bundle.entry_path, message)
    exports = to_python(outcome.output)
    assert isinstance(exports, list)
    return exports


async def _refuse_ops(ops: Sequence[OpEnvelope]) -> Sequence[Answer]:
    """Console lines of module code are dropped; anything else is refused."""
    return [
        Answer(envelope.id, _REFUSED)
        for envelope in ops
        if not isinstance(envelope.op, Log | StepBegin)
    ]
