"""The shape of the code base: import direction, public names, where SQL lives."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.conftest import PROJECT_ROOT

PACKAGES = ("bridge", "bundles", "sandbox", "runner")
# docs/ARCHITECTURE.md: runner -> sandbox -> bridge, runner -> bundles, runner -> bridge; bundles uses the
# bridge's codec and error root; bridge imports no other project package.
ALLOWED = {
    "bridge": set(),
    "bundles": {"bridge"},
    "sandbox": {"bridge"},
    "runner": {"bridge", "bundles", "sandbox"},
}
SQL = re.compile(r"\b(SELECT\s+\S|INSERT\s+INTO|CREATE\s+TABLE|UPDATE\s+\w+\s+SET|DELETE\s+FROM)")


def _modules(package: str) -> list[Path]:
    return sorted((PROJECT_ROOT / package).rglob("*.py"))


def _imported_names(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def _project_imports(path: Path) -> set[str]:
    """The project packages a module imports (as `qjsflow.<package>`)."""
    parts = [name.split(".") for name in _imported_names(path)]
    return {p[1] for p in parts if len(p) > 1 and p[0] == "qjsflow" and p[1] in PACKAGES}


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_flow_one_way(package: str) -> None:
    assert _modules(package), f"{package}/ holds no modules"
    for path in _modules(package):
        wrong = _project_imports(path) - ALLOWED[package] - {package}
        assert not wrong, f"{path.relative_to(PROJECT_ROOT)} imports {sorted(wrong)}"


# Inside runner/, its parts in layers, lowest first (docs/ARCHITECTURE.md): a module imports
# only from its own layer or those below. A part is a subpackage or a top-level module.
RUNNER_LAYERS = (
    ("errors", "bindings", "telemetry"),
    ("store",),
    ("tenancy",),
    ("scopedb",),
    ("config", "views", "reads"),
    ("engine",),
    ("operations",),
    ("runner", "testing"),
    ("cli", "console", "demo"),
)
_LAYER_OF = {part: n for n, parts in enumerate(RUNNER_LAYERS) for part in parts}


def _runner_part(path: Path) -> str:
    relative = path.relative_to(PROJECT_ROOT / "runner").parts
    return relative[0] if len(relative) > 1 else relative[0].removesuffix(".py")


def _runner_parts_imported(path: Path) -> set[str]:
    parts = set()
    for name in _imported_names(path):
        pieces = name.split(".")
        if pieces[:2] == ["qjsflow", "runner"] and len(pieces) > 2:
            parts.add(pieces[2])
    return parts


def test_runner_parts_import_only_their_layer_and_below() -> None:
    modules = [
        p for p in _modules("runner") if p.name != "__init__.py" or p.parent.name != "runner"
    ]
    parts = {_runner_part(path) for path in modules}
    assert parts == set(_LAYER_OF), "every part of runner/ has a layer, and every layer a part"
    for path in modules:
        layer = _LAYER_OF[_runner_part(path)]
        above = {p for p in _runner_parts_imported(path) if _LAYER_OF.get(p, -1) > layer}
        assert not above, f"{path.relative_to(PROJECT_ROOT)} imports {sorted(above)} from above"


def test_the_layer_check_sees_an_import_from_above(tmp_path: Path) -> None:
    upward = tmp_path / "upward.py"
    upward.write_text(
        "from qjsflow.runner.engine.drive import RunDriver\nimport qjsflow.runner.cli\n"
    )
    assert _runner_parts_imported(upward) == {"engine", "cli"}
    assert _LAYER_OF["engine"] > _LAYER_OF["store"]  # so a store module importing it is refused


def test_no_test_imports_a_private_name() -> None:
    """Tests use the package's public seams; a name starting with `_` may change any day."""
    for path in sorted((PROJECT_ROOT / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("qjsflow"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{path.name} imports {private} from {node.module}"


def test_runners_top_level_stays_small() -> None:
    """Its parts are packages that show the design; fewer than 15 modules beside them."""
    top = [p for p in (PROJECT_ROOT / "runner").glob("*.py") if p.name != "__init__.py"]
    assert len(top) < 15, sorted(p.name for p in top)


def test_the_import_check_sees_a_reverse_import(tmp_path: Path) -> None:
    reverse = tmp_path / "reverse.py"
    reverse.write_text(
        "from qjsflow.runner.store import JournalStore\nimport qjsflow.bundles.tree\n"
    )
    assert _project_imports(reverse) == {"runner", "bundles"}


@pytest.mark.parametrize("folder", [*PACKAGES, "tests", "bench"])
def test_nothing_imports_the_packages_by_their_folder_names(folder: str) -> None:
    """Installed, the packages exist only as qjsflow.<name>; an import of a bare `runner` would
    work in a checkout and fail for everyone else (and load a module twice)."""
    for path in sorted((PROJECT_ROOT / folder).rglob("*.py")):
        bare = [n for n in _imported_names(path) if n.split(".")[0] in PACKAGES]
        assert not bare, f"{path.relative_to(PROJECT_ROOT)} imports {bare}"


@pytest.mark.parametrize("package", PACKAGES)
def test_public_names_exist(package: str) -> None:
    module = importlib.import_module(f"qjsflow.{package}")
    for name in module.__all__:
        assert hasattr(module, name), f"{package}.__all__ names missing {name}"


def test_sql_lives_only_in_the_store_and_the_scope_database_server() -> None:
    # The journal's SQL is all in runner/store; the scope-database process keeps its one
    # bookkeeping table (the applied calls) in runner/scopedb/server.py.
    owners = [PROJECT_ROOT / "runner" / "store", PROJECT_ROOT / "runner" / "scopedb"]
    offenders = [
        str(path.relative_to(PROJECT_ROOT))
        for package in PACKAGES
        for path in _modules(package)
        if not any(owner in path.parents for owner in owners) and SQL.search(path.read_text())
    ]
    assert offenders == []
    for owner in owners:
        assert any(SQL.search(path.read_text()) for path in owner.rglob("*.py"))


def _loaded(imports: str, watched: tuple[str, ...]) -> list[str]:
    """Which of `watched` a fresh interpreter has loaded after `import <imports>`."""
    probe = f"import sys, {imports}; print(sorted(m for m in {watched!r} if m in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-I", "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    return list(ast.literal_eval(done.stdout.strip()))


@pytest.mark.parametrize(
    "package", ["qjsflow", "qjsflow.runner", "qjsflow.bundles", "qjsflow.sandbox"]
)
def test_the_facade_names_exist(package: str) -> None:
    """Each package imports its names when first asked (qjsflow/lazy_exports.py): every name it
    lists resolves, and a name it does not list is an AttributeError."""
    module = importlib.import_module(package)
    for name in module.__all__:
        assert hasattr(module, name), f"{package}.__all__ names missing {name}"
    assert not hasattr(module, "NoSuchName")


def test_a_package_loads_nothing_it_is_not_asked_for() -> None:
    """Importing a part of the runner (the journal store) runs the package's `__init__` first:
    it must not load the Runner, its driver or the publish path."""
    heavy = ("qjsflow.runner.runner", "qjsflow.runner.engine.drive.driver", "qjsflow.runner.config",
             "qjsflow.bundles.esbuild", "qjsflow.sandbox.pool")  # fmt: skip
    assert _loaded("qjsflow.runner.store", heavy) == []


def test_an_executor_process_loads_neither_the_runner_nor_asyncio() -> None:
    """Every executor spawn imports its module: the facade and the sandbox package import
    their names lazily, so a spawn does not pay for the runner, asyncio or the journal."""
    heavy = ("asyncio", "sqlite3", "qjsflow.runner", "qjsflow.sandbox.pool")
    assert _loaded("qjsflow.sandbox.executor", heavy) == []


def _declared_requirements() -> list[Requirement]:
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]
    declared = [Requirement(text) for text in project["dependencies"]]
    for extra, texts in project["optional-dependencies"].items():
        if extra not in ("dev", "bench"):  # pinned exactly, or installed only by `make bench`
            declared += [Requirement(text) for text in texts if not text.startswith("qjsflow")]
    return declared


def test_the_tested_versions_lie_inside_the_declared_ranges() -> None:
    """Every runtime and extra dependency has a lower bound and an upper cap, and the version
    this suite ran against (the lock's) is inside them: a cap is where testing stopped."""
    for requirement in _declared_requirements():
        specifiers = {spec.operator for spec in requirement.specifier}
        assert {">=", "<"} <= specifiers, f"{requirement} needs a lower bound and an upper cap"
        installed = metadata.version(requirement.name)
        assert requirement.specifier.contains(installed), f"{requirement.name} {installed}"


def test_the_core_imports_none_of_the_extras() -> None:
    """`pip install qjsflow` without extras must run: the runner, the CLI and the publish path
    import psycopg, OpenTelemetry, Prometheus and the console's web stack only when used."""
    extras = ("psycopg", "opentelemetry", "prometheus_client", "starlette", "jinja2", "uvicorn")
    assert _loaded("qjsflow, qjsflow.runner.cli.commands, qjsflow.runner, qjsflow.bundles",
                   extras) == []  # fmt: skip


def test_every_name_the_readme_gives_the_python_api_is_importable_from_qjsflow() -> None:
    """The README's API section and `qjsflow.__all__` name the same things."""
    import qjsflow  # noqa: PLC0415

    readme = (PROJECT_ROOT / "README.md").read_text()
    section = readme.split("## The Python API", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", section.split("- Running:", 1)[1]))
    exported = set(qjsflow.__all__) - {"__version__"}
    assert listed == exported, (sorted(listed - exported), sorted(exported - listed))
    for name in sorted(listed):
        assert getattr(qjsflow, name) is not None, name


def test_the_build_maps_every_package_folder_and_the_tree_holds_no_links() -> None:
    """The top-level folders are installed as qjsflow.* by pyproject.toml's package mapping:
    every folder holding an `__init__.py` is listed (a package left out would be missing from
    the wheel, and from the editable install's tree), each mapping names a folder, and no
    link stands in for one (tools that read the tree see every file)."""
    setuptools = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folder_of: dict[str, str] = setuptools["package-dir"]
    assert folder_of["qjsflow"] == "qjsflow"
    found = {"qjsflow", "qjsflow.fixtures"}  # fixtures: data only, mapped for the demo
    for top, folder in folder_of.items():
        root = PROJECT_ROOT / folder
        assert root.is_dir(), f"{top} maps to {folder}, not a folder"
        assert not root.is_symlink(), f"{top} maps to {folder}, a link"
        for init in root.rglob("__init__.py"):
            parts = init.parent.relative_to(root).parts
            found.add(".".join([top, *parts]))
    assert sorted(setuptools["packages"]) == sorted(found)
    tracked = subprocess.run(
        ["git", "ls-files", "-s"], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    links = [line.split("\t")[1] for line in tracked if line.startswith("120000")]
    assert not links, f"links in the tree: {links}"


def test_no_module_is_over_600_lines() -> None:
    """Small modules, each one responsibility (CONTRIBUTING.md): a module that outgrows 600
    lines is split by what its parts do, not trimmed."""
    folders = [*PACKAGES, "qjsflow"]
    sizes = {
        path.relative_to(PROJECT_ROOT): len(path.read_text().splitlines())
        for folder in folders
        for path in (PROJECT_ROOT / folder).rglob("*.py")
    }
    assert len(sizes) > 50
    over = {str(path): lines for path, lines in sizes.items() if lines > 600}
    assert not over, f"modules over 600 lines: {over}"


_DEFINED_PRIVATE = re.compile(
    r"^\s*(?:async\s+)?def\s+(_[a-z]\w*)|self\.(_[a-z]\w*)\s*(?::[^=]*)?=[^=]"
    r"|^(_[A-Za-z]\w*)\s*(?::[^=]*)?=[^=]|^class\s+(_\w+)",
    re.MULTILINE,
)
_USED_PRIVATE = re.compile(r"\.(_[A-Za-z][A-Za-z0-9]\w*)\b|setattr\([^,]+,\s*\"(_\w+)\"")


def _private_names(paths: list[Path]) -> set[str]:
    names: set[str] = set()
    for path in paths:
        for match in _DEFINED_PRIVATE.finditer(path.read_text()):
            names.update(name for name in match.groups() if name and not name.startswith("__"))
    return names


def test_no_test_reaches_a_private_name_of_the_package() -> None:
    """Tests go through public seams (an injected clock, `Runner.driver`, `store.trace`, the
    pool's and caches' public state, module constants named as knobs), never a name the
    package keeps private: such a test breaks on a rename and pins the code's insides. Names
    the tests define themselves (a test double's helpers) are theirs to use."""
    package = _private_names([p for folder in PACKAGES for p in _modules(folder)])
    tests = sorted((PROJECT_ROOT / "tests").glob("*.py"))
    own = _private_names(tests)
    reached = []
    for path in tests:
        for match in _USED_PRIVATE.finditer(path.read_text()):
            name = match.group(1) or match.group(2)
            if name in package and name not in own:
                reached.append(f"{path.name}: {name}")
    assert not reached, reached


def test_the_private_name_check_sees_a_reach(tmp_path: Path) -> None:
    module = tmp_path / "module.py"
    module.write_text("class Thing:\n    def __init__(self):\n        self._inside = 1\n")
    assert "_inside" in _private_names([module])
    assert _USED_PRIVATE.search("thing._inside == 1")
    assert _USED_PRIVATE.search('monkeypatch.setattr(module, "_inside", 2)')
