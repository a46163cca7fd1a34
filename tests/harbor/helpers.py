"""Small builders for Harbor task directories and local sandboxes in tests."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from harbor.models.task.config import EnvironmentConfig as TaskEnvironmentConfig
from harbor.models.trial.paths import TrialPaths

from rollwire.harnesses.harbor.local import LocalEnvironment

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"

TASK_TOML = """\
schema_version = "1.4"

[agent]
timeout_sec = 60.0

[verifier]
timeout_sec = 60.0
"""


def make_task(
    root: Path,
    name: str,
    *,
    solve: str = "true\n",
    test: str = "echo 1 > /logs/verifier/reward.txt\n",
    dockerfile: str = "FROM python:3.12-slim\nWORKDIR /app\n",
    files: dict[str, str] | None = None,
    instruction: str = "Do the thing.\n",
) -> Path:
    """A minimal Harbor task directory; ``files`` go under environment/."""
    task = root / name
    for sub in ("environment", "solution", "tests"):
        (task / sub).mkdir(parents=True, exist_ok=True)
    (task / "task.toml").write_text(TASK_TOML)
    (task / "instruction.md").write_text(instruction)
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    for rel, text in (files or {}).items():
        path = task / "environment" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\n" + solve)
    (task / "tests" / "test.sh").write_text("#!/bin/bash\n" + test)
    return task


def make_environment(tmp_path: Path, environment_dir: Path, **kwargs: object) -> LocalEnvironment:
    """A local sandbox for a task's environment/ directory, not yet started."""
    trial_paths = TrialPaths(tmp_path / "trial")
    trial_paths.mkdir()
    return LocalEnvironment(
        environment_dir=environment_dir,
        environment_name=environment_dir.parent.name,
        session_id=f"{environment_dir.parent.name}__test__env",
        trial_paths=trial_paths,
        task_env_config=TaskEnvironmentConfig(),
        sandbox_dir=tmp_path / "sandboxes",
        **kwargs,
    )


@contextlib.asynccontextmanager
async def running(
    tmp_path: Path, environment_dir: Path, **kwargs: object
) -> AsyncIterator[LocalEnvironment]:
    """A started local sandbox, stopped (and its root removed) afterwards."""
    env = make_environment(tmp_path, environment_dir, **kwargs)
    await env.start(force_build=False)
    try:
        yield env
    finally:
        await env.stop(delete=True)


async def run_count_errors(harness: str, proxy: object, tmp_path: Path, **kwargs: object):
    """The bundled count-errors task, once, with ``harness`` through ``proxy`` (90 s for the
    agent): how every real-agent test runs its agent."""
    from rollwire.harnesses.harbor.datasets import resolve_dataset
    from rollwire.harnesses.harbor.rollout import run_harbor_rollout

    return await run_harbor_rollout(
        resolve_dataset(EXAMPLES).task("count-errors"),
        harness=harness,
        proxy=proxy,
        trials_dir=tmp_path / "trials",
        agent_timeout_sec=90,
        **kwargs,
    )
