"""Where a secret's value may go (docs/SANDBOX.md, Secrets).

The sandbox holds a secret only as a handle (`env.API_TOKEN`); the value lives in the worker.
It is put in a handle's place in exactly two places, both where it leaves the host: the
arguments of an operator's tool, and a `fetch`'s header values (as a handle, or written as the
text `[secret NAME]` in a template string). Only the secrets of the run's own env are revealed
there: the handles its snapshot may reach, not every secret of its scope. The built-in
bindings (KV, queues, R2, Durable Objects) store what they are given, so a handle passed to
one fails the call, naming the secret, not its value.

Whatever comes back from outside (a tool's result or error, a fetch's response) is masked
before the host records it: each occurrence of the value of any secret of the scope becomes
`[secret NAME]`, so a server that echoes a header, or a tool that returns what it was given,
writes no value into the journal, the audit, a log or the run's output. Values shorter than
`MIN_MASKED_CHARS` are not masked (every text would be): keep secrets longer than that.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from qjsflow.bridge.codec import loads
from qjsflow.bridge.values import SecretRef, to_python
from qjsflow.runner.errors import FatalToolError

__all__ = ["MIN_MASKED_CHARS", "RunSecrets", "handle_names"]

MIN_MASKED_CHARS = 4


def handle_names(value: Any) -> list[str]:
    """The names of the secret handles anywhere in a decoded value, in order."""
    if isinstance(value, SecretRef):
        return [value.name]
    if isinstance(value, list | tuple):
        return [name for item in value for name in handle_names(item)]
    if isinstance(value, dict):
        return [name for item in value.values() for name in handle_names(item)]
    return []


class RunSecrets:
    """One run's view of its scope's secret values."""

    def __init__(self, scope_secrets: Mapping[str, str], run_env: str | None) -> None:
        # Made for every drive: a scope without secrets decodes nothing.
        names = set(handle_names(_decoded(run_env))) if scope_secrets else set()
        self.reachable = {name: value for name, value in scope_secrets.items() if name in names}
        # Longest first: a value holding another is masked whole.
        self._masked = sorted(
            ((value, f"[secret {name}]") for name, value in scope_secrets.items()
             if len(value) >= MIN_MASKED_CHARS),
            key=lambda pair: -len(pair[0]),
        )  # fmt: skip

    def refuse_handles(self, value: Any, where: str) -> None:
        """FatalToolError when `value` holds a handle: `where` would store it."""
        held = handle_names(value)
        if held:
            raise FatalToolError(
                f"{where}: the secret {held[0]} cannot be stored there; a secret may only be "
                "passed to a tool or used in a fetch header"
            )

    def mask(self, value: Any) -> Any:
        """`value` (as tools return them: JSON-like, with bytes) with every secret's value
        replaced by its name."""
        if not self._masked:
            return value
        return self._mask(value)

    def mask_text(self, text: str) -> str:
        for secret, shown in self._masked:
            if secret in text:
                text = text.replace(secret, shown)
        return text

    def mask_bytes(self, data: bytes) -> bytes:
        for secret, shown in self._masked:
            raw = secret.encode("utf-8", "surrogatepass")
            if raw in data:
                data = data.replace(raw, shown.encode("utf-8", "surrogatepass"))
        return data

    def _mask(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.mask_text(value)
        if isinstance(value, bytes | bytearray):
            return self.mask_bytes(bytes(value))
        if isinstance(value, list | tuple):
            return [self._mask(item) for item in value]
        if isinstance(value, dict):
            return {self._mask(key): self._mask(item) for key, item in value.items()}
        return value


def _decoded(run_env: str | None) -> Any:
    if not run_env:
        return None
    try:
        return to_python(run_env)
    except ValueError:  # a run's env was checked when it started; nothing to reveal then
        return loads("null")
