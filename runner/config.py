"""Runner configuration and the injectable clock."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from qjsflow.bridge.limits import Limits
from qjsflow.bundles import BuildLimits, TreeLimits
from qjsflow.bundles.manifest import Capabilities
from qjsflow.runner.bindings import Bindings
from qjsflow.runner.scopedb.policy import SqlLimits
from qjsflow.runner.store import ENDED
from qjsflow.runner.tenancy.budgets import Budgets
from qjsflow.runner.tenancy.environment import ScopeEnvironment
from qjsflow.sandbox import PoolConfig

__all__ = ["Retention", "RunnerConfig", "system_clock"]


def system_clock() -> float:
    """Seconds since the epoch; tests inject their own clock instead."""
    return time.time()


@dataclass(frozen=True, slots=True)
class Retention:
    """Keep ended runs this long after they ended; workers prune every `every_s`."""

    older_than_s: float
    statuses: frozenset[str] = ENDED
    snapshots: bool = False  # also snapshots no run is pinned to, published as long ago
    every_s: float = 3600.0

    def __post_init__(self) -> None:
        if not self.older_than_s > 0 or not self.every_s > 0:
            raise ValueError("retention periods must be more than 0 seconds")
        unknown = set(self.statuses) - ENDED
        if unknown:
            raise ValueError(f"only ended runs are pruned, not {sorted(unknown)}")


@dataclass(frozen=True, slots=True)
class RunnerConfig:
    tree_limits: TreeLimits = field(default_factory=TreeLimits)
    build_limits: BuildLimits = field(default_factory=BuildLimits)
    clock: Callable[[], float] = system_clock
    # Durations within one process (an attempt's timeout) are measured on this clock, which
    # never jumps; the wall clock (`clock`) stamps the journal and schedules timers.
    monotonic: Callable[[], float] = time.monotonic
    limits: Limits = field(default_factory=Limits)
    pool: PoolConfig = field(default_factory=PoolConfig)
    bindings: Bindings = field(default_factory=Bindings)  # used when a call passes none
    # What each scope's runs find in `env` (runner/tenancy/environment.py): vars, and secrets whose
    # values stay in this process.
    environments: Mapping[str, ScopeEnvironment] = field(default_factory=dict)
    lease_ttl_s: float = 30.0
    sql_limits: SqlLimits = field(default_factory=SqlLimits)
    scope_root: Path | None = None  # scope databases; default: "<journal>.scopes" beside it
    # Where each scope's `db.sql` database lives: "replicated" — the journal holds it, each
    # worker's file is a replica (runner/scopedb/replication.py) — or "local", a file on this
    # machine. None: replicated on a PostgreSQL journal (workers on many machines), local on
    # SQLite (one machine).
    scope_databases: str | None = None
    # A run whose executor process dies is parked and driven again later (back-off from 30 s
    # to an hour); it fails only when its executors have died this many times.
    executor_deaths_per_run: int = 5
    # How long a transient journal write failure (locked, disk full, a lost server) is
    # retried before the operation gives up with JournalUnavailable.
    journal_retry_s: float = 60.0
    # Workers prune runs that ended longer ago than this on their own (None: never).
    retention: Retention | None = None
    # Fair scheduling across scopes (docs/TENANCY.md): a scope's share of drives relative to
    # the others (1 when not named), and how many of its runs may be driven at once across
    # every worker on the journal (no limit when not named).
    scope_weights: Mapping[str, float] = field(default_factory=dict)
    scope_concurrency: Mapping[str, int] = field(default_factory=dict)
    # Budgets per scope (runner/tenancy/budgets.py, docs/TENANCY.md): live runs and journal bytes
    # refuse a start past them (BudgetExceeded); every budget spent parks the scope's runs as
    # `throttled` until its window ends.
    scope_budgets: Mapping[str, Budgets] = field(default_factory=dict)
    # Events delivered to one run that no wait has taken yet: past this a signal is refused
    # (they are stored until the run consumes them or is pruned).
    events_pending_per_run: int = 1000
    # What each scope's snapshots may reach at most (docs/TENANCY.md, Capability manifests):
    # a manifest asking for more is refused at publish; every call is checked against both.
    scope_policies: Mapping[str, Capabilities] = field(default_factory=dict)

    def scope_database_mode(self, server_journal: bool) -> str:
        """`scope_databases`, or what it means when unset, for a journal of that kind."""
        if self.scope_databases is None:
            return "replicated" if server_journal else "local"
        if self.scope_databases not in ("local", "replicated"):
            raise ValueError("scope_databases is local or replicated")
        return self.scope_databases

    def secret_providers(self) -> tuple[str, ...]:
        """Where this process's secret values come from (as `qjsflow workers` shows it)."""
        from qjsflow.runner.tenancy.secret_sources import SecretSource  # noqa: PLC0415  (workers only)

        from_file = ("env-file",) if any(e.secrets for e in self.environments.values()) else ()
        return (*SecretSource().providers(), *from_file)
