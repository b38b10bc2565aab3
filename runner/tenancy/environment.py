"""What a run's `env` holds, declared by the host per scope (docs/ARCHITECTURE.md, Env):
vars (plain JSON values) and secrets (a name the sandbox sees as an opaque handle; the value
stays in this process and is put in place only when the host calls a tool).

A run's env is pinned when it starts (vars and secret names go into its persisted bindings),
so a replay sees what the first execution saw; secret values are looked up, each time a tool
is called, in the process that calls it, and never enter the journal, a log, an error or an
executor.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qjsflow.bridge import CodecError, InvalidInput, loads
from qjsflow.bridge.values import BindingRef, SecretRef
from qjsflow.bundles.manifest import Capabilities, capabilities_from_json
from qjsflow.runner.tenancy.budgets import Budgets, budgets_from_json
from qjsflow.runner.tenancy.egress import EgressPolicy
from qjsflow.runner.tenancy.scopes import validate_scope

__all__ = [
    "OBJECT_KINDS",
    "MissingSecret",
    "ScopeEnvironment",
    "ScopeSettings",
    "env_of",
    "load_environments",
    "load_scope_settings",
    "reveal",
]

_BINDING = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


@dataclass(frozen=True)
class ScopeEnvironment:
    vars: Mapping[str, Any] = field(default_factory=dict)
    secrets: Mapping[str, str] = field(default_factory=dict)
    egress: EgressPolicy = field(default_factory=EgressPolicy)  # where `fetch` may go
    # Binding objects by name: KV namespaces (`env.CACHE.get(key)`) and queues
    # (`env.EMAILS.send(body)`), kept in the journal's database unless an operator binds the
    # tools `qjsflow.kv` / `qjsflow.queue` (runner/tenancy/cloudflare_bindings.py).
    kv: tuple[str, ...] = ()
    queues: tuple[str, ...] = ()
    r2: tuple[str, ...] = ()  # buckets: objects as text, kept like KV (`qjsflow.r2`)
    # Durable Object namespaces: `env.COUNTER.get(env.COUNTER.idFromName("x")).add(1)` calls
    # the tool `qjsflow.durable_object`, which only an operator can bind (until one does, a
    # run that calls it is blocked).
    durable_objects: tuple[str, ...] = ()
    # Binding objects backed by the operator's tools, for what Cloudflare provides and qjsflow
    # does not (Workers AI, Vectorize, D1, service bindings): `env.AI.run(model, input)` is a
    # journaled call to the tool `AI.run` with the arguments' list. Unbound, the run is blocked.
    tool_bindings: tuple[str, ...] = ()

    def objects(self) -> list[tuple[str, str]]:
        """(binding kind, name) of every binding object: how the sandbox builds each."""
        return [(kind, name) for key, kind in OBJECT_KINDS.items() for name in getattr(self, key)]

    def __post_init__(self) -> None:
        for name in self._names():
            if not _BINDING.fullmatch(name) or name == "db":
                raise InvalidInput(
                    f"invalid binding name {name[:80]!r}: use a letter or _, then letters, "
                    "digits or _ (64 at most; db is taken)"
                )
        names = self._names()
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise InvalidInput(f"{twice[0]!r} is declared as two bindings")

    def _names(self) -> list[str]:
        return [*self.vars, *self.secrets, *(name for _, name in self.objects())]


class MissingSecret(InvalidInput):
    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"the secret {name!r} is not configured in this process for the scope")


@dataclass(frozen=True)
class ScopeSettings:
    """What an operator's env file sets for each scope: its environment, and its budgets
    (runner/tenancy/budgets.py)."""

    environments: Mapping[str, ScopeEnvironment]
    budgets: Mapping[str, Budgets]
    policies: Mapping[str, Capabilities]  # the most a scope's manifests may declare


def load_environments(
    path: str | os.PathLike[str], host_env: Mapping[str, str] | None = None
) -> dict[str, ScopeEnvironment]:
    """The environments of an operator's env file (`load_scope_settings`)."""
    return dict(load_scope_settings(path, host_env).environments)


def load_scope_settings(
    path: str | os.PathLike[str], host_env: Mapping[str, str] | None = None
) -> ScopeSettings:
    """An operator's env file (JSON): `{"scope": {"vars": {...}, "secrets": {"NAME":
    "HOST_VARIABLE"}, "budgets": {"steps_per_day": 10000}, "capabilities": {"tools":
    ["crm.*"]}}}`. The file names, for each secret, the host environment variable that holds
    its value, so the file itself holds no secret."""
    host_env = os.environ if host_env is None else host_env
    try:
        document = loads(Path(path).read_bytes(), max_bytes=1024 * 1024)
    except OSError as error:
        raise InvalidInput(
            f"cannot read the env file {os.fspath(path)!r}: {error.strerror}"
        ) from None
    except CodecError as error:
        raise InvalidInput(f"the env file is not JSON: {error}") from None
    if not isinstance(document, dict):
        raise InvalidInput("the env file must hold an object of scopes")
    environments = {}
    budgets = {}
    policies = {}
    for scope, declared in document.items():
        validate_scope(scope)
        if not isinstance(declared, dict) or set(declared) - _FILE_KEYS:
            raise InvalidInput(
                f"scope {scope!r} of the env file: use the keys {', '.join(sorted(_FILE_KEYS))}"
            )
        secrets = declared.get("secrets", {})
        vars_ = declared.get("vars", {})
        if not isinstance(secrets, dict) or not isinstance(vars_, dict):
            raise InvalidInput(f"scope {scope!r} of the env file: vars and secrets are objects")
        values = {}
        for name, variable in secrets.items():
            if not isinstance(variable, str) or variable not in host_env:
                raise InvalidInput(
                    f"secret {name!r} of scope {scope!r}: the host environment variable "
                    f"{str(variable)[:80]!r} is not set"
                )
            values[name] = host_env[variable]
        objects = {key: _names(declared.get(key, []), scope, key) for key in _OBJECT_KEYS}
        environments[scope] = ScopeEnvironment(
            vars=vars_, secrets=values, egress=_egress(declared.get("egress", {}), scope),
            **objects,
        )  # fmt: skip
        if "budgets" in declared:
            budgets[scope] = budgets_from_json(declared["budgets"], scope)
        if "capabilities" in declared:
            try:
                policies[scope] = capabilities_from_json(declared["capabilities"], "")
            except ValueError as error:
                raise InvalidInput(f"scope {scope!r} of the env file{error}") from None
    return ScopeSettings(environments, budgets, policies)


# The binding-object settings of a scope (its env file's and configuration's keys), and the
# kind of object each gives in `env` (sandbox/prelude/55-fetch.js, bindingObject).
OBJECT_KINDS = {"kv": "kv", "queues": "queue", "r2": "r2", "durable_objects": "durable_object",
                "tool_bindings": "tool"}  # fmt: skip
_OBJECT_KEYS = tuple(OBJECT_KINDS)
_FILE_KEYS = frozenset({"vars", "secrets", "egress", "budgets", "capabilities", *_OBJECT_KEYS})


def _names(value: object, scope: str, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise InvalidInput(f"scope {scope!r} of the env file: {key} is a list of names")
    return tuple(value)


def _egress(value: object, scope: str) -> EgressPolicy:
    if not isinstance(value, dict) or set(value) - {"allow", "allow_private"}:
        raise InvalidInput(
            f"scope {scope!r} of the env file: egress holds allow (a list) and allow_private"
        )
    allow = _names(value.get("allow", []), scope, "egress.allow")
    allow_private = value.get("allow_private", False)
    if not isinstance(allow_private, bool):
        raise InvalidInput(f"scope {scope!r} of the env file: egress.allow_private is a boolean")
    return EgressPolicy(allow=allow, allow_private=allow_private)


def env_of(
    environment: ScopeEnvironment | None,
    given: Mapping[str, Any] | None,
    allowed: Callable[[str], bool] = lambda name: True,
    *,
    workflows: Sequence[str] = (),
    defaults: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A run's env at its start: the workflow bindings its snapshot's project declares
    (`workflows`: `env.MY_WORKFLOW`), the scope's vars, secret handles and binding objects that
    its snapshot may reach (`allowed`: runner/tenancy/capabilities.py), then what the caller
    passed (which wins). `defaults`: the project's own vars (its wrangler file's), which the
    scope's configuration overrides name by name."""
    env: dict[str, Any] = dict(defaults or {})
    env.update({name: BindingRef("workflow", name) for name in workflows})
    if environment is not None:
        env.update(environment.vars)
        env.update({name: SecretRef(name) for name in environment.secrets})
        env.update({name: BindingRef(kind, name) for kind, name in environment.objects()})
    env = {name: value for name, value in env.items() if allowed(name)}
    env.update(given or {})
    return env


def reveal(value: Any, secrets: Mapping[str, str]) -> Any:
    """Tool arguments with every secret handle replaced by its value (host-side only)."""
    if isinstance(value, SecretRef):
        if value.name not in secrets:
            raise MissingSecret(value.name)
        return secrets[value.name]
    if isinstance(value, list):
        return [reveal(item, secrets) for item in value]
    if isinstance(value, dict):
        return {key: reveal(item, secrets) for key, item in value.items()}
    return value
