"""Cloud sandboxes (daytona, modal, e2b, runloop), checked offline: they cannot run here.

What can be checked without the service is: which class runs them (Harbor's own), why one is
refused (its SDK, its credentials, a missing public URL), and the exact trial configuration a
rollout would hand Harbor (the agent pointed at the public URL with its session key; no gate,
no host mounts, none of the local sandboxes' arguments).
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rollwire.capture.proxy import CaptureProxy
from rollwire.harnesses.harbor import sandboxes
from rollwire.harnesses.harbor.datasets import resolve_dataset
from rollwire.harnesses.harbor.rollout import run_harbor_rollout, trial_config
from rollwire.harnesses.harbor.sandboxes import (
    REMOTE_SANDBOXES,
    RUNNABLE,
    available_sandboxes,
    sandbox_import_path,
)
from rollwire.harnesses.harbor.seams import SEAMS, Endpoint
from tests.harbor.helpers import EXAMPLES

TASKS = resolve_dataset(EXAMPLES)
ROOT = Path(__file__).resolve().parents[2]
CREDENTIALS = {
    "daytona": ("DAYTONA_API_KEY", "DAYTONA_JWT_TOKEN", "DAYTONA_ORGANIZATION_ID"),
    "modal": ("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET"),
    "e2b": ("E2B_API_KEY",),
    "runloop": ("RUNLOOP_API_KEY",),
}


@pytest.mark.parametrize("name", sorted(REMOTE_SANDBOXES))
def test_a_cloud_sandbox_runs_in_harbors_own_class(name):
    assert RUNNABLE[name].remote and RUNNABLE[name].import_path == sandbox_import_path(name)


@pytest.mark.parametrize("name", sorted(REMOTE_SANDBOXES))
def test_a_cloud_sandbox_without_its_sdk_is_refused_naming_the_extra(name, monkeypatch):
    monkeypatch.setattr(sandboxes.importlib.util, "find_spec", lambda module: None)
    problem = RUNNABLE[name].problem({})
    assert problem is not None and f"harbor[{name}]" in problem


@pytest.mark.parametrize("name", sorted(REMOTE_SANDBOXES))
def test_a_cloud_sandbox_without_credentials_is_refused_naming_them(name, monkeypatch, tmp_path):
    """With its SDK present (pretended: it is not installed here), Harbor's own preflight is
    what refuses it, and the reason names the variables to set."""
    for var in CREDENTIALS[name]:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.modal.toml
    monkeypatch.setattr(sandboxes, "_missing_sdk", lambda backend: None)
    module = importlib.import_module(REMOTE_SANDBOXES[name].partition(":")[0])
    for flag in [f for f in vars(module) if f.startswith("_HAS_")]:
        monkeypatch.setattr(module, flag, True)
    (status,) = available_sandboxes([name])
    assert not status.available and "preflight" in (status.reason or "")
    assert CREDENTIALS[name][0] in (status.reason or "")


@pytest.mark.parametrize("name", sorted(REMOTE_SANDBOXES))
def test_an_installed_agent_in_a_cloud_sandbox_is_pointed_at_the_public_url(name, tmp_path):
    seam = SEAMS["codex"]
    endpoint = Endpoint(url="https://rollwire.example.org", api_key="session-123", model="m")
    config = trial_config(
        TASKS.task("count-errors").path,
        seam,
        endpoint,
        trials_dir=tmp_path,
        agent_kwargs=None,
        environment_kwargs={},
        import_path=RUNNABLE[name].import_path,
    )
    assert config.environment.import_path == REMOTE_SANDBOXES[name]
    assert config.environment.kwargs == {} and config.environment.mounts is None
    assert config.agent.name == "codex"  # Harbor's own class: its installer runs in the cloud
    assert config.agent.base_url == "https://rollwire.example.org/v1"
    assert config.agent.env["OPENAI_API_KEY"] == "session-123"
    json.dumps(config.model_dump(mode="json"))  # what Harbor is given is plain data


@pytest.mark.anyio
async def test_an_installed_agent_in_a_cloud_sandbox_without_a_public_url_is_refused(
    proxy: CaptureProxy, monkeypatch
):
    monkeypatch.setitem(
        RUNNABLE, "modal", RUNNABLE["modal"]._replace(problem=lambda kwargs: None)
    )  # as if modal could run: the public URL is checked before anything starts
    out = await run_harbor_rollout(
        TASKS.task("count-errors"), harness="codex", proxy=proxy, sandbox="modal"
    )
    assert not out.result.ok and "--public-url" in (out.result.error or "")


def test_the_cli_refuses_a_cloud_sandbox_that_cannot_run_here_naming_why():
    done = subprocess.run(
        [
            sys.executable, "-m", "rollwire", "rollout", "--dataset", "examples/tasks",
            "--task", "count-errors", "--harness", "oracle", "--sandbox", "e2b",
        ],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    (status,) = available_sandboxes(["e2b"])
    assert not status.available  # no SDK or no credentials on these machines
    assert done.returncode == 2 and "--sandbox e2b" in done.stderr
    assert (status.reason or "") in done.stderr
