"""`qjsflow console`: a web view of runs over the same journal, for operators and, with
scope-bound tokens, for tenants (docs/CONSOLE.md). Needs the `console` extra."""

from qjsflow.runner.console.app import create_app
from qjsflow.runner.console.auth import Principal, Tokens

__all__ = ["Principal", "Tokens", "create_app"]
