"""The shipped author types (bundles/types/*.d.ts) type-check real workflows."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from qjsflow.bundles.toolchain import find_toolchain, tsc_path
from tests.conftest import FIXTURES, PROJECT_ROOT

TYPES = PROJECT_ROOT / "bundles" / "types"
TSC_FLAGS = [
    "--noEmit", "--strict", "--target", "es2022", "--module", "esnext",
    "--moduleResolution", "bundler", "--lib", "es2022", "--typeRoots", "./no-ambient-types",
]  # fmt: skip


def _tsc(*files: Path) -> subprocess.CompletedProcess[str]:
    node = find_toolchain().node
    return subprocess.run(
        [node, str(tsc_path()), *TSC_FLAGS, *map(str, sorted(TYPES.glob("*.d.ts"))), *map(str, files)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.slow  # in `make test`; heavy for the fast tier
def test_fixtures_type_check_against_the_shipped_types() -> None:
    # Author-side test scripts (fixtures/*/tests/) run on Node, not in the sandbox: their
    # types are Node's, which an author's project brings (tests/test_author_cli.py runs them).
    sandboxed = [p for p in FIXTURES.rglob("*.ts") if "tests" not in p.relative_to(FIXTURES).parts]
    done = _tsc(*sorted(sandboxed))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow  # in `make test`; heavy for the fast tier
def test_the_types_catch_a_wrong_call(tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.ts"
    wrong.write_text(
        'import type { WorkflowStep } from "qjsflow";\n'
        "export async function f(step: WorkflowStep) {\n"
        '  await step.sleep("nap", "5 fortnights");\n'
        '  await step.waitForEvent("x", { kind: "go" });\n'
        "}\n"
    )
    done = _tsc(wrong)
    assert done.returncode != 0
    assert "fortnights" in done.stdout
    assert "'kind' does not exist" in done.stdout
