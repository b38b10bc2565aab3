"""A source tree becomes a snapshot: a content-addressed id and one bundle per workflow entry.

A snapshot is its entries and the files they import, nothing else: the id is the SHA-256 of a
canonical JSON document of a format tag, each reached file's path with the SHA-256 of its
bytes, and the entry list. Files nothing imports (a journal, an asset, notes) never change it;
any changed byte of a reached file gives a new one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qjsflow.bridge import dumps
from qjsflow.bundles.errors import BundleError, SourceTreeError
from qjsflow.bundles.esbuild import BuildLimits, run_driver
from qjsflow.bundles.manifest import (
    MANIFEST_FILES,
    Capabilities,
    WorkflowSettings,
    capabilities_of,
    workflow_settings,
)
from qjsflow.bundles.toolchain import NODE_COMPAT_PACKAGES
from qjsflow.bundles.tree import (
    SourceTree,
    TreeLimits,
    TreeListing,
    read_reached,
    scan_tree,
    stage_tree,
    tree_from_mapping,
)
from qjsflow.bundles.wrangler import (
    WRANGLER_FILES,
    DeclaredWorkflow,
    WranglerProject,
    parse_wrangler,
)

__all__ = [
    "ENTRY_SUFFIXES",
    "Snapshot",
    "WorkflowBundle",
    "build_snapshot",
    "name_workflows",
    "select_entries",
    "snapshot_id_of",
]

SNAPSHOT_FORMAT = "qjsflow-snapshot-v1"
ENTRY_SUFFIXES = (".ts", ".mts", ".js", ".mjs")
_WORKFLOW_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
_SHIMS_DIR = Path(__file__).with_name("shims")
_SHIM_FILES = {
    "qjsflow": "qjsflow.js",
    "cloudflare:workers": "cloudflare-workers.js",
    "cloudflare:workflows": "cloudflare-workflows.js",
}


@dataclass(frozen=True, slots=True)
class WorkflowBundle:
    workflow: str
    entry_path: str
    code: str  # one script for QuickJS; it defines the global `__qjsflow_module`
    export: str = "default"  # the export of the entry that is this workflow
    source_map: str = ""  # esbuild's map of `code` to tree paths (source map v3, JSON)
    binding: str | None = None  # its name in env, as the wrangler file binds it


@dataclass(frozen=True, slots=True)
class Snapshot:
    snapshot_id: str
    tree: SourceTree
    entries: tuple[str, ...]
    bundles: tuple[WorkflowBundle, ...]
    capabilities: Capabilities | None = None  # declared by its manifest (bundles/manifest.py)
    # The workflows an entry holds, when they are named rather than found: by a wrangler file's
    # `workflows[]`, or `FILE:CLASS` entries. Entry -> its declared workflows.
    declared: Mapping[str, tuple[DeclaredWorkflow, ...]] = dataclasses.field(default_factory=dict)
    warnings: tuple[str, ...] = ()  # said at publish, stored nowhere
    vars: Mapping[str, Any] | None = None  # the wrangler file's `vars`: env defaults
    # What the manifest declares of each workflow by name: flow control, schedules.
    settings: Mapping[str, WorkflowSettings] = dataclasses.field(default_factory=dict)


def select_entries(listing: TreeListing, entries: Sequence[str] | None = None) -> tuple[str, ...]:
    """The entry paths: the explicit list (validated; `FILE:CLASS` names the file) or every
    script under `workflows/`."""
    if entries is not None:
        entries = [entry_and_class(entry)[0] for entry in entries]
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
    return tuple(chosen)


def entry_and_class(entry: str) -> tuple[str, str | None]:
    """`FILE[:CLASS]` as (file, class or None)."""
    path, colon, class_name = entry.partition(":")
    if colon and not class_name:
        raise SourceTreeError(entry, "names no class after the colon (FILE:CLASS)")
    return path, (class_name or None)


def declared_by_entries(entries: Sequence[str]) -> dict[str, tuple[DeclaredWorkflow, ...]]:
    """The workflows `FILE:CLASS` entries name (a class's workflow takes the class's name)."""
    declared: dict[str, tuple[DeclaredWorkflow, ...]] = {}
    for entry in entries:
        path, class_name = entry_and_class(entry)
        if class_name is not None:
            declared[path] = (*declared.get(path, ()), DeclaredWorkflow(class_name, class_name))
    return declared


def name_workflows(
    snapshot: Snapshot, exports: Mapping[str, Sequence[Mapping[str, Any]]]
) -> Snapshot:
    """The snapshot with one bundle per workflow, named from what each entry exports (as the
    sandbox described it): every `WorkflowEntrypoint` subclass by its class name, a default
    export that is a function by the file's stem. A file with no workflow, or two workflows
    of one name, is refused naming the files."""
    named: list[WorkflowBundle] = []
    owners: dict[str, str] = {}
    for bundle in snapshot.bundles:
        declared = snapshot.declared.get(bundle.entry_path)
        found = (
            _workflows_of(bundle.entry_path, exports[bundle.entry_path]) if declared is None
            else _declared_workflows(bundle.entry_path, exports[bundle.entry_path], declared)
        )  # fmt: skip
        if not found:
            raise SourceTreeError(
                bundle.entry_path,
                "exports no workflow: export default an async function (event, step), or "
                "export a class that extends WorkflowEntrypoint",
            )
        for name, export in found:
            if not _WORKFLOW_NAME.fullmatch(name):
                raise SourceTreeError(
                    bundle.entry_path,
                    f"gives the workflow name {name!r}: use a letter, then letters, digits, "
                    "- or _ (64 at most)",
                )
            if name in owners:
                raise SourceTreeError(
                    bundle.entry_path,
                    f"defines the workflow {name!r}, as {owners[name]} does: rename one",
                )
            owners[name] = bundle.entry_path
            binding = next((w.binding for w in declared or () if w.name == name), None)
            named.append(dataclasses.replace(bundle, workflow=name, export=export, binding=binding))
    unknown = sorted(set(snapshot.settings) - set(owners))
    if unknown:
        paths = {file.path for file in snapshot.tree.files}
        where = next((path for path in MANIFEST_FILES if path in paths), "the manifest")
        raise SourceTreeError(
            where, f"declares settings of {unknown[0][:64]!r}, which is not a workflow here "
            f"(its workflows: {', '.join(sorted(owners))})",
        )  # fmt: skip
    return dataclasses.replace(snapshot, bundles=tuple(named))


def _declared_workflows(
    entry_path: str, exports: Sequence[Mapping[str, Any]], declared: Sequence[DeclaredWorkflow]
) -> list[tuple[str, str]]:
    """(workflow name, export) for the classes named for an entry: each must be exported, as a
    class that extends `WorkflowEntrypoint` (or has a `run` method)."""
    classes = {
        (described["className"] if described["export"] == "default" else described["export"]):
        described["export"]
        for described in exports if described["kind"] in ("workflow-class", "run-class")
    }  # fmt: skip
    found: list[tuple[str, str]] = []
    for workflow in declared:
        export = classes.get(workflow.class_name)
        if export is None:
            raise SourceTreeError(
                entry_path,
                f"does not export the workflow class {workflow.class_name!r} (the workflow "
                f"{workflow.name!r} names it): export a class that extends WorkflowEntrypoint",
            )
        found.append((workflow.name, export))
    return found


def _workflows_of(entry_path: str, exports: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(workflow name, export) for one entry file."""
    stem = workflow_name(entry_path)
    found: list[tuple[str, str]] = []
    run_classes: list[str] = []
    for described in exports:
        export, kind, class_name = described["export"], described["kind"], described["className"]
        if export == "default" and kind == "function":
            found.append((stem, export))
        elif kind == "workflow-class":
            named = class_name if export == "default" else export
            found.append((named if named not in ("", "default") else stem, export))
        elif kind == "run-class":
            run_classes.append(export)
    if not found and len(run_classes) == 1:  # a plain class with run(), as before subclasses
        found.append((stem, run_classes[0]))
    return found


def workflow_name(entry_path: str) -> str:
    base = entry_path.rsplit("/", 1)[-1]
    return base[: base.rindex(".")]


def snapshot_id_of(
    tree: SourceTree,
    entries: Sequence[str],
    declared: Mapping[str, Sequence[DeclaredWorkflow]] | None = None,
    node_compat: bool = False,
) -> str:
    document: list[Any] = [
        SNAPSHOT_FORMAT,
        [[file.path, hashlib.sha256(file.content).hexdigest()] for file in tree.files],
        sorted(entries),
    ]
    if declared:  # which classes are which workflows is part of what was published
        document.append(sorted([entry, w.name, w.class_name] for entry, ws in declared.items()
                               for w in ws))  # fmt: skip
    if node_compat:  # the polyfills' pinned versions are part of the code
        document.append(sorted(NODE_COMPAT_PACKAGES.items()))
    return hashlib.sha256(dumps(document)).hexdigest()


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
        # Absolute (the bundler runs in the tree), not resolved: a root that is a symlink is
        # still seen, and refused, by the scan.
        root = Path(os.path.abspath(source))
        return await _build(root, entries, limits, tree_limits, exclude)
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
    declared: dict[str, tuple[DeclaredWorkflow, ...]] = {}
    warnings: list[str] = []
    project, flags = await _project(listing, tree_limits)
    node_compat = bool({"nodejs_compat", "nodejs_compat_v2"} & set(flags))
    if entries is not None:
        project = None
    if project is not None:  # a Cloudflare project: `main` holds the classes it names
        entries, declared = [project.main], {project.main: project.workflows}
        warnings += [
            f"{project.path}: the workflow {name!r} is defined by another Worker (script_name): "
            "not in this snapshot" for name in project.elsewhere
        ]  # fmt: skip
    elif entries is not None:
        declared = declared_by_entries(entries)
    chosen = select_entries(listing, entries)
    answer = await run_driver(
        {
            "root": str(root), "entries": list(chosen), "shims": _shim_sources(),
            "files": listing.files, "refused": listing.refused, "links": listing.links,
            "maxFiles": tree_limits.max_files, "maxTotalBytes": tree_limits.max_total_bytes,
            "nodeCompat": node_compat,
        },
        limits,
    )  # fmt: skip
    if "errors" in answer:
        raise BundleError([_format_error(error) for error in answer["errors"]])
    digests: dict[str, str] = answer["inputs"]
    # The manifest is part of the snapshot too: what the workflows may reach is in its id.
    manifests = [path for path in MANIFEST_FILES if path in listing.files]
    reached = sorted({*digests, *manifests})
    tree = await asyncio.to_thread(read_reached, listing, reached, tree_limits)
    manifest_files = {f.path: f.content for f in tree.files if f.path in manifests}
    capabilities = capabilities_of(manifest_files)
    settings = workflow_settings(manifest_files)
    for file in tree.files:  # the bundler read these bytes, and only these
        if file.path in digests and hashlib.sha256(file.content).hexdigest() != digests[file.path]:
            raise SourceTreeError(file.path, "changed while it was being published: try again")
    outputs = {output["entry"]: output for output in answer["outputs"]}
    bundles = tuple(
        WorkflowBundle(
            workflow_name(path), path, outputs[path]["code"], source_map=outputs[path]["map"]
        )
        for path in chosen
    )
    return Snapshot(
        snapshot_id_of(tree, chosen, declared, node_compat), tree, chosen, bundles, capabilities,
        declared=declared, warnings=(*warnings, *answer.get("warnings", ())),
        vars=None if project is None else project.vars, settings=settings,
    )  # fmt: skip


async def _project(
    listing: TreeListing, limits: TreeLimits
) -> tuple[WranglerProject | None, tuple[str, ...]]:
    """The tree's wrangler project (None without a wrangler file at its root, or one with no
    `main`), and the compatibility flags its wrangler file sets."""
    path = next((name for name in WRANGLER_FILES if name in listing.files), None)
    if path is None:
        return None, ()
    tree = await asyncio.to_thread(read_reached, listing, [path], limits)
    project, flags = parse_wrangler(path, tree.files[0].content)
    if project is None:
        return None, flags
    if not project.workflows:
        raise SourceTreeError(path, "declares no workflow of its own (workflows[] with a "
                              "class_name and no script_name)")  # fmt: skip
    if project.main not in listing.files:
        raise SourceTreeError(path, f'names "main" {project.main!r}, which '
                              f"{listing.why_not(project.main)}")  # fmt: skip
    return project, flags


def _shim_sources() -> dict[str, str]:
    return {
        module: (_SHIMS_DIR / name).read_text(encoding="utf-8")
        for module, name in _SHIM_FILES.items()
    }


def _format_error(error: dict[str, object]) -> str:
    # The virtual modules' namespace is ours, not the author's: "qjsflow-virtual:qjsflow" is
    # the module "qjsflow" to them.
    text = str(error.get("text", "unknown error")).replace("qjsflow-virtual:", "")
    file = error.get("file")
    if not file:
        return text
    return f"{file}:{error.get('line')}:{error.get('column')}: {text}"


def _is_script(path: str) -> bool:
    return path.endswith(ENTRY_SUFFIXES) and not path.endswith((".d.ts", ".d.mts"))
