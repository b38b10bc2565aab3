"""Each scope's weight and concurrency limit for fair scheduling (docs/TENANCY.md, "Fair
scheduling"), as every worker on a journal sees them: from the scope's latest configuration
version in the journal (`scheduling` in `qjsflow scope apply`), or, for a scope whose latest
version sets none, from the process's `RunnerConfig.scope_weights`/`scope_concurrency`.

Workers read the journal's again at each heartbeat (`WORKER_BEAT_MS`): a change reaches every
worker within one, with no restart. Unlike a run's env, these are not pinned to the version a
run started with: they rule the scope's share of the workers now, not what a run sees.
"""

from __future__ import annotations

from collections.abc import Mapping

from qjsflow.runner.store import JournalStore
from qjsflow.runner.tenancy.scope_config import ConfigCache

__all__ = ["ScopeLimits"]


class ScopeLimits:
    """The weights and concurrency limits a worker schedules by (read on every claim, so
    plain dictionaries: no journal read on the drive's path)."""

    def __init__(self, weights: Mapping[str, float], concurrency: Mapping[str, int]) -> None:
        self._given = (dict(weights), dict(concurrency))
        self.weights: dict[str, float] = dict(weights)
        self.concurrency: dict[str, int] = dict(concurrency)

    def weight(self, scope: str) -> float:
        return max(self.weights.get(scope, 1.0), 1e-6)

    async def refresh(self, store: JournalStore, configs: ConfigCache) -> None:
        """The journal's latest versions over the process's own settings (each version is
        parsed once a process: `ConfigCache`)."""
        weights, concurrency = dict(self._given[0]), dict(self._given[1])
        for scope, version in (await store.latest_scope_configs()).items():
            config = await configs.version(store, scope, version)
            if config.weight is not None:
                weights[scope] = config.weight
            if config.concurrency is not None:
                concurrency[scope] = config.concurrency
        self.weights, self.concurrency = weights, concurrency
