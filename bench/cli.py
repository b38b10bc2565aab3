"""Command latency: `qjsflow status RUN` on a small journal, wall time of the whole process.

Baselines measured in the same run: the interpreter starting and exiting (`python -c pass`),
and the same interpreter importing asyncio and sqlite3 (what any command must load). Target:
status within 250 ms on a 2-core machine. Run with `python -m bench.cli`; prints a markdown
table and writes bench/results/cli.json. Figures are medians over repeats.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

RESULTS = Path(__file__).with_name("results")
REPEATS = 15


def _median_ms(argv: list[str], cwd: Path) -> float:
    times = []
    for _ in range(REPEATS):
        began = time.perf_counter()
        subprocess.run(argv, cwd=cwd, check=True, capture_output=True)
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


def measure() -> dict[str, float]:
    """Medians, in ms: the interpreter alone, what any command loads, status and list."""
    script = shutil.which("qjsflow", path=str(Path(sys.executable).parent)) or "qjsflow"
    with tempfile.TemporaryDirectory() as folder:
        here = Path(folder)
        (here / "src" / "workflows").mkdir(parents=True)
        (here / "src" / "workflows" / "f.js").write_text("export default async () => 1;\n")
        common = ["--db", str(here / "j.db")]
        subprocess.run([script, "publish", "src", "--scope", "acme", *common], cwd=here,
                       check=True, capture_output=True)  # fmt: skip
        subprocess.run([script, "start", "f", "--scope", "acme", "--snapshot", "latest",
                        "--run-id", "r1", *common], cwd=here, check=True,
                       capture_output=True)  # fmt: skip
        bare = _median_ms([sys.executable, "-c", "pass"], here)
        floor = _median_ms([sys.executable, "-c", "import asyncio, sqlite3"], here)
        status = _median_ms([script, "status", "r1", *common], here)
        listing = _median_ms([script, "list", *common], here)
    return {
        "python_startup_ms": round(bare, 1),
        "asyncio_sqlite3_import_ms": round(floor, 1),
        "status_ms": round(status, 1),
        "list_ms": round(listing, 1),
        "status_over_startup": round(status / bare, 2),
        "status_target_ms": 250,
    }


def main() -> None:
    results = measure()
    bare, floor = results["python_startup_ms"], results["asyncio_sqlite3_import_ms"]
    status, listing = results["status_ms"], results["list_ms"]
    rows = [
        ("python -c pass", f"{bare:.0f} ms", "the interpreter alone"),
        ("python -c 'import asyncio, sqlite3'", f"{floor:.0f} ms", "what any command loads"),
        ("qjsflow status RUN", f"{status:.0f} ms", "target 250 ms"),
        ("qjsflow list", f"{listing:.0f} ms", ""),
        ("status / python startup", f"{status / bare:.2f}", ""),
    ]
    table = ["| measure | median | note |", "|---|---:|---|"]
    table += [f"| {name} | {value} | {note} |" for name, value, note in rows]
    print("\n".join(table))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "cli.json").write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
