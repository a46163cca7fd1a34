"""Fresh virtual environments for the packaging tests, made by uv from this checkout's lock.

uv is the one that runs the tests (``uv run`` puts its own path in ``$UV``); its cache already
holds every locked package, so an environment takes seconds, not a download. uv runs offline
here: online, it revalidates llama-cpp-python's cached sdist, and where the registry answers
with a new revision it compiles it again (8 minutes, measured).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def uv() -> str:
    found = os.environ.get("UV") or shutil.which("uv")
    assert found, "uv is not on PATH and $UV is unset: the tests run under `uv run`"
    return found


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment less the checkout's virtual environment."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT", "PYTHONPATH", "PYTHONHOME"}
    }
    env.update(HARBOR_TELEMETRY="0", LITELLM_LOCAL_MODEL_COST_MAP="True", **extra)
    env.setdefault("UV_PYTHON_DOWNLOADS", "never")
    env["UV_OFFLINE"] = "1"
    return env


def uv_cmd(
    *args: str, cwd: Path, timeout: float = 300, **env: str
) -> subprocess.CompletedProcess[str]:
    """``uv ARGS`` offline, in the test process's environment less the checkout's venv."""
    return subprocess.run(
        [uv(), *args],
        cwd=cwd,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def python_prints(env_dir: Path, code: str, *argv: str, cwd: Path) -> str:
    """What ``python -c CODE ARGV`` of the environment prints (it must exit 0)."""
    done = run(env_dir, "python", "-c", code, *argv, cwd=cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


def project_env(path: Path, *extras: str, project: bool = True) -> Path:
    """The project (editable; left out with ``project=False``) plus exactly ``extras`` from
    uv.lock, at ``path``; no dependency groups."""
    args = ["sync", "--frozen", "--no-default-groups", "--python", sys.executable]
    if not project:
        args.append("--no-install-project")
    for extra in extras:
        args += ["--extra", extra]
    done = uv_cmd(*args, cwd=ROOT, timeout=600, UV_PROJECT_ENVIRONMENT=str(path))
    assert done.returncode == 0, done.stderr[-3000:]
    return path


def run(
    env_dir: Path, *argv: str, cwd: Path, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``argv[0]`` from the environment's bin (``rollwire``, ``python``, ``ray``)."""
    exe = env_dir / "bin" / argv[0]
    return subprocess.run(
        [str(exe), *argv[1:]],
        cwd=cwd,
        env=clean_env(PATH=f"{env_dir / 'bin'}:{os.environ.get('PATH', '')}"),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
