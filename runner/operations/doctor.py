"""`qjsflow doctor`: what this machine gives qjsflow — the executors' confinement layers, the
toolchain that publishes — each as one line, a missing part with what to do about it."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from qjsflow.bridge import QjsflowError
from qjsflow.bundles import ESBUILD_VERSION, find_toolchain
from qjsflow.runner.scopedb import ScopeDatabases
from qjsflow.sandbox import ExecutorPool, PoolConfig

__all__ = ["diagnose"]


async def diagnose(
    pool_config: PoolConfig, scope_databases: str = "local", *, server_journal: bool = False
) -> dict[str, Any]:
    """Starts one executor as the runner would and reads the layers it reports;
    `scope_databases` is where this journal's scope databases live (local or replicated)."""
    async with ExecutorPool(pool_config) as pool:
        layers = await pool.confinement()
    with tempfile.TemporaryDirectory(prefix="qjsflow-doctor-") as folder:
        databases = ScopeDatabases(Path(folder))
        try:
            scope_layers = await databases.confinement()
        finally:
            await databases.aclose()
    try:
        toolchain = find_toolchain()
        tools: dict[str, Any] = {"esbuild": ESBUILD_VERSION, "node": toolchain.node}
    except QjsflowError as error:
        tools = {"error": str(error)}
    return {"confinement": pool_config.confinement, "executor": layers,
            "scope_database": scope_layers, "scope_databases": scope_databases,
            "journal": "postgresql" if server_journal else "sqlite",
            "toolchain": tools}  # fmt: skip


_MODES = {
    "local": "local files, one machine (each worker's own folder)",
    "replicated": "replicated through the journal: each worker's file is a replica",
}


def render(report: dict[str, Any]) -> str:
    layers, tools = report["executor"], report["toolchain"]
    abi = layers.get("landlockAbi", 0)
    lines = [
        f"executor seccomp filter: {'on' if layers.get('seccomp') else 'OFF'}",
        "executor Landlock: " + (f"on (ABI {abi}: no filesystem, no TCP)" if abi else "OFF"),
        f"executor no_new_privs: {'on' if layers.get('noNewPrivs') else 'OFF'}",
        f"confinement setting: {report['confinement']}",
    ]
    lines += [f"  missing: {reason}" for reason in layers.get("missing", [])]
    scope_abi = report["scope_database"].get("landlockAbi", 0)
    lines.append(
        "scope-database process Landlock: "
        + (f"on (ABI {scope_abi}: its scope folder only)" if scope_abi else "OFF")
    )
    lines.append("scope databases: " + _MODES[report["scope_databases"]])
    if report["journal"] == "postgresql":
        lines.append("PostgreSQL connections: 2 a worker (its journal, its wake-ups), 1 for "
                     "each other process (docs/OPERATIONS.md)")  # fmt: skip
    if "error" in tools:
        lines.append(f"publishing: {tools['error']}")
    else:
        lines.append(f"publishing: esbuild {tools['esbuild']}, node {tools['node']}")
    return "\n".join(lines)
