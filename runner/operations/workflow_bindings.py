"""Workflow bindings, as Cloudflare's Workflow API has them: `create({ id, params })`,
`createBatch([...])`, `get(id)`, and on an instance `status()`, `pause()`, `resume()`,
`terminate()`, `restart()`, `sendEvent({ type, payload })`.

From inside a workflow, `env.MY_WORKFLOW` (the binding its project's wrangler file declares)
calls the host's `qjsflow.workflow`, a journaled call like any tool's, which `serve_call` answers
here: a replay answers from the journal, and a call made again after a crash creates no second
instance (an instance made without an id gets one made from the parent run and the call). A
child runs in its parent's scope, on its parent's snapshot, under the same budgets; workers
drive it. From Python, `WorkflowBinding(runner, scope, workflow)` has the same shapes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Protocol

from qjsflow.runner.errors import FatalToolError
from qjsflow.runner.operations.starts import BatchItem
from qjsflow.runner.store import SnapshotRecord
from qjsflow.runner.tenancy.scopes import split_run_key
from qjsflow.runner.views import RunView, StartRunInput

__all__ = ["CLOUDFLARE_STATUS", "WorkflowBinding", "WorkflowInstance", "serve_call"]


class Runner(Protocol):
    """What a binding uses of a `Runner` (the operations sit below it)."""

    async def start(self, request: StartRunInput, *, drive: bool = ...) -> RunView: ...
    async def get(self, run_id: str, *, scope: str) -> RunView: ...
    async def pause(self, run_id: str, *, scope: str) -> RunView: ...
    async def resume(self, run_id: str, *, scope: str, drive: bool = ...) -> RunView: ...
    async def terminate(self, run_id: str, *, scope: str) -> RunView: ...
    async def restart(self, run_id: str, *, scope: str, drive: bool = ...) -> RunView: ...
    async def signal(
        self, run_id: str, event_type: str, payload: object = ..., *, scope: str,
        drive: bool = ...,
    ) -> RunView: ...  # fmt: skip
    async def find_snapshot(self, reference: str, *, scope: str) -> SnapshotRecord: ...
    async def start_batch(self, requests: Sequence[StartRunInput]) -> list[BatchItem]: ...


# A run's status as Cloudflare's `InstanceStatus.status` names it.
CLOUDFLARE_STATUS = {
    "running": "running", "sleeping": "waiting", "waiting": "waiting", "blocked": "running",
    "paused": "paused", "throttled": "queued", "queued": "queued", "completed": "complete",
    "failed": "errored", "cancelled": "terminated", "terminated": "terminated",
}  # fmt: skip
_MAX_BATCH = 100  # Cloudflare's createBatch limit


def instance_status(run: RunView) -> dict[str, Any]:
    """Cloudflare's `InstanceStatus`: `{status, output, error}` (`error`: `{name, message}`)."""
    failed = run.status == "failed" and run.error
    name, _, message = (run.error or "").partition(": ")
    return {
        "status": CLOUDFLARE_STATUS[run.status],
        "output": run.output,
        "error": {"name": name, "message": message or name} if failed else None,
    }


class WorkflowInstance:
    """One run of a workflow, as Cloudflare's `WorkflowInstance`."""

    def __init__(self, runner: Runner, scope: str, run_id: str) -> None:
        self.runner, self.scope, self.id = runner, scope, run_id

    async def status(self) -> dict[str, Any]:
        return instance_status(await self.runner.get(self.id, scope=self.scope))

    async def pause(self) -> None:
        await self.runner.pause(self.id, scope=self.scope)

    async def resume(self) -> None:
        await self.runner.resume(self.id, scope=self.scope, drive=False)

    async def terminate(self) -> None:
        await self.runner.terminate(self.id, scope=self.scope)

    async def restart(self) -> None:
        await self.runner.restart(self.id, scope=self.scope, drive=False)

    async def send_event(self, *, type: str, payload: object = None) -> None:
        await self.runner.signal(self.id, type, payload, scope=self.scope, drive=False)


class WorkflowBinding:
    """A workflow of a scope, as Cloudflare's `Workflow` binding: instances are recorded and
    workers drive them. `snapshot`: the code new instances run (an id, a prefix, `latest`)."""

    def __init__(self, runner: Runner, scope: str, workflow: str, snapshot: str = "latest") -> None:
        self.runner, self.scope, self.workflow, self.snapshot = runner, scope, workflow, snapshot

    async def create(self, *, id: str | None = None, params: object = None) -> WorkflowInstance:
        request = StartRunInput(self.scope, self.workflow, self.snapshot, params, id)
        run = await self.runner.start(request, drive=False)
        return WorkflowInstance(self.runner, self.scope, run.run_id)

    async def create_batch(self, items: Sequence[dict[str, Any]]) -> list[WorkflowInstance]:
        """Cloudflare's `createBatch`: the starts in one transaction (`Runner.start_batch`);
        an instance whose id exists with the same params is returned as it is. An item
        refused (its id taken by another start, its params too large, its flow control)
        fails the call naming it; the others stand."""
        if len(items) > _MAX_BATCH:
            raise FatalToolError(f"createBatch takes at most {_MAX_BATCH} instances")
        requests = [StartRunInput(self.scope, self.workflow, self.snapshot, item.get("params"),
                                  item.get("id")) for item in items]  # fmt: skip
        answered = await self.runner.start_batch(requests) if requests else []
        refused = [item for item in answered if item.outcome == "refused"]
        if refused:
            raise FatalToolError(f"createBatch item {refused[0].index}: {refused[0].error}")
        return [WorkflowInstance(self.runner, self.scope, item.run_id or "") for item in answered]

    async def get(self, id: str) -> WorkflowInstance:
        run = await self.runner.get(id, scope=self.scope)
        return WorkflowInstance(self.runner, self.scope, run.run_id)


async def serve_call(runner: Runner, parent: str, snapshot_id: str, args: Any) -> Any:
    """The host's `qjsflow.workflow` for a run (`parent`, a run key, on `snapshot_id`): one
    method of the binding `args["binding"]`, which the run's snapshot declares."""
    scope, parent_id = split_run_key(parent)
    snapshot = await runner.find_snapshot(snapshot_id, scope=scope)
    name = str(args.get("binding"))
    workflow = next((w.workflow for w in snapshot.workflows if w.binding == name), None)
    if workflow is None:
        raise FatalToolError(f"{name[:80]}: no workflow of this snapshot has that binding")
    binding = WorkflowBinding(runner, scope, workflow, snapshot.snapshot_id)
    op, call = args.get("op"), str(args.get("call"))
    if op == "create":
        made = await binding.create(id=_id(args, parent_id, call), params=args.get("params"))
        return {"id": made.id}
    if op == "createBatch":
        items = args.get("items")
        if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
            raise FatalToolError(f"{name}.createBatch takes a list of {{id, params}}")
        made_all = await binding.create_batch([
            {"id": _id(item, parent_id, f"{call}/{n}"), "params": item.get("params")}
            for n, item in enumerate(items)
        ])  # fmt: skip
        return [{"id": made.id} for made in made_all]
    instance = await binding.get(str(args.get("id")))
    match op:
        case "get":
            return {"id": instance.id}
        case "status":
            return await instance.status()
        case "pause" | "resume" | "terminate" | "restart":
            await getattr(instance, op)()
            return None
        case "sendEvent":
            await instance.send_event(type=str(args.get("type")), payload=args.get("payload"))
            return None
    raise FatalToolError(f"{name}: no method {str(op)[:40]!r}")


def _id(options: dict[str, Any], parent_id: str, call: str) -> str:
    """The id asked for, or one made from the parent run and the call (the same when the call
    is made again after a crash)."""
    given = options.get("id")
    if given is not None:
        return str(given)
    digest = hashlib.sha256(f"{parent_id}\n{call}".encode()).hexdigest()[:24]
    return f"child-{digest}"
