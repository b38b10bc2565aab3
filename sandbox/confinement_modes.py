"""The executor's confinement modes (sandbox/confine.py): their own module, so that the command
line can check `QJSFLOW_CONFINEMENT` without loading the confinement's code."""

from __future__ import annotations

__all__ = ["CONFINEMENT_MODES"]

CONFINEMENT_MODES = ("require", "best-effort", "off")
