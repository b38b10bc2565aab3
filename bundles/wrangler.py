"""A Cloudflare project's wrangler configuration (`wrangler.jsonc`, `wrangler.json` or
`wrangler.toml`, in that order, as wrangler itself prefers them), read as publishing needs it:
`main`, `workflows[]` (`name`, `binding`, `class_name`, `script_name`), `vars`,
`compatibility_flags` and `compatibility_date`. Every other key is wrangler's business and
is left alone. JSONC (comments, trailing commas) is read by the `json5` library.

A project with a wrangler file is published from its root, whatever its layout: the entry is
`main`, and its workflows are the classes `workflows[]` names (README, Coming from Cloudflare
Workflows).
"""

from __future__ import annotations

import math
import posixpath
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import json5
from croniter import croniter

from qjsflow.bundles.errors import SourceTreeError

__all__ = [
    "WRANGLER_FILES",
    "DeclaredWorkflow",
    "WranglerProject",
    "parse_wrangler",
    "read_document",
]

WRANGLER_FILES = ("wrangler.jsonc", "wrangler.json", "wrangler.toml")
_MAX_BYTES = 256 * 1024
_CLASS = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$]{0,127}$")
_FLAG = re.compile(r"^[a-z0-9_]{1,64}$")
_BINDING = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


@dataclass(frozen=True, slots=True)
class DeclaredWorkflow:
    """One workflow a project publishes: its name, and the class of `main` that is it."""

    name: str
    class_name: str
    binding: str | None = None
    schedules: tuple[str, ...] = ()  # cron expressions, UTC (Cloudflare's `schedules`)


@dataclass(frozen=True, slots=True)
class WranglerProject:
    path: str  # the wrangler file, in the tree
    main: str  # the entry, a tree path
    workflows: tuple[DeclaredWorkflow, ...]
    # Workflows bound here but defined by another Worker (`script_name`): not in this snapshot.
    elsewhere: tuple[str, ...] = ()
    vars: Mapping[str, Any] | None = None
    compatibility_flags: tuple[str, ...] = ()
    compatibility_date: str | None = None


def read_document(path: str, content: bytes) -> Any:
    """The wrangler file's document (TOML, or JSON with comments and trailing commas)."""
    if len(content) > _MAX_BYTES:
        raise SourceTreeError(path, f"is over {_MAX_BYTES // 1024} KiB")
    try:
        text = content.decode("utf-8")
        if path.endswith(".toml"):
            return tomllib.loads(text)
        return json5.loads(text)
    except UnicodeDecodeError:
        raise SourceTreeError(path, "is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as error:
        raise SourceTreeError(path, f"is not valid TOML: {error}") from None
    except (ValueError, RecursionError) as error:
        raise SourceTreeError(path, f"is not valid JSON: {str(error)[:200]}") from None


def parse_wrangler(path: str, content: bytes) -> tuple[WranglerProject | None, tuple[str, ...]]:
    """The project a wrangler file describes (None when it names no `main`: the tree keeps
    the `workflows/` layout), and its compatibility flags; `SourceTreeError` naming the first
    problem."""
    document = read_document(path, content)
    if not isinstance(document, dict):
        raise SourceTreeError(path, "holds no object of settings")
    flags = document.get("compatibility_flags", [])
    if not isinstance(flags, list) or not all(isinstance(f, str) and _FLAG.match(f) for f in flags):
        raise SourceTreeError(path, "has compatibility_flags that are not a list of flag names")
    main = document.get("main")
    if main is None:
        return None, tuple(flags)
    if not isinstance(main, str) or not main.strip():
        raise SourceTreeError(path, 'has a "main" that is not a path')
    entry = posixpath.normpath(main.strip())
    if entry.startswith(("../", "/")) or entry == "..":
        raise SourceTreeError(path, f'names "main" {main[:120]!r}, outside the project')
    workflows, elsewhere = _workflows(path, document.get("workflows", []))
    date = document.get("compatibility_date")
    vars_ = _vars(path, document.get("vars"))
    project = WranglerProject(
        path=path, main=entry, workflows=workflows, elsewhere=elsewhere,
        vars=vars_, compatibility_flags=tuple(flags),
        compatibility_date=date if isinstance(date, str) else None,
    )  # fmt: skip
    return project, tuple(flags)


def _workflows(path: str, value: object) -> tuple[tuple[DeclaredWorkflow, ...], tuple[str, ...]]:
    if not isinstance(value, list):
        raise SourceTreeError(path, "has workflows that are not a list")
    found: list[DeclaredWorkflow] = []
    elsewhere: list[str] = []
    for n, item in enumerate(value):
        where = f"workflows[{n}]"
        if not isinstance(item, dict):
            raise SourceTreeError(path, f"has {where} that is not an object")
        name, class_name = item.get("name"), item.get("class_name")
        binding = item.get("binding")
        if not isinstance(class_name, str) or not _CLASS.match(class_name):
            raise SourceTreeError(path, f"has {where} with no class_name (a class's name)")
        if not isinstance(name, str) or not name:
            raise SourceTreeError(path, f"has {where} with no name")
        if isinstance(item.get("script_name"), str):
            elsewhere.append(name)  # defined by another Worker: bound here, published there
            continue
        found.append(
            DeclaredWorkflow(
                name,
                class_name,
                _binding(path, where, binding),
                _schedules(path, where, item.get("schedules")),
            )
        )
    return tuple(found), tuple(elsewhere)


def _binding(path: str, where: str, binding: object) -> str | None:
    """A workflow's name in env (`env.MY_WORKFLOW`), checked as env's names are."""
    if binding is None:
        return None
    if not isinstance(binding, str) or not _BINDING.match(binding) or binding == "db":
        raise SourceTreeError(path, f"has {where} whose binding is not a name env can hold")
    return binding


_MAX_VARS_DEPTH = 32


def _vars(path: str, value: object) -> dict[str, Any] | None:
    """The project's `vars`: names env can hold, each a JSON value (a TOML date is not)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise SourceTreeError(path, "has vars that are not a table of names and values")
    for name, item in value.items():
        if not isinstance(name, str) or not _BINDING.match(name) or name == "db":
            raise SourceTreeError(path, f"has a var {str(name)[:80]!r} whose name env cannot hold")
        if not _is_json(item, 0):
            raise SourceTreeError(path, f"has a var {name!r} that is not a JSON value")
    return dict(value)


def _is_json(value: object, depth: int) -> bool:
    if depth > _MAX_VARS_DEPTH:
        return False
    if value is None or isinstance(value, str | bool | int):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_is_json(item, depth + 1) for item in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json(v, depth + 1) for k, v in value.items())
    return False


def _schedules(path: str, where: str, value: object) -> tuple[str, ...]:
    """A workflow's cron triggers: five-field cron expressions (UTC), at most 16."""
    if value is None:
        return ()
    if (
        not isinstance(value, list)
        or len(value) > 16
        or not all(
            isinstance(cron, str) and len(cron.split()) == 5 and croniter.is_valid(cron)
            for cron in value
        )
    ):
        raise SourceTreeError(path, f"has {where} whose schedules are not a list of five-field "
                              "cron expressions")  # fmt: skip
    return tuple(value)
