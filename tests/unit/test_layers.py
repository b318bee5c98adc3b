"""The layers (docs/architecture.md) hold: import-linter's contract in pyproject.toml passes
on the package as installed, and fails when a forbidden import is planted.

import-linter cannot follow the editable install's import hook (memdiag.streams lives in
streams/), so each test lays out the installed tree itself, from pyproject's own
``package-dir`` mapping, as the wheel does."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def installed_tree(target: Path) -> Path:
    """The packages as the wheel installs them, under ``target``."""
    setup = tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]
    mapping = setup.get("package-dir", {})
    for package in setup["packages"]:
        parent = package.rpartition(".")[0]
        if package in mapping:
            source = ROOT / mapping[package]
        elif parent in mapping:
            source = ROOT / mapping[parent] / package.rpartition(".")[2]
        else:
            source = ROOT.joinpath(*package.split("."))
        dest = target.joinpath(*package.split("."))
        dest.mkdir(parents=True, exist_ok=True)
        for f in source.glob("*.py"):
            shutil.copy(f, dest / f.name)
    return target


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(PYPROJECT), "--no-cache"],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_installed_packages_keep_the_layers(tmp_path: Path) -> None:
    result = lint_imports(installed_tree(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "planted", "edge"),
    [
        # the two stages side by side never import each other
        ("memdiag/streams/session/session.py", "import memdiag.analytics.db", "memdiag.analytics"),
        # a lower layer never imports a higher one
        (
            "memdiag/schemas/models.py",
            "from memdiag.streams.rules import followup",
            "memdiag.streams",
        ),
        ("memdiag/contract/envelope.py", "import memdiag.settings", "memdiag.settings"),
        ("memdiag/runner.py", "from memdiag.cli import main", "memdiag.cli"),
    ],
)
def test_a_planted_forbidden_import_breaks_the_contract(
    tmp_path: Path, module: str, planted: str, edge: str
) -> None:
    tree = installed_tree(tmp_path)
    target = tree / module
    target.write_text(target.read_text() + f"\n{planted}  # planted by the test\n")
    result = lint_imports(tree)
    assert result.returncode != 0, result.stdout
    assert "BROKEN" in result.stdout and edge in result.stdout, result.stdout


def test_no_module_imports_the_folders_as_top_level_packages() -> None:
    """``streams``, ``schemas`` and ``analytics`` are folders, installed as memdiag.*: an
    ``import streams`` would work in the repository (its root is on sys.path) and break in
    the wheel."""
    wrong = []
    for path in ROOT.rglob("*.py"):
        if any(
            part in {".venv", ".build", "build"} or part.startswith(".")
            for part in path.relative_to(ROOT).parts
        ):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                if name.split(".")[0] in {"streams", "schemas", "analytics"}:
                    wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    assert not wrong, wrong


def test_the_worker_never_loads_duckdb() -> None:
    """DuckDB is 25 MB of a process's resident memory: the worker's process (the command
    line's parsers, then every module of memdiag.streams) must not import it."""
    code = (
        "import pkgutil, sys, importlib\n"
        "import memdiag.cli, memdiag.streams\n"
        "memdiag.cli.build_parser()\n"
        "for m in pkgutil.walk_packages(memdiag.streams.__path__, 'memdiag.streams.'):\n"
        "    importlib.import_module(m.name)\n"
        "print(sorted(n for n in sys.modules if n.split('.')[0] == 'duckdb'))\n"
    )
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, cwd=ROOT)  # fmt: skip
    assert found.stdout.strip() == "[]", found.stdout
