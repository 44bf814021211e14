"""The architecture holds: import-linter's contracts (pyproject.toml) pass on
the tree, and each kind of breach fails them: an upward import, a circle, the
command line or argparse reached from the library."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("harness", "oracle", "ports", "reports", "benchmarks")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(root: Path, contract: str | None = None) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` over the packages under ``root`` (found first on the
    path): every contract, or the one whose id is ``contract``."""
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
    only = ["--contract", contract] if contract else []
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", *only], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def tree_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packages and the contracts, copied once: each breach is planted in its own copy."""
    root = tmp_path_factory.mktemp("tree")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


def planted(tree_copy: Path, tmp_path: Path, module: str, line: str) -> Path:
    root = tmp_path / "tree"
    shutil.copytree(tree_copy, root)
    path = root / module
    path.write_text(path.read_text() + f"\n{line}\n")
    return root


def test_the_tree_keeps_every_contract() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 4 kept, 0 broken." in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        # The data model reaching up to the runner: an upward import.
        ("harness/model/sparse.py", "import harness.sides.runner", "layers"),
        # The kernels reaching the engine.
        ("harness/kernels/numeric.py", "import harness.engine", "layers"),
        # The runner's item model importing the runner that imports it: a circle.
        ("harness/sides/items.py", "import harness.sides.runner", "acyclic"),
        # The engine reaching into the command line.
        ("harness/engine/execution.py", "import harness.commands.common", "cli"),
        # A benchmark running the command line instead of the engine.
        ("benchmarks/numeric_cost.py", "import harness.cli", "cli"),
        # A library module parsing a command line.
        ("harness/verdicts/summary.py", "import argparse", "argparse"),
    ],
)
def test_a_planted_breach_fails_the_contracts(
    tree_copy: Path, tmp_path: Path, module: str, line: str, contract: str
) -> None:
    root = planted(tree_copy, tmp_path, module, line)
    # The copy keeps the contract until the breach: the breach alone breaks it.
    assert lint_imports(tree_copy, contract).returncode == 0
    result = lint_imports(root, contract)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Contracts: 0 kept, 1 broken." in result.stdout
    # The report names the module that broke it (a circle by its name within the package).
    dotted = module.removesuffix(".py").replace("/", ".")
    assert dotted in result.stdout or f".{dotted.rsplit('.', 1)[1]} ->" in result.stdout


def test_every_python_file_is_read_in_a_sitting() -> None:
    """No Python file over 600 lines (there are no data tables in Python here)."""
    files = [p for folder in (*PACKAGES, "tools", "tests") for p in (ROOT / folder).rglob("*.py")]
    longer = {str(p.relative_to(ROOT)): n for p in files if (n := len(p.read_text().splitlines())) > 600}
    assert files and longer == {}


def test_the_readme_is_read_in_five_minutes() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250
