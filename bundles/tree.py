"""Reading a hostile source tree, under caps, without following anything.

A folder is first scanned (names and kinds, no bytes: `scan_tree`); the bundler then reaches
what the entries import, and only those files are read (`read_reached`), each opened beneath
the root one folder at a time with O_NOFOLLOW | O_NONBLOCK and checked again with fstat, so a
file swapped for a FIFO or a link between the scan and the read is refused, never waited on.
A symlink, device, FIFO or socket that nothing imports is never a problem; one that an import
reaches refuses the publish, naming it. A mapping path -> text is validated and staged.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from qjsflow.bundles.errors import SourceTreeError

if TYPE_CHECKING:
    import pathspec

__all__ = [
    "IGNORE_FILE",
    "SourceFile",
    "SourceTree",
    "TreeLimits",
    "TreeListing",
    "read_reached",
    "scan_tree",
    "stage_tree",
    "tree_from_mapping",
]

# A path part: printable ASCII without separators or quotes; no "." or ".." parts.
_PART = re.compile(r"^[A-Za-z0-9_@+=,.~-][A-Za-z0-9 _@+=,.~-]{0,127}$")


@dataclass(frozen=True, slots=True)
class TreeLimits:
    """Caps on what a published tree may hold."""

    # Bytes are the cap that matters (a real SDK, such as twilio's, reaches a thousand small
    # files); the count only bounds a tree of empty files. Operators set both
    # (`RunnerConfig.tree_limits`).
    max_files: int = 20_000
    max_file_bytes: int = 1024 * 1024
    max_total_bytes: int = 32 * 1024 * 1024
    max_depth: int = 12
    # The scan lists names only (a node_modules folder holds thousands): bounded apart.
    max_scan_entries: int = 100_000


@dataclass(frozen=True, slots=True)
class SourceFile:
    path: str  # relative, "/"-separated, validated
    content: bytes


@dataclass(frozen=True, slots=True)
class SourceTree:
    """The files of a tree, sorted by path: the canonical form everything is derived from."""

    files: tuple[SourceFile, ...]

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


@dataclass(frozen=True, slots=True)
class TreeListing:
    """What a cheap scan of a folder found, without reading any file's bytes.

    `files` are the regular files an import may reach (path -> size); `refused` says why a
    path (a file, or a folder and all below it) may not be: a symlink out of the tree, a FIFO,
    a size over the cap, an odd name, an ignore rule. Nothing in `refused` matters unless an
    import reaches it, so an unused asset never blocks a publish.
    """

    root: Path
    files: dict[str, int]
    refused: dict[str, str]
    # Symlinks whose target is inside the tree (a pnpm node_modules): link -> target. They
    # are not read; an import through one loads the target, which is listed in `files`.
    links: dict[str, str]

    def why_not(self, path: str) -> str:
        """Why `path` cannot be bundled (it is not in `files`)."""
        parts = path.split("/")
        for depth in range(len(parts), 0, -1):
            reason = self.refused.get("/".join(parts[:depth]))
            if reason is not None:
                return reason
        return "is not in the published tree"


# Never read, at any depth: version control, the executables npm links, and (by name) the
# files SQLite keeps beside a journal.
_NEVER = frozenset({".git", ".hg", ".svn"})
_JOURNAL_SUFFIXES = ("", "-wal", "-shm", "-journal")
IGNORE_FILE = ".qjsflowignore"


def scan_tree(
    root: str | os.PathLike[str],
    limits: TreeLimits | None = None,
    exclude: Sequence[str | os.PathLike[str]] = (),
) -> TreeListing:
    """List a folder for publishing: names and kinds only (lstat), nothing followed.

    `exclude` names files that are never part of a tree (the journal a publisher writes, and
    its -wal/-shm); `.qjsflowignore` at the root adds gitignore-style rules.
    """
    limits = limits or TreeLimits()
    base = Path(root)
    try:
        root_stat = os.lstat(base)
    except OSError as error:
        raise SourceTreeError("", f"cannot read the folder: {error.strerror}") from None
    if not stat.S_ISDIR(root_stat.st_mode):
        raise SourceTreeError("", "is not a folder (a symlink to one is refused too)")
    listing = TreeListing(base, {}, {}, {})
    scan = _Scan(listing, limits, _excluded_identities(exclude), _ignore_rules(base))
    pending: list[tuple[Path, str]] = [(base, "")]
    while pending:
        folder, prefix = pending.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError as error:
            listing.refused[prefix.rstrip("/")] = f"cannot be listed: {error.strerror}"
            continue
        pending += scan.entries(entries, prefix)
    return listing


class _Scan:
    """Sorts a scan's entries into a listing: listed, linked, refused (with why) or skipped."""

    def __init__(
        self,
        listing: TreeListing,
        limits: TreeLimits,
        skipped: set[tuple[int, int]],
        ignore: pathspec.GitIgnoreSpec | None,
    ) -> None:
        self.listing = listing
        self.limits = limits
        self.skipped = skipped
        self.ignore = ignore
        self.real_root = os.path.realpath(listing.root)
        self.seen = 0

    def entries(self, entries: list[os.DirEntry[str]], prefix: str) -> list[tuple[Path, str]]:
        """Sort one folder's entries; returns the folders to descend into."""
        folders = []
        for entry in entries:
            self.seen += 1
            if self.seen > self.limits.max_scan_entries:
                raise SourceTreeError("", f"holds more than {self.limits.max_scan_entries} entries")
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # gone since the listing: as if it had never been there
            relative = f"{prefix}{entry.name}"
            if stat.S_ISDIR(info.st_mode):
                if self._keeps_folder(entry.name, relative, prefix, info):
                    folders.append((Path(entry.path), f"{relative}/"))
            elif self._keeps(entry.name, relative, info):
                self._file(entry.path, relative, info)
        return folders

    def _keeps_folder(self, name: str, relative: str, prefix: str, info: os.stat_result) -> bool:
        if name == ".bin" and prefix.endswith("node_modules/"):
            return False  # the executables npm links: never a module
        return self._keeps(name, relative + "/", info, relative)

    def _keeps(
        self, name: str, matched: str, info: os.stat_result, relative: str | None = None
    ) -> bool:
        """False for what is skipped without a trace or refused by a rule (recorded)."""
        key = relative if relative is not None else matched
        if name in _NEVER or (info.st_dev, info.st_ino) in self.skipped:
            return False
        if self.ignore is not None and self.ignore.match_file(matched):
            self.listing.refused[key] = f"is ignored by {IGNORE_FILE}"
            return False
        problem = _path_problem(key, self.limits)
        if problem is not None:
            self.listing.refused[key] = problem
            return False
        return True

    def _file(self, path: str, relative: str, info: os.stat_result) -> None:
        listing, mode = self.listing, info.st_mode
        if stat.S_ISLNK(mode):
            target = os.path.realpath(path)
            if target.startswith(self.real_root + os.sep):
                listing.links[relative] = os.path.relpath(target, self.real_root).replace(
                    os.sep, "/"
                )
            else:
                listing.refused[relative] = "is a symlink pointing outside the tree"
        elif not stat.S_ISREG(mode):
            listing.refused[relative] = f"is a {_kind(mode)}; only regular files are published"
        elif info.st_size > self.limits.max_file_bytes:
            listing.refused[relative] = f"is larger than {self.limits.max_file_bytes} bytes"
        else:
            listing.files[relative] = info.st_size


def _excluded_identities(paths: Sequence[str | os.PathLike[str]]) -> set[tuple[int, int]]:
    """(device, inode) of each excluded file and its SQLite companions that exist."""
    found: set[tuple[int, int]] = set()
    for path in paths:
        for suffix in _JOURNAL_SUFFIXES:
            try:
                info = os.stat(f"{os.fspath(path)}{suffix}")
            except OSError:
                continue
            found.add((info.st_dev, info.st_ino))
    return found


def _ignore_rules(base: Path) -> pathspec.GitIgnoreSpec | None:
    import pathspec  # noqa: PLC0415  (only a publish needs it: CLI commands start faster)

    if not os.path.lexists(base / IGNORE_FILE):
        return None
    data = _read_regular(base / IGNORE_FILE, IGNORE_FILE, TreeLimits(max_file_bytes=65536))
    return pathspec.GitIgnoreSpec.from_lines(data.decode("utf-8", "replace").splitlines())


def read_reached(listing: TreeListing, paths: Sequence[str], limits: TreeLimits) -> SourceTree:
    """Read the files the bundler reached, each opened beneath the root one folder at a time
    without following anything, under the caps that apply to what is bundled."""
    files = []
    for path in paths:
        if path not in listing.files:
            raise SourceTreeError(path, listing.why_not(path))
        files.append(SourceFile(path, _read_beneath(listing.root, path, limits)))
    return _finish(files, limits)


def _read_beneath(root: Path, relative: str, limits: TreeLimits) -> bytes:
    *folders, name = relative.split("/")
    directory = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(root, directory)
    try:
        for folder in folders:
            try:
                inner = os.open(folder, directory, dir_fd=fd)
            except OSError as error:
                raise SourceTreeError(relative, f"cannot be opened: {error.strerror}") from None
            os.close(fd)
            fd = inner
        return _read_regular(Path(name), relative, limits, dir_fd=fd)
    finally:
        os.close(fd)


def _read_regular(
    path: Path, relative: str, limits: TreeLimits, dir_fd: int | None = None
) -> bytes:
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
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
    problem = _path_problem(path, limits)
    if problem is not None:
        raise SourceTreeError(path, problem)
    return path


def _path_problem(path: str, limits: TreeLimits) -> str | None:
    parts = path.split("/")
    if len(parts) > limits.max_depth:
        return f"is nested deeper than {limits.max_depth} folders"
    for part in parts:
        if part in {".", ".."} or not _PART.fullmatch(part):
            return (
                "is not a plain relative path (printable ASCII names without quotes or "
                "backslashes, no '.', '..', empty or absolute parts)"
            )
    return None


def stage_tree(tree: SourceTree, root: Path) -> None:
    """Write a tree (from a mapping) into a fresh private folder: regular files only."""
    root.mkdir(mode=0o700)
    for file in tree.files:
        target = root / file.path
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(file.content)


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
