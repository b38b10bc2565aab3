"""Shared fixtures: a real journal file per test, the project's folders."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bundles import build_snapshot, tree_from_mapping
from runner import Runner
from sandbox import ExecutorPool, PoolConfig

PROJECT_ROOT = Path(__file__).resolve().parent.parent
FIXTURES = PROJECT_ROOT / "fixtures"


@pytest.fixture
async def runner(tmp_path: Path) -> AsyncIterator[Runner]:
    async with Runner.open(tmp_path / "journal.db") as opened:
        yield opened


_BUNDLES: dict[str, str] = {}


async def bundle_of(source: str, name: str = "w.ts") -> str:
    """The real esbuild bundle of one workflow source (cached per test session)."""
    key = f"{name}\0{source}"
    if key not in _BUNDLES:
        snapshot = await build_snapshot(tree_from_mapping({f"workflows/{name}": source}))
        _BUNDLES[key] = snapshot.bundles[0].code
    return _BUNDLES[key]


@pytest.fixture
async def pool() -> AsyncIterator[ExecutorPool]:
    async with ExecutorPool(PoolConfig(size=2)) as opened:
        yield opened
