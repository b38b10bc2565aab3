"""How a start writes its run: the one path by which a run comes to be (`Runner.start`, a
batch, a schedule's firing, a workflow binding's `create`). In its transaction: the scope's
configuration version and settings, the snapshot, admission under the scope's budgets, and
the run row with its `run_created` event. A start with a caller's run id is idempotent.

A batch (`Runner.start_batch`, `qjsflow start --batch FILE`, a binding's `createBatch`) is up
to `MAX_BATCH` starts in one transaction, each answered on its own: created, existed (the same
start made before), or refused and why; a refused item writes nothing and stops no other.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from qjsflow.bridge import InvalidInput, QjsflowError, dumps_text
from qjsflow.bridge.values import from_python
from qjsflow.runner.config import RunnerConfig
from qjsflow.runner.errors import InvalidRunId, UnknownWorkflow
from qjsflow.runner.operations.control import check_same_start
from qjsflow.runner.operations.scope_configs import start_settings
from qjsflow.runner.reads import RUN_ID, snapshot_in
from qjsflow.runner.store import JournalTransaction, RunRecord, RunStatus
from qjsflow.runner.telemetry.tracing import new_traceparent
from qjsflow.runner.tenancy.capabilities import Reach
from qjsflow.runner.tenancy.environment import env_of
from qjsflow.runner.tenancy.scope_config import ConfigCache
from qjsflow.runner.tenancy.scopes import run_key, split_run_key, validate_scope
from qjsflow.runner.tenancy.usage import admit
from qjsflow.runner.views import StartRunInput

__all__ = [
    "MAX_BATCH", "BatchItem", "Creation", "batch_of", "checked_tags", "creation", "new_run_id",
]  # fmt: skip

MAX_BATCH = 1000


@dataclass(frozen=True, slots=True)
class Creation:
    """A start's run key, and what writes it in a transaction at a time: (the run asked
    for, None when it was created or else the run that already had its id)."""

    run_key: str
    write: Callable[[JournalTransaction, int], tuple[RunRecord, RunRecord | None]]

    def __call__(self, tx: JournalTransaction, now: int) -> tuple[RunRecord, RunRecord | None]:
        return self.write(tx, now)


@dataclass(frozen=True, slots=True)
class BatchItem:
    """One start of a batch: `created`, `existed` (the same start made before) or
    `refused` (with why: nothing of it was written)."""

    index: int
    outcome: str
    run_id: str | None = None
    error: str | None = None


_TAG_KEY = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_MAX_TAGS = 20


def checked_tags(tags: Mapping[str, str] | None) -> dict[str, str]:
    """A start's tags, checked (`InvalidInput` naming the first problem)."""
    if not tags:
        return {}
    if not isinstance(tags, Mapping) or len(tags) > _MAX_TAGS:
        raise InvalidInput(f"tags are at most {_MAX_TAGS} pairs of a key and a value")
    for key, value in tags.items():
        if not isinstance(key, str) or not _TAG_KEY.fullmatch(key):
            raise InvalidInput(f"invalid tag key {str(key)[:80]!r}: use 1-64 of A-Z, a-z, 0-9, "
                               "_, . and -")  # fmt: skip
        if not isinstance(value, str) or len(value) > 256 or not value.isprintable():
            raise InvalidInput(f"tag {key!r}: its value is printable text of 256 at most")
    return dict(tags)


def new_run_id(run_id: str | None) -> str:
    """The caller's run id, checked, or a random one."""
    if run_id is None:
        return secrets.token_hex(16)  # 128 random bits
    if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id):
        raise InvalidRunId(run_id)
    return run_id


def creation(request: StartRunInput, *, config: RunnerConfig, configs: ConfigCache) -> Creation:
    """What writes `request`'s run (its input encoded and its id made here, once: a
    transaction run again after a fault writes the same run)."""
    scope = validate_scope(request.scope)
    run_id = run_key(scope, new_run_id(request.run_id))
    limit = config.limits.value_bytes
    encoded_input = from_python(request.input, max_bytes=limit, what="the run input")
    traceparent = new_traceparent(request.traceparent)
    tags = checked_tags(request.tags)

    def create(tx: JournalTransaction, now: int) -> tuple[RunRecord, RunRecord | None]:
        settings = start_settings(tx, scope, config, configs)
        snapshot = snapshot_in(tx, reference=request.snapshot_id, scope=scope)
        entries = {w.workflow: w.entry_path for w in snapshot.workflows}
        entry_path = entries.get(request.workflow)
        if entry_path is None or request.entry_path not in (None, entry_path):
            raise UnknownWorkflow(request.workflow, sorted(entries))
        bindings_text = from_python(
            env_of(settings.environment, request.persisted_bindings,
                   Reach(snapshot.capabilities, settings.policy).binding_allowed,
                   workflows=[w.binding for w in snapshot.workflows if w.binding],
                   defaults=snapshot.vars),
            max_bytes=limit, what="the persisted bindings",
        )  # fmt: skip
        record = RunRecord(
            run_id=run_id, scope=scope, workflow=request.workflow,
            snapshot_id=snapshot.snapshot_id, entry_path=entry_path, status=RunStatus.running,
            input=encoded_input, persisted_bindings=bindings_text, output=None, error=None,
            created_at=now, updated_at=now, wake_at=None, waiting_for=None, cpu_used_s=0.0,
            logs_count=0, cancel_requested=False, traceparent=traceparent,
            config_version=settings.version,
        )  # fmt: skip
        if settings.budgets is not None and tx.get_run(run_id) is None:
            admit(tx, scope, settings.budgets, new_live_run=True)
        if tx.insert_run(record):
            tx.append_event(run_id, "run_created", now, dumps_text({"scope": scope}))
            if tags:
                tx.insert_tags(run_id, tags)
            return record, None
        return record, tx.get_run(run_id)

    return Creation(run_id, create)


def batch_of(
    requests: Sequence[StartRunInput], *, config: RunnerConfig, configs: ConfigCache
) -> Callable[[JournalTransaction, int], list[BatchItem]]:
    """A batch's transaction: each start in a savepoint of its own, answered on its own."""
    if not 1 <= len(requests) <= MAX_BATCH:
        raise InvalidInput(f"a batch holds 1 to {MAX_BATCH} starts, not {len(requests)}")
    prepared: list[Creation | str] = []
    for request in requests:
        try:
            prepared.append(creation(request, config=config, configs=configs))
        except QjsflowError as error:  # refused before any write: its input, its id
            prepared.append(str(error))

    def run_all(tx: JournalTransaction, now: int) -> list[BatchItem]:
        items = []
        for index, made in enumerate(prepared):
            if isinstance(made, str):
                items.append(BatchItem(index, "refused", error=made[:300]))
                continue
            try:
                with tx.savepoint():
                    wanted, existing = made(tx, now)
                    if existing is not None:
                        check_same_start(existing, wanted)
            except QjsflowError as error:
                items.append(BatchItem(index, "refused", error=str(error)[:300]))
                continue
            outcome = "created" if existing is None else "existed"
            items.append(BatchItem(index, outcome, split_run_key(wanted.run_id)[1]))
        return items

    return run_all
