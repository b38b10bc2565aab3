"""The executor pool: warm executor processes, drives serviced through an async host callback,
and a watchdog that cannot be argued with.

The watchdog reads each busy executor's CPU time from /proc and SIGKILLs it once a drive has used
more than its compute budget (plus a small grace). CPU time only grows while the executor
computes, never while it waits for the host, so time spent servicing ops is not charged. A
killed, crashed or limit-hitting executor is discarded and a fresh one takes its place;
executors are also recycled after `recycle_after` drives.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from qjsflow.bridge import CodecError, QjsflowError
from qjsflow.bridge.codec import dumps, loads
from qjsflow.bridge.digest import bundle_digest
from qjsflow.bridge.limits import Limits
from qjsflow.bridge.printable import printable
from qjsflow.bridge.types import (
    Answer,
    DriveOutcome,
    DriveRequest,
    Failed,
    OpEnvelope,
    needs_answer,
)
from qjsflow.bridge.wire import (
    ProtocolError,
    answer_to_wire,
    parse_op,
    parse_outcome,
    request_to_wire,
)
from qjsflow.sandbox.cpu_clock import CpuClock
from qjsflow.sandbox.frames import FrameError, frame, read_frame_async
from qjsflow.sandbox.messages import drive_message

__all__ = [
    "DIAGNOSTICS_LOGGED",
    "DIAGNOSTIC_CHARS",
    "FORBIDDEN_CALL",
    "ExecutorPool",
    "Host",
    "PoolConfig",
    "remove_stale_workdirs",
]

FORBIDDEN_CALL = (
    "the executor made a system call its filter forbids and was killed by the kernel (SIGSYS):"
    " an attempt to escape the sandbox, or a call a drive needs that the filter lacks"
)
_log = logging.getLogger("qjsflow.sandbox")

Host = Callable[[Sequence[OpEnvelope]], Awaitable[Sequence[Answer]]]
# Nothing of the host's environment; only the time zone, fixed so that local-time reads in JS
# (getHours, getTimezoneOffset, toString) are the same on every worker and on every replay.
# "UTC0" is a POSIX rule that needs no file: with "UTC" glibc looks for a zone file of that
# name, which the executor's confinement may hide, and then falls back to /etc/localtime.
_EXECUTOR_ENV = {"TZ": "UTC0"}
_PREPARE = b'{"type":"prepare"}'
# The bundles' texts an executor keeps (`ExecutorProcess.bundle_fields`): sent once, then named by
# their digest. A 400 kB text cost each drive ~0.9 ms to encode, pipe, decode and look up.
TEXTS_KEPT = 4
TEXT_CHARS_KEPT = 32 * 2**20
# After a drive an executor prepares its next context when the caller has recorded the drive
# (`prepare_idle`), so that preparing does not compete with that; at the latest after this.
PREPARE_LATEST_S = 0.005
# The executor's CPU rlimit: a backstop against a drive the watchdog cannot stop (the host's
# threads frozen), the same however many drives an executor serves. One that has used half of
# it is replaced after its drive, so that a healthy executor never meets it.
CPU_BACKSTOP_S = 6060
# Executor working folders are named after the process that made them, so a pool can remove
# those of processes that died (SIGKILLed workers leave theirs behind).
_WORKDIR_PREFIX = "qjsflow-executor-"
# An executor's own lines on its stderr (an internal error, why it stopped) reach this
# process's log through a pipe, escaped and bounded: an inherited stderr that is a regular
# file (a worker run as `qjsflow worker 2>>worker.log`) refuses every write under the
# executor's no-files rlimit, and the line would be lost. Lines past the first few of an
# executor's life are counted, not logged: a flood from a broken executor fills no disk.
DIAGNOSTIC_CHARS = 500
DIAGNOSTICS_LOGGED = 20


def remove_stale_workdirs(root: str | None = None) -> int:
    """Remove the executor folders of processes that are gone; returns how many."""
    removed = 0
    folder = root or tempfile.gettempdir()
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            owner = _workdir_owner(entry.name)
            if owner is None or not entry.is_dir(follow_symlinks=False) or _alive(owner):
                continue
            shutil.rmtree(entry.path, ignore_errors=True)
            removed += 1
    return removed


def _workdir_owner(name: str) -> int | None:
    if not name.startswith(_WORKDIR_PREFIX):
        return None
    pid, _, _ = name.removeprefix(_WORKDIR_PREFIX).partition("-")
    return int(pid) if pid.isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


@dataclass(frozen=True, slots=True)
class PoolConfig:
    size: int = 4  # executors at most; spawned as concurrent drives need them
    # Drives before an executor is replaced by a fresh process. Every drive has a context of
    # its own, and an executor's memory stays flat over thousands of drives (measured: 20-21
    # MiB over 3,000); replacing one costs ~0.12 s of compute (docs/performance-log.md).
    recycle_after: int = 1000
    watchdog_interval_s: float = 0.05
    watchdog_grace_s: float = 0.25
    address_space_bytes: int = 1024 * 1024 * 1024
    startup_timeout_s: float = 30.0
    # The executor's system-call filter and Landlock (sandbox/confine.py): "require" refuses
    # to start an executor a layer is missing from, "best-effort" warns once, "off" (for
    # machines without them, knowingly) applies none.
    confinement: str = "best-effort"
    # The executor's module and extra arguments: only the confinement tests change them.
    entry: str = "qjsflow.sandbox.executor"
    entry_args: tuple[str, ...] = ()


class ExecutorProcess:
    """One executor process and its private working folder."""

    def __init__(self, process: asyncio.subprocess.Process, workdir: str) -> None:
        self.process = process
        self.workdir = workdir
        self.drives = 0
        self.killed_for: str | None = None
        self.layers: dict[str, Any] = {}  # the confinement it reported (sandbox/confine.py)
        # Whether its next context is prepared or being prepared: it prepares one as it
        # starts, after a drive once told to (`ExecutorPool.prepare_idle`), else as the next
        # drive arrives. Only an idle executor is told: mid-drive, a frame is an answer.
        self.prepared = True
        # The bundles' texts it holds, by digest, oldest first (with their lengths): it keeps
        # what it is sent and forgets what it is told to, so this is its store's mirror.
        self.bundles: collections.OrderedDict[str, int] = collections.OrderedDict()
        # Its compute as /proc counts it, opened at the first read and kept for its life
        # (sandbox/cpu_clock.py).
        self._clock: CpuClock | None = None
        self._diagnostics = asyncio.get_running_loop().create_task(self._log_diagnostics())

    async def _log_diagnostics(self) -> None:
        """Log the executor's stderr lines until it exits (`DIAGNOSTIC_CHARS`)."""
        stderr = self.process.stderr
        if stderr is None:
            return
        pid, seen = self.process.pid, 0
        while True:
            try:
                line = await stderr.readline()
            except ValueError:  # longer than the reader's limit: dropped by the reader
                line = b"(a line too long to read)"
            if not line:
                break
            seen += 1
            if seen <= DIAGNOSTICS_LOGGED:
                cut = line.rstrip(b"\n")[: DIAGNOSTIC_CHARS * 4]  # UTF-8: at most 4 a character
                text = cut.decode("utf-8", "replace")[:DIAGNOSTIC_CHARS]
                _log.warning("executor %d: %s", pid, printable(text))
        if seen > DIAGNOSTICS_LOGGED:
            _log.warning("executor %d: %d more lines on its stderr, not logged", pid,
                         seen - DIAGNOSTICS_LOGGED)  # fmt: skip

    @classmethod
    async def spawn(cls, config: PoolConfig, cpu_limit_s: int) -> ExecutorProcess:
        workdir = tempfile.mkdtemp(prefix=f"{_WORKDIR_PREFIX}{os.getpid()}-")
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-m",
            config.entry,
            str(config.address_space_bytes),
            str(cpu_limit_s),
            config.confinement,
            *config.entry_args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,  # its lines are logged here (`DIAGNOSTIC_CHARS`)
            cwd=workdir,
            env=_EXECUTOR_ENV,
            limit=2**20,
            # Its own session; its rlimits it sets itself, first thing (no preexec_fn: a
            # fork that runs Python code in a threaded parent can deadlock).
            start_new_session=True,
        )
        executor = cls(process, workdir)
        try:
            ready = await asyncio.wait_for(executor.receive(), config.startup_timeout_s)
        except (FrameError, TimeoutError):
            executor.kill("it did not start")
            await executor.reap()
            raise QjsflowError("a QuickJS executor process failed to start") from None
        if not isinstance(ready, dict) or ready.get("type") != "ready":
            executor.kill("it did not start")
            await executor.reap()
            if isinstance(ready, dict) and ready.get("type") == "refused":
                raise QjsflowError(
                    f"an executor refused to start: {str(ready.get('reason'))[:300]}"
                )
            raise QjsflowError("a QuickJS executor process started with a bad greeting")
        executor.layers = ready.get("layers") or {}
        return executor

    def cpu_seconds(self) -> float:
        try:  # read twice a drive, and by the watchdog
            if self._clock is None:
                # Opened at the first read (at the next, if opening failed: out of descriptors,
                # say), and only while the process is not reaped: its pid is still its own.
                if self.process.returncode is not None:
                    return 0.0
                self._clock = CpuClock(self.process.pid)
            return self._clock.seconds()
        except OSError:
            return 0.0

    def bundle_fields(self, request: DriveRequest) -> dict[str, Any]:
        """What a drive message says of its bundle: its digest, and its text only if this
        executor does not hold it; then, past `TEXTS_KEPT` texts or `TEXT_CHARS_KEPT`
        characters, which it should forget, oldest first (never the one sent)."""
        key = request.bundle_key or bundle_digest(request.bundle)
        held = self.bundles
        if key in held:
            held.move_to_end(key)
            return {"bundleKey": key}
        fields: dict[str, Any] = {"bundleKey": key, "bundle": request.bundle}
        held[key] = len(request.bundle)
        forget = []
        while len(held) > 1 and (len(held) > TEXTS_KEPT or sum(held.values()) > TEXT_CHARS_KEPT):
            forget.append(held.popitem(last=False)[0])
        if forget:
            fields["forget"] = forget
        return fields

    async def send(self, payload: bytes) -> None:
        stdin = self.process.stdin
        assert stdin is not None
        stdin.write(frame(payload))
        await stdin.drain()

    def prepare(self) -> None:
        """Ask it to prepare its next drive's context now (no answer: written, not awaited)."""
        stdin = self.process.stdin
        if self.prepared or stdin is None or self.process.returncode is not None:
            return
        self.prepared = True
        with contextlib.suppress(ConnectionError, RuntimeError):  # it died: the next take sees
            stdin.write(frame(_PREPARE))

    async def receive(self) -> Any:
        stdout = self.process.stdout
        assert stdout is not None
        # Each op's values are checked (size, depth) by parse_op; the frame needs no walk.
        return loads(await read_frame_async(stdout), max_depth=None)

    def kill(self, reason: str) -> None:
        if self.killed_for is None:
            self.killed_for = reason
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()

    async def reap(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        await self.process.wait()
        with contextlib.suppress(TimeoutError):  # its stderr's end follows its exit
            await asyncio.wait_for(asyncio.shield(self._diagnostics), 1.0)
        if self._clock is not None:
            self._clock.close()
            self._clock = None
        shutil.rmtree(self.workdir, ignore_errors=True)


@dataclass(slots=True)
class _Watch:
    executor: ExecutorProcess
    cpu_start: float
    request: DriveRequest  # its compute budget (`_budget`), looked at by the watchdog only
    spent: float | None = None  # the executor's compute when the outcome came


class ExecutorPool:
    """Drives bundles in executor processes; `async with ExecutorPool() as pool:`."""

    def __init__(self, config: PoolConfig | None = None) -> None:
        self.config = config or PoolConfig()
        self.idle: list[ExecutorProcess] = []
        self._slots = asyncio.Semaphore(self.config.size)
        self._watches: dict[int, _Watch] = {}
        self._watchdog: asyncio.Task[None] | None = None
        self._closed = False
        self._swept = False  # stale executor folders removed (see remove_stale_workdirs)
        self._warming: asyncio.Task[ExecutorProcess] | None = None
        self._live = 0  # executors spawned and not yet reaped
        self.layers: dict[str, Any] = {}  # the confinement the last executor reported
        self.killed: collections.Counter[str] = collections.Counter()  # by reason, for metrics
        self._warned = False
        self.replaced = 0  # executors discarded after a kill, crash or limit (for tests, stats)

    async def __aenter__(self) -> ExecutorPool:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
        idle, self.idle = self.idle, []
        if self._warming is not None:
            warming, self._warming = self._warming, None
            with contextlib.suppress(Exception):
                idle.append(await warming)
        for executor in idle:
            await executor.reap()

    def stats(self) -> dict[str, int]:
        """Executors alive and idle now (the rest are driving)."""
        return {"live": self._live, "idle": len(self.idle)}

    async def confinement(self) -> dict[str, Any]:
        """The layers an executor of this pool reports (starting one if none has started)."""
        if not self.layers:
            executor = await self._take()
            self.idle.append(executor)
        return dict(self.layers)

    def prepare_idle(self) -> None:
        """Idle executors prepare their next context now: a drive has been recorded (the
        driver calls this after its last commit) or `PREPARE_LATEST_S` has passed."""
        for executor in self.idle:
            executor.prepare()

    def _prepare_if_idle(self, executor: ExecutorProcess) -> None:
        if executor in self.idle:  # never mid-drive: a frame then would be read as answers
            executor.prepare()

    def warm(self) -> None:
        """Start an executor now for a drive that is coming (publishing starts one while
        esbuild works, so asking what a bundle exports does not wait for a spawn)."""
        if not self._closed and not self.idle and self._warming is None:
            self._warming = asyncio.get_running_loop().create_task(self._spawn())

    async def drive(self, request: DriveRequest, host: Host) -> DriveOutcome:
        """Run one replay of `request.bundle`, servicing its ops through `host`."""
        if self._closed:
            raise QjsflowError("the executor pool is closed")
        self._ensure_watchdog()
        async with self._slots:
            executor = await self._take()
            executor.prepared = True  # if it was not, it prepares as the drive arrives
            keep = False
            watch = _Watch(executor, executor.cpu_seconds(), request)
            self._watches[id(watch)] = watch
            try:
                outcome, keep = await self._converse(watch, host)
            except (FrameError, ConnectionError, BrokenPipeError):
                outcome = await self._died(executor)
            except CodecError as error:
                executor.kill("protocol")
                outcome = Failed(False, f"the sandbox broke the protocol: {error}", 0.0)
            finally:
                del self._watches[id(watch)]
                spent = executor.cpu_seconds() if watch.spent is None else watch.spent
                used = max(0.0, spent - watch.cpu_start)
                await self._give_back(executor, keep, spent)
            if outcome.cpu_s != used:  # an outcome parsed with its compute has it already
                outcome = dataclasses.replace(outcome, cpu_s=used)
            return outcome

    async def _converse(self, watch: _Watch, host: Host) -> tuple[DriveOutcome, bool]:
        executor, request = watch.executor, watch.request
        limits = request.limits
        message = drive_message(request_to_wire(request), **executor.bundle_fields(request))
        await executor.send(message)
        while True:
            reply = await executor.receive()
            kind = reply.get("type") if isinstance(reply, dict) else None
            try:
                if kind == "outcome":
                    # Its compute, read as it arrives: the outcome is made with it.
                    watch.spent = executor.cpu_seconds()
                    used = max(0.0, watch.spent - watch.cpu_start)
                    await self.last_ops(executor, reply.get("ops"), limits, host)
                    recycle = reply.get("recycle") is True
                    return parse_outcome(reply.get("outcome"), limits, used), not recycle
                if kind != "ops" or not isinstance(reply.get("ops"), list):
                    raise ProtocolError(f"unexpected frame {str(kind)[:40]!r}")
                ops = [parse_op(raw, limits) for raw in reply["ops"]]
            except ProtocolError as error:
                executor.kill("protocol")
                return Failed(False, f"the sandbox broke the protocol: {error}", 0.0), False
            try:
                answers = await self._service(executor, ops, host)
            except ProtocolError as error:  # the host found an op that contradicts the journal
                executor.kill("protocol")
                return Failed(False, f"the sandbox broke the protocol: {error}", 0.0), False
            wire = {"type": "answers", "answers": [answer_to_wire(a) for a in answers]}
            await executor.send(dumps(wire))

    async def last_ops(
        self, executor: ExecutorProcess, raw: object, limits: Limits, host: Host
    ) -> None:
        """The ops that came with a drive's outcome: only ops that await no answer (results the
        sandbox settled itself, console lines) may."""
        if raw is None:
            return
        if not isinstance(raw, list):
            raise ProtocolError("an outcome's ops must be a list")
        ops = [parse_op(op, limits) for op in raw]
        if any(needs_answer(envelope.op) for envelope in ops):
            raise ProtocolError("an outcome's ops must be ops that await no answer")
        await self._service(executor, ops, host)

    async def _service(
        self, executor: ExecutorProcess, ops: list[OpEnvelope], host: Host
    ) -> Sequence[Answer]:
        try:
            answers = await host(ops)
        except BaseException:
            executor.kill("the host failed")
            raise
        expected = [op.id for op in ops if needs_answer(op.op)]
        if [answer.id for answer in answers] != expected:
            executor.kill("the host failed")
            raise QjsflowError("the host must answer every op but logs and begins, in order")
        return answers

    async def _died(self, executor: ExecutorProcess) -> Failed:
        reason = executor.killed_for
        if reason is not None and reason.startswith("compute"):
            self.killed["compute limit"] += 1
            return Failed(False, f"{reason} exceeded (the executor was killed)", 0.0)
        with contextlib.suppress(TimeoutError):  # how it died: its exit status says
            await asyncio.wait_for(executor.process.wait(), 2.0)
        executor.kill("died")
        if executor.process.returncode == -signal.SIGSYS:
            self.killed["forbidden system call"] += 1
            return Failed(False, FORBIDDEN_CALL, 0.0)
        self.killed["died"] += 1
        return Failed(True, "the executor process died during the drive", 0.0)

    async def _take(self) -> ExecutorProcess:
        """An executor for a drive: one spawned ahead if it is ready (its context is
        prepared), else the longest idle that has prepared its next context (else the longest
        idle), else a new one. Then, if none is left idle and the pool has room, a spare is
        spawned: an executor prepares its next context (~1-2 ms) after each drive, so drives
        one after another alternate between two rather than wait for it."""
        while True:
            executor = await self._next_executor()
            if executor is not None and executor.process.returncode is None:
                break
            if executor is not None:  # died while idle (killed from outside): replace it
                self.replaced += 1
                self._live -= 1
                await executor.reap()
        if not self.idle and self._live < self.config.size:
            self.warm()
        return executor

    async def _next_executor(self) -> ExecutorProcess | None:
        warming, self._warming = self._warming, None
        if warming is not None and warming.done():
            if warming.exception() is None:
                return warming.result()
            warming = None  # a spare that failed to start: a drive spawns its own
        if self.idle:
            self._warming = warming
            # The longest idle with its context prepared (else the longest idle).
            ready = next((e for e in self.idle if e.prepared), self.idle[0])
            self.idle.remove(ready)
            return ready
        if warming is not None:
            with contextlib.suppress(QjsflowError):
                return await warming
            return None
        return await self._spawn()

    async def _spawn(self) -> ExecutorProcess:
        if not self._swept:  # once, before this pool's first executor: not on every open
            self._swept = True
            await asyncio.to_thread(remove_stale_workdirs)
        executor = await ExecutorProcess.spawn(self.config, CPU_BACKSTOP_S)
        self._live += 1
        self.layers = executor.layers
        missing = executor.layers.get("missing") or []
        if missing and not self._warned:  # once per pool: every executor would say the same
            self._warned = True
            _log.warning("executors run without part of their confinement: %s",
                         "; ".join(str(m) for m in missing))  # fmt: skip
        return executor

    async def _give_back(self, executor: ExecutorProcess, keep: bool, spent_s: float) -> None:
        """Back to the idle ones, or replaced: after a kill, a crash or a limit, after
        `recycle_after` drives, or once it has used half its CPU backstop (`spent_s`)."""
        executor.drives += 1
        executor.prepared = False  # its context is freed: the next is prepared when asked
        healthy = keep and executor.killed_for is None and executor.process.returncode is None
        young = executor.drives < self.config.recycle_after and spent_s < CPU_BACKSTOP_S / 2
        if healthy and young and not self._closed:
            self.idle.append(executor)
            loop = asyncio.get_running_loop()
            loop.call_later(PREPARE_LATEST_S, self._prepare_if_idle, executor)
            return
        if not healthy:
            self.replaced += 1
        self._live -= 1
        await executor.reap()

    def _ensure_watchdog(self) -> None:
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = asyncio.get_running_loop().create_task(self._watch_loop())

    async def _watch_loop(self) -> None:
        grace = self.config.watchdog_grace_s
        while True:
            await asyncio.sleep(self.config.watchdog_interval_s)
            for watch in list(self._watches.values()):
                used = watch.executor.cpu_seconds() - watch.cpu_start
                budget_s, name = _budget(watch.request)
                if used > budget_s + grace:
                    watch.executor.kill(name)


def _budget(request: DriveRequest) -> tuple[float, str]:
    limits = request.limits
    run_left = limits.compute_per_run_s - request.cpu_used_s
    if limits.compute_per_drive_s <= run_left:
        return limits.compute_per_drive_s, (
            f"compute limit per drive of {limits.compute_per_drive_s:g} s"
        )
    return max(0.0, run_left), f"compute limit per run of {limits.compute_per_run_s:g} s"
