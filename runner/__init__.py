"""The host: the journal, the run lifecycle, the servicing of bridge ops, the CLI."""

from runner.config import RunnerConfig
from runner.runner import PublishedWorkflow, PublishResult, Runner
from runner.scopes import InvalidScope, validate_scope

__all__ = [
    "InvalidScope",
    "PublishResult",
    "PublishedWorkflow",
    "Runner",
    "RunnerConfig",
    "validate_scope",
]
