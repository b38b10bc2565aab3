"""`qjsflow publish` through a real subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from tests.conftest import FIXTURES


def _qjsflow(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "qjsflow.runner.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_publish_json_is_one_document(tmp_path: Path) -> None:
    db = str(tmp_path / "j.db")
    done = _qjsflow("--db", db, "--json", "publish", str(FIXTURES), "--scope", "acme")
    assert done.returncode == 0, done.stderr
    document = orjson.loads(done.stdout)
    assert len(document["snapshot_id"]) == 64
    assert {w["workflow"] for w in document["workflows"]} == {
        "order-approval",
        "CrmSync",
        "daily-digest",
    }
    again = _qjsflow("--db", db, "--json", "publish", str(FIXTURES), "--scope", "acme")
    assert orjson.loads(again.stdout) == {**document, "created": False}
    assert document["warnings"] == []


def test_refused_tree_exits_2_with_a_line_per_error_and_hints(tmp_path: Path) -> None:
    tree = tmp_path / "tree" / "workflows"
    tree.mkdir(parents=True)
    (tree / "bad.ts").write_text('import "/etc/passwd";\nexport default 1;\n')
    (tree / "worse.ts").write_text('import { z } from "zod";\nexport default () => z;\n')
    (tree / "worst.ts").write_text(
        'import { Nope } from "cloudflare:workers";\nexport default () => Nope;\n'
    )
    done = _qjsflow("--db", str(tmp_path / "j.db"), "publish", str(tree.parent), "--scope", "a")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "qjsflow: error: workflows/bad.ts:1:7: imports a file outside the snapshot: /etc/passwd"
        " (absolute import)",
        "  hint: a snapshot holds only the published folder: move the file into it",
        'qjsflow: error: workflows/worse.ts:1:18: imports the package "zod", which is not'
        " installed: install it into node_modules inside the tree",
        "  hint: run `npm install` in the published folder, so the package lands in its"
        " node_modules",
        'qjsflow: error: workflows/worst.ts:1:9: No matching export in "cloudflare:workers" for'
        ' import "Nope"',
        "  hint: see the authoring guide (README) for what qjsflow provides",
    ]


def test_a_manifest_beyond_the_scope_policy_exits_2_naming_it(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "workflows").mkdir(parents=True)
    (tree / "workflows" / "flow.ts").write_text("export default async () => 1;\n")
    (tree / "qjsflow.json").write_text('{"capabilities": {"tools": ["crm.sync"], "sql": "write"}}')
    env = tmp_path / "env.json"
    env.write_text('{"acme": {"capabilities": {"tools": ["crm.*"], "sql": "read"}}}')
    db = str(tmp_path / "j.db")
    done = _qjsflow("--db", db, "--env", str(env), "publish", str(tree), "--scope", "acme")
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "qjsflow: error: the snapshot's manifest asks for more than scope 'acme' allows:"
        " sql 'write' (the policy allows 'read')"
    )
    (tree / "qjsflow.json").write_text('{"capabilities": {"tools": ["crm.sync"], "sql": "read"}}')
    done = _qjsflow("--db", db, "--env", str(env), "publish", str(tree), "--scope", "acme")
    assert done.returncode == 0, done.stderr
    assert "capabilities: tools crm.sync; bindings (none); fetch (none); sql read" in done.stdout
    listed = _qjsflow("--db", db, "snapshots")
    assert "tools crm.sync;" in listed.stdout


def test_bad_scope_exits_2(tmp_path: Path) -> None:
    done = _qjsflow("--db", str(tmp_path / "j.db"), "publish", str(FIXTURES), "--scope", "../b")
    assert done.returncode == 2
    assert "invalid scope '../b'" in done.stderr


@pytest.mark.slow
def test_snapshots_are_listed_and_start_takes_a_prefix_or_latest(tmp_path: Path) -> None:
    db = str(tmp_path / "j.db")
    published = orjson.loads(
        _qjsflow("--db", db, "--json", "publish", str(FIXTURES), "--scope", "acme").stdout
    )
    listed = orjson.loads(_qjsflow("--db", db, "--json", "snapshots").stdout)
    assert [(s["scope"], s["snapshot_id"]) for s in listed] == [("acme", published["snapshot_id"])]
    human = _qjsflow("--db", db, "snapshots", "--scope", "acme").stdout
    assert published["snapshot_id"][:16] in human
    assert "CrmSync, daily-digest, order-approval" in human
    for reference in ("latest", published["snapshot_id"][:8]):
        started = _qjsflow("--db", db, "--json", "start", "daily-digest", "--scope", "acme",
                           "--snapshot", reference, "--input", '{"items": []}')  # fmt: skip
        assert started.returncode == 0, started.stderr
        assert orjson.loads(started.stdout)["snapshot_id"] == published["snapshot_id"]
    elsewhere = _qjsflow("--db", db, "start", "daily-digest", "--scope", "beta",
                         "--snapshot", "latest")  # fmt: skip
    assert elsewhere.returncode == 2
    assert "no snapshot 'latest' in scope 'beta'" in elsewhere.stderr


def test_a_cloudflare_project_from_its_root_and_entries_by_class(tmp_path: Path) -> None:
    from tests.test_cloudflare_projects import _project  # noqa: PLC0415  (its tree)

    root = _project(tmp_path / "p")
    db = str(tmp_path / "j.db")
    done = _qjsflow("--db", db, "--json", "publish", str(root), "--scope", "cf")
    assert done.returncode == 0, done.stderr
    document = orjson.loads(done.stdout)
    assert [w["workflow"] for w in document["workflows"]] == ["reporter", "workflows-starter"]
    assert any("virtual:react-router/server-build" in w for w in document["warnings"])
    assert 'qjsflow: warning: src/index.ts: imports "virtual:react-router' in done.stderr
    (root / "wrangler.jsonc").unlink()
    chosen = _qjsflow("--db", db, "--json", "publish", str(root), "--scope", "cf",
                      "--entry", "src/index.ts:MyWorkflow")  # fmt: skip
    assert chosen.returncode == 0, chosen.stderr
    assert [w["workflow"] for w in orjson.loads(chosen.stdout)["workflows"]] == ["MyWorkflow"]
    wrong = _qjsflow("--db", db, "publish", str(root), "--scope", "cf", "--entry", "src/x.ts:")
    assert wrong.returncode == 2
    assert "names no class after the colon" in wrong.stderr
