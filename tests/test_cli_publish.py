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


def test_refused_tree_exits_2_with_one_line(tmp_path: Path) -> None:
    tree = tmp_path / "tree" / "workflows"
    tree.mkdir(parents=True)
    (tree / "bad.ts").write_text('import "/etc/passwd";\nexport default 1;\n')
    done = _qjsflow("--db", str(tmp_path / "j.db"), "publish", str(tree.parent), "--scope", "a")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert "imports a file outside the snapshot: /etc/passwd" in done.stderr
    assert "Traceback" not in done.stderr


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
