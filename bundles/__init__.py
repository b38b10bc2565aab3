"""Publishing: a hostile source tree becomes an immutable, content-addressed snapshot whose
workflow entries are bundled once by the pinned esbuild, confined to the tree (DESIGN §7)."""

from bundles.errors import BundleError, PublishError, SourceTreeError
from bundles.esbuild import ESBUILD_VERSION, BuildLimits
from bundles.snapshot import (
    Snapshot,
    WorkflowBundle,
    build_snapshot,
    select_entries,
    snapshot_id_of,
)
from bundles.tree import SourceFile, SourceTree, TreeLimits, read_tree, tree_from_mapping

__all__ = [
    "ESBUILD_VERSION",
    "BuildLimits",
    "BundleError",
    "PublishError",
    "Snapshot",
    "SourceFile",
    "SourceTree",
    "SourceTreeError",
    "TreeLimits",
    "WorkflowBundle",
    "build_snapshot",
    "read_tree",
    "select_entries",
    "snapshot_id_of",
    "tree_from_mapping",
]
