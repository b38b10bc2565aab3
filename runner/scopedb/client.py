"""`ScopeDatabases`: the host's handle on the scope-database process.

Author SQL never runs in the journal's process: server processes (runner/scopedb/server.py),
one per active scope, are spawned on first use. Each answers its scope's requests one at a
time; a request that outlives its deadline by `kill_grace_s` kills its server, which is
started again on the next call (SQLite's own journal keeps each scope file consistent).

Every request carries an id its answer repeats, and one reader task per process takes the
answers off the pipe and hands each to the request of its id. A caller cancelled at any await
(its drive's lease lost, the run terminated elsewhere) leaves its answer to be dropped by the
reader, never read by the next request, which may be another run's.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from qjsflow.bridge.codec import dumps, loads
from qjsflow.runner.scopedb.policy import SqlLimits
from qjsflow.runner.scopedb.replication import Ask, ChangeLost, Replication
from qjsflow.runner.store import JournalStore
from qjsflow.runner.tenancy.scopes import validate_scope
from qjsflow.sandbox.frames import FrameError, frame, read_frame_async

__all__ = ["ScopeDatabases", "SqlCall", "SqlOutcome", "default_root"]


@dataclass(frozen=True, slots=True)
class SqlOutcome:
    result: str | None  # encoded {rows, changes, lastInsertRowid}
    code: str | None
    message: str | None
    elapsed_s: float
    # Replicated (replication.py): the change to record in the journal as the scope's
    # `version`, in the transaction that records the call (None: nothing to record).
    change: str | None = None
    version: int = 0


@dataclass(frozen=True, slots=True)
class SqlCall:
    """One author statement to run: the call it is (`run_id`, `call_key`), its text and
    parameters (encoded), its deadline, and whether the snapshot may only read."""

    run_id: str
    call_key: str
    sql: str
    params: str
    deadline_s: float
    read_only: bool = False

    def request(self, scope: str, limits: SqlLimits) -> dict[str, Any]:
        """The server's request for it (runner/scopedb/server.py)."""
        return {
            "scope": scope, "runId": self.run_id, "call": self.call_key, "sql": self.sql,
            "params": self.params, "deadlineS": self.deadline_s, "limits": asdict(limits),
            "readOnly": self.read_only,
        }  # fmt: skip


R = TypeVar("R")
_RETRIES = 20  # writers that each lost the scope's next version to another machine


class _ScopeProcess:
    """One server process serving one scope, one request at a time."""

    def __init__(self) -> None:
        self.process: asyncio.subprocess.Process | None = None
        self.lock = asyncio.Lock()
        self.reader: asyncio.Task[None] | None = None
        self.waiting: dict[int, asyncio.Future[Any]] = {}
        self.next_id = 0
        # The journal version its replica holds, as this host last learned it (None: ask);
        # kept so that a statement asks the process nothing more than its statement.
        self.version: int | None = None

    def started(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.version = None
        self.reader = asyncio.create_task(self._read(process))

    async def ask(self, request: dict[str, Any], wait_s: float) -> Any:
        """Send `request` and wait for the answer of its id (the caller holds the lock)."""
        process = self.process
        assert process is not None
        assert process.stdin is not None
        self.next_id += 1
        request_id = self.next_id
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.waiting[request_id] = answer
        try:
            process.stdin.write(frame(dumps({**request, "id": request_id})))
            await process.stdin.drain()
            return await asyncio.wait_for(answer, wait_s)
        finally:
            self.waiting.pop(request_id, None)  # an answer still to come is dropped

    async def _read(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        try:
            while True:
                reply = loads(await read_frame_async(process.stdout))
                request_id = reply.get("id") if isinstance(reply, dict) else None
                answer = None
                if isinstance(request_id, int):
                    answer = self.waiting.pop(request_id, None)
                if answer is not None and not answer.done():
                    answer.set_result(reply)
        except (FrameError, ConnectionError, ValueError) as error:
            for answer in self.waiting.values():
                if not answer.done():
                    answer.set_exception(ConnectionError(f"the SQL process's pipe: {error}"))

    async def stop(self) -> None:
        process, self.process = self.process, None
        reader, self.reader = self.reader, None
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader


class ScopeDatabases:
    """Author SQL, each scope in a server process of its own: a statement of one scope never
    waits for another scope's (a runaway native function call included)."""

    def __init__(
        self, root: Path, limits: SqlLimits | None = None, store: JournalStore | None = None
    ) -> None:
        self.root = root
        self.limits = limits or SqlLimits()
        # With a journal store, each scope's database is a replica of the journal's (one
        # source of truth for every machine); without, a local file (one machine).
        self.replication = None if store is None else Replication(store, root)
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
        statement = SqlCall(run_id, call_key, sql, params, deadline_s, read_only)
        request = statement.request(validate_scope(scope), self.limits)  # before any file
        slot = self._slot(scope)
        async with slot.lock:
            try:
                wait_s = deadline_s + self.limits.busy_wait_s + self.limits.kill_grace_s
                reply = await self._ask(slot, request, wait_s)
            except (TimeoutError, FrameError, ConnectionError) as error:
                await slot.stop()
                return _interrupted(error, deadline_s)
        await self._evict()
        return _outcome(reply)

    @property
    def mode(self) -> str:
        return "local" if self.replication is None else "replicated"

    async def call(
        self,
        scope: str,
        statement: SqlCall,
        *,
        record: Callable[[SqlOutcome], Awaitable[R]],
    ) -> R:
        """`execute`, and `record` its outcome in the journal (the caller's transaction):
        after the statement for a local file; for a replica, while it holds the statement's
        transaction open, with its change as the scope's next version — committed on the
        replica only once the journal has it, run again after catching up if another
        machine took that version (`ChangeLost`)."""
        if self.replication is None:
            return await record(await self.execute(
                scope, run_id=statement.run_id, call_key=statement.call_key, sql=statement.sql,
                params=statement.params, deadline_s=statement.deadline_s,
                read_only=statement.read_only,
            ))  # fmt: skip
        request = {**statement.request(validate_scope(scope), self.limits), "replicated": True}
        slot = self._slot(scope)
        async with slot.lock:
            return await self._replicated(slot, scope, request, record)

    async def _replicated(
        self,
        slot: _ScopeProcess,
        scope: str,
        request: dict[str, Any],
        record: Callable[[SqlOutcome], Awaitable[R]],
    ) -> R:
        replication = self.replication
        assert replication is not None
        ask = self._replica_asker(slot, scope)
        wait_s = request["deadlineS"] + self.limits.busy_wait_s + self.limits.kill_grace_s
        for _ in range(_RETRIES):
            try:
                await self._caught_up(slot, scope)
                reply = await self._ask(slot, request, wait_s)
            except (TimeoutError, FrameError, ConnectionError) as error:
                await slot.stop()
                return await record(_interrupted(error, request["deadlineS"]))
            if "ok" not in reply:
                return await record(_outcome(reply))
            held = reply["ok"]
            slot.version = int(held["version"])
            change = held.get("change")
            version = int(held["version"]) + 1
            text = None if change is None else dumps(change).decode()
            outcome = SqlOutcome(held["result"], None, None, held["elapsedS"], text, version)
            if change is None:
                return await record(outcome)
            try:
                recorded = await record(outcome)
            except ChangeLost:
                await ask({"op": "finish", "version": None})
                continue
            except BaseException:
                # The journal's answer is unknown (or the drive was stopped): the held
                # transaction goes with its process; a catch-up brings the change if the
                # journal has it, and the call's applied record with it.
                await slot.stop()
                raise
            await ask({"op": "finish", "version": version})
            slot.version = version
            if replication.due_image(version):
                await replication.keep_image(scope, ask, int(time.time() * 1000))
            return recorded
        return await record(SqlOutcome(
            None, "busy", f"other machines wrote to the scope's database first {_RETRIES} times "
            "in a row", 0.0))  # fmt: skip

    async def _caught_up(self, slot: _ScopeProcess, scope: str) -> None:
        """The slot's replica brought to the journal's head (its version asked only when
        this host does not know it)."""
        assert self.replication is not None
        ask = self._replica_asker(slot, scope)
        have = slot.version
        if have is None:
            have = int((await ask({"op": "version"}))["version"])
        slot.version = await self.replication.catch_up(scope, have, ask)

    def _replica_asker(self, slot: _ScopeProcess, scope: str) -> Ask:
        return partial(self.ask_replica, slot, scope)

    async def ask_replica(self, slot: object, scope: str, asked: dict[str, Any]) -> Any:
        """One request to a scope's replica (replica.py), the caller holding its lock: its
        version, a held call's end, changes to apply, an image, a restore."""
        assert isinstance(slot, _ScopeProcess)
        request = {"scope": scope, "limits": asdict(self.limits), "replica": asked}
        reply = await self._ask(slot, request, 120.0)
        if "ok" not in reply:
            raise RuntimeError(f"the replica of scope {scope!r}: {reply['error']['message']}")
        return reply["ok"]

    async def forget(self, scope: str, run_ids: list[str]) -> None:
        """Drop the applied-call records of these runs from `scope`'s database, if it has one
        (a pruned run's id used again must run its SQL anew)."""
        if self.replication is not None:
            await self._forget_replicated(scope, run_ids)
            return
        if not run_ids or not self.path_of(scope).exists():
            return
        request = {"scope": scope, "forget": run_ids, "limits": asdict(self.limits)}
        slot = self._slot(scope)
        async with slot.lock:
            reply = await self._ask(slot, request, 60.0)
        if "ok" not in reply:
            raise RuntimeError(f"the scope database of {scope!r} could not forget pruned runs")

    async def _forget_replicated(self, scope: str, run_ids: list[str]) -> None:
        """Forgetting is a change like any other: every replica forgets."""
        replication = self.replication
        assert replication is not None
        if not run_ids or await replication.head(scope) == 0:
            return
        change = dumps({"forget": run_ids}).decode()
        slot = self._slot(scope)
        async with slot.lock:
            for _ in range(_RETRIES):
                await self._caught_up(slot, scope)
                if await replication.append(scope, (slot.version or 0) + 1, change):
                    await self._caught_up(slot, scope)
                    return
        raise RuntimeError(f"the scope database of {scope!r} could not forget pruned runs")

    async def confinement(self) -> dict[str, Any]:
        """The layers a scope-database process reports (one is started for a scope named
        `doctor` if none has been)."""
        if not self.layers:
            slot = self._slot("doctor")
            async with slot.lock:
                await self._server(slot)
        return dict(self.layers)

    async def _ask(self, slot: _ScopeProcess, request: dict[str, Any], wait_s: float) -> Any:
        """One request and its reply; the caller holds the slot's lock."""
        await self._server(slot)
        return await slot.ask(request, wait_s)

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
        slot.started(process)
        self.layers = greeting.get("layers") or {}
        return process

    async def aclose(self) -> None:
        scopes, self._scopes = list(self._scopes.values()), OrderedDict()
        for slot in scopes:
            async with slot.lock:
                process = slot.process
                if process is not None and process.stdin is not None:
                    process.stdin.close()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(process.wait(), 5)
                await slot.stop()  # kills it if it did not end, and its reader


def _outcome(reply: dict[str, Any]) -> SqlOutcome:
    """A statement's outcome as its process answered it."""
    if "ok" in reply:
        return SqlOutcome(reply["ok"]["result"], None, None, reply["ok"]["elapsedS"])
    failure = reply["error"]
    return SqlOutcome(None, failure["code"], failure["message"], failure["elapsedS"])


def _interrupted(error: BaseException, deadline_s: float) -> SqlOutcome:
    """A statement whose process died or stopped answering (it is killed, started anew)."""
    stopped = "stopped answering" if isinstance(error, TimeoutError) else "died"
    return SqlOutcome(None, "interrupted", f"the SQL process {stopped}", deadline_s)


def default_root(journal: Path | None) -> Path:
    """Where scope databases live unless configured: beside the journal file
    (`<journal>.scopes`); for a server journal (no file), in the working folder
    (`./qjsflow.scopes`). They are local SQLite files either way."""
    if journal is None:
        return Path("qjsflow.scopes").resolve()
    return journal.with_name(journal.name + ".scopes")
