"""``--sandbox docker`` as a user runs it, and the gate in a container.

A task of the kind real Harbor datasets hold (its Dockerfile runs ``RUN``, sets ``ENV`` and
``WORKDIR`` and switches to a non-root ``USER``) through ``rollwire rollout`` as a subprocess:
oracle 1.0 and nop 0.0 under ``--sandbox docker``, and a refusal naming ``RUN`` under ``local``.
Then the probe agent from inside a container: its own session through the gate, nothing else.
Real daemon (``DOCKER_HOST``, as ``.ci/docker`` starts it), real Harbor trials.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rollwire.harnesses.harbor import seams
from rollwire.harnesses.harbor.docker import docker_problem
from rollwire.harnesses.harbor.rollout import run_harbor_rollout, serve_proxy
from tests.harbor.helpers import make_task
from tests.harbor.probe_agent import (
    assert_only_its_own_session,
    host_targets,
    probe_seam,
    read_probe,
)

pytestmark = [pytest.mark.slow, pytest.mark.docker]

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = """\
FROM debian:bookworm-slim
RUN useradd --create-home --uid 1500 worker && mkdir -p /work/data \\
 && printf '3\\n4\\n5\\n' > /work/data/numbers.txt && chown -R worker /work
ENV DATA_FILE=/work/data/numbers.txt
WORKDIR /work
USER worker
"""
SOLVE = 'test "$(id -un)" = worker && awk \'{s+=$1} END {print s}\' "$DATA_FILE" > /work/sum.txt\n'
TEST = (
    'if [ "$(cat /work/sum.txt 2>/dev/null)" = 12 ]; then echo 1; else echo 0; fi'
    " > /logs/verifier/reward.txt\n"
)


@pytest.fixture(scope="module", autouse=True)
def daemon() -> None:
    problem = docker_problem()
    if problem is not None:
        pytest.fail(f"the docker rollout tests need a Docker daemon: {problem}", pytrace=False)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("held-out")
    make_task(
        root,
        "sum-as-worker",
        dockerfile=DOCKERFILE,
        solve=SOLVE,
        test=TEST,
        instruction="Write the sum of the numbers in $DATA_FILE to /work/sum.txt.\n",
    )
    return root


def rollwire(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rollwire", *args],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
        env={**os.environ, "HARBOR_TELEMETRY": "0"},
    )


@pytest.mark.parametrize(("harness", "reward"), [("oracle", 1.0), ("nop", 0.0)])
def test_a_dockerfile_task_scores_under_the_docker_sandbox(dataset, harness, reward):
    done = rollwire(
        "rollout", "--dataset", str(dataset), "--task", "sum-as-worker",
        "--harness", harness, "--sandbox", "docker", "--json",
    )  # fmt: skip
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["ok"], (result["error"], done.stderr[-2000:])
    assert result["reward"] == reward and result["sandbox"] == "docker"


def test_the_same_task_is_refused_under_local_naming_run(dataset):
    done = rollwire(
        "rollout", "--dataset", str(dataset), "--task", "sum-as-worker",
        "--harness", "oracle", "--sandbox", "local", "--json",
    )  # fmt: skip
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert not result["ok"] and result["reward"] is None
    assert "RUN" in result["error"], result["error"]


def test_a_task_on_an_absent_base_image_fails_naming_it_and_its_dockerfile_line(tmp_path):
    make_task(
        tmp_path,
        "absent-base",
        dockerfile="FROM rollwire-test/absent-base:1\n",
        solve="true\n",
        test="echo 1 > /logs/verifier/reward.txt\n",
    )
    done = rollwire(
        "rollout", "--dataset", str(tmp_path), "--task", "absent-base",
        "--harness", "oracle", "--sandbox", "docker", "--json",
    )  # fmt: skip
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 1 and not result["ok"] and result["reward"] is None
    assert result["exception_type"] == "MissingBaseImageError"
    assert "rollwire-test/absent-base:1" in result["error"] and "Dockerfile:1" in result["error"]
    # Harbor reads logs from the sandbox after the failed start: one line says there was none,
    # without a second copy of the start's error chained under it.
    assert "never started" in done.stderr and "During handling" not in done.stderr


@pytest.mark.anyio
async def test_an_agent_in_a_container_reaches_its_session_and_nothing_else(
    proxy, fake, dataset, monkeypatch, tmp_path
):
    monkeypatch.setitem(seams.SEAMS, "probe", probe_seam())
    other = proxy.sessions.open().session_id
    async with serve_proxy(proxy) as proxy_url:
        targets = host_targets(fake.url, proxy_url)
        out = await run_harbor_rollout(
            dataset / "sum-as-worker",
            harness="probe",
            proxy=proxy,
            sandbox="docker",
            trials_dir=tmp_path / "trials",
            agent_kwargs={"targets": targets, "other_key": other},
        )
    assert out.trial_dir is not None, out.result.error
    report = read_probe((out.trial_dir / "agent" / "probe.txt").read_text())
    assert_only_its_own_session(report, targets)
    assert proxy.sessions.get(other).n_calls == 0
    assert out.result.sandbox == "docker"
    assert out.document is not None and out.document.stats.turns == 1


@pytest.mark.anyio
async def test_an_installed_agent_solves_a_task_in_a_container_through_its_gate(
    proxy, fake, tmp_path
):
    """gemini-cli, installed by rollwire on this host (npm, on the Node from PyPI), mounted
    read-only into a debian:bookworm-slim container that has no Node of its own, calls its
    session through the gate in the container's network namespace and solves count-errors."""
    import shutil

    from tests.harbor.test_agent_gemini_cli import POLICY

    task = tmp_path / "count-errors"
    shutil.copytree(ROOT / "examples" / "tasks" / "count-errors", task)
    dockerfile = task / "environment" / "Dockerfile"
    dockerfile.write_text(
        dockerfile.read_text().replace("FROM python:3.12-slim", "FROM debian:bookworm-slim")
    )
    fake.behavior.scripted_replies = list(POLICY)
    out = await run_harbor_rollout(
        task,
        harness="gemini-cli",
        proxy=proxy,
        trials_dir=tmp_path / "trials",
        agent_timeout_sec=120,
        sandbox="docker",
    )
    result = out.result
    assert result.ok, (result.error, [f.message for f in result.findings], out.agent_log_tail)
    assert result.sandbox == "docker" and result.reward == 1.0
    assert fake.stats["ok"] == len(POLICY) and result.n_turns == 2
    doc = out.document
    assert doc is not None and {t.dialect for t in doc.turns} == {"google"}
    assert doc.stats.roots == 1 and doc.stats.trainable_sequences == 1
