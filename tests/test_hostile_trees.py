"""docs/ARCHITECTURE.md (Publishing): a source tree is hostile. Each refusal names the offending import or file,
stores nothing, and carries no byte of any host file in its message."""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

import pytest

from qjsflow.bundles import BuildLimits, PublishError, SourceTreeError, TreeLimits
from qjsflow.runner import Runner, RunnerConfig
from tests.journal_reads import table_counts

ENTRY = "workflows/evil.ts"


@pytest.fixture
def secret(tmp_path: Path) -> tuple[Path, str]:
    """A host file outside every tree, holding a marker no refusal may echo."""
    marker = f"HOST-SECRET-{uuid.uuid4().hex}"
    path = tmp_path / "outside" / "secret.ts"
    path.parent.mkdir()
    path.write_text(f'export const secret = "{marker}";\n')
    return path, marker


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "project" / "tree"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def _importing(specifier: str, attributes: str = "") -> str:
    return f'import x from "{specifier}"{attributes};\nexport default async () => x;\n'


async def _refused(runner: Runner, tree: Path, marker: str) -> str:
    counts = table_counts(runner.store)
    with pytest.raises(PublishError) as caught:
        await runner.publish("acme", tree)
    message = str(caught.value)
    assert marker not in message
    assert table_counts(runner.store) == counts
    return message


pytestmark = pytest.mark.timeout(30)


async def test_absolute_import(runner: Runner, tmp_path: Path, secret: tuple[Path, str]) -> None:
    path, marker = secret
    tree = _tree(tmp_path, {ENTRY: _importing(str(path))})
    message = await _refused(runner, tree, marker)
    assert f"{ENTRY}:1:14: imports a file outside the snapshot: {path}" in message


async def test_parent_import_escaping_the_tree(
    runner: Runner, tmp_path: Path, secret: tuple[Path, str]
) -> None:
    _, marker = secret
    tree = _tree(tmp_path, {ENTRY: _importing("../../../outside/secret")})
    message = await _refused(runner, tree, marker)
    assert "imports a file outside the snapshot: ../../../outside/secret" in message


async def test_text_import_of_proc_environ(runner: Runner, tmp_path: Path) -> None:
    marker = f"ENV-MARKER-{uuid.uuid4().hex}"
    os.environ["QJSFLOW_TEST_MARKER"] = marker
    try:
        tree = _tree(tmp_path, {ENTRY: _importing("/proc/self/environ", ' with {type: "text"}')})
        message = await _refused(runner, tree, marker)
    finally:
        del os.environ["QJSFLOW_TEST_MARKER"]
    assert "imports a file outside the snapshot: /proc/self/environ" in message


async def test_json_import_of_a_host_file(
    runner: Runner, tmp_path: Path, secret: tuple[Path, str]
) -> None:
    path, marker = secret
    tree = _tree(tmp_path, {ENTRY: _importing(str(path), ' with {type: "json"}')})
    await _refused(runner, tree, marker)


async def test_dev_zero_is_refused_not_read(runner: Runner, tmp_path: Path) -> None:
    tree = _tree(tmp_path, {ENTRY: _importing("/dev/zero", ' with {type: "text"}')})
    assert "outside the snapshot: /dev/zero" in await _refused(runner, tree, "\0")


async def test_symlink_pointing_outside(
    runner: Runner, tmp_path: Path, secret: tuple[Path, str]
) -> None:
    path, marker = secret
    tree = _tree(tmp_path, {ENTRY: _importing("../lib/link")})
    (tree / "lib").mkdir()
    (tree / "lib" / "link.ts").symlink_to(path)
    message = await _refused(runner, tree, marker)
    assert "lib/link.ts: is a symlink" in message


async def test_bare_import_resolvable_only_from_an_ancestor_node_modules(
    runner: Runner, tmp_path: Path
) -> None:
    marker = f"PACKAGE-SECRET-{uuid.uuid4().hex}"
    package = tmp_path / "project" / "node_modules" / "evil"
    package.mkdir(parents=True)
    (package / "package.json").write_text('{"name": "evil", "main": "index.js"}')
    (package / "index.js").write_text(f'module.exports = "{marker}";\n')
    tree = _tree(tmp_path, {ENTRY: _importing("evil")})
    message = await _refused(runner, tree, marker)
    assert f'{ENTRY}:1:14: imports the package "evil"' in message


async def test_tsconfig_paths_pointing_outside(
    runner: Runner, tmp_path: Path, secret: tuple[Path, str]
) -> None:
    _, marker = secret
    tsconfig = '{"compilerOptions": {"baseUrl": ".", "paths": {"@lib/*": ["../../outside/*"]}}}'
    tree = _tree(tmp_path, {ENTRY: _importing("@lib/secret"), "tsconfig.json": tsconfig})
    message = await _refused(runner, tree, marker)
    assert 'imports the package "@lib/secret"' in message


async def test_directory_package_json_main_pointing_outside(
    runner: Runner, tmp_path: Path, secret: tuple[Path, str]
) -> None:
    _, marker = secret
    tree = _tree(
        tmp_path,
        {
            ENTRY: _importing("../lib"),
            "lib/package.json": '{"main": "../../../outside/secret.ts"}',
        },
    )
    await _refused(runner, tree, marker)


async def test_fifo_in_the_tree(runner: Runner, tmp_path: Path) -> None:
    tree = _tree(tmp_path, {ENTRY: _importing("../data/feed.txt", ' with {type: "text"}')})
    (tree / "data").mkdir()
    os.mkfifo(tree / "data" / "feed.txt")
    message = await _refused(runner, tree, "never")
    assert "data/feed.txt: is a FIFO" in message


async def test_socket_in_the_tree(runner: Runner, tmp_path: Path) -> None:
    tree = _tree(tmp_path, {ENTRY: _importing("./x")})
    listener = socket.socket(socket.AF_UNIX)
    try:
        listener.bind(str(tree / "workflows" / "x.ts"))
        message = await _refused(runner, tree, "never")
    finally:
        listener.close()
    assert "workflows/x.ts: is a socket" in message


async def test_the_tree_root_itself_may_not_be_a_symlink(runner: Runner, tmp_path: Path) -> None:
    tree = _tree(tmp_path, {ENTRY: _importing("./x")})
    link = tmp_path / "link"
    link.symlink_to(tree)
    with pytest.raises(SourceTreeError, match="is not a folder"):
        await runner.publish("acme", link)


@pytest.mark.parametrize(
    ("limits", "files", "problem"),
    [
        (TreeLimits(max_files=2), {"a.ts": "", "b.ts": ""}, "reach more than 2 files"),
        (TreeLimits(max_file_bytes=200), {"a.ts": "x" * 201}, "a.ts: is larger than 200 bytes"),
        (
            TreeLimits(max_total_bytes=300),
            {"a.ts": "//" + "x" * 150, "b.ts": "//" + "y" * 150},
            "reach more than 300 bytes",
        ),
        (TreeLimits(max_depth=2), {"a/b/c.ts": ""}, "a/b/c.ts: is nested deeper than 2"),
    ],
)
async def test_caps_apply_to_what_the_entries_reach(
    tmp_path: Path, limits: TreeLimits, files: dict[str, str], problem: str
) -> None:
    imports = "".join(f'import "../{name}";\n' for name in files)
    unreached = {f"unreached/{name}": text for name, text in files.items()}
    entry = f"{imports}export default async () => 1;\n"
    tree = _tree(tmp_path, {ENTRY: entry, **files})
    async with Runner.open(tmp_path / "j.db", RunnerConfig(tree_limits=limits)) as runner:
        with pytest.raises(PublishError, match=problem):
            await runner.publish("acme", tree)
        # The same files, imported by nothing, are no problem.
        quiet = _tree(tmp_path / "quiet", {ENTRY: "export default async () => 1;\n", **unreached})
        assert (await runner.publish("acme", quiet)).workflows


@pytest.mark.parametrize(
    "path", ["/abs.ts", "../up.ts", "a/../b.ts", "a//b.ts", "./a.ts", "a\\b.ts", 'q"uote.ts']
)
async def test_mapping_paths_must_be_plain(runner: Runner, path: str) -> None:
    with pytest.raises(SourceTreeError, match="is not a plain relative path"):
        await runner.publish("acme", {ENTRY: "export default 1;\n", path: "x"})


async def test_runner_keeps_working_after_refusals(runner: Runner, tmp_path: Path) -> None:
    bad = _tree(tmp_path, {ENTRY: _importing("/etc/passwd", ' with {type: "text"}')})
    with pytest.raises(PublishError):
        await runner.publish("acme", bad)
    good = await runner.publish("acme", {ENTRY: "export default async () => 1;\n"})
    assert good.created


async def test_bundles_over_the_output_cap_stop_the_build_early(tmp_path: Path) -> None:
    """150 workflows importing one 200 KB module: about 30 MB of bundles. The build stops at
    the cap instead of holding every bundle in memory first."""
    shared = "export const big = " + repr("x" * 200_000).replace("'", '"') + ";\n"
    files = {"lib/big.ts": shared}
    for n in range(150):
        files[f"workflows/w{n}.ts"] = (
            'import { big } from "../lib/big";\nexport default async () => big.length;\n'
        )
    config = RunnerConfig(build_limits=BuildLimits(max_output_bytes=2 * 1024 * 1024))
    async with Runner.open(tmp_path / "j.db", config) as runner:
        with pytest.raises(PublishError, match="larger than 2097152 bytes"):
            await runner.publish("acme", files)
        assert table_counts(runner.store)["snapshots"] == 0
