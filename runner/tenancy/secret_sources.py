"""Where a worker finds the values of the secrets a scope's configuration names (docs/TENANCY.md,
"Scope configuration"): each secret names a variable, and its value is the worker's environment
variable of that name, or else the file of that name in a directory of secrets, one file per
variable, as systemd (`$CREDENTIALS_DIRECTORY`, `LoadCredential=`) and Kubernetes (a secret
volume) mount them, or `QJSFLOW_SECRETS_DIR`. The journal holds names only."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

__all__ = ["MAX_SECRET_BYTES", "SecretSource"]

MAX_SECRET_BYTES = 64 * 1024
_VARIABLE = re.compile(r"[A-Za-z0-9_]{1,128}")  # as a configuration must name it: no path
_DIRECTORIES = ("QJSFLOW_SECRETS_DIR", "CREDENTIALS_DIRECTORY")


class SecretSource:
    """This process's secret values, by variable name (read when a drive needs one, so a
    rotated file or a restarted process's new environment is seen)."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = os.environ if environ is None else environ

    def get(self, variable: str) -> str | None:
        if not _VARIABLE.fullmatch(variable):
            return None
        if variable in self._environ:
            return self._environ[variable]
        for folder in self._folders():
            path = folder / variable
            try:
                with path.open("rb") as handle:
                    data = handle.read(MAX_SECRET_BYTES + 1)
            except OSError:
                continue
            if len(data) <= MAX_SECRET_BYTES:
                return data.decode("utf-8", "replace").removesuffix("\n")
        return None

    def providers(self) -> tuple[str, ...]:
        """Where it looks, as `qjsflow workers` shows it."""
        return ("environment", *(f"files:{folder}" for folder in self._folders()))

    def _folders(self) -> list[Path]:
        return [Path(self._environ[name]) for name in _DIRECTORIES if self._environ.get(name)]
