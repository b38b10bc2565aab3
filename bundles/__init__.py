"""Publishing: a hostile source tree becomes an immutable, content-addressed snapshot whose
workflow entries are bundled once by the pinned esbuild, confined to the tree
(docs/ARCHITECTURE.md, Publishing).

Its names are imported when first used (`qjsflow.lazy_exports`): reading a stored snapshot
does not load esbuild's driver or the tree scanner.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qjsflow.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from qjsflow.bundles.errors import BundleError, PublishError, SourceTreeError
    from qjsflow.bundles.esbuild import BuildLimits
    from qjsflow.bundles.snapshot import (
        Snapshot,
        WorkflowBundle,
        build_snapshot,
        name_workflows,
        select_entries,
        snapshot_id_of,
    )
    from qjsflow.bundles.toolchain import find_toolchain, setup_tools
    from qjsflow.bundles.tree import (
        IGNORE_FILE,
        SourceFile,
        SourceTree,
        TreeLimits,
        TreeListing,
        scan_tree,
        tree_from_mapping,
    )
    from qjsflow.bundles.versions import ESBUILD_VERSION

_HOMES = {
    "qjsflow.bundles.errors": ("BundleError", "PublishError", "SourceTreeError"),
    "qjsflow.bundles.esbuild": ("BuildLimits",),
    "qjsflow.bundles.snapshot": (
        "Snapshot", "WorkflowBundle", "build_snapshot", "name_workflows", "select_entries",
        "snapshot_id_of",
    ),
    "qjsflow.bundles.toolchain": ("find_toolchain", "setup_tools"),
    "qjsflow.bundles.tree": (
        "IGNORE_FILE", "SourceFile", "SourceTree", "TreeLimits", "TreeListing", "scan_tree",
        "tree_from_mapping",
    ),
    "qjsflow.bundles.versions": ("ESBUILD_VERSION",),
}  # fmt: skip

__getattr__ = lazy_exports(__name__, _HOMES)

__all__ = [
    "ESBUILD_VERSION",
    "IGNORE_FILE",
    "BuildLimits",
    "BundleError",
    "PublishError",
    "Snapshot",
    "SourceFile",
    "SourceTree",
    "SourceTreeError",
    "TreeLimits",
    "TreeListing",
    "WorkflowBundle",
    "build_snapshot",
    "find_toolchain",
    "name_workflows",
    "scan_tree",
    "select_entries",
    "setup_tools",
    "snapshot_id_of",
    "tree_from_mapping",
]
