"""The executor process: runs author code in QuickJS, one fresh context per drive.

Started by the pool as `python -I -m qjsflow.sandbox.executor` with an empty environment, a
private empty working folder and rlimits. It reads frames on fd 0 and writes frames on a
private copy of fd 1 (fd 1 itself is pointed at stderr, so nothing can corrupt the frame
stream). It never opens a
file, socket or database, and once started it cannot: `sandbox/confine.py` puts it under a
seccomp filter and Landlock (docs/SANDBOX.md, Confinement).

Per drive: take the context prepared while idle (prelude evaluated, which yields `dispatch`,
and intrinsics locked down), set the memory and stack limits, boot the run, load the bundle,
start the body, then loop: run pending jobs, settle the next replayed step, or send the outbox
to the parent and settle its answers one at a time — until the body settles or nothing is left
to do. Compute is counted with `time.process_time()` (this process does nothing else) and the
QuickJS time limit is set to what is left before every call into JS.
"""

from __future__ import annotations

import os
import resource
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import quickjs

from qjsflow.bridge.codec import dumps, dumps_text, loads
from qjsflow.bridge.errors import CodecError
from qjsflow.bridge.rules import RULES
from qjsflow.sandbox.bytecode import (
    PREPARING_HEAP,
    BundleCode,
    EnginePointers,
    PreludeLoader,
    collect_cycles_from,
    engine_pointers,
)
from qjsflow.sandbox.confine import confine
from qjsflow.sandbox.frames import frame, read_frame_fd
from qjsflow.sandbox.lockdown_plan import plan_part
from qjsflow.sandbox.messages import Message, read_message


def load_prelude(plan: str = "") -> str:
    """The prelude's parts (sandbox/prelude/*.js, in name order) as one script that evaluates
    to `dispatch`: they share one function scope, so no part is ever on globalThis. The text
    rules the host checks come first, as `RULES`; `plan`, the lockdown's routes compiled
    (sandbox/lockdown_plan.py), goes right after the lockdown's part."""
    parts = []
    for path in sorted(Path(__file__).with_name("prelude").glob("*.js")):
        parts.append(path.read_text(encoding="utf-8"))
        if path.name == _LOCKDOWN_PART and plan:
            parts.append(plan)
    body = RULES.prelude_source() + "\n".join(parts)
    return f"(function () {{\n{body}\n}})();\n"


_LOCKDOWN_PART = "60-lockdown.js"
PRELUDE = load_prelude()


def planned_prelude(prelude: PreludeLoader) -> PreludeLoader:
    """`prelude` compiled again with its lockdown's plan (sandbox/lockdown_plan.py), found by
    preparing one context; `prelude` itself when no plan can be compiled. Done at the
    executor's start (~10 ms, once): every context it prepares after that follows the plan."""
    part = plan_part(Prepared(prelude).answer)
    if part is None:
        return prelude
    planned = PreludeLoader(load_prelude(part), fast=prelude.fast)
    return planned if planned.fast == prelude.fast else prelude


_JOB_CHECK_EVERY = 1024


class DriveStopped(Exception):
    """The drive ends now with this failed outcome (and the engine's frames where it did)."""

    def __init__(self, message: str, *, limit: bool, stack: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.limit = limit
        self.stack = stack


_PREPARE_TIME_LIMIT_S = 5.0
# The drive's end when the engine stopped the body (the prelude's `fail` of its COMPUTE_STOPPED,
# 30-errors-and-config.js): only where the outcome begins, never in a value of the author's.
_COMPUTE_STOPPED = (
    '{"outcome":{"status":"failed","retryable":false,"message":"compute limit exceeded"'
)
_LAST_LOOK_S = 0.05  # reading the prelude's outcome after the budget ran out
_LAST_LOOK_JOBS = 16
_NO_TEXT = "the executor was not sent the workflow's code (an internal error)"


def _with_prelude(
    prelude: PreludeLoader,
) -> tuple[quickjs.Context, EnginePointers | None, Any]:
    context = quickjs.Context()
    context.set_time_limit(_PREPARE_TIME_LIMIT_S)
    pointers = engine_pointers(prelude.library, context)
    collect_cycles_from(prelude.library, pointers, PREPARING_HEAP)
    return context, pointers, prelude.evaluate(context, pointers)


class Prepared:
    """A fresh context with the prelude evaluated and the intrinsics locked down: everything a
    drive needs that does not depend on the run, made while the executor waits for work.

    `answer`: the prelude's answer to `prepare`, which holds the lockdown's routes when it
    walked rather than followed a plan compiled in (`planned_prelude`)."""

    def __init__(
        self,
        prelude: PreludeLoader,
        bundles: BundleCode | None = None,
        last: LastBundle | None = None,
        limits: DriveLimits | None = None,
    ) -> None:
        self.library = prelude.library
        try:
            self.context, self.pointers, self.dispatch = _with_prelude(prelude)
        except RuntimeError:  # its bytecode failed to load: the source, in a clean context
            self.context, self.pointers, self.dispatch = _with_prelude(prelude)
        answer = self.dispatch("prepare", "")
        if not isinstance(answer, str) or answer.startswith('{"error":'):
            raise RuntimeError("the prelude failed to prepare a context")
        self.answer = answer
        # The bundle this executor drove last, defined ahead (its bytecode read: no code of
        # it runs until the drive's `load`), as the next drive is most likely of it too: a
        # 400 kB bundle's read then costs no drive its time. None: nothing defined.
        self.defined: str | None = None
        if bundles is not None and last is not None:
            key, text, memory = last
            if bundles.define(self.context, text, memory, key=key, pointers=self.pointers):
                self.defined = key
        # The engine's limits of the drive before, set now, as the next drive most likely
        # has the same: its own start then only compares them (`limit`).
        self.limits: DriveLimits | None = None
        if limits is not None:
            self.limit(*limits)

    def limit(self, memory_bytes: int, stack_bytes: int) -> None:
        """Set the context's memory and stack limits for a drive (and the heap it may reach
        before the engine looks for garbage in cycles: half its memory limit), unless they
        are set already."""
        if self.limits == (memory_bytes, stack_bytes):
            return
        self.context.set_memory_limit(memory_bytes)
        collect_cycles_from(self.library, self.pointers, memory_bytes // 2)
        self.context.set_max_stack_size(stack_bytes)
        self.limits = (memory_bytes, stack_bytes)


# A drive's memory and stack limits, in bytes.
DriveLimits = tuple[int, int]


# The bundle a drive ran, for the next context to define ahead: its key, its text, and the
# memory limit it was compiled under (its bytecode may have to be made again).
LastBundle = tuple[str, str, int]


class BundleTexts:
    """The bundles' texts this executor holds, by digest: the parent sends a text with the
    first drive of it, then only its digest, and says which to forget (`_Executor.bundles`
    in sandbox/pool.py is its mirror). A text forgotten takes its bytecode with it, so the
    parent alone decides which bundles' code this process keeps."""

    def __init__(self, bundles: BundleCode) -> None:
        self._texts: dict[str, str] = {}
        self._bundles = bundles

    def take(self, message: dict[str, Any]) -> tuple[str, str] | None:
        """The drive message's bundle, as (digest, text); None if it names one not held."""
        for key in message.get("forget") or ():
            self._texts.pop(key, None)
            self._bundles.forget(key)
        key = message["bundleKey"]
        text = message.get("bundle")
        if text is not None:
            self._texts[key] = text
        found = self._texts.get(key)
        return None if found is None else (key, found)


class Drive:
    def __init__(
        self,
        message: Message,
        bundle: str,
        frames_out: int,
        prepared: Prepared,
        bundles: BundleCode | None = None,
        *,
        bundle_key: str | None = None,
    ) -> None:
        """A drive of `message`: its header, and its request's text for the prelude
        (sandbox/messages.py)."""
        head, self.request = message
        self.bundle = bundle
        self.bundle_key = bundle_key
        self.bundles = bundles
        self.frames_out = frames_out
        limits = head["limits"]
        self.limits = limits
        self.run_left_s = limits["compute_per_run_s"] - head["cpuUsedS"]
        self.budget_s = min(limits["compute_per_drive_s"], self.run_left_s)
        self.started = time.process_time()
        self.wall_started = time.monotonic()
        self.wall_budget_s = float(limits["drive_wall_s"])
        self.jobs = 0
        self.context = prepared.context
        self.defined = prepared.defined
        self.from_bytecode = False  # its bundle was loaded from bytecode (see `_load`)
        self.pointers = prepared.pointers
        self.dispatch = prepared.dispatch
        prepared.limit(limits["memory_bytes"], limits["stack_bytes"])

    @property
    def budget_name(self) -> str:
        """The compute budget that runs out first (named only when it has: a drive that
        stays within it never formats it)."""
        limits = self.limits
        if limits["compute_per_drive_s"] <= self.run_left_s:
            return f"compute limit per drive of {limits['compute_per_drive_s']:g} s"
        return f"compute limit per run of {limits['compute_per_run_s']:g} s"

    def run(self) -> bytes:
        """The outcome frame payload: ASCII JSON from the prelude, or a failure built here."""
        try:
            if self.budget_s <= 0:
                raise DriveStopped(f"{self.budget_name} exceeded", limit=False)
            self.call("boot", self.request)
            self._load()
            self.call("start", "", what="starting the workflow")
            return self._loop()
        except DriveStopped as stop:
            return _failed(stop.message, recycle=stop.limit, stack=stop.stack)

    def _load(self) -> None:
        """Evaluate the bundle: from the bytecode this process compiled of it, or its source."""
        memory = int(self.limits["memory_bytes"])
        bundles = self.bundles
        if bundles is not None and (
            (self.defined is not None and self.defined == self.bundle_key)
            or bundles.define(
                self.context, self.bundle, memory, key=self.bundle_key, pointers=self.pointers
            )
        ):
            self.from_bytecode = True
            self.call("load", "", what="loading the workflow")
        else:
            self.call("load", self.bundle, what="loading the workflow")

    def _loop(self) -> bytes:
        while True:
            self._drain()
            ops = self.call("next")  # one call a turn (`nextTurn`, sandbox/prelude/70-body.js)
            if ops.startswith("{"):  # the drive's end: its outcome, and its last ops
                if ops.startswith(_COMPUTE_STOPPED):  # name the budget the prelude cannot know
                    stopped = loads(ops, max_depth=None)["outcome"]
                    raise DriveStopped(
                        f"{self.budget_name} exceeded", limit=True, stack=stopped.get("stack")
                    )
                return _outcome(ops)
            if ops in ("1", "+"):  # a replayed step settled, or pure steps settled by the prelude
                continue
            if not ops:  # a timer is set
                if self._wait_for_timer():
                    continue
                return _outcome(self.call("finish"))
            for answer in self.exchange(ops):
                self.call("answer", dumps_text(answer))
                self._drain()

    def _wait_for_timer(self) -> bool:
        """Nothing else to do: sleep until the next timer is due and fire it (False when
        none is set). Sleeping costs no compute; the drive's wall-clock budget bounds it."""
        delay, _, kind = self.call("nextTimer").partition(",")
        delay_ms = int(delay)
        if delay_ms < 0:
            return False
        waited = time.monotonic() - self.wall_started
        if waited + delay_ms / 1000 > self.wall_budget_s:
            if kind == "retry":  # a step's retry: journaled, so the next drive makes it
                return False
            raise DriveStopped(
                f"a timer of {delay_ms} ms would outlive the drive's wall-clock budget of "
                f"{self.wall_budget_s:g} s: wait with step.sleep instead",
                limit=False,
            )
        time.sleep(delay_ms / 1000)
        self.call("fireTimer", what="a timer")
        return True

    def exchange(self, ops: str) -> list[Any]:
        """Send a batch of ops to the parent and return its answers (none for an empty batch)."""
        if not ops:
            return []
        write_all(self.frames_out, frame(b'{"type":"ops","ops":' + ops.encode("ascii") + b"}"))
        reply = read_frame_fd(0)
        if reply is None:
            raise SystemExit(0)  # the parent went away
        answers: list[Any] = loads(reply, max_depth=None)["answers"]
        return answers

    def _remaining(self) -> float:
        return float(self.budget_s) - (time.process_time() - self.started)

    def _limit_time(self) -> None:
        remaining = self._remaining()
        if remaining <= 0:
            raise DriveStopped(
                f"{self.budget_name} exceeded", limit=False, stack=self._interrupted_at()
            )
        self.context.set_time_limit(remaining)

    def _interrupted_at(self) -> str | None:
        """Where the engine stopped the author's code, when the budget ran out inside an async
        body: the body's promise rejects with the engine's interrupt, and once its handler has
        run (a few jobs, on a small time limit) the prelude's outcome holds those frames."""
        self.context.set_time_limit(_LAST_LOOK_S)
        try:
            for _ in range(_LAST_LOOK_JOBS):
                if not self.context.execute_pending_job():
                    break
            outcome = self.dispatch("outcome", "")
            failed = loads(outcome, max_depth=None) if isinstance(outcome, str) and outcome else {}
        except (quickjs.JSException, CodecError):
            return None
        stack = failed.get("stack") if failed.get("status") == "failed" else None
        return stack if isinstance(stack, str) else None

    def call(self, command: str, argument: str = "", what: str = "") -> str:
        self._limit_time()
        try:
            answer = self.dispatch(command, argument)
        except quickjs.JSException as error:
            raise self._engine_failure(error) from None
        if not isinstance(answer, str):
            raise DriveStopped(f"the prelude answered {command} with a non-string", limit=True)
        if answer.startswith('{"error":'):
            failure = loads(answer, max_depth=None)["error"]
            prefix = f"{what}: " if what else ""
            message = f"{prefix}{failure['name']}: {failure['message']}"
            raise DriveStopped(failure["message"] if failure.get("limit") else message,
                               limit=bool(failure.get("limit")),
                               stack=failure.get("stack") or None)  # fmt: skip
        return answer

    def _drain(self) -> None:
        context = self.context
        while True:
            if self.jobs % _JOB_CHECK_EVERY == 0:
                self._limit_time()
                if self.jobs >= self.limits["jobs_per_drive"]:
                    raise DriveStopped(
                        f"jobs per drive limit of {self.limits['jobs_per_drive']} exceeded",
                        limit=False,
                    )
            try:
                ran = context.execute_pending_job()
            except quickjs.JSException as error:
                raise self._engine_failure(error) from None
            if not ran:
                return
            self.jobs += 1

    def _engine_failure(self, error: quickjs.JSException) -> DriveStopped:
        # Only engine-made errors escape the prelude (uncatchable interrupts, memory): their
        # text is the engine's, never an author object's toString. Its frames say where the
        # author's code was when it stopped.
        text, _, frames = str(error).partition("\n")
        text = text[:500]
        stack = frames[: RULES.stack_chars] or None
        if "interrupted" in text:
            return DriveStopped(f"{self.budget_name} exceeded", limit=True, stack=stack)
        if "out of memory" in text:
            message = f"memory limit of {self.limits['memory_bytes']} bytes exceeded"
            return DriveStopped(message, limit=True, stack=stack)
        if "stack" in text:
            message = f"stack limit of {self.limits['stack_bytes']} bytes exceeded"
            return DriveStopped(message, limit=True, stack=stack)
        # Anything else is the sandbox's own failure, not the author's: its text (a prelude
        # TypeError, say) goes to the operator's log, never into the run's error.
        print(f"qjsflow executor: internal error: {text}", file=sys.stderr, flush=True)
        return DriveStopped(
            "the sandbox stopped the drive on an internal error (details in the worker's log)",
            limit=True,
        )


def _outcome(ended: str) -> bytes:
    """The outcome frame of the prelude's `ended` text ({"outcome": …, "ops": …})."""
    return b'{"type":"outcome",' + ended[1:].encode("ascii")


def _failed(message: str, *, recycle: bool, stack: str | None = None) -> bytes:
    # Cut as the prelude cuts: a message composed here (`load: name: message`) is as long as
    # the author made it, and the wire refuses anything longer.
    text = message[: RULES.error_message_chars]
    outcome: dict[str, Any] = {"status": "failed", "retryable": False, "message": text}
    if stack:
        outcome["stack"] = stack[: RULES.stack_chars]
    return dumps({"type": "outcome", "outcome": outcome, "recycle": recycle})


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def limit_self(address_space_bytes: int, cpu_s: int) -> None:
    """The executor's rlimits, set by itself before it reads anything (the pool passes them as
    arguments): memory, CPU, no files written, no core dumps, few descriptors."""
    resource.setrlimit(resource.RLIMIT_AS, (address_space_bytes, address_space_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 5))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)


def main(before_drive: Callable[[], object] | None = None) -> None:
    """argv: address-space bytes, CPU seconds, confinement mode (`require`, `best-effort`,
    `off`). `before_drive` is for the confinement tests only (sandbox/confinement_probe.py)."""
    limit_self(int(sys.argv[1]), int(sys.argv[2]))
    mode = sys.argv[3] if len(sys.argv) > 3 else "best-effort"
    # Compiled once for every drive of this process, with its lockdown's plan; before
    # confinement, as finding the binding's version and library opens files.
    prelude = planned_prelude(PreludeLoader(PRELUDE))
    bundles = BundleCode(prelude)
    frames_out = os.dup(1)
    os.dup2(2, 1)
    try:
        layers = confine(frames_out, mode)  # from here on: no files, sockets or processes
    except RuntimeError as refused:  # `require`, and a layer is missing: say which, stop
        write_all(frames_out, frame(dumps({"type": "refused", "reason": str(refused)})))
        sys.exit(1)
    ready = {"type": "ready", "layers": layers.as_wire()}
    write_all(frames_out, frame(dumps(ready)))
    serve(lambda: read_frame_fd(0), frames_out, prelude, bundles, before_drive)


def serve(
    read: Callable[[], bytes | None],
    frames_out: int,
    prelude: PreludeLoader,
    bundles: BundleCode,
    before_drive: Callable[[], object] | None = None,
) -> None:
    """Drive after drive, each in a context of its own, never shared between runs.

    The first context is prepared at once; each next one when the parent says `prepare` (it
    has recorded the drive before: preparing, ~1-2 ms of compute, would otherwise compete
    with that on a small machine) or, at the latest, when the next drive comes. A drive's
    outcome is sent before its context is freed (~0.4 ms), so its end is never waited on."""
    prepared: Prepared | None = Prepared(prelude)
    texts = BundleTexts(bundles)
    last: LastBundle | None = None
    limits: DriveLimits | None = None
    while (payload := read()) is not None:
        message = read_message(payload)
        if prepared is None:
            prepared = Prepared(prelude, bundles, last, limits)
        head = message[0]
        if head.get("type") == "prepare":
            continue
        if before_drive is not None:
            before_drive()
        bundle = texts.take(head)
        if bundle is None:  # the parent's mirror is wrong: say so, and be replaced
            write_all(frames_out, frame(_failed(_NO_TEXT, recycle=True)))
            continue
        key, text = bundle
        drive = Drive(message, text, frames_out, prepared, bundles, bundle_key=key)
        prepared = None
        result = drive.run()
        # Defined ahead in the next context only if its bytecode served (not a bundle that
        # does not compile: that would be compiled again at each preparation).
        last = (key, text, int(drive.limits["memory_bytes"])) if drive.from_bytecode else None
        limits = (int(drive.limits["memory_bytes"]), int(drive.limits["stack_bytes"]))
        write_all(frames_out, frame(result))
        del drive  # its context, freed once the parent has the outcome


if __name__ == "__main__":
    try:
        main()
    except Exception as error:  # one line for the operator: a traceback would show host paths
        print(f"qjsflow executor: stopped: {type(error).__name__}", file=sys.stderr, flush=True)
        sys.exit(1)
    sys.exit(0)
