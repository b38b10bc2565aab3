"""A source tree becomes a snapshot: a content-addressed id and one bundle per workflow entry.

A snapshot is its entries and the files they import, nothing else: the id is the SHA-256 of a
canonical JSON document of a format tag, each reached file's path with the SHA-256 of its
bytes, and the entry list. Files nothing imports (a journal, an asset, notes) never change it;
any changed byte of a reached file gives a new one.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from qjsflow.bridge import dumps
from qjsflow.bundles.errors import BundleError, SourceTreeError
from qjsflow.bundles.esbuild import BuildLimits, run_driver
from qjsflow.bundles.tree import (
    SourceTree,
    TreeLimits,
    TreeListing,
    read_reached,
    scan_tree,
    stage_tree,
    tree_from_mapping,
)

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


def select_entries(listing: TreeListing, entries: Sequence[str] | None = None) -> tuple[str, ...]:
    """The entry paths: the explicit list (validated) or every script under `workflows/`."""
    if entries is None:
        chosen = sorted(
            path
            for path in listing.files
            if path.count("/") == 1 and path.startswith("workflows/") and _is_script(path)
        )
        if not chosen:
            raise SourceTreeError(
                "workflows/", "holds no .ts or .js file; name entries explicitly or add one"
            )
    else:
        chosen = sorted(set(entries))
        for path in chosen:
            if path not in listing.files:
                raise SourceTreeError(path, f"is named as an entry but {listing.why_not(path)}")
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
    source: str | os.PathLike[str] | Mapping[str, str | bytes],
    entries: Sequence[str] | None = None,
    *,
    limits: BuildLimits | None = None,
    tree_limits: TreeLimits | None = None,
    exclude: Sequence[str | os.PathLike[str]] = (),
) -> Snapshot:
    """Bundle the entries of a folder (or a mapping path -> text) and read exactly the files
    they reach; raises a PublishError naming the problem. `exclude` names files never read
    (the publisher's own journal)."""
    tree_limits = tree_limits or TreeLimits()
    limits = limits or BuildLimits()
    if not isinstance(source, Mapping):
        return await _build(Path(source), entries, limits, tree_limits, exclude)
    given = tree_from_mapping(source, tree_limits)
    with tempfile.TemporaryDirectory(prefix="qjsflow-stage-") as stage:
        root = Path(stage) / "tree"
        stage_tree(given, root)
        return await _build(root, entries, limits, tree_limits, ())


async def _build(
    root: Path,
    entries: Sequence[str] | None,
    limits: BuildLimits,
    tree_limits: TreeLimits,
    exclude: Sequence[str | os.PathLike[str]],
) -> Snapshot:
    listing = await asyncio.to_thread(scan_tree, root, tree_limits, exclude)
    chosen = select_entries(listing, entries)
    answer = await run_driver(
        {
            "root": str(root), "entries": list(chosen), "shims": _shim_sources(),
            "files": listing.files, "refused": listing.refused, "links": listing.links,
            "maxFiles": tree_limits.max_files, "maxTotalBytes": tree_limits.max_total_bytes,
        },
        limits,
    )  # fmt: skip
    if "errors" in answer:
        raise BundleError([_format_error(error) for error in answer["errors"]])
    digests: dict[str, str] = answer["inputs"]
    tree = await asyncio.to_thread(read_reached, listing, sorted(digests), tree_limits)
    for file in tree.files:  # the bundler read these bytes, and only these
        if hashlib.sha256(file.content).hexdigest() != digests[file.path]:
            raise SourceTreeError(file.path, "changed while it was being published: try again")
    codes = {output["entry"]: output["code"] for output in answer["outputs"]}
    bundles = tuple(WorkflowBundle(workflow_name(path), path, codes[path]) for path in chosen)
    return Snapshot(snapshot_id_of(tree, chosen), tree, chosen, bundles)


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
