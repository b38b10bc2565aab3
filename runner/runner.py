"""`Runner`: the Python API of qjsflow (DESIGN §9)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from bundles import (
    SourceTree,
    build_snapshot,
    read_tree,
    select_entries,
    snapshot_id_of,
    tree_from_mapping,
)
from runner.config import RunnerConfig
from runner.scopes import validate_scope
from runner.store import JournalStore, SnapshotRecord

__all__ = ["PublishResult", "PublishedWorkflow", "Runner", "Source"]

Source = str | os.PathLike[str] | Mapping[str, str | bytes]


@dataclass(frozen=True, slots=True)
class PublishedWorkflow:
    workflow: str
    entry_path: str


@dataclass(frozen=True, slots=True)
class PublishResult:
    scope: str
    snapshot_id: str
    workflows: tuple[PublishedWorkflow, ...]
    created: bool  # False when the same snapshot was already published in this scope


class Runner:
    """Publishes snapshots and (with later parts of the plan) drives runs against one journal."""

    def __init__(self, store: JournalStore, config: RunnerConfig) -> None:
        self._store = store
        self.config = config

    @classmethod
    @asynccontextmanager
    async def open(
        cls, db_path: str | os.PathLike[str], config: RunnerConfig | None = None
    ) -> AsyncIterator[Runner]:
        """`async with Runner.open(path) as runner:` — the journal is created if missing."""
        runner = await cls.connect(db_path, config)
        try:
            yield runner
        finally:
            await runner.aclose()

    @classmethod
    async def connect(
        cls, db_path: str | os.PathLike[str], config: RunnerConfig | None = None
    ) -> Runner:
        """Open a runner whose lifetime the caller ends with `aclose()`."""
        store = await JournalStore.open(Path(db_path))
        return cls(store, config or RunnerConfig())

    async def aclose(self) -> None:
        await self._store.aclose()

    async def publish(
        self, scope: str, source: Source, entries: Sequence[str] | None = None
    ) -> PublishResult:
        """Publish a folder or a mapping path -> source as a snapshot of `scope`.

        Publishing the same files again returns the existing snapshot and bundles nothing.
        """
        validate_scope(scope)
        tree = await asyncio.to_thread(self._read_source, source)
        chosen = select_entries(tree, entries)
        snapshot_id = snapshot_id_of(tree, chosen)
        existing = await self._store.find_snapshot(scope, snapshot_id)
        if existing is not None:
            return _published(existing, created=False)
        snapshot = await build_snapshot(tree, chosen, self.config.build_limits)
        created = await self._store.insert_snapshot(scope, snapshot, self.config.clock())
        record = await self._store.find_snapshot(scope, snapshot_id)
        assert record is not None, "a snapshot just stored must be found"
        return _published(record, created=created)

    def _read_source(self, source: Source) -> SourceTree:
        if isinstance(source, Mapping):
            return tree_from_mapping(source, self.config.tree_limits)
        return read_tree(source, self.config.tree_limits)

    @property
    def store(self) -> JournalStore:
        return self._store


def _published(record: SnapshotRecord, *, created: bool) -> PublishResult:
    workflows = tuple(PublishedWorkflow(w.workflow, w.entry_path) for w in record.workflows)
    return PublishResult(record.scope, record.snapshot_id, workflows, created)
