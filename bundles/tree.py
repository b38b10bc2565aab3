"""Reading a hostile source tree into memory, under caps, without following anything.

A tree comes from a folder or from a mapping path -> text. Only regular files are read; a
symlink, device, FIFO or socket anywhere refuses the whole tree (naming it), before any byte of
it is read. Files are opened with O_NOFOLLOW | O_NONBLOCK and checked again with fstat, so a
file swapped for a FIFO or a link between the scan and the read is refused too, never waited on.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from qjsflow.bundles.errors import SourceTreeError

__all__ = ["SourceFile", "SourceTree", "TreeLimits", "read_tree", "tree_from_mapping"]

# A path part: printable ASCII without separators or quotes; no "." or ".." parts.
_PART = re.compile(r"^[A-Za-z0-9_@+=,.~-][A-Za-z0-9 _@+=,.~-]{0,127}$")


@dataclass(frozen=True, slots=True)
class TreeLimits:
    """Caps on what a published tree may hold."""

    max_files: int = 500
    max_file_bytes: int = 1024 * 1024
    max_total_bytes: int = 8 * 1024 * 1024
    max_depth: int = 12


@dataclass(frozen=True, slots=True)
class SourceFile:
    path: str  # relative, "/"-separated, validated
    content: bytes


@dataclass(frozen=True, slots=True)
class SourceTree:
    """The files of a tree, sorted by path: the canonical form everything is derived from."""

    files: tuple[SourceFile, ...]

    def paths(self) -> tuple[str, ...]:
        return tuple(file.path for file in self.files)

    @property
    def total_bytes(self) -> int:
        return sum(len(file.content) for file in self.files)


def tree_from_mapping(
    sources: Mapping[str, str | bytes], limits: TreeLimits | None = None
) -> SourceTree:
    """A tree from a mapping of relative paths to file contents."""
    limits = limits or TreeLimits()
    files: list[SourceFile] = []
    for raw_path, content in sources.items():
        path = _check_path(raw_path, limits)
        data = content.encode("utf-8") if isinstance(content, str) else bytes(content)
        files.append(SourceFile(path, data))
    return _finish(files, limits)


def read_tree(root: str | os.PathLike[str], limits: TreeLimits | None = None) -> SourceTree:
    """A tree from a folder; every entry must be a regular file or a folder."""
    limits = limits or TreeLimits()
    base = Path(root)
    try:
        root_stat = os.lstat(base)
    except OSError as error:
        raise SourceTreeError("", f"cannot read the folder: {error.strerror}") from None
    if not stat.S_ISDIR(root_stat.st_mode):
        raise SourceTreeError("", "is not a folder (a symlink to one is refused too)")
    files: list[SourceFile] = []
    for relative in _walk(base, limits):
        files.append(SourceFile(relative, _read_regular(base / relative, relative, limits)))
    return _finish(files, limits)


def _walk(base: Path, limits: TreeLimits) -> list[str]:
    """Relative paths of every regular file under `base`; anything else refuses the tree."""
    found: list[str] = []
    pending: list[tuple[Path, str]] = [(base, "")]
    while pending:
        folder, prefix = pending.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
        except OSError as error:
            raise SourceTreeError(prefix, f"cannot list the folder: {error.strerror}") from None
        for entry in entries:
            relative = f"{prefix}{entry.name}"
            _check_path(relative, limits)
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISDIR(mode):
                pending.append((Path(entry.path), f"{relative}/"))
            elif stat.S_ISREG(mode):
                found.append(relative)
                if len(found) > limits.max_files:
                    raise SourceTreeError("", f"holds more than {limits.max_files} files")
            else:
                raise SourceTreeError(relative, f"is a {_kind(mode)}; only regular files allowed")
    return found


def _read_regular(path: Path, relative: str, limits: TreeLimits) -> bytes:
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as error:
        raise SourceTreeError(relative, f"cannot be opened: {error.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise SourceTreeError(relative, f"is a {_kind(mode)}; only regular files allowed")
        data = handle.read(limits.max_file_bytes + 1)
    if len(data) > limits.max_file_bytes:
        raise SourceTreeError(relative, f"is larger than {limits.max_file_bytes} bytes")
    return data


def _check_path(path: str, limits: TreeLimits) -> str:
    parts = path.split("/")
    if len(parts) > limits.max_depth:
        raise SourceTreeError(path, f"is nested deeper than {limits.max_depth} folders")
    for part in parts:
        if part in {".", ".."} or not _PART.fullmatch(part):
            raise SourceTreeError(
                path,
                "is not a plain relative path (printable ASCII names without quotes or "
                "backslashes, no '.', '..', empty or absolute parts)",
            )
    return path


def _finish(files: list[SourceFile], limits: TreeLimits) -> SourceTree:
    if not files:
        raise SourceTreeError("", "holds no files")
    if len(files) > limits.max_files:
        raise SourceTreeError("", f"holds more than {limits.max_files} files")
    files.sort(key=lambda file: file.path)
    total = 0
    folders: set[str] = set()
    for file in files:
        if len(file.content) > limits.max_file_bytes:
            raise SourceTreeError(file.path, f"is larger than {limits.max_file_bytes} bytes")
        total += len(file.content)
        parts = file.path.split("/")
        folders.update("/".join(parts[:i]) for i in range(1, len(parts)))
    if total > limits.max_total_bytes:
        raise SourceTreeError("", f"holds more than {limits.max_total_bytes} bytes in all")
    for file in files:
        if file.path in folders:
            raise SourceTreeError(file.path, "is both a file and a folder")
    return SourceTree(tuple(files))


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "special file"
