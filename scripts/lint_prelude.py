"""Type-check the prelude as QuickJS runs it: `tsc --checkJs --noUnusedLocals` over the
script the executor evaluates (the text rules and every part, inside one function), so an
unused variable, a misspelt name or a wrong call fails `make lint`.

Usage: lint-prelude.py [EXTRA.js]  (EXTRA is appended inside the function: how the test shows
that the check fails on what it should catch).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from qjsflow.sandbox.executor import load_prelude

_END = "\n})();\n"
ROOT = Path(__file__).resolve().parent.parent
TSC = ROOT / ".jstools" / "node_modules" / ".bin" / "tsc"
GLOBALS = ROOT / "sandbox" / "prelude" / "quickjs-globals.d.ts"
OPTIONS = (
    "--allowJs", "--checkJs", "--noEmit", "--strict", "false", "--noUnusedLocals",
    "--noUnusedParameters", "--target", "es2024", "--lib", "es2024",
)  # fmt: skip


def main(extra: list[str]) -> int:
    if not TSC.exists():
        print(
            f"lint_prelude: {TSC.relative_to(ROOT)} is missing: run `make setup`", file=sys.stderr
        )
        return 2
    appended = "".join(Path(path).read_text(encoding="utf-8") for path in extra)
    prelude_text = load_prelude()
    body, end = prelude_text[: -len(_END)], prelude_text[-len(_END) :]
    assert end == _END, "the prelude no longer ends as this check expects"
    script = body + appended + end
    with tempfile.TemporaryDirectory() as folder:
        prelude = Path(folder) / "prelude.js"
        prelude.write_text(script, encoding="utf-8")
        checked = subprocess.run(
            [str(TSC), *OPTIONS, prelude.name, str(GLOBALS)],
            cwd=folder, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
    output = checked.stdout + checked.stderr
    if checked.returncode != 0:
        print(output, end="", file=sys.stderr)
        print("lint_prelude: the prelude does not type-check (see above)", file=sys.stderr)
    return checked.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
