"""What a snapshot's workflows may reach, as its tree declares it (docs/TENANCY.md,
Capability manifests).

Declared in `qjsflow.json` at the tree's root (`{"capabilities": {...}}`), or, without one, in
the Cloudflare project's wrangler file (`wrangler.jsonc`, `.json` or `.toml`): the
`capabilities` of each entry of its `workflows` section, together. The file is part of the
snapshot (its bytes are in the id):

    {"capabilities": {"tools": ["crm.sync", "mail.*"], "bindings": ["CACHE", "API_TOKEN"],
                      "fetch": ["api.example.com", "*.example.org"], "sql": "read"}}

`tools`: tool addresses, or a prefix ending in `.*`; `bindings`: names in `env`; `fetch`: hosts,
`*.domain`, or URL prefixes (the scope's egress policy must allow them too); `sql`: `none`,
`read` or `write`. A tree with no manifest declares nothing and is bounded only by its scope's
policy.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from qjsflow.bridge import CodecError, dumps_text, loads
from qjsflow.bundles.errors import SourceTreeError
from qjsflow.bundles.flow import FlowControl, flow_from_json
from qjsflow.bundles.wrangler import WRANGLER_FILES, read_document

__all__ = [
    "MANIFEST_FILES",
    "SQL_MODES",
    "Capabilities",
    "WorkflowSettings",
    "capabilities_from_json",
    "capabilities_of",
    "exceeding",
    "workflow_settings",
]

MANIFEST_FILES = ("qjsflow.json", *WRANGLER_FILES)
SQL_MODES = ("none", "read", "write")
_KEYS = frozenset({"tools", "bindings", "fetch", "sql"})
_ENTRY = re.compile(r"^[\x21-\x7e]{1,256}$")  # printable ASCII, no spaces
_MAX_ENTRIES = 256


@dataclass(frozen=True, slots=True)
class Capabilities:
    tools: tuple[str, ...] = ()
    bindings: tuple[str, ...] = ()
    fetch: tuple[str, ...] = ()
    sql: str = "none"

    def to_json(self) -> str:
        return dumps_text(
            {"tools": list(self.tools), "bindings": list(self.bindings),
             "fetch": list(self.fetch), "sql": self.sql}
        )  # fmt: skip

    def allows_tool(self, address: str) -> bool:
        return any(_covers_name(pattern, address) for pattern in self.tools)

    def allows_binding(self, name: str) -> bool:
        return any(_covers_name(pattern, name) for pattern in self.bindings)

    def allows_sql(self, writes: bool) -> bool:
        return self.sql == "write" or (self.sql == "read" and not writes)


def _covers_name(pattern: str, name: str) -> bool:
    if pattern == "*":
        return True
    if pattern.endswith(".*"):
        return name.startswith(pattern[:-1])
    return pattern == name


def _covers_url(bound: str, entry: str) -> bool:
    """Whether the policy entry `bound` covers every URL the manifest entry `entry` does
    (URL prefixes compared parsed, never as text: "https://a.com" must not cover
    "https://a.com.evil.test/")."""
    if "://" not in entry:
        return bound.lower() == entry.lower() or (
            bound.startswith("*.") and entry.lower().endswith(bound[1:].lower())
        )
    url = urlsplit(entry)
    host = (url.hostname or "").lower()
    if "://" not in bound:
        if bound.startswith("*."):
            return host.endswith(bound[1:].lower())
        return host == bound.lower()
    prefix = urlsplit(bound)
    same_origin = (prefix.scheme, (prefix.hostname or "").lower(), prefix.port) == (
        url.scheme, host, url.port,
    )  # fmt: skip
    return same_origin and (url.path or "/").startswith(prefix.path or "/")


def exceeding(asked: Capabilities, policy: Capabilities) -> list[str]:
    """What `asked` declares beyond `policy` (an operator's bound), one phrase per item."""
    beyond = [f"tool {t!r}" for t in asked.tools if not _within_names(t, policy.tools)]
    beyond += [f"binding {b!r}" for b in asked.bindings if not _within_names(b, policy.bindings)]
    beyond += [f"fetch {f!r}" for f in asked.fetch if not _within_fetch(f, policy.fetch)]
    if SQL_MODES.index(asked.sql) > SQL_MODES.index(policy.sql):
        beyond.append(f"sql {asked.sql!r} (the policy allows {policy.sql!r})")
    return beyond


def _within_names(pattern: str, bounds: Iterable[str]) -> bool:
    # A bound covers a pattern as it covers a name: "crm.*" bounds "crm.sync" and "crm.admin.*".
    return any(_covers_name(bound, pattern) for bound in bounds)


def _within_fetch(entry: str, bounds: Iterable[str]) -> bool:
    for bound in bounds:
        if bound.lower() == entry.lower():
            return True
        if entry.startswith("*."):
            # The subdomains of x are within "*.y" only if x is y or under it.
            inner = entry[2:].lower()
            if bound.startswith("*.") and (
                inner == bound[2:].lower() or inner.endswith(bound[1:].lower())
            ):
                return True
        elif _covers_url(bound, entry):
            return True
    return False


def capabilities_from_json(value: object, where: str) -> Capabilities:
    """Capabilities as written in a manifest or an operator's policy; `where` names it."""
    if not isinstance(value, dict) or set(value) - _KEYS:
        raise ValueError(f"{where}: capabilities hold some of {', '.join(sorted(_KEYS))}")
    lists = {key: _entries(value.get(key, []), f"{where}: capabilities.{key}") for key in
             ("tools", "bindings", "fetch")}  # fmt: skip
    sql = value.get("sql", "none")
    if sql not in SQL_MODES:
        raise ValueError(f"{where}: capabilities.sql is one of {', '.join(SQL_MODES)}")
    return Capabilities(lists["tools"], lists["bindings"], lists["fetch"], str(sql))


def _entries(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) > _MAX_ENTRIES:
        raise ValueError(f"{where} is a list of at most {_MAX_ENTRIES} strings")
    for item in value:
        if not isinstance(item, str) or not _ENTRY.fullmatch(item):
            raise ValueError(f"{where}: {str(item)[:80]!r} is not 1-256 printable characters")
    return tuple(value)


def capabilities_of(files: Mapping[str, bytes]) -> Capabilities | None:
    """The capabilities a tree declares (path -> bytes of its manifest files), or None."""
    for path in MANIFEST_FILES:
        if path in files:
            return _parse(path, files[path])
    return None


def _parse(path: str, content: bytes) -> Capabilities | None:
    document = _document(path, content)
    try:
        if path == "qjsflow.json":
            if not isinstance(document, dict) or not set(document) <= {"capabilities", "workflows"}:
                raise ValueError('holds an object of "capabilities" and "workflows"')
            if "capabilities" not in document:
                return None
            return capabilities_from_json(document["capabilities"], path)
        return _from_wrangler(document, path)
    except ValueError as error:
        raise SourceTreeError(path, str(error).removeprefix(f"{path}: ")) from None


def _from_wrangler(document: Any, path: str) -> Capabilities | None:
    workflows = document.get("workflows") if isinstance(document, dict) else None
    declared = [
        capabilities_from_json(entry["capabilities"], path)
        for entry in (workflows if isinstance(workflows, list) else [])
        if isinstance(entry, dict) and "capabilities" in entry
    ]
    if not declared:
        return None
    modes = [SQL_MODES.index(c.sql) for c in declared]
    return Capabilities(
        tools=tuple(dict.fromkeys(t for c in declared for t in c.tools)),
        bindings=tuple(dict.fromkeys(b for c in declared for b in c.bindings)),
        fetch=tuple(dict.fromkeys(f for c in declared for f in c.fetch)),
        sql=SQL_MODES[max(modes)],
    )


def _document(path: str, content: bytes) -> Any:
    if path != "qjsflow.json":
        return read_document(path, content)
    try:
        return loads(content.decode("utf-8"))
    except (UnicodeDecodeError, CodecError) as error:
        raise SourceTreeError(path, f"is not valid JSON: {error}") from None


@dataclass(frozen=True, slots=True)
class WorkflowSettings:
    """What a manifest declares of one workflow beside its code: its flow control, and (in
    `qjsflow.json`) its schedules as the runner takes them (checked as they are set)."""

    flow: FlowControl | None = None
    schedules: tuple[Mapping[str, Any], ...] = ()


_SETTING_KEYS = frozenset({"flow_control", "schedules"})


def workflow_settings(files: Mapping[str, bytes]) -> dict[str, WorkflowSettings]:
    """Each workflow's settings as the tree's manifest declares them (name -> settings):
    `qjsflow.json`'s `workflows` object, or a wrangler file's `workflows[].flow_control`."""
    for path in MANIFEST_FILES:
        if path in files:
            try:
                return _settings(path, _document(path, files[path]))
            except ValueError as error:
                raise SourceTreeError(path, str(error)) from None
    return {}


def _settings(path: str, document: Any) -> dict[str, WorkflowSettings]:
    if not isinstance(document, dict):
        return {}
    found: dict[str, WorkflowSettings] = {}
    workflows = document.get("workflows")
    if path != "qjsflow.json":  # wrangler's list; its schedules are cron strings, read there
        for n, entry in enumerate(workflows if isinstance(workflows, list) else []):
            if isinstance(entry, dict) and entry.get("flow_control") is not None:
                where = f"workflows[{n}].flow_control"
                found[str(entry.get("name"))] = WorkflowSettings(
                    flow_from_json(entry["flow_control"], where)
                )
        return found
    if workflows is None:
        return {}
    if not isinstance(workflows, dict) or len(workflows) > 256:
        raise ValueError("workflows is an object of workflow names and their settings")
    for name, entry in workflows.items():
        where = f"workflows.{str(name)[:64]}"
        if not isinstance(entry, dict) or set(entry) - _SETTING_KEYS:
            raise ValueError(f"{where} is an object of {', '.join(sorted(_SETTING_KEYS))}")
        flow = entry.get("flow_control")
        schedules = entry.get("schedules", [])
        if (
            not isinstance(schedules, list)
            or len(schedules) > 16
            or not all(isinstance(item, dict) for item in schedules)
        ):
            raise ValueError(f"{where}.schedules is a list of at most 16 schedules (objects)")
        found[str(name)] = WorkflowSettings(
            None if flow is None else flow_from_json(flow, f"{where}.flow_control"),
            tuple(schedules),
        )
    return found
