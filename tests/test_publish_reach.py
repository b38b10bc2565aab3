"""A snapshot is its entries and the files they import (docs/ARCHITECTURE.md, Publishing):
what nothing imports is never read beyond a name in a scan, never blocks a publish and never
changes the id; npm packages resolve inside the tree's own node_modules."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from qjsflow.bridge import loads
from qjsflow.bundles import PublishError, TreeLimits
from qjsflow.bundles.toolchain import TEST_PACKAGES, checkout_tools_dir
from qjsflow.runner import Runner, RunnerConfig, StartRunInput
from tests.conftest import PROJECT_ROOT
from tests.journal_reads import query

ENTRY = 'import { twice } from "../lib/math";\nexport default async () => twice(21);\n'


def _write(root: Path, files: dict[str, str | bytes]) -> Path:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return root


def _project(root: Path) -> Path:
    return _write(
        root,
        {
            "workflows/answer.ts": ENTRY,
            "lib/math.ts": "export const twice = (n: number) => n * 2;\n",
        },
    )


def _clutter(root: Path, outside: Path) -> None:
    """Everything a real project holds that no workflow imports."""
    _write(
        root,
        {
            "assets/video.bin": os.urandom(2 * 1024 * 1024 + 1),
            "my notes (draft).txt": "thoughts\n",
            "lib/broken.ts": "export const = ;\n",
            ".git/HEAD": "ref: refs/heads/main\n",
            "node_modules/.bin/README": "x\n",
            "README.md": "# a project\n",
        },
    )
    os.mkfifo(root / "feed.fifo")
    (root / "node_modules" / ".bin" / "tsc").symlink_to("/usr/bin/env")
    (root / "lib" / "outside.ts").symlink_to(outside)


async def test_unreached_files_never_block_and_never_change_the_id(
    runner: Runner, tmp_path: Path
) -> None:
    secret = _write(tmp_path / "outside", {"secret.ts": "export const s = 1;\n"}) / "secret.ts"
    plain = await runner.publish("acme", _project(tmp_path / "plain"))
    cluttered_root = _project(tmp_path / "cluttered")
    _clutter(cluttered_root, secret)
    cluttered = await runner.publish("acme", cluttered_root)
    assert cluttered.snapshot_id == plain.snapshot_id
    assert cluttered.created is False
    run = await runner.start(StartRunInput("acme", "answer", plain.snapshot_id))
    assert (run.status, run.output) == ("completed", 42)


async def test_a_changed_imported_byte_changes_the_id(runner: Runner, tmp_path: Path) -> None:
    root = _project(tmp_path / "tree")
    first = await runner.publish("acme", root)
    (root / "lib" / "math.ts").write_text("export const twice = (n: number) => n + n;\n")
    assert (await runner.publish("acme", root)).snapshot_id != first.snapshot_id


async def test_the_journal_inside_the_tree_is_never_read(tmp_path: Path) -> None:
    root = _project(tmp_path / "tree")
    async with Runner.open(tmp_path / "elsewhere.db") as outside:
        without = await outside.publish("acme", root)
    async with Runner.open(root / "qjsflow.db") as runner:
        first = await runner.publish("acme", root)  # the journal and its -wal exist now
        await runner.start(StartRunInput("acme", "answer", first.snapshot_id))
        again = await runner.publish("acme", root)
    assert (again.snapshot_id, again.created) == (first.snapshot_id, False)
    assert first.snapshot_id == without.snapshot_id


@pytest.mark.slow
def test_publishing_dot_twice_from_the_shell_gives_one_id(tmp_path: Path) -> None:
    root = _project(tmp_path / "tree")

    def publish() -> str:
        done = subprocess.run(
            [sys.executable, "-m", "qjsflow.runner.cli", "--json", "publish", ".", "--scope", "a"],
            cwd=root, env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
            capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        return str(loads(done.stdout)["snapshot_id"])

    assert publish() == publish()
    assert (root / "qjsflow.db").exists()
    from_above = subprocess.run(
        [sys.executable, "-m", "qjsflow.runner.cli", "--db", "j.db", "--json", "publish", "tree",
         "--scope", "a"],
        cwd=root.parent, env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert from_above.returncode == 0, from_above.stderr
    assert loads(from_above.stdout)["snapshot_id"] == publish()


async def test_version_control_ignored_folders_and_npm_links_are_not_even_scanned(
    tmp_path: Path,
) -> None:
    root = _project(tmp_path / "tree")
    crowd = {f"{folder}/f{i}.txt": "x" for folder in (".git", "build") for i in range(60)}
    _write(root, {**crowd, ".qjsflowignore": "build/\n"})
    _write(root, {f"node_modules/.bin/t{i}": "x" for i in range(60)})
    limits = TreeLimits(max_scan_entries=40)
    async with Runner.open(tmp_path / "j.db", RunnerConfig(tree_limits=limits)) as runner:
        assert (await runner.publish("acme", root)).workflows
        _write(root, {f"visible/f{i}.txt": "x" for i in range(60)})
        with pytest.raises(PublishError, match="holds more than 40 entries"):
            await runner.publish("acme", root)


async def test_an_ignored_file_that_is_imported_is_refused_naming_the_rule(
    runner: Runner, tmp_path: Path
) -> None:
    root = _write(
        tmp_path / "tree",
        {
            "workflows/leak.ts": 'import { key } from "../secrets/key";\nexport default () => key;\n',
            "secrets/key.ts": 'export const key = "k";\n',
            ".qjsflowignore": "# local only\nsecrets/\n",
        },
    )
    with pytest.raises(PublishError, match=r"secrets/key.ts: is ignored by \.qjsflowignore"):
        await runner.publish("acme", root)


# -- npm packages ------------------------------------------------------------------------------

ORDERS = """
import { z } from "zod";
import { z as z4 } from "zod/v4";
import { Hono } from "hono";
export default async (event: { payload: unknown }, step: any) => {
  const Order = z.object({ id: z.string(), qty: z.number().int().positive() });
  const parsed = Order.safeParse(event.payload);
  const strict = z4.object({ id: z4.string() }).safeParse(event.payload).success;
  const app = new Hono();
  app.get("/orders/:id", (c) => c.text("x"));
  const total = await step.do("total", async () => (parsed.success ? parsed.data.qty * 2 : 0));
  const issues = parsed.success ? [] : parsed.error.issues.map((i) => i.path.join("."));
  return { ok: parsed.success, strict, total, issues, routes: app.routes.map((r) => r.path) };
};
"""


def _with_packages(root: Path) -> Path:
    installed = checkout_tools_dir() / "test-packages" / "node_modules"
    for name, version in TEST_PACKAGES.items():
        manifest = installed / name / "package.json"
        assert manifest.is_file(), f"{name} is missing: run `make setup`"
        assert loads(manifest.read_bytes())["version"] == version
        shutil.copytree(installed / name, root / "node_modules" / name, symlinks=True)
    return root


async def test_zod_and_hono_from_node_modules_bundle_and_run(
    runner: Runner, tmp_path: Path
) -> None:
    root = _with_packages(_write(tmp_path / "tree", {"workflows/orders.ts": ORDERS}))
    published = await runner.publish("acme", root)
    good = await runner.start(
        StartRunInput("acme", "orders", published.snapshot_id, {"id": "a", "qty": 3})
    )
    assert good.output == {
        "ok": True, "strict": True, "total": 6, "issues": [], "routes": ["/orders/:id"],
    }  # fmt: skip
    bad = await runner.start(
        StartRunInput("acme", "orders", published.snapshot_id, {"id": 1, "qty": -1})
    )
    assert bad.output["issues"] == ["id", "qty"]
    # Only what the workflow imports is in the snapshot, not all of both packages.
    [(file_count,)] = query(runner.store.location, "SELECT file_count FROM snapshots")
    package_files = sum(1 for path in (root / "node_modules").rglob("*") if path.is_file())
    assert 1 < file_count < package_files / 4


async def test_a_package_that_needs_a_node_builtin_fails_naming_both(
    runner: Runner, tmp_path: Path
) -> None:
    root = _write(
        tmp_path / "tree",
        {
            "workflows/w.ts": 'import { read } from "needs-fs";\nexport default () => read();\n',
            "node_modules/needs-fs/package.json": '{"name": "needs-fs", "main": "index.js"}',
            "node_modules/needs-fs/index.js": (
                'import { readFileSync } from "fs";\nexport const read = () => readFileSync("x");\n'
            ),
        },
    )
    with pytest.raises(PublishError) as caught:
        await runner.publish("acme", root)
    assert (
        'node_modules/needs-fs/index.js:1:29: imports (through the package "needs-fs") '
        'the Node built-in "fs"' in str(caught.value)
    )


@pytest.mark.parametrize("specifier", ["node:net", "net", "node:fs/promises"])
async def test_node_builtins_are_refused_in_author_code(
    runner: Runner, tmp_path: Path, specifier: str
) -> None:
    source = f'import * as m from "{specifier}";\nexport default () => typeof m;\n'
    with pytest.raises(PublishError, match="the Node built-in"):
        await runner.publish("acme", {"workflows/w.ts": source})


async def test_a_package_linked_from_outside_the_tree_is_refused(
    runner: Runner, tmp_path: Path
) -> None:
    marker = f"OUTSIDE-{uuid.uuid4().hex}"
    outside = _write(
        tmp_path / "elsewhere" / "evil",
        {
            "package.json": '{"name": "evil", "main": "index.js"}',
            "index.js": f'export default "{marker}";\n',
        },
    )
    root = _write(
        tmp_path / "tree", {"workflows/w.ts": 'import e from "evil";\nexport default () => e;\n'}
    )
    (root / "node_modules").mkdir()
    (root / "node_modules" / "evil").symlink_to(outside, target_is_directory=True)
    with pytest.raises(PublishError) as caught:
        await runner.publish("acme", root)
    assert marker not in str(caught.value)
    assert "node_modules/evil: is a symlink pointing outside the tree" in str(caught.value)


async def test_a_socket_nothing_imports_is_no_problem(runner: Runner, tmp_path: Path) -> None:
    root = _project(tmp_path / "tree")
    listener = socket.socket(socket.AF_UNIX)
    try:
        listener.bind(str(root / "lib" / "debug.sock"))
        assert (await runner.publish("acme", root)).workflows
    finally:
        listener.close()


@pytest.mark.slow
async def test_a_pnpm_layout_links_inside_the_tree(runner: Runner, tmp_path: Path) -> None:
    """pnpm installs packages in node_modules/.pnpm and links them: links inside the tree
    resolve; the snapshot holds the files they point at."""
    root = _write(tmp_path / "tree", {"workflows/orders.ts": ORDERS})
    store = root / "node_modules" / ".pnpm"
    installed = checkout_tools_dir() / "test-packages" / "node_modules"
    for name in TEST_PACKAGES:
        target = store / f"{name}@pinned" / "node_modules" / name
        shutil.copytree(installed / name, target, symlinks=True)
        (root / "node_modules" / name).symlink_to(
            os.path.relpath(target, root / "node_modules"), target_is_directory=True
        )
    published = await runner.publish("acme", root)
    run = await runner.start(
        StartRunInput("acme", "orders", published.snapshot_id, {"id": "a", "qty": 1})
    )
    assert run.output["total"] == 2
