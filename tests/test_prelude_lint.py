"""The prelude's type check (`make lint` runs scripts/lint_prelude.py over the shipped
prelude): it fails on what it is there to catch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PROJECT_ROOT

SCRIPT = PROJECT_ROOT / "scripts" / "lint_prelude.py"


def _lint(*extra: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, extra)],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


@pytest.mark.slow  # `make lint` itself runs the check over the shipped prelude
@pytest.mark.parametrize(
    ("snippet", "complaint"),
    [
        ("function neverCalled() { return 1; }\n", "'neverCalled' is declared but"),
        ('wellFormd("x");\n', "Cannot find name 'wellFormd'"),
        ("let leftOver = RULES.sql_chars;\n", "'leftOver' is declared but"),
        ("RULES.sql_char.toFixed();\n", "Property 'sql_char' does not exist"),
    ],
)
def test_the_check_fails_on_what_it_is_for(tmp_path: Path, snippet: str, complaint: str) -> None:
    extra = tmp_path / "extra.js"
    extra.write_text(snippet)
    checked = _lint(extra)
    assert checked.returncode != 0
    assert complaint in checked.stderr
    assert "prelude.js(" in checked.stderr  # located, in the script as QuickJS runs it
