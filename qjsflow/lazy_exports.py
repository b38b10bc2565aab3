"""A package's public names, each imported from its home module when first asked for.

Every command, executor spawn and test imports some part of qjsflow, and importing
`qjsflow.runner.store` runs `qjsflow.runner`'s `__init__` first: if that imported the whole
runner eagerly, `qjsflow status` would pay for the driver, the publish path and the sandbox
pool it never uses (~60 ms of module creation). Packages therefore name their exports here
and load each on first use (PEP 562's module `__getattr__`); type checkers still see them
through each package's `TYPE_CHECKING` imports.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, homes: Mapping[str, tuple[str, ...]]) -> Callable[[str], Any]:
    """The module `__getattr__` of `package`, whose exports are `homes`: home module -> names.
    A name found is stored on the package, so each is imported once."""
    home_of = {name: home for home, names in homes.items() for name in names}

    def __getattr__(name: str) -> Any:
        home = home_of.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(home), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
