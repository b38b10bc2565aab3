"""What a run may reach (docs/TENANCY.md, Capability manifests): its snapshot's manifest
(bundles/manifest.py) and its scope's policy, both. A call outside them fails with the coded
error `capability_denied` naming what was refused, is journaled in the tool audit as denied,
and never reaches the host's tool."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from qjsflow.bundles.manifest import SQL_MODES, Capabilities, exceeding
from qjsflow.runner.errors import CapabilityRefused
from qjsflow.runner.tenancy.cloudflare_bindings import BINDING_ADDRESSES
from qjsflow.runner.tenancy.egress import FETCH_ADDRESS, EgressPolicy
from qjsflow.runner.tenancy.run_tags import TAGS_ADDRESS

__all__ = ["DENIED", "SQL_ADDRESS", "Reach", "check_publish"]

DENIED = "capability_denied"  # the code of the error a denied call fails with
SQL_ADDRESS = "qjsflow.sql"  # how a denied db.sql call is named in the tool audit


@dataclass(frozen=True, slots=True)
class Reach:
    manifest: Capabilities | None = None  # None: the snapshot declares nothing
    policy: Capabilities | None = None  # None: the operator bounds nothing

    def _refusal(self, what: str, allows: Callable[[Capabilities], bool]) -> str | None:
        if self.manifest is not None and not allows(self.manifest):
            return f"{what} is not among the capabilities the snapshot declares"
        if self.policy is not None and not allows(self.policy):
            return f"{what} is not allowed by the scope's capability policy"
        return None

    def tool_refusal(self, address: str, args: Any) -> str | None:
        """Why a tool call (fetch and the binding objects included) may not be made."""
        if address == FETCH_ADDRESS:
            url = str(args.get("url", "")) if isinstance(args, Mapping) else ""
            return self._refusal(f"fetch {url[:200]!r}", lambda c: _fetches(c, url))
        if address == TAGS_ADDRESS:  # labels the calling run, and nothing else
            return None
        if address in BINDING_ADDRESSES:
            name = str(args.get("binding", "")) if isinstance(args, Mapping) else ""
            return self._refusal(f"the binding {name[:80]!r}", lambda c: c.allows_binding(name))
        return self._refusal(f"the tool {address[:200]!r}", lambda c: c.allows_tool(address))

    def egress(self, policy: EgressPolicy) -> EgressPolicy:
        """The scope's egress policy, narrowed to the fetch entries of manifest and policy."""
        lists = tuple(c.fetch for c in (self.manifest, self.policy) if c is not None)
        return dataclasses.replace(policy, within=policy.within + lists) if lists else policy

    def binding_allowed(self, name: str) -> bool:
        return self._refusal("", lambda c: c.allows_binding(name)) is None

    @property
    def sql(self) -> str:
        """What db.sql may do: none, read or write (the narrower of manifest and policy)."""
        modes = [c.sql for c in (self.manifest, self.policy) if c is not None] or ["write"]
        return min(modes, key=SQL_MODES.index)

    def sql_refusal(self) -> str | None:
        if self.sql != "none":
            return None
        return self._refusal("db.sql", lambda c: c.sql != "none")


def _fetches(capabilities: Capabilities, url: str) -> bool:
    """Whether `url` is within the capabilities' fetch entries (matched as egress is)."""
    import httpx  # noqa: PLC0415  (only a fetch needs it; see runner/tenancy/egress.py)

    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError):
        return False
    return EgressPolicy(allow=capabilities.fetch).allows(parsed)


def check_publish(scope: str, declared: Capabilities | None, policy: Capabilities | None) -> None:
    """Refuse a snapshot whose manifest asks for more than its scope's policy allows."""
    if declared is None or policy is None:
        return
    beyond = exceeding(declared, policy)
    if beyond:
        raise CapabilityRefused(scope, beyond)
