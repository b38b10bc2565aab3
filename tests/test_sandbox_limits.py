"""Hostile workflow code hits a limit: the drive fails naming it, quickly, while the parent's
event loop keeps ticking and the pool keeps serving well-behaved drives."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import os
import shutil
import signal
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest

from qjsflow.bridge.failure import StepFailure
from qjsflow.bridge.limits import Limits
from qjsflow.bridge.types import (
    Answer,
    Completed,
    DriveRequest,
    Failed,
    OpEnvelope,
)
from qjsflow.sandbox import ExecutorPool, PoolConfig, bytecode
from qjsflow.sandbox import executor as executor_module
from qjsflow.sandbox import pool as pool_module
from qjsflow.sandbox.bytecode import PreludeLoader
from qjsflow.sandbox.executor import PRELUDE, Drive, Prepared, planned_prelude
from tests.conftest import bundle_of, drive_read, executor_pids, fan_out_source
from tests.memory_host import MemoryHost

BUDGET_S = 0.5
LIMITS = Limits(compute_per_drive_s=BUDGET_S, memory_bytes=32 * 1024 * 1024)
WELL_BEHAVED = 'export default async (e, step) => step.do("ok", async () => 41 + 1);'


class Heartbeat:
    """Ticks every 50 ms; the largest gap shows whether anything froze the event loop."""

    def __init__(self) -> None:
        self.largest_gap_s = 0.0
        self.ticks = 0

    async def run(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.05)
            now = time.monotonic()
            self.largest_gap_s = max(self.largest_gap_s, now - last)
            self.ticks += 1
            last = now


@pytest.fixture
async def heartbeat() -> AsyncIterator[Heartbeat]:
    beat = Heartbeat()
    task = asyncio.get_running_loop().create_task(beat.run())
    yield beat
    task.cancel()


HOSTILE = {
    "busy loop": ("for (;;) {}", "compute limit per drive of 0.5 s"),
    "endless promise chain": (
        "const spin = () => { Promise.resolve().then(spin); }; spin(); await new Promise(() => {});",
        "compute limit per drive of 0.5 s",
    ),
    "native allocation loop": ("for (;;) new Array(1e6).fill(1);", "compute limit per drive"),
    "string doubling": ('let s = "x"; for (;;) s += s;', "memory limit of 33554432 bytes"),
    "unbounded recursion": ("const f = (n) => f(n + 1) + 1; f(0);", "stack limit of 1048576 bytes"),
    "looping getter on a thrown value": (
        "throw { get message() { for (;;) {} }, toString() { for (;;) {} } };",
        "compute limit per drive of 0.5 s",
    ),
    "looping toString on a thrown value": (
        "throw { toString() { for (;;) {} }, [Symbol.toPrimitive]() { for (;;) {} } };",
        "Error: ",
    ),
    "loop inside a step": (
        'await step.do("spin", async () => { for (;;) {} });',
        "compute limit per drive of 0.5 s",
    ),
    "huge BigInt thrown": ("throw 10n ** 100000n;", "a BigInt was thrown"),
    "step result over 1 MiB": (
        'await step.do("big", async () => "x".repeat(1024 * 1024 + 1));',
        "larger than the limit of 1048576 bytes",
    ),
    "step result nested 4,000 deep": (
        'await step.do("deep", async () => { let v = 1; for (let i = 0; i < 4000; i++) v = [v]; return v; });',
        "nested deeper than 64 levels",
    ),
    "step returning a function": (
        'await step.do("fn", async () => () => 1);',
        'the result of step "fn" (#1) holds a function',
    ),
    "step returning a cycle": (
        'await step.do("cycle", async () => { const a = {}; a.a = a; return a; });',
        'the result of step "cycle" (#1) holds a cycle',
    ),
}


@pytest.mark.slow  # each case runs to a compute limit: in `make test`
@pytest.mark.parametrize("case", sorted(HOSTILE))
@pytest.mark.timeout(60)
async def test_hostile_code_fails_naming_the_limit(
    pool: ExecutorPool, heartbeat: Heartbeat, case: str
) -> None:
    body, expected = HOSTILE[case]
    source = f"export default async function run(event, step) {{ {body} }}"
    host = MemoryHost()
    outcome = await pool.drive(host.request(await bundle_of(source), limits=LIMITS), host)
    assert isinstance(outcome, Failed), outcome
    assert expected in outcome.message
    assert outcome.retryable is False
    assert outcome.cpu_s <= 2 * BUDGET_S
    assert heartbeat.largest_gap_s < 0.5
    assert heartbeat.ticks > 0

    good = MemoryHost()
    after = await pool.drive(good.request(await bundle_of(WELL_BEHAVED)), good)
    assert isinstance(after, Completed)
    assert orjson.loads(after.output) == 42


async def test_compute_per_run_is_a_ledger_across_drives(pool: ExecutorPool) -> None:
    limits = Limits(compute_per_drive_s=5.0, compute_per_run_s=1.0)
    host = MemoryHost()
    request = host.request(
        await bundle_of("export default async () => { for (;;) {} };"), "{}", limits
    )
    outcome = await pool.drive(dataclasses.replace(request, cpu_used_s=0.7), host)
    assert isinstance(outcome, Failed)
    assert "compute limit per run of 1 s" in outcome.message
    assert outcome.cpu_s <= 2 * 0.3 + 0.1


COUNTED = {
    "steps of one name": (
        'for (let i = 0; i < 4; i++) await step.do("s", async () => i);',
        Limits(steps_per_run=3),
        "steps per run limit of 3 exceeded",
    ),
    "steps of many names": (
        'for (let i = 0; i < 4; i++) await step.do("s" + i, async () => i);',
        Limits(steps_per_run=3),
        "steps per run limit of 3 exceeded",
    ),
    "notifications": (
        'for (let i = 0; i < 5; i++) await step.notify({ title: "t" + i });',
        Limits(notify_per_drive=3),
        "notify per drive limit of 3 exceeded",
    ),
    "nesting": (
        "const down = (n) => step.do('d' + n, async () => n > 0 ? down(n - 1) : 0); await down(12);",
        Limits(),
        "steps nested deeper than 8 levels",
    ),
}


@pytest.mark.parametrize("case", sorted(COUNTED))
async def test_counted_limits_are_configurable(pool: ExecutorPool, case: str) -> None:
    body, limits, expected = COUNTED[case]
    source = f"export default async (e, step) => {{ {body} }};"
    host = MemoryHost()
    outcome = await pool.drive(host.request(await bundle_of(source), limits=limits), host)
    assert isinstance(outcome, Failed)
    assert expected in outcome.message


async def test_an_executor_killed_mid_drive_is_replaced(pool: ExecutorPool) -> None:
    source = 'export default async (e, step) => step.tool("call", "slow.tool", {});'
    killed: list[int] = []

    async def killing_host(ops: Sequence[OpEnvelope]) -> list[Answer]:
        for pid in executor_pids():
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        await asyncio.sleep(0.1)
        return [Answer(op.id, StepFailure("Error", "unused")) for op in ops]

    host = MemoryHost()
    outcome = await pool.drive(host.request(await bundle_of(source)), killing_host)
    assert killed
    assert isinstance(outcome, Failed)
    assert outcome.retryable is True
    assert "executor process died" in outcome.message
    assert pool.replaced == 1

    good = MemoryHost()
    after = await pool.drive(good.request(await bundle_of(WELL_BEHAVED)), good)
    assert isinstance(after, Completed)
    assert not set(killed) & set(executor_pids())


async def test_executors_are_recycled_after_n_drives() -> None:
    code = await bundle_of(WELL_BEHAVED)
    seen: set[int] = set()
    async with ExecutorPool(PoolConfig(size=1, recycle_after=2)) as pool:
        for _ in range(4):
            host = MemoryHost()

            async def observing(ops: Sequence[OpEnvelope], host: MemoryHost = host) -> list[Answer]:
                seen.update(executor_pids())
                return await host(ops)

            assert isinstance(await pool.drive(host.request(code), observing), Completed)
    assert len(seen) == 2


async def test_an_executors_cpu_clock_is_read_through_one_descriptor_closed_with_it() -> None:
    """The pool reads each executor's compute from its /proc file, kept open for the
    executor's life (so a pid reused later can never be read in its place): recycling
    executors and closing the pool leave no such descriptor behind."""
    code = await bundle_of(WELL_BEHAVED)
    assert _stat_files_open() == 0
    seen = []
    async with ExecutorPool(PoolConfig(size=1, recycle_after=2)) as pool:
        for _ in range(5):
            host = MemoryHost()
            outcome = await pool.drive(host.request(code), host)
            assert isinstance(outcome, Completed)
            seen.append(_stat_files_open())
    assert seen == [1, 0, 1, 0, 1]  # the live executor's; none once it was recycled
    assert _stat_files_open() == 0


async def test_an_executors_cpu_clock_opened_in_vain_is_opened_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A descriptor that could not be opened (the host out of them, say) must not blind the
    watchdog for the executor's life: the next read opens it."""
    real_open = os.open
    refused: list[str] = []

    def out_of_descriptors(path: str, flags: int, *rest: Any, **named: Any) -> int:
        if path.endswith("stat") and not refused:  # the first try, wherever it is made
            refused.append(path)
            raise OSError(24, "Too many open files")
        return real_open(path, flags, *rest, **named)

    monkeypatch.setattr(os, "open", out_of_descriptors)
    executor = await pool_module.ExecutorProcess.spawn(PoolConfig(), 60)
    try:
        executor.cpu_seconds()
        assert refused
        assert executor.cpu_seconds() > 0  # starting it (an interpreter, QuickJS) took compute
    finally:
        monkeypatch.undo()
        await executor.reap()
    assert executor.cpu_seconds() == 0.0  # reaped: its pid may be another's now


@pytest.mark.parametrize("schedstat", [True, False])
async def test_an_executors_compute_is_counted_in_nanoseconds_where_the_kernel_can(
    schedstat: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From the kernel's count of the time the executor's thread ran (a drive's compute, not
    a multiple of the 10 ms clock tick); from its user and system ticks where that count is
    missing. Either way the drive is charged what it spent."""
    if not schedstat:
        real_open = os.open

        def no_schedstat(path: str, flags: int, *rest: Any, **named: Any) -> int:
            if path.endswith("/schedstat"):
                raise FileNotFoundError(2, "No such file or directory")
            return real_open(path, flags, *rest, **named)

        monkeypatch.setattr(os, "open", no_schedstat)
    code = await bundle_of(
        "export default async () => { let n = 0; while (n < 3e6) n++; return n; };"
    )
    charged = []
    async with ExecutorPool(PoolConfig(size=1)) as one:
        for _ in range(3):
            host = MemoryHost()
            outcome = await one.drive(host.request(code), host)
            assert isinstance(outcome, Completed)
            assert outcome.output == "3000000"
            charged.append(outcome.cpu_s)
    ticks = [round(cpu_s * os.sysconf("SC_CLK_TCK"), 6) for cpu_s in charged]
    if schedstat:
        assert all(0 < cpu_s < 5 for cpu_s in charged), charged
        assert any(tick != int(tick) for tick in ticks), charged  # finer than a tick
    else:
        assert all(tick == int(tick) for tick in ticks), charged
        assert sum(charged) > 0, charged


def _stat_files_open() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own, closed by now
            count += os.readlink(f"/proc/self/fd/{fd}").endswith(("/stat", "/schedstat"))
    return count


async def test_executors_run_with_no_environment_an_empty_folder_and_rlimits(
    pool: ExecutorPool,
) -> None:
    facts: list[tuple[bytes, list[str], str]] = []

    async def inspecting(ops: Sequence[OpEnvelope]) -> list[Answer]:
        for pid in executor_pids():
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            folder = os.listdir(f"/proc/{pid}/cwd")
            limits = Path(f"/proc/{pid}/limits").read_text()
            facts.append((environ, folder, limits))
        return await host(ops)

    host = MemoryHost()
    outcome = await pool.drive(host.request(await bundle_of(WELL_BEHAVED)), inspecting)
    assert isinstance(outcome, Completed)
    assert facts
    environ, folder, limits = facts[0]
    assert environ == b"TZ=UTC0\x00"  # the fixed time zone, nothing of the host
    assert folder == []
    lines = {line[:26].strip(): line[26:].split() for line in limits.splitlines()[1:]}
    assert lines["Max address space"][0] == str(1024**3)
    assert lines["Max file size"][0] == "0"
    assert int(lines["Max open files"][0]) <= 8
    # The backstop is the same for every executor, however many drives it serves.
    assert lines["Max cpu time"][0] == str(pool_module.CPU_BACKSTOP_S)


async def test_an_executor_that_used_half_its_cpu_backstop_is_replaced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Replaced after its drive, so that it never meets the backstop in the middle of one."""
    code = await bundle_of(WELL_BEHAVED)
    backstop = pool_module.CPU_BACKSTOP_S
    pids: list[set[int]] = []

    async def observing(ops: Sequence[OpEnvelope], host: MemoryHost) -> list[Answer]:
        pids.append(set(executor_pids()))
        return await host(ops)

    async with ExecutorPool(PoolConfig(size=1)) as pool:
        first = MemoryHost()

        async def aging(ops: Sequence[OpEnvelope]) -> list[Answer]:
            # As if the executor had used most of a backstop of 0.1 s (starting takes more).
            monkeypatch.setattr(pool_module, "CPU_BACKSTOP_S", 0.1)
            return await observing(ops, first)

        assert isinstance(await pool.drive(first.request(code), aging), Completed)
        monkeypatch.setattr(pool_module, "CPU_BACKSTOP_S", backstop)
        second = MemoryHost()
        outcome = await pool.drive(second.request(code), lambda ops: observing(ops, second))
        assert isinstance(outcome, Completed)
        assert pool.replaced == 0  # not for a fault: for its age
    before, after = pids
    assert before
    assert after
    assert not before & after


async def test_a_pool_removes_the_folders_of_dead_executors_only() -> None:
    dead = tempfile.mkdtemp(prefix="qjsflow-executor-999999999-")  # beyond any pid: no process
    live = tempfile.mkdtemp(prefix=f"qjsflow-executor-{os.getpid()}-")
    other = tempfile.mkdtemp(prefix="qjsflow-executorish-")
    try:
        async with ExecutorPool(PoolConfig(size=1)) as pool:
            assert os.path.isdir(dead)  # opening a pool touches nothing; its first spawn does
            outcome = await pool.drive(MemoryHost().request(await bundle_of(WELL_BEHAVED)),
                                       MemoryHost())  # fmt: skip
            assert isinstance(outcome, Completed)
        assert not os.path.exists(dead)
        assert os.path.isdir(live)
        assert os.path.isdir(other)
    finally:
        for folder in (dead, live, other):
            shutil.rmtree(folder, ignore_errors=True)


CYCLES = """
export default async (event, step) => {
  let made = 0;
  for (let i = 0; i < 400; i++) {
    // 400 x ~256 kB of objects that point at each other: garbage only a cycle collection frees
    const ring = [];
    for (let j = 0; j < 2000; j++) ring.push({ next: null, data: [j, j, j, j] });
    for (let j = 0; j < ring.length; j++) ring[j].next = ring[(j + 1) % ring.length];
    made += ring.length;
  }
  return made;
};
"""


async def test_garbage_in_cycles_is_collected_well_within_the_memory_limit(
    pool: ExecutorPool,
) -> None:
    """A drive may grow its heap to half its memory limit before the engine first
    looks for garbage in cycles (fewer looks while a fan-out builds up); past that it looks as
    before, so cyclic garbage many times the limit never reaches it."""
    host = MemoryHost()
    limits = Limits(memory_bytes=32 * 2**20)
    outcome = await pool.drive(host.request(await bundle_of(CYCLES), limits=limits), host)
    assert isinstance(outcome, Completed), outcome
    assert outcome.output == str(400 * 2000)


def _gc_threshold(loader: PreludeLoader, prepared: Prepared) -> int:
    pointer = bytecode.context_pointer(loader.library, prepared.context)
    threshold: int = loader.library.JS_GetGCThreshold(loader.library.JS_GetRuntime(pointer))
    return threshold


@pytest.mark.parametrize("memory_mib", [64, 8])
def test_a_drives_context_first_collects_cycles_at_half_its_limit(
    memory_mib: int,
) -> None:
    """Half the drive's limit, also when that is below what preparing allowed."""
    loader = PreludeLoader(PRELUDE)
    assert loader.library is not None
    limits = Limits(memory_bytes=memory_mib * 2**20)
    _, prepared = _drive_here(loader, MemoryHost().request("", limits=limits))
    assert _gc_threshold(loader, prepared) == memory_mib * 2**20 // 2


def test_preparing_a_context_looks_for_no_garbage_in_cycles() -> None:
    """Preparing makes none worth a look; the engine, looking, would have set its next
    threshold from the heap it found (so the one set before preparing would be gone)."""
    loader = PreludeLoader(PRELUDE)
    assert loader.library is not None
    first = Prepared(loader)
    for prepared in (first, Prepared(planned_prelude(loader))):  # a walk, then a plan followed
        assert _gc_threshold(loader, prepared) == bytecode.PREPARING_HEAP


ALLOCATES_20_MIB = """
export default async () => {
  const held = [];
  for (let i = 0; i < 20; i++) held.push(new Uint8Array(2 ** 20));
  return held.length;
};
"""
RECURSES = """
const deeper = (n) => (n === 0 ? 0 : 1 + deeper(n - 1));
export default async () => deeper(400);
"""


async def test_each_drive_has_its_own_limits_whatever_the_drive_before_it_had() -> None:
    """An executor sets the limits of its last drive on the next context as it prepares it
    (the next drive most likely has the same): a drive with other limits still gets its own,
    tighter or looser, one after the other on the one executor."""
    tight = Limits(memory_bytes=8 * 2**20, stack_bytes=64 * 2**10)
    loose = Limits(memory_bytes=64 * 2**20, stack_bytes=2**20)
    allocates, recurses = await bundle_of(ALLOCATES_20_MIB), await bundle_of(RECURSES)
    order = (loose, tight, tight, loose, loose, tight)
    seen = []
    async with ExecutorPool(PoolConfig(size=1)) as one:
        for limits in order:
            for bundle in (allocates, recurses):
                host = MemoryHost()
                outcome = await one.drive(host.request(bundle, limits=limits), host)
                assert isinstance(outcome, Completed | Failed)
                ended = outcome.output if isinstance(outcome, Completed) else outcome.message
                seen.append(ended.split(" exceeded")[0])
    loose_ends = ["20", "400"]
    tight_ends = ["memory limit of 8388608 bytes", "stack limit of 65536 bytes"]
    assert seen == [
        end for limits in order for end in (loose_ends if limits is loose else tight_ends)
    ]


async def test_an_authors_error_that_reads_as_the_compute_limit_is_the_authors(
    pool: ExecutorPool,
) -> None:
    """The executor names the budget when the engine stopped the body; a step's error, a log
    line or a result that only says so (sent with the outcome, in one frame) is the author's."""
    code = await bundle_of(
        "export default async (event, step) => {\n"
        "  try {\n"
        '    await step.do("x", { retries: { limit: 0, delay: 0 } }, async () => {\n'
        '      throw new Error("compute limit exceeded");\n'
        "    });\n"
        "  } catch (error) {\n"
        "    console.log(error.message);\n"
        '    return { message: "compute limit exceeded" };\n'
        "  }\n"
        "};\n"
    )
    host = MemoryHost()
    outcome = await pool.drive(host.request(code), host)
    assert isinstance(outcome, Completed), outcome
    assert orjson.loads(outcome.output) == {"message": "compute limit exceeded"}
    assert host.logs == ["compute limit exceeded"]


def test_a_context_prepared_with_the_last_drives_limits_has_them_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Set as it is prepared, so that a drive with the same limits sets nothing; a drive with
    others sets its own."""
    loader = PreludeLoader(PRELUDE)
    assert loader.library is not None
    prepared = Prepared(loader, limits=(16 * 2**20, 2**20))
    assert prepared.limits == (16 * 2**20, 2**20)
    assert _gc_threshold(loader, prepared) == 8 * 2**20
    thresholds: list[int] = []
    monkeypatch.setattr(
        executor_module, "collect_cycles_from", lambda _, __, size: thresholds.append(size)
    )
    same = Limits(memory_bytes=16 * 2**20, stack_bytes=2**20)
    Drive(drive_read(MemoryHost().request("", limits=same)), "", -1, prepared)
    assert thresholds == []  # nothing set again
    other = Limits(memory_bytes=32 * 2**20, stack_bytes=2**20)
    Drive(drive_read(MemoryHost().request("", limits=other)), "", -1, prepared)
    assert thresholds == [16 * 2**20]
    assert prepared.limits == (32 * 2**20, 2**20)


def _drive_here(loader: PreludeLoader, request: DriveRequest) -> tuple[Drive, Prepared]:
    """A drive of `request` in this process, in a context of its own."""
    prepared = Prepared(loader)
    return Drive(drive_read(request), request.bundle, -1, prepared), prepared


async def test_a_fan_out_of_live_steps_is_not_searched_for_garbage() -> None:
    """Two thousand steps in flight at once (~16 MB, all live): with the default limits the
    engine never looks for garbage in cycles while they build up. Each look walks the whole
    heap; from an eighth of the limit, a 4,000-step fan-out looked four or five times, a
    quarter of its drive. A look would leave the threshold set from the heap it found."""
    loader = PreludeLoader(PRELUDE)
    assert loader.library is not None
    drive, prepared = _drive_here(
        loader, MemoryHost().request(await bundle_of(fan_out_source(2000)))
    )
    outcome = orjson.loads(drive.run())
    assert outcome["outcome"]["output"] == "2000"
    assert _gc_threshold(loader, prepared) == Limits().memory_bytes // 2


_MEMORY_USAGE_FIELDS = 26  # int64 fields of QuickJS's JSMemoryUsage, malloc_size and count first


def _heap(loader: PreludeLoader, prepared: Prepared) -> tuple[int, int]:
    """Bytes allocated and allocations live in a context's runtime, as the engine counts."""
    library = loader.library
    library.JS_ComputeMemoryUsage.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    library.JS_ComputeMemoryUsage.restype = None
    pointer = bytecode.context_pointer(library, prepared.context)
    usage = (ctypes.c_int64 * _MEMORY_USAGE_FIELDS)()
    library.JS_ComputeMemoryUsage(library.JS_GetRuntime(pointer), usage)
    return usage[0], usage[3]  # malloc_size, malloc_count


async def test_a_step_in_flight_costs_the_engine_few_allocations() -> None:
    """What a step.do keeps allocated while in flight (its call, promise, attempt, ops):
    every allocation is made, freed, and for a fan-out walked by the engine's looks for
    garbage. Fewer closures and copies a step: 141 allocations and ~8.4 kB a step before,
    ~111 and ~6.4 kB now (QuickJS counts them exactly; the bound leaves a little room)."""
    loader = PreludeLoader(PRELUDE)
    assert loader.library is not None
    heaps = []
    for steps in (0, 1000):
        source = fan_out_source(steps, then_sleep=True)
        drive, prepared = _drive_here(loader, MemoryHost().request(await bundle_of(source)))

        def suspend(ops: str) -> list[object]:  # the sleep, answered as the host would
            return [{"id": op["id"], "result": {"suspend": "sleep"}, "at": None}
                    for op in orjson.loads(ops) if op["op"]["op"] == "step.sleep"]  # fmt: skip

        drive.exchange = suspend  # type: ignore[method-assign]
        outcome = orjson.loads(drive.run())["outcome"]
        assert outcome["status"] == "suspended", outcome
        heaps.append(_heap(loader, prepared))
    (bytes_before, count_before), (bytes_after, count_after) = heaps
    assert (count_after - count_before) / 1000 <= 120
    assert (bytes_after - bytes_before) / 1000 <= 7000
