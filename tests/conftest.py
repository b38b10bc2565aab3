"""Shared fixtures: a real journal file per test, the project's folders."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from runner import Runner

PROJECT_ROOT = Path(__file__).resolve().parent.parent
FIXTURES = PROJECT_ROOT / "fixtures"


@pytest.fixture
async def runner(tmp_path: Path) -> AsyncIterator[Runner]:
    async with Runner.open(tmp_path / "journal.db") as opened:
        yield opened
