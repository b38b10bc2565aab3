"""The author's commands: `qjsflow run` (a workflow to its end in a temporary journal, on a
virtual clock, with mocks) and `qjsflow dev` (republish on every change, with the console)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qjsflow.bridge import CodecError, InvalidInput, loads
from qjsflow.bundles import PublishError
from qjsflow.runner.bindings import ToolFn
from qjsflow.runner.cli.output import printable, render_json, table
from qjsflow.runner.config import RunnerConfig
from qjsflow.runner.runner import Runner
from qjsflow.runner.tenancy.environment import ScopeEnvironment, load_scope_settings
from qjsflow.runner.testing import Idle, MockTool, WorkflowTest

__all__ = ["develop", "run_workflow"]

EXIT_FAILED = 1
_POLL_S = 0.5  # how often `dev` looks at the tree
_SKIPPED = frozenset({"node_modules", ".git"})


def _pairs(given: list[str], option: str) -> list[tuple[str, str]]:
    pairs = []
    for item in given:
        name, equals, value = item.partition("=")
        if not equals or not name:
            raise InvalidInput(f"{option} wants NAME=VALUE, got {printable(item[:80])!r}")
        pairs.append((name, value))
    return pairs


def _json(text: str, what: str) -> Any:
    if text.startswith("@"):
        try:
            text = Path(text[1:]).read_text(encoding="utf-8")
        except OSError as error:
            raise InvalidInput(f"{what}: cannot read {text[1:80]!r}: {error.strerror}") from None
    try:
        return loads(text)
    except CodecError as error:
        raise InvalidInput(f"{what} is not valid JSON: {error}") from None


async def run_workflow(args: argparse.Namespace, tools: Mapping[str, ToolFn]) -> tuple[str, int]:
    """`qjsflow run`: what to print, and the exit code."""
    if not Path(args.dir).is_dir():
        raise InvalidInput(f"no folder {printable(args.dir[:200])!r}")
    payload = _json(args.input, "--input")
    events: dict[str, list[Any]] = {}
    for kind, text in _pairs(args.event, "--event"):
        events.setdefault(kind, []).append(_json(text, f"--event {kind}"))
    mocks: dict[str, Any] = dict(tools)
    mocks.update({a: MockTool(_json(t, f"--mock-tool {a}"))
                  for a, t in _pairs(args.mock_tool, "--mock-tool")})  # fmt: skip
    steps = {name: _json(text, f"--mock-step {name}")
             for name, text in _pairs(args.mock_step, "--mock-step")}  # fmt: skip
    real_time = not args.fast_forward
    scope, environment = _environment_of(args)
    async with WorkflowTest(args.dir, tools=mocks, real_time=real_time, scope=scope,
                            environment=environment) as test:  # fmt: skip
        run = await test.start(args.workflow, payload, events=events, mock_steps=steps)
        idle = await test.run_until_idle(run.run_id, waits_time_out=args.let_waits_time_out)
        rows = await test.timeline(run.run_id)
        calls = {a: t.calls for a, t in mocks.items() if isinstance(t, MockTool) and t.calls}
    code = 0 if idle.run.status == "completed" else EXIT_FAILED
    if args.json:
        shown = {
            "status": idle.run.status, "output": idle.run.output, "error": idle.run.error,
            "stopped": idle.stopped, "timeline": [dict(zip([c.lower() for c in rows[0]], row,
                                                           strict=True)) for row in rows[1:]],
            "tool_calls": calls,
        }  # fmt: skip
        return render_json(shown), code
    return _render(idle, rows, calls), code


def _render(idle: Idle, rows: list[tuple[str, ...]], calls: Mapping[str, list[Any]]) -> str:
    run = idle.run
    lines = [*table([tuple(printable(cell) for cell in row) for row in rows]), ""]
    for address, made in calls.items():
        lines.append(printable(f"tool {address}: {len(made)} calls"))
    if run.status == "completed":
        lines.append(printable(f"completed: {render_json(run.output)}"))
    elif idle.stopped is not None:
        lines.append(printable(f"stopped ({run.status}): {idle.stopped}"))
    else:
        lines.append(printable(f"{run.status}: {run.error or ''}"))
        lines += [printable(f"    {frame}") for frame in run.error_stack[:5]]
    return "\n".join(lines)


def _fingerprint(root: Path) -> tuple[tuple[str, int, int], ...]:
    """Every file under the tree with its size and modification time (links not followed)."""
    seen = []
    for folder, names, files in os.walk(root):
        names[:] = sorted(n for n in names if n not in _SKIPPED)
        for name in sorted(files):
            with contextlib.suppress(OSError):
                info = os.lstat(os.path.join(folder, name))
                seen.append((os.path.join(folder, name), info.st_size, info.st_mtime_ns))
    return tuple(seen)


async def develop(args: argparse.Namespace, db: str, config: RunnerConfig) -> None:
    """`qjsflow dev`: publish the tree now and after every change (a publish error is shown
    with its file:line, and the last good snapshot stays), drive runs, serve the console."""
    import uvicorn  # noqa: PLC0415  (the console extra)

    from qjsflow.runner.console.app import create_app  # noqa: PLC0415

    root = Path(args.dir)
    if not root.is_dir():
        raise InvalidInput(f"no folder {printable(args.dir[:200])!r}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with Runner.open(db, config) as runner:

        async def factory() -> Runner:  # the console's own (its lifespan closes it)
            return await Runner.connect(db, config, create=False)

        server = uvicorn.Server(uvicorn.Config(
            create_app(factory, None), host="127.0.0.1", port=args.port, log_level="warning",
            server_header=False,
        ))  # fmt: skip
        serving = asyncio.create_task(server.serve())
        working = asyncio.create_task(runner.serve(stop=stop, concurrency=4))
        _say(f"console on http://127.0.0.1:{args.port}/ ; watching {printable(str(root))}")
        seen: tuple[tuple[str, int, int], ...] | None = None
        # uvicorn takes SIGINT and SIGTERM while it serves (and passes them on when it ends).
        while not stop.is_set() and not server.should_exit:
            now = _fingerprint(root)
            if now != seen:
                seen = now
                await _publish(runner, args.scope, root)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), _POLL_S)
        server.should_exit = True
        stop.set()
        await asyncio.gather(serving, working)
    _say("stopped")


async def _publish(runner: Runner, scope: str, root: Path) -> None:
    began = time.monotonic()
    try:
        published = await runner.publish(scope, root)
    except PublishError as error:
        for line in str(error).splitlines():
            _say(f"error: {line}" if not line.startswith("  hint: ") else line)
        return
    state = "published" if published.created else "unchanged"
    names = ", ".join(w.workflow for w in published.workflows)
    took = (time.monotonic() - began) * 1000
    _say(f"{state} snapshot {published.snapshot_id[:12]} ({names}) in {took:.0f} ms")


def _say(line: str) -> None:
    print(printable(f"[{time.strftime('%H:%M:%S')}] {line}"), flush=True)


def _environment_of(args: argparse.Namespace) -> tuple[str, ScopeEnvironment | None]:
    """The scope a local run runs as and its environment: with `--env`, the env file's scope
    (`--scope`, or the file's only one) with its vars, secrets (from this shell's variables)
    and egress; without, scope "test" and none."""
    if not args.env:
        return args.scope or "test", None
    environments = load_scope_settings(args.env).environments
    if args.scope is None and len(environments) != 1:
        scopes = ", ".join(sorted(environments)[:20]) or "none"
        raise InvalidInput(f"say which scope of the env file with --scope (it has: {scopes})")
    scope = args.scope or next(iter(environments))
    if scope not in environments:
        raise InvalidInput(f"the env file has no scope {printable(scope[:80])!r}")
    return scope, environments[scope]
