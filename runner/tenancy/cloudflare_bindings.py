"""The local Cloudflare bindings: a KV namespace and a queue per scope, kept in the journal's
database, so workflows written against `env.KV` and `env.QUEUE` run with no operator code.

The sandbox's binding objects call the tools `qjsflow.kv` and `qjsflow.queue` (journaled like
any tool call); an operator who binds those addresses replaces these with their own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from qjsflow.bridge import dumps_text
from qjsflow.bridge.values import to_json_form
from qjsflow.runner.errors import FatalToolError
from qjsflow.runner.store import JournalStore

__all__ = [
    "BINDING_ADDRESSES",
    "DURABLE_OBJECT_ADDRESS",
    "KV_ADDRESS",
    "QUEUE_ADDRESS",
    "R2_ADDRESS",
    "WORKFLOW_ADDRESS",
    "kv_tool",
    "queue_tool",
    "r2_tool",
]

KV_ADDRESS = "qjsflow.kv"
QUEUE_ADDRESS = "qjsflow.queue"
R2_ADDRESS = "qjsflow.r2"
DURABLE_OBJECT_ADDRESS = "qjsflow.durable_object"  # only an operator's tool answers it
# Workflow bindings: served by the runner (runner/operations/workflow_bindings.py).
WORKFLOW_ADDRESS = "qjsflow.workflow"
# The tools a binding object calls, its name in `args["binding"]` (sandbox/prelude/55-fetch.js).
BINDING_ADDRESSES = frozenset(
    {KV_ADDRESS, QUEUE_ADDRESS, R2_ADDRESS, DURABLE_OBJECT_ADDRESS, WORKFLOW_ADDRESS}
)
_MAX_LIST = 1000


async def kv_tool(
    store: JournalStore, scope: str, args: dict[str, Any], now: Callable[[], int]
) -> Any:
    """`get`, `put`, `delete` and `list` on the scope's KV namespace `args["binding"]`."""
    namespace, op = str(args.get("binding")), args.get("op")
    key = args.get("key")
    if op == "list":
        prefix = str(args.get("prefix") or "")
        limit = min(int(args.get("limit") or _MAX_LIST), _MAX_LIST)
        keys = await store.kv_list(scope, namespace, prefix, limit)
        return {"keys": [{"name": name} for name in keys], "list_complete": len(keys) < limit}
    if not isinstance(key, str) or not key:
        raise FatalToolError(f"{namespace}.{op}: the key must be a non-empty string")
    if op == "get":
        return await store.kv_get(scope, namespace, key)
    if op == "put":
        value = args.get("value")
        if not isinstance(value, str):
            raise FatalToolError(f"{namespace}.put: the value must be a string")
        await store.kv_put(scope, namespace, key, value, now())
        return None
    if op == "delete":
        await store.kv_put(scope, namespace, key, None, now())
        return None
    raise FatalToolError(f"{namespace}: no method {str(op)[:40]!r}")


async def queue_tool(
    store: JournalStore, scope: str, args: dict[str, Any], now: Callable[[], int]
) -> Any:
    """`send` of one or more message bodies to the scope's queue `args["binding"]`."""
    bodies = args.get("bodies")
    if not isinstance(bodies, list) or not bodies:
        raise FatalToolError(f"{args.get('binding')}.send: nothing to send")
    texts = [dumps_text(to_json_form(body)) for body in bodies]
    await store.queue_send(scope, str(args.get("binding")), texts, now())
    return None


async def r2_tool(
    store: JournalStore, scope: str, args: dict[str, Any], now: Callable[[], int]
) -> Any:
    """An R2 bucket's `get`, `head`, `put`, `delete`, `list`, kept beside the KV namespaces (a
    bucket `B` is the namespace `r2:B`); objects are text."""
    bucket = f"r2:{args.get('binding')}"
    op = args.get("op")
    if op == "list":
        listed = await kv_tool(store, scope, {**args, "binding": bucket}, now)
        return {"objects": [{"key": k["name"]} for k in listed["keys"]],
                "truncated": not listed["list_complete"]}  # fmt: skip
    if op == "head":
        op = "get"
    return await kv_tool(store, scope, {**args, "binding": bucket, "op": op}, now)
