"""`ScopeDatabases`: the host's handle on the scope-database process.

Author SQL never runs in the journal's process: server processes (runner/scopedb/server.py),
one per active scope, are spawned on first use. Each answers its scope's requests one at a
time; a request that outlives its deadline by `kill_grace_s` kills its server, which is
started again on the next call (SQLite's own journal keeps each scope file consistent).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections import OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from qjsflow.bridge.codec import dumps, loads
from qjsflow.runner.scopedb.policy import SqlLimits
from qjsflow.runner.scopes import validate_scope
from qjsflow.sandbox.frames import FrameError, frame, read_frame_async

__all__ = ["ScopeDatabases", "SqlOutcome"]


@dataclass(frozen=True, slots=True)
class SqlOutcome:
    result: str | None  # encoded {rows, changes, lastInsertRowid}
    code: str | None
    message: str | None
    elapsed_s: float


class _ScopeProcess:
    """One server process serving one scope, one request at a time."""

    def __init__(self) -> None:
        self.process: asyncio.subprocess.Process | None = None
        self.lock = asyncio.Lock()

    async def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()


class ScopeDatabases:
    """Author SQL, each scope in a server process of its own: a statement of one scope never
    waits for another scope's (a runaway native function call included)."""

    def __init__(self, root: Path, limits: SqlLimits | None = None) -> None:
        self.root = root
        self.limits = limits or SqlLimits()
        self._scopes: OrderedDict[str, _ScopeProcess] = OrderedDict()
        self.layers: dict[str, Any] = {}  # the confinement the last process reported

    def path_of(self, scope: str) -> Path:
        return self.root / f"{validate_scope(scope)}.sqlite"

    async def execute(
        self,
        scope: str,
        *,
        run_id: str,
        call_key: str,
        sql: str,
        params: str,
        deadline_s: float,
        read_only: bool = False,
    ) -> SqlOutcome:
        """Run one author statement in `scope`'s database, at most once per `call_key`; with
        `read_only`, a statement that would write is refused (`capability_denied`)."""
        validate_scope(scope)  # before any file is touched
        request = dumps(
            {
                "scope": scope, "runId": run_id, "call": call_key, "sql": sql, "params": params,
                "deadlineS": deadline_s, "limits": asdict(self.limits), "readOnly": read_only,
            }
        )  # fmt: skip
        slot = self._slot(scope)
        async with slot.lock:
            try:
                reply = await self._ask(slot, request, deadline_s + self.limits.kill_grace_s)
            except (TimeoutError, FrameError, ConnectionError) as error:
                await slot.stop()
                stopped = "stopped answering" if isinstance(error, TimeoutError) else "died"
                return SqlOutcome(None, "interrupted", f"the SQL process {stopped}", deadline_s)
        await self._evict()
        if "ok" in reply:
            return SqlOutcome(reply["ok"]["result"], None, None, reply["ok"]["elapsedS"])
        failure = reply["error"]
        return SqlOutcome(None, failure["code"], failure["message"], failure["elapsedS"])

    async def forget(self, scope: str, run_ids: list[str]) -> None:
        """Drop the applied-call records of these runs from `scope`'s database, if it has one
        (a pruned run's id used again must run its SQL anew)."""
        if not run_ids or not self.path_of(scope).exists():
            return
        request = dumps({"scope": scope, "forget": run_ids, "limits": asdict(self.limits)})
        slot = self._slot(scope)
        async with slot.lock:
            reply = await self._ask(slot, request, 60.0)
        if "ok" not in reply:
            raise RuntimeError(f"the scope database of {scope!r} could not forget pruned runs")

    async def confinement(self) -> dict[str, Any]:
        """The layers a scope-database process reports (one is started for a scope named
        `doctor` if none has been)."""
        if not self.layers:
            slot = self._slot("doctor")
            async with slot.lock:
                await self._server(slot)
        return dict(self.layers)

    async def _ask(self, slot: _ScopeProcess, request: bytes, wait_s: float) -> Any:
        """One request and its reply; the caller holds the slot's lock."""
        process = await self._server(slot)
        assert process.stdin is not None
        assert process.stdout is not None
        process.stdin.write(frame(request))
        await process.stdin.drain()
        return loads(await asyncio.wait_for(read_frame_async(process.stdout), wait_s))

    def _slot(self, scope: str) -> _ScopeProcess:
        slot = self._scopes.get(scope)
        if slot is None:
            slot = self._scopes[scope] = _ScopeProcess()
        self._scopes.move_to_end(scope)
        return slot

    async def _evict(self) -> None:
        """Keep at most `max_processes`: stop the least recently used idle ones."""
        for scope in list(self._scopes):
            if len(self._scopes) <= self.limits.max_processes:
                return
            slot = self._scopes[scope]
            if not slot.lock.locked():
                del self._scopes[scope]
                await slot.stop()

    async def _server(self, slot: _ScopeProcess) -> asyncio.subprocess.Process:
        if slot.process is not None and slot.process.returncode is None:
            return slot.process
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-m", "qjsflow.runner.scopedb.server", str(self.root),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,  # a crash's traceback names host paths
            cwd=self.root, env={}, limit=2**20,
        )  # fmt: skip
        assert process.stdout is not None
        try:
            ready = await asyncio.wait_for(read_frame_async(process.stdout), 30)
        except (TimeoutError, FrameError):
            process.kill()
            await process.wait()
            raise RuntimeError("the scope-database process failed to start") from None
        greeting = loads(ready)
        if not isinstance(greeting, dict) or greeting.get("ready") is not True:
            raise RuntimeError("the scope-database process started with a bad greeting")
        slot.process = process
        self.layers = greeting.get("layers") or {}
        return process

    async def aclose(self) -> None:
        scopes, self._scopes = list(self._scopes.values()), OrderedDict()
        for slot in scopes:
            async with slot.lock:
                process, slot.process = slot.process, None
                if process is None or process.stdin is None:
                    continue
                process.stdin.close()
                try:
                    await asyncio.wait_for(process.wait(), 5)
                except TimeoutError:
                    process.kill()
                    await process.wait()
