"""The layer contract (pyproject.toml, [tool.importlinter]; docs/architecture.md, "Layers").

The contract holds on the real tree; the same check on a copy of the package with one back-reference
added (a function-level import, which counts like a top-level one) or one unplaced package fails,
so the check can fail; and every package and top-level module under src/rollwire is placed.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "rollwire"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def _layers_contract() -> dict:
    (contract,) = [c for c in _config()["contracts"] if c.get("containers") == ["rollwire"]]
    return contract


def _lint(cwd: Path, src: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` with the project's contracts, on the package found under ``src``."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(ROOT / "pyproject.toml")],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _copy(tmp_path: Path) -> Path:
    """A throwaway copy of the package (no bytecode), to break on purpose."""
    shutil.copytree(PACKAGE, tmp_path / "rollwire", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path / "rollwire"


def _lint_with(tmp_path: Path, module: str, text: str) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on a copy of the package with ``text`` appended to ``module``."""
    with (_copy(tmp_path) / module).open("a") as f:
        f.write(text)
    return _lint(tmp_path, tmp_path)


def test_the_contract_holds_on_the_tree():
    run = _lint(ROOT, ROOT / "src")
    assert run.returncode == 0, run.stdout + run.stderr
    assert re.search(r"Contracts: \d+ kept, 0 broken", run.stdout), run.stdout


def test_control_a_lazy_back_reference_breaks_the_contract(tmp_path):
    # capture is the lowest package layer; a function-level import of tools reaches up.
    late = "\n\ndef _late():\n    import rollwire.tools.rollouts  # noqa: F401\n"
    run = _lint_with(tmp_path, "capture/findings.py", late)
    assert run.returncode != 0, run.stdout
    assert "rollwire.capture is not allowed to import rollwire.tools" in run.stdout, run.stdout
    assert "rollwire.capture.findings -> rollwire.tools.rollouts" in run.stdout, run.stdout


def test_control_siblings_of_one_layer_may_not_import_each_other(tmp_path):
    sibling = "\n\nfrom rollwire.sessions import base as _base  # noqa: E402, F401\n"
    run = _lint_with(tmp_path, "datasets/stats.py", sibling)
    assert run.returncode != 0, run.stdout
    assert "rollwire.datasets is not allowed to import rollwire.sessions" in run.stdout, run.stdout


def test_control_a_command_module_importing_cli_breaks_the_server_contract(tmp_path):
    # The cycle issue 21 removed: collect_cli importing cli back.
    back = "\n\ndef _late():\n    from rollwire.server import cli  # noqa: F401\n"
    run = _lint_with(tmp_path, "server/collect_cli.py", back)
    assert run.returncode != 0, run.stdout
    assert "rollwire.server.collect_cli is not allowed to import rollwire.server.cli" in run.stdout


def test_control_an_unplaced_package_breaks_the_contract(tmp_path):
    copy = _copy(tmp_path)
    (copy / "newpkg").mkdir()
    (copy / "newpkg" / "__init__.py").write_text('"""Not placed in the layers."""\n')
    run = _lint(tmp_path, tmp_path)
    assert run.returncode != 0, run.stdout
    assert "rollwire.newpkg" in run.stdout, run.stdout


def test_every_package_and_module_is_placed_in_the_layers():
    contract = _layers_contract()
    assert contract["containers"] == ["rollwire"]
    assert contract.get("exhaustive") is True
    placed = [name.strip() for layer in contract["layers"] for name in re.split(r"[|:]", layer)]
    assert len(placed) == len(set(placed)), placed
    present = {
        p.stem if p.is_file() else p.name
        for p in PACKAGE.iterdir()
        if (p.is_file() and p.suffix == ".py" and p.name != "__init__.py")
        or (p.is_dir() and (p / "__init__.py").exists())
    }
    assert set(placed) == present, (sorted(present - set(placed)), sorted(set(placed) - present))


def test_every_layer_says_what_it_owns_and_may_import():
    """Each package's ``__init__`` and each top-level module opens with a docstring that names
    what it may import (docs/architecture.md's table says the same)."""
    contract = _layers_contract()
    placed = [name.strip() for layer in contract["layers"] for name in re.split(r"[|:]", layer)]
    for name in placed:
        path = PACKAGE / name / "__init__.py"
        if not path.exists():
            path = PACKAGE / f"{name}.py"
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert re.search(r"import", doc), f"{path}: no docstring saying what it may import"
