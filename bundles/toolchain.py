"""Where Node.js and the pinned esbuild come from, and how they are installed.

Publishing needs `node` and esbuild ESBUILD_VERSION. They are looked for, in order:
1. `QJSFLOW_NODE` (a node executable) and `QJSFLOW_ESBUILD` (an esbuild package folder, the
   one holding `lib/main.js` and `package.json`), when set;
2. `QJSFLOW_JSTOOLS_DIR/node_modules/esbuild`, when set;
3. a checkout's own `.jstools/` (filled by `make setup`, with TypeScript for the tests);
4. the per-user cache, `$XDG_CACHE_HOME/qjsflow/jstools` (`~/.cache/qjsflow/jstools`), which
   `qjsflow setup-tools` fills from the npm registry: the pinned version, whose tarballs are
   checked against the SHA-512 digests pinned here before anything is installed.
A candidate with another version is skipped and named in the error, which says exactly what
is missing and how to get it.
"""

from __future__ import annotations

import base64
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from qjsflow.bridge import ToolchainError, loads
from qjsflow.bundles.versions import ESBUILD_VERSION, TYPESCRIPT_VERSION

__all__ = [
    "ESBUILD_VERSION",
    "NODE_COMPAT_PACKAGES",
    "Toolchain",
    "checkout_tools_dir",
    "find_toolchain",
    "install_for_development",
    "setup_tools",
    "tsc_path",
    "user_cache_dir",
]

# What a project with Cloudflare's `nodejs_compat` flag gets for Node's built-ins, as
# Cloudflare's own tooling does: unenv's modules, and npm's `events` and `buffer` where unenv's
# differ from Node's in ways old packages rely on (an EventEmitter they `.call(this)`), with
# their dependencies. Installed beside esbuild, pinned, checked like it.
NODE_COMPAT_PACKAGES = {
    "unenv": "2.0.0-rc.24", "pathe": "2.0.3", "events": "3.3.0", "buffer": "6.0.3",
    "base64-js": "1.5.1", "ieee754": "1.2.1",
}  # fmt: skip
# npm packages the tests install into workflow trees (publishing real packages), pinned.
TEST_PACKAGES = {"zod": "3.25.76", "hono": "4.6.8"}
# npm's integrity digests of the pinned tarballs (`npm view <package>@<version> dist.integrity`).
_INTEGRITY = {
    "esbuild": "sha512-HKVLS8dvII+xoKW9kmqxbRKrnWEXfJJr/FZhhJmiqIB0e053QNYFqOBouTMO/"
    "k5sID4MvCiUCvv8b9M4h32wIA==",
    "@esbuild/linux-x64": "sha512-4xTZr1FUmSoQW4XIWmit3tzQrUTZM+N3P0XV8xROKYF50XfI7xeO90+"
    "1bZvNwxIufQ9hDQVRJH5YhgPVF8A/HQ==",
    "@esbuild/linux-arm64": "sha512-pW4AC0P3it8c7do9MVM4p51FzHzdM/TZrerurgRcHJ2WTa1VQ1CIq18x"
    "ncfpBJw4ojkiZZrKW2yIBWBP92j6Ug==",
}
_INTEGRITY.update({
    "unenv": "sha512-i7qRCmY42zmCwnYlh9H2SvLEypEFGye5iRmEMKjcGi7zk9UquigRj"
    "FtTLz0TYqr0ZGLZhaMHl/foy1bZR+Cwlw==",
    "pathe": "sha512-WUjGcAqP1gQacoQe+OBJsFA7Ld4DyXuUIjZ5cc75cLHvJ7dtNsTug"
    "phxIADwspS+AraAUePCKrSVtPLFj/F88w==",
    "events": "sha512-mQw+2fkQbALzQ7V0MY0IqdnXNOeTtP4r0lN9z7AAawCXgqea7bDii"
    "20AYrIBrFd/Hx0M2Ocz6S111CaFkUcb0Q==",
    "buffer": "sha512-FTiCpNxtwiZZHEZbcbTIcZjERVICn9yq/pDFkTl95/AxzD1naBctN"
    "7YO68riM/gLSDY7sdrMby8hofADYuuqOA==",
    "base64-js": "sha512-AKpaYlHn8t4SVbOHCy+b5+KKgvR4vrsD8vbvrbiQJps7fKDTkjkDr"
    "y6ji0rUJjC0kzbNePLwzxq8iypo41qeWA==",
    "ieee754": "sha512-dcyqhDvX1C46lXZcVqCpK+FtMRQVdIMN6/Df5js2zouUsqG7I6sFx"
    "itIC+7KYK29KdXOLHdu9zL4sFnoVQnqaA==",
})  # fmt: skip
_PLATFORM_PACKAGES = {"x86_64": "@esbuild/linux-x64", "aarch64": "@esbuild/linux-arm64"}
_NODE_HINT = (
    "install Node.js 18 or later (Debian: `apt-get install nodejs npm`), or set QJSFLOW_NODE "
    "to a node executable"
)
_ESBUILD_HINT = (
    f"run `qjsflow setup-tools` (it fetches esbuild {ESBUILD_VERSION} from the npm registry "
    "into the per-user cache), or set QJSFLOW_ESBUILD to an esbuild "
    f"{ESBUILD_VERSION} package folder"
)


@dataclass(frozen=True, slots=True)
class Toolchain:
    node: str
    esbuild_package: Path  # the esbuild npm package folder (holds lib/main.js)

    @property
    def node_compat(self) -> Path | None:
        """The node_modules folder holding NODE_COMPAT_PACKAGES beside esbuild, if it does."""
        modules = self.esbuild_package.parent
        if all(_version_of(modules / name) == version
               for name, version in NODE_COMPAT_PACKAGES.items()):  # fmt: skip
            return modules
        return None


def checkout_tools_dir() -> Path:
    """A checkout's `.jstools/` (or QJSFLOW_JSTOOLS_DIR): what `make setup` fills."""
    override = os.environ.get("QJSFLOW_JSTOOLS_DIR")
    if override:
        return Path(override)
    return Path(__file__).resolve().parent.parent / ".jstools"


def user_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "qjsflow" / "jstools"


def tsc_path() -> Path:
    """The pinned TypeScript compiler's entry script in the checkout (run it with node)."""
    return checkout_tools_dir() / "node_modules" / "typescript" / "bin" / "tsc"


def _version_of(package: Path) -> str | None:
    try:
        manifest = loads((package / "package.json").read_bytes())
    except (OSError, ValueError):
        return None
    version = manifest.get("version") if isinstance(manifest, dict) else None
    return version if isinstance(version, str) else None


def _candidates() -> list[tuple[str, Path]]:
    found: list[tuple[str, Path]] = []
    explicit = os.environ.get("QJSFLOW_ESBUILD")
    if explicit:
        found.append(("QJSFLOW_ESBUILD", Path(explicit)))
    found.append(("the checkout's tools", checkout_tools_dir() / "node_modules" / "esbuild"))
    found.append(("the per-user cache", user_cache_dir() / "node_modules" / "esbuild"))
    return found


def find_toolchain() -> Toolchain:
    """node and the pinned esbuild package, or a ToolchainError saying how to get them."""
    node = os.environ.get("QJSFLOW_NODE") or shutil.which("node")
    if node is None or not os.access(node, os.X_OK):
        where = f" at {node}" if node else ""
        raise ToolchainError(f"node is not installed{where}: {_NODE_HINT}")
    wrong: list[str] = []
    for origin, package in _candidates():
        version = _version_of(package)
        if version == ESBUILD_VERSION and (package / "lib" / "main.js").is_file():
            return Toolchain(node=node, esbuild_package=package)
        if version is not None:
            wrong.append(f"{origin} has esbuild {version}")
        elif origin == "QJSFLOW_ESBUILD":
            wrong.append(f"QJSFLOW_ESBUILD={package} is not an esbuild package folder")
    seen = f" ({'; '.join(wrong)})" if wrong else ""
    raise ToolchainError(f"esbuild {ESBUILD_VERSION} is not installed{seen}: {_ESBUILD_HINT}")


def _npm() -> str:
    npm = os.environ.get("QJSFLOW_NPM") or shutil.which("npm")
    if npm is None:
        raise ToolchainError(f"npm is not installed: {_NODE_HINT}")
    return npm


def _npm_install(target: Path, specs: list[str]) -> None:
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            _npm(), "install", "--no-save", "--no-package-lock", "--no-audit", "--no-fund",
            "--loglevel=error", "--prefix", str(target), *specs,
        ],
        check=True, stdout=subprocess.DEVNULL,  # stdout is the CLI's (one JSON document)
    )  # fmt: skip


def install_for_development() -> Path:
    """The checkout's `.jstools/`: the pinned esbuild and the TypeScript the tests use, and
    (in `test-packages/`) the npm packages the tests publish inside workflow trees."""
    target = checkout_tools_dir()
    _install_missing(target, {"esbuild": ESBUILD_VERSION, "typescript": TYPESCRIPT_VERSION,
                              **NODE_COMPAT_PACKAGES})  # fmt: skip
    _install_missing(target / "test-packages", TEST_PACKAGES)
    find_toolchain()
    return target


def _install_missing(target: Path, wanted: dict[str, str]) -> None:
    """Every package of `wanted` at its version, when one is missing (all of them at once:
    npm removes from the folder what an install does not name)."""
    if any(_version_of(target / "node_modules" / name) != version
           for name, version in wanted.items()):  # fmt: skip
        _npm_install(target, [f"{name}@{version}" for name, version in wanted.items()])


def _integrity(tarball: Path) -> str:
    digest = hashlib.sha512(tarball.read_bytes()).digest()
    return "sha512-" + base64.b64encode(digest).decode("ascii")


def setup_tools(target: Path | None = None) -> Path:
    """Fill the per-user cache with esbuild ESBUILD_VERSION, from tarballs whose digests match
    the pinned ones: `qjsflow setup-tools`."""
    destination = target or user_cache_dir()
    modules = destination / "node_modules"
    if _version_of(modules / "esbuild") == ESBUILD_VERSION and all(
        _version_of(modules / name) == version for name, version in NODE_COMPAT_PACKAGES.items()
    ):
        return destination
    machine = platform.machine()
    binary = _PLATFORM_PACKAGES.get(machine)
    if binary is None or platform.system() != "Linux":
        raise ToolchainError(
            f"no pinned esbuild binary for {platform.system()} {machine}: install esbuild "
            f"{ESBUILD_VERSION} yourself and set QJSFLOW_ESBUILD to its package folder"
        )
    with tempfile.TemporaryDirectory(prefix="qjsflow-tools-") as scratch:
        tarballs = []
        wanted = {"esbuild": ESBUILD_VERSION, binary: ESBUILD_VERSION, **NODE_COMPAT_PACKAGES}
        for package, version in wanted.items():
            packed = subprocess.run(
                [_npm(), "pack", "--silent", "--pack-destination", scratch,
                 f"{package}@{version}"],
                check=True, capture_output=True, text=True,
            )  # fmt: skip
            tarball = Path(scratch) / packed.stdout.strip().splitlines()[-1]
            if _integrity(tarball) != _INTEGRITY[package]:
                raise ToolchainError(
                    f"the {package}@{version} tarball from the registry does not match "
                    "its pinned checksum: nothing was installed"
                )
            tarballs.append(str(tarball))
        _npm_install(destination, tarballs)
    if _version_of(destination / "node_modules" / "esbuild") != ESBUILD_VERSION:
        raise ToolchainError(f"esbuild did not install into {destination}")
    return destination
