"""rollwire's agent installs: from the real registries, once, and usable inside a sandbox.

Small real packages stand in for the agents (npm ``semver``, PyPI ``pyflakes``: each has an
executable and installs in seconds); the agents themselves run in test_real_agents.py and
test_agent_*.py. Installs go to a per-module directory, so nothing here touches the user's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rollwire.harnesses.harbor import installs
from rollwire.harnesses.harbor.datasets import resolve_dataset
from rollwire.harnesses.harbor.installs import (
    PACKAGES,
    AgentInstallError,
    AgentPackage,
    ensure_installed,
    installed_here,
)
from rollwire.harnesses.harbor.rollout import run_harbor_rollout
from tests.harbor.helpers import EXAMPLES, running

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

NPM_TOOL = AgentPackage("semver-tool", "npm", "semver", "7.6.3", ("semver",))
PYPI_TOOL = AgentPackage("pyflakes-tool", "pypi", "pyflakes", "3.2.0", ("pyflakes",))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("agents")


async def _in_sandbox(tmp_path: Path, installed: installs.Installed, command: str):
    """Run ``command`` in a local sandbox with no network and the install mounted."""
    async with running(
        tmp_path, EXAMPLES / "count-errors" / "environment", network=False,
        mounts=installed.mounts(),
    ) as env:  # fmt: skip
        return await env.exec(command, timeout_sec=120)


async def test_an_npm_package_runs_in_a_sandbox_without_network_from_its_shims(root, tmp_path):
    installed = await ensure_installed(NPM_TOOL, root)
    assert installed.node_bin is not None and (installed.node_bin / "node").exists()
    # The way Node agents' Harbor commands find their tool, and the way the others do.
    result = await _in_sandbox(
        tmp_path,
        installed,
        ". ~/.nvm/nvm.sh && semver 1.2.3 && ~/.local/bin/semver 4.5.6 && node --version",
    )
    assert result.return_code == 0, result.stderr
    assert (result.stdout or "").split() == ["1.2.3", "4.5.6", f"v{installs.NODE_VERSION}"]


async def test_a_pypi_package_runs_in_a_sandbox_without_network_from_its_shims(root, tmp_path):
    installed = await ensure_installed(PYPI_TOOL, root)
    assert installed.node_bin is None
    result = await _in_sandbox(
        tmp_path, installed, '. "$HOME/.local/bin/env" && pyflakes --version'
    )
    assert result.return_code == 0, result.stderr
    assert (result.stdout or "").startswith("3.2.0")


async def test_the_mounts_are_read_only_inside_the_sandbox(root, tmp_path):
    installed = await ensure_installed(NPM_TOOL, root)
    result = await _in_sandbox(
        tmp_path, installed, f"touch {installed.prefix}/x 2>&1; touch ~/.nvm/x 2>&1; echo done"
    )
    assert (result.stdout or "").count("Read-only file system") == 2, result.stdout


async def test_a_second_install_reuses_the_first(root):
    await ensure_installed(NPM_TOOL, root)
    said: list[str] = []
    again = await ensure_installed(NPM_TOOL, root, progress=said.append)
    assert said == [] and (again.prefix / ".rollwire-complete").exists()


async def test_an_unknown_version_fails_naming_the_package_and_leaves_nothing(root):
    missing = AgentPackage("nope", "npm", "semver", "0.0.0-not-published", ("semver",))
    with pytest.raises(AgentInstallError, match=r"semver@0\.0\.0-not-published") as caught:
        await ensure_installed(missing, root)
    assert "ETARGET" in str(caught.value) or "No matching version" in str(caught.value)
    assert not (root / missing.dirname).exists()


async def test_a_leftover_without_its_marker_is_not_an_install_and_is_replaced(root):
    leftover = root / PYPI_TOOL.dirname.replace("3.2.0", "3.1.0")
    leftover.mkdir(parents=True)
    (leftover / "junk").write_text("half an install")
    older = AgentPackage("pyflakes-tool", "pypi", "pyflakes", "3.1.0", ("pyflakes",))
    installed = await ensure_installed(older, root)
    assert not (installed.prefix / "junk").exists() and (installed.prefix / "bin/pyflakes").exists()


def test_a_harness_not_in_the_table_is_an_error_listing_the_table():
    with pytest.raises(AgentInstallError, match="claude-code"):
        installs.package_for("no-such-agent")
    assert installed_here("no-such-agent") is None


def test_agents_list_reports_every_agent_and_its_state(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "rollwire", "agents", "--dir", str(tmp_path), "list", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["root"] == str(tmp_path.resolve())
    assert [a["harness"] for a in report["agents"]] == list(PACKAGES)
    assert not any(a["installed"] for a in report["agents"])


def test_agents_install_names_an_unknown_agent():
    out = subprocess.run(
        [sys.executable, "-m", "rollwire", "agents", "install", "no-such-agent"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "no-such-agent" in out.stderr and "aider" in out.stderr


@pytest.mark.parametrize("harness", ["goose", "openhands"])
async def test_an_agent_rollwire_cannot_install_is_refused_in_a_local_sandbox_naming_why(
    harness, proxy
):
    out = await run_harbor_rollout(
        resolve_dataset(EXAMPLES).task("count-errors"), harness=harness, proxy=proxy
    )
    assert not out.result.ok and out.result.n_turns == 0
    assert "no npm or PyPI install" in (out.result.error or "")
    assert "cloud sandbox" in (out.result.error or "")
