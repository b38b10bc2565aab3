"""Scope configuration in the journal, for operators (`qjsflow scope`, `Runner.apply_scope_config`
and its reads): apply a version, show one, list them, compare two, roll back to one.

What a configuration holds and how it is validated is runner/tenancy/scope_config.py; a run
records the version it started with (runner/runner.py, `start`), and its drives use that
version's settings (runner/engine/drive/session.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import Any

from qjsflow.bridge import InvalidInput, dumps_text, loads
from qjsflow.bridge.values import from_python, to_python
from qjsflow.bundles.manifest import Capabilities
from qjsflow.runner.config import RunnerConfig
from qjsflow.runner.reads import snapshot_in
from qjsflow.runner.store import JournalStore, JournalTransaction, RunRecord
from qjsflow.runner.tenancy.budgets import Budgets
from qjsflow.runner.tenancy.capabilities import Reach
from qjsflow.runner.tenancy.environment import ScopeEnvironment, env_of
from qjsflow.runner.tenancy.scope_config import (
    ConfigCache,
    ScopeConfig,
    config_diff,
    parse_config_text,
)
from qjsflow.runner.tenancy.scopes import validate_scope
from qjsflow.runner.tenancy.sealed_secrets import KEYS_VARIABLE, SecretKeys, seal

__all__ = [
    "ScopeConfigVersion", "ScopeConfigs", "StartSettings", "move_to_config", "start_settings",
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class ScopeConfigVersion:
    """One version of a scope's configuration: its settings (secret names and the host
    variables holding their values, never a value), when it was applied (seconds since the
    epoch), and whether applying it made a new version."""

    scope: str
    version: int
    applied_at: float
    config: dict[str, Any]
    created: bool = True


@dataclass(frozen=True, slots=True)
class StartSettings:
    """What a run's start takes from its scope's settings: the environment its `env` is made
    from, the capability policy, the budgets it is admitted under, and the configuration
    version it records (None: the starting process's own settings, for a scope with none in
    the journal)."""

    environment: ScopeEnvironment | None
    policy: Capabilities | None
    budgets: Budgets | None
    version: int | None


def start_settings(
    latest: tuple[int, str, int] | None, scope: str, config: RunnerConfig, configs: ConfigCache
) -> StartSettings:
    """The scope's `latest` configuration in the journal (read in the start's transaction,
    `JournalTransaction.send_latest_scope_config`); the process's own settings for a scope
    that has none there."""
    if latest is None:
        return StartSettings(config.environments.get(scope), config.scope_policies.get(scope),
                             config.scope_budgets.get(scope), None)  # fmt: skip
    version, text, _ = latest
    parsed = configs.parsed(scope, version, text)
    return StartSettings(parsed.declared(), parsed.capabilities, parsed.budgets, version)


def move_to_config(
    tx: JournalTransaction,
    run: RunRecord,
    *,
    target: str,
    config: RunnerConfig,
    configs: ConfigCache,
) -> tuple[int, str]:
    """The configuration version a run moves to (`target`: "latest" or a version number) and
    its `env` made again from it: what its start took from its old settings is replaced, what
    its caller gave is kept (`restart --config`)."""
    wanted = None if target == "latest" else _version_number(target)
    found = tx.scope_config(run.scope, wanted)
    if found is None:
        which = "no configuration" if wanted is None else f"no configuration version {wanted}"
        raise InvalidInput(f"scope {run.scope!r} has {which} (qjsflow scope apply FILE)")
    version, text, _ = found
    new = configs.parsed(run.scope, version, text)
    if run.config_version is None:
        old = config.environments.get(run.scope)
    else:
        earlier = tx.scope_config(run.scope, run.config_version)
        old = None if earlier is None else configs.parsed(run.scope, *earlier[:2]).declared()
    given = {
        name: value for name, value in to_python(run.persisted_bindings).items()
        if name not in _names(old)
    }  # fmt: skip
    snapshot = snapshot_in(tx, reference=run.snapshot_id, scope=run.scope)
    env = env_of(
        new.declared(), given, Reach(snapshot.capabilities, new.capabilities).binding_allowed
    )
    return version, from_python(env, max_bytes=config.limits.value_bytes, what="the env")


def _version_number(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 2**62:
        raise InvalidInput(f"--config is latest or a version number, not {text[:40]!r}")
    return int(text)


def _names(environment: ScopeEnvironment | None) -> set[str]:
    """The names a scope's settings put in a run's env."""
    if environment is None:
        return set()
    objects = (name for _, name in environment.objects())
    return {*environment.vars, *environment.secrets, *objects}


class ScopeConfigs:
    """The scope-configuration operations of a `Runner` (which provides `store`)."""

    store: JournalStore

    async def apply_scope_config(
        self, scope: str, text: str, *, toml: bool = False
    ) -> ScopeConfigVersion:
        """Validate a configuration (JSON, or TOML) and store it as the scope's next version
        (`InvalidInput` naming each problem: the last good version stays). Applying what the
        latest version holds already makes no new version. New runs start with it; running
        ones keep theirs."""
        scope = validate_scope(scope)
        config = parse_config_text(text, scope, toml=toml)
        return await self._store_version(scope, config)

    async def rollback_scope_config(self, scope: str, version: int) -> ScopeConfigVersion:
        """The settings of an earlier `version`, applied again as the scope's next version."""
        earlier = await self.scope_config(scope, version)
        return await self._store_version(scope, ScopeConfig.from_text(_text(earlier), scope))

    async def scope_config(self, scope: str, version: int | None = None) -> ScopeConfigVersion:
        """A version of the scope's configuration (the latest without `version`)."""
        scope = validate_scope(scope)
        found = await self.store.scope_config(scope, version)
        if found is None:
            which = "no configuration" if version is None else f"no configuration version {version}"
            raise InvalidInput(f"scope {scope!r} has {which} (qjsflow scope apply FILE)")
        return _view(scope, *found)

    async def scope_config_history(self, scope: str) -> list[ScopeConfigVersion]:
        """Every version of the scope's configuration, the newest first."""
        scope = validate_scope(scope)
        return [_view(scope, *found) for found in await self.store.scope_config_history(scope)]

    async def scope_config_diff(
        self, scope: str, before: int | None = None, after: int | None = None
    ) -> str:
        """What changed from version `before` to `after` (by default, the latest and the one
        before it), as a unified diff of their settings."""
        newer = await self.scope_config(scope, after)
        older_version = newer.version - 1 if before is None else before
        older = None if older_version < 1 else await self.scope_config(scope, older_version)
        return config_diff(
            None if older is None else _text(older), _text(newer),
            names=(f"version {older_version}", f"version {newer.version}"),
        )  # fmt: skip

    async def set_secret(
        self, scope: str, name: str, value: str, *, keys: SecretKeys | None = None
    ) -> None:
        """Seal `value` under the scope's key (which this process must hold: `keys`, or the
        folder `QJSFLOW_SECRET_KEYS` names) and store it as the secret `name`: a configuration
        names it with the source `@journal`. The journal never holds the value."""
        scope = validate_scope(scope)
        ScopeEnvironment(secrets={name: ""})  # a valid binding name, or InvalidInput
        key = (keys or SecretKeys()).key(scope)
        if key is None:
            raise InvalidInput(
                f"no key for scope {scope!r}: make one with qjsflow secrets keygen, and give "
                f"its folder as {KEYS_VARIABLE}"
            )
        sealed = seal(key, scope, name, value)
        row = (sealed.key_id, sealed.nonce, sealed.ciphertext)
        now = int(time.time() * 1000)
        await self.store.transact(partial(_put_secret, scope=scope, name=name, row=row, now=now))

    async def delete_secret(self, scope: str, name: str) -> bool:
        """Forget the sealed secret `name`; False when there was none."""
        scope = validate_scope(scope)
        return bool(await self.store.transact(partial(_delete_secret, scope=scope, name=name)))

    async def secret_names(self, scope: str) -> list[tuple[str, float]]:
        """The scope's sealed secrets: each name and when it was set (never a value)."""
        rows = await self.store.sealed_secrets(validate_scope(scope))
        return [(name, row[3] / 1000) for name, row in rows.items()]

    async def _store_version(self, scope: str, config: ScopeConfig) -> ScopeConfigVersion:
        now = int(time.time() * 1000)
        version, created = await self.store.transact(
            partial(_insert, scope=scope, text=config.text(), now=now)
        )
        return ScopeConfigVersion(scope, version, now / 1000, config.document(), created)


def _insert(tx: JournalTransaction, *, scope: str, text: str, now: int) -> tuple[int, bool]:
    return tx.insert_scope_config(scope, text, now)


def _view(scope: str, version: int, text: str, at: int) -> ScopeConfigVersion:
    return ScopeConfigVersion(scope, version, at / 1000, loads(text))


def _text(view: ScopeConfigVersion) -> str:
    return ScopeConfig.from_text(dumps_text(view.config), view.scope).text()


def _put_secret(
    tx: JournalTransaction, *, scope: str, name: str, row: tuple[str, str, str], now: int
) -> None:
    tx.put_sealed_secret(scope, name, row, now)


def _delete_secret(tx: JournalTransaction, *, scope: str, name: str) -> bool:
    return tx.delete_sealed_secret(scope, name)
