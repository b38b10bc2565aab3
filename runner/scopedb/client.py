"""`ScopeDatabases`: the host's handle on the scope-database process.

Author SQL never runs in the journal's process: one server process (runner/scopedb/server.py)
owns the scope files and is spawned on first use. Requests are answered one at a time; a
request that outlives its deadline by far kills the server, which is started again on the next
call (SQLite's own journal keeps each scope file consistent).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson

from runner.scopedb.policy import SqlLimits
from runner.scopes import validate_scope
from sandbox.frames import FrameError, frame, read_frame_async

__all__ = ["ScopeDatabases", "SqlOutcome"]

_GRACE_S = 10.0


@dataclass(frozen=True, slots=True)
class SqlOutcome:
    result: str | None  # encoded {rows, changes, lastInsertRowid}
    code: str | None
    message: str | None
    elapsed_s: float


class ScopeDatabases:
    def __init__(self, root: Path, limits: SqlLimits | None = None) -> None:
        self.root = root
        self.limits = limits or SqlLimits()
        self._process: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()

    def path_of(self, scope: str) -> Path:
        return self.root / f"{validate_scope(scope)}.sqlite"

    async def execute(
        self, scope: str, *, run_id: str, call_key: str, sql: str, params: str, deadline_s: float
    ) -> SqlOutcome:
        """Run one author statement in `scope`'s database, at most once per `call_key`."""
        validate_scope(scope)  # before any file is touched
        request = orjson.dumps(
            {
                "scope": scope, "runId": run_id, "call": call_key, "sql": sql, "params": params,
                "deadlineS": deadline_s, "limits": asdict(self.limits),
            }
        )  # fmt: skip
        async with self._lock:
            process = await self._server()
            try:
                assert process.stdin is not None
                assert process.stdout is not None
                process.stdin.write(frame(request))
                await process.stdin.drain()
                reply = orjson.loads(
                    await asyncio.wait_for(read_frame_async(process.stdout), deadline_s + _GRACE_S)
                )
            except (TimeoutError, FrameError, ConnectionError) as error:
                await self._stop()
                stopped = "stopped answering" if isinstance(error, TimeoutError) else "died"
                return SqlOutcome(None, "interrupted", f"the SQL process {stopped}", deadline_s)
        if "ok" in reply:
            return SqlOutcome(reply["ok"]["result"], None, None, reply["ok"]["elapsedS"])
        failure = reply["error"]
        return SqlOutcome(None, failure["code"], failure["message"], failure["elapsedS"])

    async def _server(self) -> asyncio.subprocess.Process:
        if self._process is not None and self._process.returncode is None:
            return self._process
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-m", "runner.scopedb.server", str(self.root),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=self.root,
            env={}, limit=2**20,
        )  # fmt: skip
        assert process.stdout is not None
        try:
            ready = await asyncio.wait_for(read_frame_async(process.stdout), 30)
        except (TimeoutError, FrameError):
            process.kill()
            await process.wait()
            raise RuntimeError("the scope-database process failed to start") from None
        if orjson.loads(ready) != {"ready": True}:
            raise RuntimeError("the scope-database process started with a bad greeting")
        self._process = process
        return process

    async def _stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()

    async def aclose(self) -> None:
        async with self._lock:
            process, self._process = self._process, None
            if process is not None and process.stdin is not None:
                process.stdin.close()
                try:
                    await asyncio.wait_for(process.wait(), 5)
                except TimeoutError:
                    process.kill()
                    await process.wait()
