"""Every kind of value the encoder accepts round-trips: through real QuickJS, the journal, the
views, `--json`, and back into JS on replay (shared vectors: tests/value_vectors.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from qjsflow.bridge.values import from_python, to_json_form, to_python
from qjsflow.runner import Bindings, Runner
from qjsflow.runner.tenancy.scopes import run_key
from tests.conftest import PROJECT_ROOT, FakeClock, start_source
from tests.value_vectors import VECTORS, Vector

_EXPRESSIONS = ",\n".join(f"  () => ({v.js})" for v in VECTORS)
FLOW = f"""
const VECTORS: Array<() => unknown> = [
{_EXPRESSIONS}
];
export default async function (event: any, step: any) {{
  const first: unknown[] = [];
  for (let i = 0; i < VECTORS.length; i++) first.push(await step.do("v" + i, async () => VECTORS[i]()));
  await step.sleep("replay", 1000);
  // After the sleep the body replays: each value comes back from the journal, decoded in JS.
  for (let i = 0; i < first.length; i++) await step.do("again" + i, async () => first[i]);
  console.log(first[1], first[2]);
  return event.payload;
}}
"""


def _ids() -> list[str]:
    return [v.kind for v in VECTORS]


@pytest.mark.parametrize("vector", VECTORS, ids=_ids())
def test_python_side_of_each_vector(vector: Vector) -> None:
    decoded = to_python(vector.encoded)
    assert repr(decoded) == repr(vector.python)
    assert to_json_form(decoded) == vector.json
    orjson.dumps(to_json_form(decoded))  # --json can always write it
    if vector.from_python:
        assert orjson.loads(from_python(vector.python)) == orjson.loads(vector.encoded)


async def test_every_vector_round_trips_through_quickjs_and_the_journal(
    clocked_runner: Runner, clock: FakeClock
) -> None:
    exact = [v.python for v in VECTORS if v.from_python]
    run = await start_source(clocked_runner, FLOW, exact, run_id="vectors")
    assert run.status == "sleeping", run.error
    clock.advance(2)
    run = await clocked_runner.resume("vectors", scope="acme")
    assert run.status == "completed", run.error

    rows = {
        row.name: row for row in await clocked_runner.store.list_steps(run_key("acme", "vectors"))
    }
    for index, vector in enumerate(VECTORS):
        assert rows[f"v{index}"].output == vector.encoded, vector.kind
        assert rows[f"again{index}"].output == vector.encoded, f"replayed {vector.kind}"
    views = {s.name: s for s in await clocked_runner.list_steps("vectors", scope="acme")}
    for index, vector in enumerate(VECTORS):
        assert repr(views[f"v{index}"].output) == repr(vector.python), vector.kind
    # Python-made values reach JS and come back as the same encoded text.
    assert repr(run.output) == repr(exact)


@pytest.mark.slow  # in `make test`; heavy for the fast tier
def test_views_and_json_output_of_hostile_values(tmp_path: Path) -> None:
    """The CLI's status, steps and unscoped list never fail on a stored value."""
    root = tmp_path / "src" / "workflows"
    root.mkdir(parents=True)
    source = FLOW.replace('await step.sleep("replay", 1000);', "")
    (root / "flow.ts").write_text(source)
    db = tmp_path / "j.db"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "qjsflow.runner.cli", "--db", str(db), *args],
            cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    published = cli("--json", "publish", str(tmp_path / "src"), "--scope", "acme")
    snapshot = orjson.loads(published.stdout)["snapshot_id"]
    started = cli("--json", "start", "flow", "--scope", "acme", "--snapshot", snapshot,
                  "--run-id", "r1")  # fmt: skip
    assert started.returncode == 0, started.stderr
    assert cli("worker", "--until-idle").returncode == 0
    assert orjson.loads(cli("--json", "status", "r1").stdout)["status"] == "completed"
    for args in (("status", "r1", "--scope", "acme"), ("steps", "r1", "--scope", "acme"),
                 ("list",)):  # fmt: skip
        for json in ((), ("--json",)):
            done = cli(*json, *args)
            assert done.returncode == 0, (args, done.stderr)
            if json:
                orjson.loads(done.stdout)
    steps = orjson.loads(cli("--json", "steps", "r1", "--scope", "acme").stdout)
    outputs = {s["name"]: s["output"] for s in steps}
    for index, vector in enumerate(VECTORS):
        assert outputs[f"v{index}"] == vector.json, vector.kind


async def test_tool_arguments_of_every_kind_reach_the_tool(clocked_runner: Runner) -> None:
    seen: list[object] = []

    async def record(args: object) -> object:
        seen.append(args)
        return args

    source = FLOW.replace(
        'await step.sleep("replay", 1000);',
        'await step.tool("t", "record", first);',
    )
    run = await start_source(
        clocked_runner, source, None, bindings=Bindings(tools={"record": record})
    )
    assert run.status == "completed", run.error
    assert repr(seen) == repr([[v.python for v in VECTORS]])
