"""After a secrets test: no secret's value anywhere a person or a process could read it back —
the journal's files (and its scope databases) byte by byte, every CLI view of every run, and
the console's pages and API."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
from collections.abc import Iterable
from pathlib import Path

import httpx
import uvicorn

from qjsflow.runner import Runner, RunnerConfig
from qjsflow.runner.console import create_app
from tests.conftest import PROJECT_ROOT

_VIEWS = ("status", "steps", "logs", "tools", "history", "timeline")


def assert_no_secret_anywhere(
    values: Iterable[str], journal: Path, runs: Iterable[tuple[str, str]], scope_root: Path
) -> None:
    """`runs` are (scope, run id); `journal` a SQLite journal file, `scope_root` its scope
    databases' folder."""
    secrets = [value for value in values if value]
    runs = list(runs)
    files = [p for p in journal.parent.glob(journal.name + "*") if p.is_file()]
    files += [p for p in scope_root.rglob("*") if p.is_file()] if scope_root.exists() else []
    for path in files:
        data = path.read_bytes()
        for secret in secrets:
            assert secret.encode() not in data, f"a secret's value is in {path.name}"
    for scope, run_id in runs:
        for view in _VIEWS:
            for as_json in (True, False):
                shown = _cli(journal, view, run_id, "--scope", scope, *(["--json"] * as_json))
                _nowhere(secrets, shown, f"qjsflow {view}")
    _nowhere(secrets, _cli(journal, "list"), "qjsflow list")
    _nowhere(secrets, _console_texts(journal, scope_root, runs), "the console")


def _nowhere(secrets: list[str], text: str, where: str) -> None:
    for secret in secrets:
        assert secret not in text, f"a secret's value is shown by {where}"


def _cli(journal: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "qjsflow.runner.cli", "--db", str(journal), *args],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    return done.stdout + done.stderr


def _console_texts(journal: Path, scope_root: Path, runs: list[tuple[str, str]]) -> str:
    config = RunnerConfig(scope_root=scope_root)

    async def factory() -> Runner:
        return await Runner.connect(journal, config, create=False)

    # Bound and listening before the server runs: requests wait in the socket's backlog until
    # it accepts them, so nothing has to watch for it to start.
    listening = socket.create_server(("127.0.0.1", 0))
    port = listening.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(factory, None), log_level="warning"))
    thread = threading.Thread(
        target=lambda: asyncio.run(server.serve(sockets=[listening])), daemon=True
    )
    thread.start()
    try:
        texts = []
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            for path in ("/runs", "/api/runs", "/usage", "/api/snapshots"):
                texts.append(client.get(path).text)
            for scope, run_id in runs:
                for prefix in ("/runs", "/api/runs"):
                    answered = client.get(f"{prefix}/{scope}/{run_id}")
                    assert answered.status_code == 200, answered.text[:200]
                    texts.append(answered.text)
        return "\n".join(texts)
    finally:
        server.should_exit = True
        thread.join(10)
        listening.close()
