"""How a start writes its run: the one path by which a run comes to be (`Runner.start`, a
batch, a schedule's firing, a workflow binding's `create`). In its transaction: the scope's
configuration version and settings, the snapshot, admission under the scope's budgets, and
the run row with its `run_created` event. A start with a caller's run id is idempotent.

A batch (`Runner.start_batch`, `qjsflow start --batch FILE`, a binding's `createBatch`) is up
to `MAX_BATCH` starts in one transaction, each answered on its own: created, existed (the same
start made before), or refused and why; a refused item writes nothing and stops no other.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache, partial

from qjsflow.bridge import InvalidInput, QjsflowError, dumps_text, loads
from qjsflow.bridge.values import from_python
from qjsflow.bundles.flow import PRIORITY_RULE, FlowControl, flow_from_json, is_priority
from qjsflow.runner.config import RunnerConfig
from qjsflow.runner.errors import InvalidRunId, UnknownWorkflow
from qjsflow.runner.operations.control import check_same_start
from qjsflow.runner.operations.scope_configs import StartSettings, start_settings
from qjsflow.runner.operations.start_reads import KeptReads, StartReads
from qjsflow.runner.reads import RUN_ID, snapshot_in
from qjsflow.runner.store import JournalTransaction, RunRecord, RunStatus
from qjsflow.runner.telemetry.tracing import new_traceparent
from qjsflow.runner.tenancy.capabilities import Reach
from qjsflow.runner.tenancy.environment import env_of
from qjsflow.runner.tenancy.flow_gates import gate_start
from qjsflow.runner.tenancy.run_tags import checked_tags
from qjsflow.runner.tenancy.scope_config import ConfigCache
from qjsflow.runner.tenancy.scopes import run_key, split_run_key, validate_scope
from qjsflow.runner.tenancy.usage import admit
from qjsflow.runner.views import StartRunInput

__all__ = [
    "MAX_BATCH", "BatchItem", "Creation", "GatedStart", "batch_of", "checked_priority",
    "creation", "new_run_id",
]  # fmt: skip

MAX_BATCH = 1000


class GatedStart(Exception):
    """A start its workflow gates, asked to be driven in its own transaction: nothing was
    written; it is written alone (`Runner.start`), then driven if its gate admitted it."""


@dataclass(frozen=True, slots=True)
class Creation:
    """A start's run key, and what writes it in a transaction at a time: (the run asked
    for, None when it was created or else the run that answers it: the one that already
    had its id, or the pending run a debounced start was merged into). With `inline`, a
    start its workflow gates raises `GatedStart` before writing anything."""

    run_key: str
    write: Callable[[JournalTransaction, int, bool, bool], tuple[RunRecord, RunRecord | None]]
    # The run a presuming start would write at a time, if that can be told without the
    # journal (runner/engine/drive/ahead.py); None when it cannot.
    foresee: Callable[[int], RunRecord | None]

    def __call__(
        self, tx: JournalTransaction, now: int, *, inline: bool = False, presume: bool = False
    ) -> tuple[RunRecord, RunRecord | None]:
        return self.write(tx, now, inline, presume)


@dataclass(frozen=True, slots=True)
class BatchItem:
    """One start of a batch: `created`, `existed` (the same start made before),
    `debounced` (merged into the pending run `run_id`) or `refused` (with why: nothing of it
    was written)."""

    index: int
    outcome: str
    run_id: str | None = None
    error: str | None = None


def new_run_id(run_id: str | None) -> str:
    """The caller's run id, checked, or a random one."""
    if run_id is None:
        return secrets.token_hex(16)  # 128 random bits
    if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id):
        raise InvalidRunId(run_id)
    return run_id


@dataclass(frozen=True, slots=True)
class _Asked:
    """A start's request, checked and encoded once (a transaction run again after a fault
    writes the same run)."""

    request: StartRunInput
    scope: str
    run_id: str
    input: str
    traceparent: str | None
    flow: FlowControl | None
    priority: int | None

    def planned(
        self, kept: KeptReads, now: int, config: RunnerConfig, configs: ConfigCache
    ) -> tuple[RunRecord, StartSettings, FlowControl | None]:
        """The run as this start writes it at `now`, from what it read (or kept)."""
        request, scope, snapshot = self.request, self.scope, kept.snapshot
        settings = start_settings(kept.latest, scope, config, configs)
        entries = {w.workflow: w for w in snapshot.workflows}
        found = entries.get(request.workflow)
        if found is None or request.entry_path not in (None, found.entry_path):
            raise UnknownWorkflow(request.workflow, sorted(entries))
        flow = self.flow or (None if found.flow is None else stored_flow(found.flow))
        bindings_text = from_python(
            env_of(settings.environment, request.persisted_bindings,
                   Reach(snapshot.capabilities, settings.policy).binding_allowed,
                   workflows=[w.binding for w in snapshot.workflows if w.binding],
                   defaults=snapshot.vars),
            max_bytes=config.limits.value_bytes, what="the persisted bindings",
        )  # fmt: skip
        priority = self.priority
        record = RunRecord(
            run_id=self.run_id, scope=scope, workflow=request.workflow,
            snapshot_id=snapshot.snapshot_id, entry_path=found.entry_path,
            status=RunStatus.running, input=self.input, persisted_bindings=bindings_text,
            output=None, error=None, created_at=now, updated_at=now, wake_at=None,
            waiting_for=None, cpu_used_s=0.0, logs_count=0, cancel_requested=False,
            traceparent=self.traceparent, config_version=settings.version,
            priority=priority if priority is not None else 0 if flow is None else flow.priority,
        )  # fmt: skip
        return record, settings, flow


def creation(
    request: StartRunInput,
    *,
    config: RunnerConfig,
    configs: ConfigCache,
    reads: StartReads | None = None,
) -> Creation:
    """What writes `request`'s run. `reads`: what earlier starts read, which one that
    presumes takes as still so (runner/operations/start_reads.py)."""
    scope = validate_scope(request.scope)
    run_id = run_key(scope, new_run_id(request.run_id))
    asked = _Asked(
        request, scope, run_id,
        input=from_python(request.input, max_bytes=config.limits.value_bytes,
                          what="the run input"),
        traceparent=new_traceparent(request.traceparent),
        flow=None if request.flow is None else _flow(request.flow, "the start's flow"),
        priority=checked_priority(request.priority),
    )  # fmt: skip
    tags = checked_tags(request.tags)

    def create(
        tx: JournalTransaction, now: int, inline: bool, presume: bool = False
    ) -> tuple[RunRecord, RunRecord | None]:
        """The run, and the one there already (None: it was inserted). `presume`: the run is
        new, inserted without reading whether it is (`insert_run`), and what an earlier start
        read is still so (`reads`)."""
        kept = reads.presumed(tx, scope, request.snapshot_id) if presume and reads else None
        if kept is None:
            latest = tx.send_latest_scope_config(scope)  # answered with the snapshot's read
            snapshot = snapshot_in(tx, reference=request.snapshot_id, scope=scope)
            kept = KeptReads(latest(), snapshot)
            if reads is not None:
                reads.keep(scope, request.snapshot_id, kept)
        record, settings, flow = asked.planned(kept, now, config, configs)
        gated = flow is not None and flow.gated
        # Looked for only when it matters before the insert (which finds it otherwise).
        existing = tx.get_run(run_id) if gated or settings.budgets is not None else None
        if settings.budgets is not None and existing is None:
            admit(tx, scope, settings.budgets, new_live_run=True)
        if flow is not None and gated:
            if existing is not None:
                return record, existing
            if inline:
                raise GatedStart(run_id)
            written = partial(_created, tx, scope=scope, tags=tags, now=now)
            queued = gate_start(tx, record, flow, request.input, now=now, created=written)
            return (record, queued.run) if not queued.created else (queued.run, None)
        if tx.insert_run(record, presumed=presume):
            _created(tx, record, scope=scope, tags=tags, now=now)
            return record, None
        return record, tx.get_run(run_id)

    def foreseen(now: int) -> RunRecord | None:
        """The run a start that presumes would write at `now`, from the reads an earlier
        start kept, if it is plain: no budgets to admit it under, no gate to queue it. None
        when it cannot be told without the journal."""
        kept = None if reads is None else reads.kept(scope, request.snapshot_id)
        if kept is None:
            return None
        try:
            record, settings, flow = asked.planned(kept, now, config, configs)
        except QjsflowError:  # (the start's own transaction says so)
            return None
        if settings.budgets is not None or (flow is not None and flow.gated):
            return None
        return record

    return Creation(run_id, create, foreseen)


def _created(
    tx: JournalTransaction, record: RunRecord, *, scope: str, tags: Mapping[str, str], now: int
) -> None:
    tx.append_event(record.run_id, "run_created", now, dumps_text({"scope": scope}))
    if tags:
        tx.insert_tags(record.run_id, tags)


@lru_cache(maxsize=256)
def stored_flow(text: str) -> FlowControl:
    """A workflow's flow control as its snapshot stores it (checked at publish), parsed once
    a process: every start of a gated workflow reads it."""
    return _flow(loads(text), "the stored flow control")


def _flow(document: object, where: str) -> FlowControl:
    try:
        return flow_from_json(document, where)
    except ValueError as error:
        raise InvalidInput(str(error)) from None


def checked_priority(priority: object) -> int | None:
    """A start's priority, checked (`InvalidInput` naming the range)."""
    if priority is None:
        return None
    if not is_priority(priority):
        raise InvalidInput(PRIORITY_RULE)
    assert isinstance(priority, int)
    return priority


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
                    if existing is not None and existing.run_id == wanted.run_id:
                        check_same_start(existing, wanted)
            except QjsflowError as error:
                items.append(BatchItem(index, "refused", error=str(error)[:300]))
                continue
            answer = wanted if existing is None else existing
            outcome = ("created" if existing is None else
                       "existed" if existing.run_id == wanted.run_id else "debounced")  # fmt: skip
            items.append(BatchItem(index, outcome, split_run_key(answer.run_id)[1]))
        return items

    return run_all
