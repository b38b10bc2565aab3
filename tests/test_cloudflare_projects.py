"""Cloudflare projects publish from their root, as they are: a wrangler file (JSONC with
comments and trailing commas, JSON or TOML) names `main` and the workflow classes in it,
whatever the layout; helpers, JSON imports and a Worker's own imports that only its build
knows (left out, with a warning) do not stop the publish."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qjsflow import WorkflowBinding
from qjsflow.bundles import SourceTreeError
from qjsflow.runner import Runner, StartRunInput
from qjsflow.runner.errors import FatalToolError

WRANGLER_JSONC = """/**
 * Wrangler's own comment block, as `npm create cloudflare` writes it.
 */
{
  "$schema": "node_modules/wrangler/config-schema.json",
  "name": "workflows-starter",
  "main": "src/index.ts",
  "compatibility_date": "2026-06-01",
  "observability": { "enabled": true, },  // trailing commas, as the templates have them
  "workflows": [
    { "name": "workflows-starter", "binding": "MY_WORKFLOW", "class_name": "MyWorkflow" },
    { "name": "reporter", "binding": "REPORTER", "class_name": "Reporter", },
    { "name": "billing", "binding": "BILLING", "class_name": "Billing", "script_name": "bills" },
  ],
  "vars": { "GREETING": "hi" },
}
"""

WRANGLER_TOML = """
name = "workflows-starter"
main = "src/index.ts"
compatibility_date = "2026-06-01"

[[workflows]]
name = "workflows-starter"
binding = "MY_WORKFLOW"
class_name = "MyWorkflow"
"""

INDEX = """
import { WorkflowEntrypoint, WorkflowStep, WorkflowEvent } from "cloudflare:workers";
import { createRequestHandler } from "react-router";
import { progress } from "./workflows/progress";
import config from "./config.json";

// Only the Worker's fetch uses what its own build provides.
const handler = createRequestHandler(() => import("virtual:react-router/server-build"));

type Env = { GREETING: string };

export class MyWorkflow extends WorkflowEntrypoint<Env, { n: number }> {
  async run(event: WorkflowEvent<{ n: number }>, step: WorkflowStep) {
    const a = await step.do("first", async () => progress(event.payload.n));
    return { a, label: config.label };
  }
}

export class Reporter extends WorkflowEntrypoint<Env, unknown> {
  async run(event: WorkflowEvent<unknown>, step: WorkflowStep) {
    return await step.do("report", async () => `reported ${this.env.GREETING}`);
  }
}

export default {
  async fetch(request: Request): Promise<Response> {
    return handler(request);
  },
};
"""


def _project(root: Path, wrangler: tuple[str, str] = ("wrangler.jsonc", WRANGLER_JSONC)) -> Path:
    (root / "src" / "workflows").mkdir(parents=True)
    (root / "src" / "lib").mkdir()
    (root / wrangler[0]).write_text(wrangler[1])
    (root / "src" / "index.ts").write_text(INDEX)
    (root / "src" / "workflows" / "progress.ts").write_text(
        'import { twice } from "../lib/math";\nexport const progress = (n: number) => twice(n) + 1;\n'
    )
    (root / "src" / "lib" / "math.ts").write_text("export const twice = (n: number) => n * 2;\n")
    (root / "src" / "config.json").write_text('{"label": "starter"}')
    package = root / "node_modules" / "react-router"
    package.mkdir(parents=True)
    (package / "package.json").write_text(
        json.dumps({"name": "react-router", "main": "index.js", "sideEffects": False})
    )
    (package / "index.js").write_text(
        "export function createRequestHandler(load) { return async () => (await load()).x; }\n"
    )
    return root


async def _completed(runner: Runner, scope: str, workflow: str, payload: object) -> object:
    run = await runner.start(StartRunInput(scope, workflow, "latest", payload))
    assert run.status == "completed", run.error
    return run.output


async def test_a_wrangler_jsonc_project_publishes_from_its_root(
    runner: Runner, tmp_path: Path
) -> None:
    published = await runner.publish("cf", _project(tmp_path / "p"))
    assert [(w.workflow, w.entry_path, w.export) for w in published.workflows] == [
        ("reporter", "src/index.ts", "Reporter"),
        ("workflows-starter", "src/index.ts", "MyWorkflow"),
    ]
    assert await _completed(runner, "cf", "workflows-starter", {"n": 4}) == {
        "a": 9, "label": "starter",
    }  # fmt: skip
    # The project's wrangler vars are its runs' env defaults; the scope's configuration wins.
    assert await _completed(runner, "cf", "reporter", None) == "reported hi"
    await runner.apply_scope_config("cf", '{"vars": {"GREETING": "hello"}}')
    assert await _completed(runner, "cf", "reporter", None) == "reported hello"
    warnings = "\n".join(published.warnings)
    assert "the workflow 'billing' is defined by another Worker (script_name)" in warnings
    assert (
        'src/index.ts: imports "virtual:react-router/server-build", left out of the snapshot'
        in warnings
    )


async def test_a_wrangler_toml_project_and_its_id(runner: Runner, tmp_path: Path) -> None:
    toml = await runner.publish("cf", _project(tmp_path / "t", ("wrangler.toml", WRANGLER_TOML)))
    assert [w.workflow for w in toml.workflows] == ["workflows-starter"]
    jsonc = await runner.publish("cf", _project(tmp_path / "j"))
    assert jsonc.snapshot_id != toml.snapshot_id  # the wrangler file is part of the snapshot


async def test_entries_name_a_file_and_its_class(runner: Runner, tmp_path: Path) -> None:
    root = _project(tmp_path / "p")
    (root / "wrangler.jsonc").unlink()
    one = await runner.publish("cf", root, ["src/index.ts:Reporter"])
    assert [(w.workflow, w.export) for w in one.workflows] == [("Reporter", "Reporter")]
    both = await runner.publish("cf", root, ["src/index.ts"])
    assert sorted(w.workflow for w in both.workflows) == ["MyWorkflow", "Reporter"]
    assert one.snapshot_id != both.snapshot_id  # which classes are workflows is in the id
    with pytest.raises(SourceTreeError, match="does not export the workflow class 'Nope'"):
        await runner.publish("cf", root, ["src/index.ts:Nope"])


@pytest.mark.parametrize(
    ("wrangler", "said"),
    [
        ('{"main": 7, "workflows": []}', '"main" that is not a path'),
        ('{"workflows": []}', "workflows/: holds no .ts or .js file"),  # no main: that layout
        ('{"main": "../outside.ts", "workflows": []}', "outside the project"),
        ('{"main": "src/index.ts", "workflows": []}', "declares no workflow of its own"),
        ('{"main": "src/gone.ts", "workflows": [{"name": "a", "class_name": "A"}]}',
         "\"main\" 'src/gone.ts', which is not in the published tree"),
        ('{"main": "src/index.ts", "workflows": [{"name": "a"}]}', "no class_name"),
        ('{"main": "src/index.ts", "workflows": [{"name": "a", "class_name": "Gone"}]}',
         "does not export the workflow class 'Gone'"),
        ("{main: [", "is not valid JSON"),
        ("[" * 5000, "is not valid JSON"),
        ('{"main": "src/index.ts", "vars": {"db": 1}, "workflows": [{"name": "a", "class_name": '
         '"A"}]}', "a var 'db' whose name env cannot hold"),
    ],
)  # fmt: skip
async def test_a_broken_wrangler_file_is_refused_naming_it(
    runner: Runner, tmp_path: Path, wrangler: str, said: str
) -> None:
    root = _project(tmp_path / "p", ("wrangler.jsonc", wrangler))
    with pytest.raises(SourceTreeError, match=said):
        await runner.publish("cf", root)


async def test_an_import_left_out_throws_only_where_it_is_used(
    runner: Runner, tmp_path: Path
) -> None:
    """A Cloudflare module qjsflow has no equivalent of loads quietly; a workflow that uses it
    fails naming it. A package not installed that the bundle uses is still refused."""
    root = tmp_path / "uses"
    (root / "workflows").mkdir(parents=True)
    (root / "workflows" / "mail.ts").write_text(
        'import { EmailMessage } from "cloudflare:email";\n'
        "export default async (event: { payload: boolean }) =>\n"
        '  event.payload ? new EmailMessage("a", "b", "c") : "no mail";\n'
    )
    published = await runner.publish("cf", root)
    assert any('imports "cloudflare:email"' in w for w in published.warnings)
    assert await _completed(runner, "cf", "mail", False) == "no mail"
    run = await runner.start(StartRunInput("cf", "mail", "latest", True))
    assert run.status == "failed"
    assert 'the module "cloudflare:email" is not in this snapshot' in (run.error or "")
    (root / "workflows" / "mail.ts").write_text(
        'import { z } from "zod";\nexport default async () => z.string();\n'
    )
    with pytest.raises(Exception, match='imports the package "zod", which is not installed'):
        await runner.publish("cf", root)


OLD_EMITTER = """
var EventEmitter = require("events").EventEmitter;
var util = require("util");
function Thing() { EventEmitter.call(this); this.n = 0; }  // as packages written for Node 0.x do
util.inherits(Thing, EventEmitter);
Thing.prototype.bump = function () { this.n += 1; this.emit("bumped", this.n); };
module.exports = Thing;
"""

COMPAT_INDEX = """
import { WorkflowEntrypoint } from "cloudflare:workers";
import Thing from "old-emitter";
import { readFileSync } from "node:fs";
import { format } from "node:util";
import path from "path";

export class Compat extends WorkflowEntrypoint {
  async run(event, step) {
    return await step.do("use node", async () => {
      const thing = new Thing();
      let seen = 0;
      thing.on("bumped", (n) => { seen = n; });
      thing.bump();
      thing.bump();
      let denied = "none";
      try { readFileSync("/etc/passwd"); } catch (e) { denied = e.message; }
      return {
        seen, base64: Buffer.from("hi").toString("base64"), formatted: format("%s=%d", "a", 1),
        joined: path.join("a", "b"), denied, env: typeof process.env,
      };
    });
  }
}
export default { fetch() { return new Response("ok"); } };
"""


def _compat_project(root: Path, flags: list[str]) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "src" / "index.ts").write_text(COMPAT_INDEX)
    (root / "wrangler.jsonc").write_text(json.dumps({
        "main": "src/index.ts", "compatibility_flags": flags,
        "workflows": [{"name": "compat", "binding": "COMPAT", "class_name": "Compat"}],
    }))  # fmt: skip
    package = root / "node_modules" / "old-emitter"
    package.mkdir(parents=True)
    (package / "package.json").write_text('{"name": "old-emitter", "main": "index.js"}')
    (package / "index.js").write_text(OLD_EMITTER)
    return root


async def test_nodejs_compat_gives_node_built_ins_from_unenv_and_npm(
    runner: Runner, tmp_path: Path
) -> None:
    """With the flag: `events` (an EventEmitter old packages `.call(this)`), `util`,
    `buffer` and `path`, `process` and `Buffer` as globals; `fs` loads and its calls throw,
    naming them. Without it: refused, naming the flag."""
    refused = _compat_project(tmp_path / "without", [])
    with pytest.raises(Exception, match="which workflows have only with the nodejs_compat flag"):
        await runner.publish("cf", refused)
    await runner.publish("cf", _compat_project(tmp_path / "with", ["nodejs_compat"]))
    assert await _completed(runner, "cf", "compat", None) == {
        "seen": 2, "base64": "aGk=", "formatted": "a=1", "joined": "a/b", "env": "object",
        "denied": "node:fs.readFileSync is not available in a workflow (node:fs: no file "
        "system, sockets, processes or threads here)",
    }  # fmt: skip


FAMILY = """
import { WorkflowEntrypoint } from "cloudflare:workers";
import { waitForInstance } from "qjsflow";

export class Parent extends WorkflowEntrypoint {
  async run(event, step) {
    const child = await this.env.CHILD.create({ params: { n: event.payload } });
    const found = await this.env.CHILD.get(child.id);
    const ended = await waitForInstance(step, found, { firstMs: 10 });
    const named = await this.env.CHILD.create({ id: "named-child", params: { n: 0, wait: true } });
    await named.sendEvent({ type: "go", payload: 5 });
    const second = await waitForInstance(step, named, { firstMs: 10 });
    const batch = await this.env.CHILD.createBatch([{ params: { n: 1 } }, { id: "batch-2", params: { n: 2 } }]);
    return { id: child.id, ended, second, batch: batch.map((made) => made.id) };
  }
}

export class Child extends WorkflowEntrypoint {
  async run(event, step) {
    const extra = event.payload.wait ? (await step.waitForEvent("go", { type: "go" })).payload : 0;
    return await step.do("double", async () => event.payload.n * 2 + extra);
  }
}
"""


async def test_workflow_bindings_create_children_once_and_wait_for_them(
    runner: Runner, tmp_path: Path
) -> None:
    root = tmp_path / "family"
    (root / "src").mkdir(parents=True)
    (root / "src" / "index.ts").write_text(FAMILY)
    (root / "wrangler.jsonc").write_text(json.dumps({"main": "src/index.ts", "workflows": [
        {"name": "parent", "binding": "PARENT", "class_name": "Parent"},
        {"name": "child", "binding": "CHILD", "class_name": "Child"},
    ]}))  # fmt: skip
    await runner.publish("cf", root)
    parent = await runner.start(StartRunInput("cf", "parent", "latest", 21, "p1"))
    await runner.serve(until_idle=True)  # the children, and the parent's drives after sleeps
    done = await runner.get("p1", scope="cf")
    assert done.status == "completed", done.error
    child_id = done.output["id"]
    assert done.output["ended"] == {"status": "complete", "output": 42, "error": None}
    assert done.output["second"]["output"] == 5
    children = await runner.list(scope="cf", workflow="child")
    # One instance per create, though the parent's body ran again on each of its drives.
    batch = done.output["batch"]
    assert batch[1] == "batch-2"
    assert sorted(r.run_id for r in children) == sorted([child_id, "named-child", *batch])
    # A create made again after a crash (the same call of the same run) finds its instance.
    from qjsflow.runner.operations.workflow_bindings import serve_call  # noqa: PLC0415

    again = await serve_call(runner, f"cf/{parent.run_id}", parent.snapshot_id, {
        "binding": "CHILD", "op": "create", "params": {"n": 21}, "call": "CHILD.create#1",
    })  # fmt: skip
    assert again == {"id": child_id}
    assert len(await runner.list(scope="cf", workflow="child")) == 4
    binding = WorkflowBinding(runner, "cf", "child")
    status = await binding.get(child_id)
    assert await status.status() == {"status": "complete", "output": 42, "error": None}
    # createBatch is one batch of starts: the same start again is the instance it made; an
    # item whose id another start took is refused, naming it.
    same = await binding.create_batch([{"id": "batch-2", "params": {"n": 2}}])
    assert [made.id for made in same] == ["batch-2"]
    with pytest.raises(FatalToolError, match="createBatch item 1: run 'batch-2' already exists"):
        await binding.create_batch([{"id": "batch-3", "params": {}}, {"id": "batch-2"}])


async def test_a_real_sized_sdk_of_many_files_publishes(runner: Runner, tmp_path: Path) -> None:
    """The tree's cap is bytes, not a count of files: a package of 800 small modules (twilio's
    SDK reaches more than 500) publishes."""
    root = tmp_path / "sdk"
    (root / "workflows").mkdir(parents=True)
    package = root / "node_modules" / "big-sdk"
    (package / "lib").mkdir(parents=True)
    (package / "package.json").write_text('{"name": "big-sdk", "main": "index.js"}')
    for n in range(800):
        (package / "lib" / f"m{n}.js").write_text(f"module.exports = {n};\n")
    (package / "index.js").write_text(
        "module.exports = [" + ", ".join(f'require("./lib/m{n}.js")' for n in range(800)) + "];\n"
    )
    (root / "workflows" / "sum.ts").write_text(
        'import parts from "big-sdk";\n'
        "export default async () => parts.reduce((a: number, b: number) => a + b, 0);\n"
    )
    await runner.publish("cf", root)
    assert await _completed(runner, "cf", "sum", None) == sum(range(800))
