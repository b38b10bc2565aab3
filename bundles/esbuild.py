"""How a build runs: `driver.mjs` under node in a fresh session, with an empty environment,
a wall-clock timeout and an address-space limit, so a hostile tree can neither hang the
publisher nor exhaust its memory. Where node and esbuild come from: bundles/toolchain.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qjsflow.bridge import ToolchainError, dumps, loads
from qjsflow.bundles.toolchain import Toolchain, find_toolchain

__all__ = ["BuildLimits", "confined_command", "run_driver"]

# Resolved: node finds its modules from the real file, and confinement grants its real folder.
_DRIVER = Path(__file__).resolve().with_name("driver.mjs")


@dataclass(frozen=True, slots=True)
class BuildLimits:
    """Bounds on one esbuild run over a whole snapshot."""

    timeout_s: float = 30.0
    address_space_bytes: int = 2 * 1024 * 1024 * 1024
    max_output_bytes: int = 32 * 1024 * 1024
    # Landlock around the bundler (sandbox/confined_exec.py): "require", "best-effort" or "off".
    confinement: str = "best-effort"


async def run_driver(request: dict[str, Any], limits: BuildLimits) -> Any:
    """Run driver.mjs on `request` and return its decoded answer; bounded in time and memory."""
    toolchain = find_toolchain()
    compat = None
    if request.get("nodeCompat"):
        compat = toolchain.node_compat
        if compat is None:
            raise ToolchainError(
                "the nodejs_compat flag needs the Node polyfills beside esbuild: run `qjsflow "
                "setup-tools` (it fetches them, pinned, with esbuild)"
            )
    payload = dumps(
        {
            **request,
            "esbuild": str(toolchain.esbuild_package),
            "maxOutputBytes": limits.max_output_bytes,
            "nodeCompat": None if compat is None else str(compat),
        }
    )
    process = await asyncio.create_subprocess_exec(
        *confined_command(toolchain, request["root"], limits.confinement),
        toolchain.node,
        "--max-old-space-size=512",
        str(_DRIVER),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,  # never shown: it could echo what the bundler read
        cwd=request["root"],
        env={},
        start_new_session=True,
    )
    # Set from here (no preexec_fn in a threaded process): the driver waits for its request
    # on stdin, which is written only after this.
    space = limits.address_space_bytes
    resource.prlimit(process.pid, resource.RLIMIT_AS, (space, space))
    try:
        stdout = await asyncio.wait_for(
            _bounded_output(process, payload, limits.max_output_bytes), timeout=limits.timeout_s
        )
    except TimeoutError:
        _kill_group(process.pid)
        await process.wait()
        return {"errors": [{"text": f"bundling took longer than {limits.timeout_s:g} s"}]}
    finally:
        _kill_group(process.pid)  # esbuild's own service process must not outlive the build
    if stdout is None:
        await process.wait()
        text = f"the bundles are larger than {limits.max_output_bytes} bytes in all"
        return {"errors": [{"text": text}]}
    if process.returncode != 0:
        # stderr is not shown: it could echo text the bundler read while it failed.
        return {"errors": [{"text": f"the bundler stopped with exit status {process.returncode}"}]}
    return loads(stdout, max_bytes=limits.max_output_bytes + _ENVELOPE_BYTES)


def confined_command(toolchain: Toolchain, root: str, mode: str) -> list[str]:
    """The command that puts the bundler under Landlock (sandbox/confined_exec.py): it may read the
    tree, the driver and a few system files, read and run node, the system's libraries and the
    esbuild packages, and nothing else; no TCP. Empty for `off`."""
    if mode == "off":
        return []
    node_prefix = Path(os.path.realpath(toolchain.node)).parent.parent
    # The Node polyfills (nodejs_compat) are read, and their folders listed, as they resolve.
    polyfills = [] if toolchain.node_compat is None else [str(toolchain.node_compat)]
    spec = {
        "read": [root, str(_DRIVER.parent), "/etc/ld.so.cache", "/etc/ssl", "/dev/null",
                 *polyfills],
        "exec": [str(node_prefix), "/usr/lib", "/lib", "/lib64", "/usr/lib64",
                 str(toolchain.esbuild_package.parent)],
        "mode": mode,
    }  # fmt: skip
    return [sys.executable, "-I", "-m", "qjsflow.sandbox.confined_exec", dumps(spec).decode()]


# The JSON around the bundles: entry names, quotes and escapes (the code is ASCII already).
_ENVELOPE_BYTES = 1024 * 1024


async def _bounded_output(
    process: asyncio.subprocess.Process, payload: bytes, max_bytes: int
) -> bytes | None:
    """The driver's answer, read as it comes and never more than the cap: None (and the
    driver killed) once the output passes it."""
    assert process.stdin is not None
    assert process.stdout is not None
    process.stdin.write(payload)
    with contextlib.suppress(ConnectionError):
        await process.stdin.drain()
    process.stdin.close()
    chunks: list[bytes] = []
    size = 0
    while chunk := await process.stdout.read(256 * 1024):
        size += len(chunk)
        if size > max_bytes + _ENVELOPE_BYTES:
            _kill_group(process.pid)
            return None
        chunks.append(chunk)
    await process.wait()
    return b"".join(chunks)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
