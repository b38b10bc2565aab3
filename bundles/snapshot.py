"""A source tree becomes a snapshot: a content-addressed id and one bundle per workflow entry.

The id is the SHA-256 of a canonical JSON document: a format tag, every file's path with the
SHA-256 of its bytes, and the entry list. With default entries (every `.ts`/`.js` directly under
`workflows/`) the entry list is a function of the files, so the same files always give the
same id, and any changed byte gives a new one.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from qjsflow.bridge import dumps
from qjsflow.bundles.errors import BundleError, SourceTreeError
from qjsflow.bundles.esbuild import BuildLimits, run_driver
from qjsflow.bundles.tree import SourceTree

__all__ = [
    "ENTRY_SUFFIXES",
    "Snapshot",
    "WorkflowBundle",
    "build_snapshot",
    "select_entries",
    "snapshot_id_of",
]

SNAPSHOT_FORMAT = "qjsflow-snapshot-v1"
ENTRY_SUFFIXES = (".ts", ".mts", ".js", ".mjs")
_WORKFLOW_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
_SHIMS_DIR = Path(__file__).with_name("shims")
_SHIM_FILES = {"qjsflow": "qjsflow.js", "cloudflare:workers": "cloudflare-workers.js"}


@dataclass(frozen=True, slots=True)
class WorkflowBundle:
    workflow: str
    entry_path: str
    code: str  # one script for QuickJS; it defines the global `__qjsflow_module`


@dataclass(frozen=True, slots=True)
class Snapshot:
    snapshot_id: str
    tree: SourceTree
    entries: tuple[str, ...]
    bundles: tuple[WorkflowBundle, ...]


def select_entries(tree: SourceTree, entries: Sequence[str] | None = None) -> tuple[str, ...]:
    """The entry paths: the explicit list (validated) or every script under `workflows/`."""
    paths = set(tree.paths())
    if entries is None:
        chosen = sorted(
            path
            for path in paths
            if path.count("/") == 1 and path.startswith("workflows/") and _is_script(path)
        )
        if not chosen:
            raise SourceTreeError(
                "workflows/", "holds no .ts or .js file; name entries explicitly or add one"
            )
    else:
        chosen = sorted(set(entries))
        for path in chosen:
            if path not in paths:
                raise SourceTreeError(path, "is named as an entry but is not in the tree")
            if not _is_script(path):
                raise SourceTreeError(path, f"is not a script ({', '.join(ENTRY_SUFFIXES)})")
    names: dict[str, str] = {}
    for path in chosen:
        name = workflow_name(path)
        if not _WORKFLOW_NAME.fullmatch(name):
            raise SourceTreeError(
                path,
                f"gives the workflow name {name!r}: use a letter, then letters, digits, - or _",
            )
        if name in names:
            raise SourceTreeError(path, f"gives the workflow name {name!r}, as {names[name]} does")
        names[name] = path
    return tuple(chosen)


def workflow_name(entry_path: str) -> str:
    base = entry_path.rsplit("/", 1)[-1]
    return base[: base.rindex(".")]


def snapshot_id_of(tree: SourceTree, entries: Sequence[str]) -> str:
    canonical = dumps(
        [
            SNAPSHOT_FORMAT,
            [[file.path, hashlib.sha256(file.content).hexdigest()] for file in tree.files],
            sorted(entries),
        ]
    )
    return hashlib.sha256(canonical).hexdigest()


async def build_snapshot(
    tree: SourceTree, entries: Sequence[str] | None = None, limits: BuildLimits | None = None
) -> Snapshot:
    """Bundle every entry of `tree`; raises a PublishError naming the problem."""
    chosen = select_entries(tree, entries)
    codes = await _bundle(tree, chosen, limits or BuildLimits())
    bundles = tuple(WorkflowBundle(workflow_name(path), path, codes[path]) for path in chosen)
    return Snapshot(snapshot_id_of(tree, chosen), tree, chosen, bundles)


async def _bundle(
    tree: SourceTree, entries: tuple[str, ...], limits: BuildLimits
) -> dict[str, str]:
    with tempfile.TemporaryDirectory(prefix="qjsflow-stage-") as stage:
        root = Path(stage) / "tree"
        _stage(tree, root)
        answer = await run_driver(
            {"root": str(root), "entries": list(entries), "shims": _shim_sources()}, limits
        )
    if "errors" in answer:
        raise BundleError([_format_error(error) for error in answer["errors"]])
    return {output["entry"]: output["code"] for output in answer["outputs"]}


def _stage(tree: SourceTree, root: Path) -> None:
    """Write the tree into a fresh private folder: regular files only, nothing else."""
    root.mkdir(mode=0o700)
    for file in tree.files:
        target = root / file.path
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(file.content)


def _shim_sources() -> dict[str, str]:
    return {
        module: (_SHIMS_DIR / name).read_text(encoding="utf-8")
        for module, name in _SHIM_FILES.items()
    }


def _format_error(error: dict[str, object]) -> str:
    text = str(error.get("text", "unknown error"))
    file = error.get("file")
    if not file:
        return text
    return f"{file}:{error.get('line')}:{error.get('column')}: {text}"


def _is_script(path: str) -> bool:
    return path.endswith(ENTRY_SUFFIXES) and not path.endswith((".d.ts", ".d.mts"))
