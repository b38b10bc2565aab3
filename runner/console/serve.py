"""Serving the console with uvicorn: loopback by default; beyond it only with a token file."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Sequence
from pathlib import Path

import uvicorn

from qjsflow.bridge import InvalidInput
from qjsflow.runner.config import RunnerConfig
from qjsflow.runner.console.app import create_app
from qjsflow.runner.console.auth import Tokens
from qjsflow.runner.console.guard import host_names
from qjsflow.runner.runner import Runner

__all__ = ["serve_console"]


def serve_console(
    db: str,
    config: RunnerConfig,
    *,
    host: str,
    port: int,
    token_file: str | None,
    allow_hosts: Sequence[str] = (),
) -> None:
    """Serve until stopped; the console answers the loopback names, `host` and
    `allow_hosts` (the names people reach it by) and no other `Host`."""
    if not 0 < port < 65536:
        raise InvalidInput("--port must be 1 to 65535")
    names = host_names(host, allow_hosts)  # a bad name: one line, before anything else
    tokens = None if token_file is None else Tokens.load(token_file)
    if tokens is None and not _loopback(host):
        raise InvalidInput(f"listening on {host[:80]!r} needs --token-file: without one, anyone "
                           "who reaches the port can see and steer every run")  # fmt: skip
    if not Path(db).exists() and not db.startswith("postgresql://"):
        raise InvalidInput(f"no journal database at {db}: publish something first")

    async def runner() -> Runner:
        return await Runner.connect(db, config, create=False)

    async def check() -> None:  # a journal that cannot be opened: one line, before serving
        await (await runner()).aclose()

    asyncio.run(check())

    app = create_app(runner, tokens, names)
    uvicorn.run(app, host=host, port=port, log_level="warning", server_header=False)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
