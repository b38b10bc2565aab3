"""Publishing real trees with the real esbuild into a real journal file."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import quickjs

from qjsflow.bridge import InvalidInput
from qjsflow.bundles import BundleError, SourceTreeError, build_snapshot
from qjsflow.runner import ALL_SCOPES, InvalidScope, Runner, SnapshotNotFound, StartRunInput
from tests.conftest import FIXTURES
from tests.journal_reads import table_counts

FUNCTION_STYLE = """
import { helper } from "../lib/x";
export default async function run(event: { payload: number }, step: unknown) {
  return helper(event.payload);
}
"""


def _copy_fixtures(tmp_path: Path) -> Path:
    target = tmp_path / "tree"
    shutil.copytree(FIXTURES, target)
    return target


def _evaluate(code: str, expression: str) -> object:
    context = quickjs.Context()
    context.eval(code)
    return context.eval(expression)


async def test_same_tree_twice_is_one_snapshot_and_stores_nothing_new(
    runner: Runner, tmp_path: Path
) -> None:
    tree = _copy_fixtures(tmp_path)
    first = await runner.publish("acme", tree)
    counts = table_counts(runner.store)
    second = await runner.publish("acme", tree)
    assert first.created
    assert not second.created
    assert second.snapshot_id == first.snapshot_id
    assert table_counts(runner.store) == counts
    assert counts["bundles"] == len(first.workflows) == 3


async def test_one_changed_byte_gives_a_new_snapshot(runner: Runner, tmp_path: Path) -> None:
    tree = _copy_fixtures(tmp_path)
    first = await runner.publish("acme", tree)
    lib = tree / "lib" / "format.ts"
    lib.write_bytes(lib.read_bytes().replace(b"toFixed(2)", b"toFixed(3)"))
    second = await runner.publish("acme", tree)
    assert second.created
    assert second.snapshot_id != first.snapshot_id


async def test_workflows_are_named_by_stem_or_class(runner: Runner) -> None:
    result = await runner.publish("acme", FIXTURES)
    assert {(w.workflow, w.entry_path) for w in result.workflows} == {
        ("order-approval", "workflows/order-approval.ts"),
        ("CrmSync", "workflows/crm-sync.js"),
        ("daily-digest", "workflows/daily-digest.ts"),
    }


async def test_ts_entry_importing_across_folders_evaluates_in_quickjs(runner: Runner) -> None:
    result = await runner.publish(
        "acme",
        {
            "workflows/double.ts": FUNCTION_STYLE,
            "lib/x.ts": "export const helper = (n: number): number => n * 2;\n",
        },
    )
    bundle = await runner.store.load_bundle("acme", result.snapshot_id, "double")
    assert bundle is not None
    assert bundle.entry_path == "workflows/double.ts"
    assert _evaluate(bundle.code, "typeof __qjsflow_module.default") == "function"
    assert _evaluate(bundle.code, "__qjsflow_module.default({payload: 21}).constructor.name") == (
        "Promise"
    )


async def test_class_style_entry_extends_the_shim_entrypoint(runner: Runner) -> None:
    result = await runner.publish("acme", FIXTURES)
    bundle = await runner.store.load_bundle("acme", result.snapshot_id, "CrmSync")
    assert bundle is not None
    probe = "Object.getPrototypeOf(__qjsflow_module.CrmSync).name"
    assert _evaluate(bundle.code, probe) == "WorkflowEntrypoint"


async def test_explicit_entries_replace_the_default(runner: Runner) -> None:
    result = await runner.publish(
        "acme",
        {"flows/one.js": "export default async () => 1;\n", "README.md": "notes\n"},
        entries=["flows/one.js"],
    )
    assert [(w.workflow, w.entry_path) for w in result.workflows] == [("one", "flows/one.js")]


async def test_syntax_error_names_file_line_and_column(runner: Runner) -> None:
    counts = table_counts(runner.store)
    source = "export default async function run() {\n  const x = ;\n}\n"
    with pytest.raises(BundleError) as caught:
        await runner.publish("acme", {"workflows/broken.ts": source})
    assert 'workflows/broken.ts:2:12: Unexpected ";"' in str(caught.value)
    assert table_counts(runner.store) == counts


async def test_snapshots_belong_to_their_scope(runner: Runner) -> None:
    result = await runner.publish("acme", FIXTURES)
    assert await runner.store.find_snapshot("acme", result.snapshot_id) is not None
    assert await runner.store.find_snapshot("other", result.snapshot_id) is None
    assert await runner.store.load_bundle("other", result.snapshot_id, "CrmSync") is None


@pytest.mark.parametrize("scope", ["", "A", "../b", "a/../../j", "x" * 65, "-a"])
async def test_invalid_scopes_are_refused(runner: Runner, scope: str) -> None:
    with pytest.raises(InvalidScope, match="invalid scope"):
        await runner.publish(scope, FIXTURES)


async def test_a_tree_without_workflows_is_refused(runner: Runner) -> None:
    with pytest.raises(SourceTreeError, match=r"workflows/: holds no \.ts or \.js file"):
        await runner.publish("acme", {"lib/x.ts": "export const x = 1;\n"})


async def test_two_workflows_with_one_name_are_refused_naming_both_files(runner: Runner) -> None:
    flow = "export default async () => 1;\n"
    with pytest.raises(SourceTreeError, match=r"workflows/a\.ts: defines the workflow 'a', as "):
        await runner.publish("acme", {"workflows/a.ts": flow, "workflows/a.js": flow})
    orders = (
        'import { WorkflowEntrypoint } from "cloudflare:workers";\n'
        "export class Orders extends WorkflowEntrypoint { async run() { return 1; } }\n"
    )
    with pytest.raises(
        SourceTreeError,
        match=r"workflows/y\.ts: defines the workflow 'Orders', as workflows/x\.ts does",
    ):
        await runner.publish("acme", {"workflows/x.ts": orders, "workflows/y.ts": orders})


async def test_snapshots_are_listed_and_found_by_prefix_or_latest(runner: Runner) -> None:
    older = await runner.publish("acme", {"workflows/a.ts": "export default () => 1;\n"})
    newer = await runner.publish("acme", {"workflows/b.ts": "export default () => 2;\n"})
    other = await runner.publish("beta", {"workflows/c.ts": "export default () => 3;\n"})
    listed = await runner.snapshots(scope="acme")
    assert [s.snapshot_id for s in listed] == [newer.snapshot_id, older.snapshot_id]
    assert [w.workflow for w in listed[0].workflows] == ["b"]
    everyone = await runner.snapshots(scope=ALL_SCOPES)
    assert {s.scope for s in everyone} == {"acme", "beta"}
    assert (await runner.find_snapshot("latest", scope="acme")).snapshot_id == newer.snapshot_id
    prefix = older.snapshot_id[:8]
    assert (await runner.find_snapshot(prefix, scope="acme")).snapshot_id == older.snapshot_id
    run = await runner.start(StartRunInput("acme", "b", "latest"))
    assert (run.snapshot_id, run.output) == (newer.snapshot_id, 2)
    # Another scope's snapshot answers exactly like a missing one.
    for reference in (other.snapshot_id, other.snapshot_id[:10], "0" * 64):
        with pytest.raises(SnapshotNotFound, match=f"no snapshot '{reference}' in scope 'acme'"):
            await runner.find_snapshot(reference, scope="acme")
    for too_short in ("latest ", older.snapshot_id[:7], "LATEST", older.snapshot_id.upper()):
        with pytest.raises(SnapshotNotFound, match="a prefix of it of 8 or more hex digits"):
            await runner.find_snapshot(too_short, scope="acme")


async def test_an_ambiguous_prefix_asks_for_more(runner: Runner) -> None:
    built = await build_snapshot({"workflows/w.ts": "export default () => 1;\n"})
    for tail in ("0", "1"):  # two ids sharing 8 digits: made, as chance would take ages
        twin = dataclasses.replace(built, snapshot_id="abcdef12" + tail * 56)
        await runner.store.insert_snapshot("acme", twin, 0.0)
    with pytest.raises(InvalidInput, match="several snapshots in scope 'acme' start with"):
        await runner.find_snapshot("abcdef12", scope="acme")
    found = await runner.find_snapshot("abcdef121", scope="acme")
    assert found.snapshot_id == "abcdef12" + "1" * 56
