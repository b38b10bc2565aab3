"""A scope's configuration as data in the journal (docs/TENANCY.md, "Scope configuration"):
vars, the names of its secrets and the host environment variable a worker reads each one's
value from, its binding objects, egress policy, budgets and capability policy.

It is versioned like a snapshot (`qjsflow scope apply`); a run records the version it started
with, so every worker that drives it, anywhere, sees the same `env`. The journal never holds a
secret's value: a worker resolves it from its own environment when a tool call or a fetch
needs it (`ScopeConfig.environment`).

A document is JSON or TOML, one scope's settings, with the keys of one scope of the operator's
env file: `{"vars": {...}, "secrets": {"API_KEY": "ACME_API_KEY"}, "kv": ["CACHE"],
"egress": {"allow": ["api.example.com"]}, "budgets": {"steps_per_day": 10000},
"capabilities": {"tools": ["crm.*"]}, "scheduling": {"weight": 3, "concurrency": 20}}`. Every
problem is named, one per line.
"""

from __future__ import annotations

import difflib
import json
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from qjsflow.bridge import CodecError, InvalidInput, dumps_text, loads
from qjsflow.bundles.manifest import Capabilities, capabilities_from_json
from qjsflow.runner.store import JournalStore
from qjsflow.runner.tenancy.budgets import Budgets
from qjsflow.runner.tenancy.egress import EgressPolicy
from qjsflow.runner.tenancy.environment import OBJECT_KINDS, ScopeEnvironment
from qjsflow.runner.tenancy.sealed_secrets import JOURNAL_SOURCE
from qjsflow.runner.tenancy.secret_sources import SecretSource

__all__ = [
    "MAX_CONFIG_BYTES", "ConfigCache", "ScopeConfig", "config_diff", "parse_config_text",
]  # fmt: skip

MAX_CONFIG_BYTES = 256 * 1024
_OBJECT_KEYS = tuple(OBJECT_KINDS)
_KEYS = frozenset(
    {"vars", "secrets", "egress", "budgets", "capabilities", "scheduling", *_OBJECT_KEYS}
)
_MAX_WEIGHT, _MAX_CONCURRENCY = 1000.0, 1_000_000
_HOST_VARIABLE = (
    "a host environment variable's name (letters, digits, _), or @journal for a value sealed in"
    " the journal (qjsflow secrets set)"
)


@dataclass(frozen=True, slots=True)
class ScopeConfig:
    """One version of a scope's configuration, validated."""

    vars: Mapping[str, Any]
    secrets: Mapping[str, str]  # name -> the host environment variable holding its value
    egress: EgressPolicy
    kv: tuple[str, ...] = ()
    queues: tuple[str, ...] = ()
    r2: tuple[str, ...] = ()
    durable_objects: tuple[str, ...] = ()
    tool_bindings: tuple[str, ...] = ()  # binding objects backed by the operator's tools
    budgets: Budgets | None = None
    capabilities: Capabilities | None = None  # the most its snapshots may declare
    # Fair scheduling (docs/TENANCY.md): the scope's share of every worker's drives, and how
    # many of its runs all workers drive at once. Unset: the worker's RunnerConfig says.
    weight: float | None = None
    concurrency: int | None = None

    def environment(
        self, source: SecretSource, sealed: Mapping[str, str] | None = None
    ) -> ScopeEnvironment:
        """The scope's environment in this process, as a drive uses it: its secrets' values
        from `source`, or for those sealed in the journal (`@journal`), from `sealed` (opened
        with this process's key); one this process cannot resolve is left out: the run parks
        `blocked` on it until a worker that can drives it."""
        found = {
            name: (sealed or {}).get(name) if variable == JOURNAL_SOURCE else source.get(variable)
            for name, variable in self.secrets.items()
        }  # fmt: skip
        return self._with_secrets({name: v for name, v in found.items() if v is not None})

    @property
    def sealed_names(self) -> list[str]:
        """The secrets whose values are sealed in the journal."""
        return sorted(name for name, source in self.secrets.items() if source == JOURNAL_SOURCE)

    def declared(self) -> ScopeEnvironment:
        """The scope's environment as a run's start records it: a handle for every secret it
        names, whatever this process can resolve (no value: never revealed from here)."""
        return self._with_secrets(dict.fromkeys(self.secrets, ""))

    def _with_secrets(self, secrets: Mapping[str, str]) -> ScopeEnvironment:
        return ScopeEnvironment(
            vars=self.vars, secrets=secrets, egress=self.egress, kv=self.kv, queues=self.queues,
            r2=self.r2, durable_objects=self.durable_objects, tool_bindings=self.tool_bindings,
        )  # fmt: skip

    def document(self) -> dict[str, Any]:
        """The configuration as its canonical document (what the journal stores)."""
        shown: dict[str, Any] = {"vars": dict(self.vars), "secrets": dict(self.secrets)}
        for key in _OBJECT_KEYS:
            if getattr(self, key):
                shown[key] = list(getattr(self, key))
        if self.egress != EgressPolicy():
            shown["egress"] = {"allow": list(self.egress.allow),
                               "allow_private": self.egress.allow_private}  # fmt: skip
        if self.budgets is not None:
            shown["budgets"] = {
                f.name: getattr(self.budgets, f.name) for f in fields(Budgets)
                if getattr(self.budgets, f.name) is not None
            }  # fmt: skip
        if self.capabilities is not None:
            shown["capabilities"] = loads(self.capabilities.to_json())
        scheduling = {"weight": self.weight, "concurrency": self.concurrency}
        if any(value is not None for value in scheduling.values()):
            shown["scheduling"] = {k: v for k, v in scheduling.items() if v is not None}
        return shown

    def text(self) -> str:
        """The canonical document as the journal stores it: sorted keys, one line."""
        return dumps_text(_sorted(self.document()))

    @classmethod
    def from_text(cls, text: str, scope: str) -> ScopeConfig:
        """A version as the journal stores it."""
        return parse_config(loads(text), scope)


class ConfigCache:
    """Parsed versions of scopes' configurations, by (scope, version): a version never changes
    once applied, so each is read and parsed once a process."""

    _KEPT = 256

    def __init__(self) -> None:
        self._parsed: dict[tuple[str, int], ScopeConfig] = {}

    def cached(self, scope: str, version: int) -> ScopeConfig | None:
        """A version parsed already in this process, if it is."""
        return self._parsed.get((scope, version))

    def parsed(self, scope: str, version: int, text: str) -> ScopeConfig:
        key = (scope, version)
        config = self._parsed.get(key)
        if config is None:
            config = self._parsed[key] = ScopeConfig.from_text(text, scope)
            while len(self._parsed) > self._KEPT:
                del self._parsed[next(iter(self._parsed))]
        return config

    async def version(self, store: JournalStore, scope: str, version: int) -> ScopeConfig:
        """A version a run recorded: read from the journal the first time only."""
        config = self._parsed.get((scope, version))
        if config is not None:
            return config
        found = await store.scope_config(scope, version)
        if found is None:  # versions are never deleted: this is a broken journal
            raise RuntimeError(f"scope {scope!r} has no configuration version {version}")
        return self.parsed(scope, version, found[1])


def parse_config_text(text: str, scope: str, *, toml: bool) -> ScopeConfig:
    """A configuration file's text (JSON, or TOML), validated: `InvalidInput` naming each
    problem, one per line."""
    if len(text.encode()) > MAX_CONFIG_BYTES:
        raise InvalidInput(f"the configuration is over {MAX_CONFIG_BYTES // 1024} KiB")
    try:
        document: object = tomllib.loads(text) if toml else loads(text)
    except (tomllib.TOMLDecodeError, CodecError) as error:
        kind = "TOML" if toml else "JSON"
        raise InvalidInput(f"the configuration is not {kind}: {error}") from None
    return parse_config(document, scope)


def parse_config(document: object, scope: str) -> ScopeConfig:
    where = f"the configuration of scope {scope!r}"
    if not isinstance(document, dict):
        raise InvalidInput(f"{where} must be an object (a table) of settings")
    problems = [f"{where}: unknown key {key!r} (use {', '.join(sorted(_KEYS))})"
                for key in sorted(set(document) - _KEYS)]  # fmt: skip
    vars_ = document.get("vars", {})
    if not isinstance(vars_, dict):
        problems.append(f"{where}: vars is an object of names and values")
        vars_ = {}
    for name, value in vars_.items():
        problem = _not_json(value, f"vars.{str(name)[:80]}")
        if problem is not None:
            problems.append(f"{where}: {problem}")
    secrets = document.get("secrets", {})
    if not isinstance(secrets, dict):
        problems.append(f"{where}: secrets maps each secret's name to {_HOST_VARIABLE}")
        secrets = {}
    for name, variable in secrets.items():
        if variable == JOURNAL_SOURCE:
            continue
        if not isinstance(variable, str) or not variable.replace("_", "a").isalnum():
            problems.append(f"{where}: secret {str(name)[:80]!r} names {_HOST_VARIABLE}")
    objects: dict[str, tuple[str, ...]] = {}
    for key in _OBJECT_KEYS:
        value = document.get(key, [])
        if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
            problems.append(f"{where}: {key} is a list of names")
            value = []
        objects[key] = tuple(value)
    egress = _egress(document.get("egress", {}), where, problems)
    budgets = _budgets(document.get("budgets"), where, problems)
    weight, concurrency = _scheduling(document.get("scheduling", {}), where, problems)
    capabilities = None
    if "capabilities" in document:
        try:
            capabilities = capabilities_from_json(document["capabilities"], where)
        except ValueError as error:
            problems.append(str(error))
    if problems:
        raise InvalidInput("\n".join(problems))
    try:
        config = ScopeConfig(vars_, {str(k): str(v) for k, v in secrets.items()}, egress,
                             budgets=budgets, capabilities=capabilities, weight=weight,
                             concurrency=concurrency, **objects)  # fmt: skip
        config.declared()  # the binding names: valid, and none declared twice
    except InvalidInput as error:
        raise InvalidInput(f"{where}: {error}") from None
    return config


def _not_json(value: object, path: str, depth: int = 0) -> str | None:
    """What makes `value` no JSON value a run's env can hold (a TOML date, NaN, ...), if
    anything: values are stored and given to runs as JSON, never converted."""
    if depth > 32:
        return f"{path} is nested too deep"
    if value is None or isinstance(value, bool | int | str):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path} is not a finite number"
    if isinstance(value, list):
        return next((p for i, v in enumerate(value)
                     if (p := _not_json(v, f"{path}[{i}]", depth + 1))), None)  # fmt: skip
    if isinstance(value, dict):
        return next((p for k, v in value.items()
                     if (p := _not_json(v, f"{path}.{str(k)[:80]}", depth + 1))), None)  # fmt: skip
    kind = type(value).__name__
    return f"{path} is a {kind}, not a JSON value (write it as a string)"


def _egress(value: object, where: str, problems: list[str]) -> EgressPolicy:
    if not isinstance(value, dict) or set(value) - {"allow", "allow_private"}:
        problems.append(f"{where}: egress holds allow (a list of hosts) and allow_private")
        return EgressPolicy()
    allow = value.get("allow", [])
    allow_private = value.get("allow_private", False)
    if not isinstance(allow, list) or not all(isinstance(host, str) for host in allow):
        problems.append(f"{where}: egress.allow is a list of hosts")
        allow = []
    if not isinstance(allow_private, bool):
        problems.append(f"{where}: egress.allow_private is true or false")
        allow_private = False
    return EgressPolicy(allow=tuple(allow), allow_private=allow_private)


def _budgets(value: object, where: str, problems: list[str]) -> Budgets | None:
    if value is None:
        return None
    names = {item.name for item in fields(Budgets)}
    if not isinstance(value, dict) or set(value) - names:
        problems.append(f"{where}: budgets holds some of {', '.join(sorted(names))}")
        return None
    try:
        return Budgets(**value)
    except (InvalidInput, TypeError) as error:
        problems.append(f"{where}: {error}")
        return None


def _scheduling(value: object, where: str, problems: list[str]) -> tuple[float | None, int | None]:
    if not isinstance(value, dict) or set(value) - {"weight", "concurrency"}:
        problems.append(f"{where}: scheduling holds weight and concurrency")
        return None, None
    weight, concurrency = value.get("weight"), value.get("concurrency")
    if weight is not None and (
        isinstance(weight, bool) or not isinstance(weight, int | float)
        or not math.isfinite(weight) or not 0 < weight <= _MAX_WEIGHT
    ):  # fmt: skip
        problems.append(f"{where}: scheduling.weight is a number over 0, at most {_MAX_WEIGHT:g}")
        weight = None
    if concurrency is not None and (
        isinstance(concurrency, bool) or not isinstance(concurrency, int)
        or not 1 <= concurrency <= _MAX_CONCURRENCY
    ):  # fmt: skip
        problems.append(f"{where}: scheduling.concurrency is a whole number from 1 to "
                        f"{_MAX_CONCURRENCY}")  # fmt: skip
        concurrency = None
    return (None if weight is None else float(weight)), concurrency


def config_diff(before: str | None, after: str, *, names: tuple[str, str]) -> str:
    """Two stored versions as a unified diff of their documents, a line a setting."""

    def lines(text: str | None) -> list[str]:
        if text is None:
            return []
        return json.dumps(loads(text), indent=2, sort_keys=True, ensure_ascii=False).splitlines()

    return "\n".join(difflib.unified_diff(lines(before), lines(after), *names, lineterm=""))


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _sorted(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_sorted(item) for item in value]
    return value
