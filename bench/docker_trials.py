"""Harbor oracle trials per second in the ``docker`` sandbox, beside ``local`` in the same run,
and a task image's build time cold and cached.

One task both sandboxes can run (``FROM debian:bookworm-slim``, ``WORKDIR /app``, no ``RUN``:
``local`` refuses ``RUN``), its oracle writing the answer the verifier checks, through
``run_harbor_rollout(harness="oracle", sandbox=...)`` as any caller runs it, at concurrency 1
and 4 (an anyio task group bounded by a semaphore). A trial counts only at reward 1.0. The
ratio local ÷ docker is what a container costs over a bubblewrap sandbox on this machine
(dockerd with the vfs storage driver: every container's root is a full copy of the image).

Image build: a task whose Dockerfile has ``RUN`` steps (a user, files, ``ENV``, ``USER``) and a
fresh nonce, so its first trial builds the image (cold) and later ones find it by content hash
(cached); both times are the trial's ``environment_setup`` phase.

Needs a Docker daemon with ``debian:bookworm-slim`` (``eval "$(bash .ci/docker)"`` starts one
and builds it).

    uv run python bench/docker_trials.py [--trials 8,16] [--builds 3] \
        [--out bench/results/docker_trials.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import anyio

from rollwire.harnesses.harbor.docker import docker_problem
from rollwire.harnesses.harbor.rollout import run_harbor_rollout

ROOT = Path(__file__).resolve().parents[1]
CONCURRENCY = (1, 4)
PLAIN_DOCKERFILE = "FROM debian:bookworm-slim\nWORKDIR /app\n"
BUILT_DOCKERFILE = """\
FROM debian:bookworm-slim
ENV BENCH_NONCE={nonce}
RUN useradd --create-home --uid 1500 worker && mkdir -p /work/data \\
 && printf '3\\n4\\n5\\n' > /work/data/numbers.txt && chown -R worker /work
ENV DATA_FILE=/work/data/numbers.txt
WORKDIR /work
USER worker
"""


def make_task(root: Path, name: str, dockerfile: str, solve: str, test: str) -> Path:
    task = root / name
    for sub in ("environment", "solution", "tests"):
        (task / sub).mkdir(parents=True, exist_ok=True)
    (task / "instruction.md").write_text("Do the thing.\n")
    (task / "task.toml").write_text(
        'version = "1.0"\n\n[verifier]\ntimeout_sec = 60.0\n\n[agent]\ntimeout_sec = 60.0\n\n'
        "[environment]\nbuild_timeout_sec = 600.0\ncpus = 1\nmemory_mb = 1024\n"
    )
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\n" + solve)
    (task / "tests" / "test.sh").write_text("#!/bin/bash\n" + test)
    return task


async def trial(task: Path, sandbox: str, trials_dir: Path) -> dict[str, Any]:
    out = await run_harbor_rollout(task, harness="oracle", sandbox=sandbox, trials_dir=trials_dir)
    r = out.result
    return {
        "ok": r.ok and r.reward == 1.0,
        "error": r.error,
        "timings": r.timings,
    }


async def timed_run(task: Path, sandbox: str, n: int, conc: int, work: Path) -> dict[str, Any]:
    sem = anyio.Semaphore(conc)
    items: list[dict[str, Any]] = []

    async def one() -> None:
        async with sem:
            items.append(await trial(task, sandbox, work / f"{sandbox}-{conc}"))

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(n):
            tg.start_soon(one)
    wall = time.perf_counter() - start
    ok = sum(i["ok"] for i in items)
    totals = [i["timings"].get("total", float("nan")) for i in items]
    return {
        "sandbox": sandbox,
        "concurrency": conc,
        "trials": n,
        "ok": ok,
        "wall_s": round(wall, 3),
        "trials_per_s": round(ok / wall, 3),
        "median_trial_s": round(statistics.median(totals), 3),
        "errors": sorted({str(i["error"])[:200] for i in items if not i["ok"]}),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    problem = docker_problem()
    if problem is not None:
        raise SystemExit(f"docker_trials: {problem}")
    trials = [int(x) for x in args.trials.split(",")]
    work = Path(tempfile.mkdtemp(prefix="rollwire-bench-docker-"))
    plain = make_task(
        work,
        "plain",
        PLAIN_DOCKERFILE,
        "echo 12 > /app/answer.txt\n",
        'if [ "$(cat /app/answer.txt)" = 12 ]; then echo 1; else echo 0; fi'
        " > /logs/verifier/reward.txt\n",
    )
    for sandbox in ("local", "docker"):  # warm-up: the image built, the caches hot
        first = await trial(plain, sandbox, work / "warmup")
        if not first["ok"]:
            raise SystemExit(f"docker_trials: warm-up on {sandbox} failed: {first['error']}")
    runs = []
    for conc, n in zip(CONCURRENCY, trials, strict=True):
        for sandbox in ("local", "docker"):
            run = await timed_run(plain, sandbox, n, conc, work)
            print(json.dumps(run), flush=True)
            runs.append(run)
    builds = []
    for b in range(args.builds):
        built = make_task(
            work,
            f"built-{b}",
            BUILT_DOCKERFILE.format(nonce=uuid.uuid4().hex),
            "awk '{s+=$1} END {print s}' \"$DATA_FILE\" > /work/sum.txt\n",
            'if [ "$(cat /work/sum.txt)" = 12 ]; then echo 1; else echo 0; fi'
            " > /logs/verifier/reward.txt\n",
        )
        cold = await trial(built, "docker", work / "builds")
        cached = await trial(built, "docker", work / "builds")
        row = {
            "cold_setup_s": cold["timings"].get("environment_setup"),
            "cached_setup_s": cached["timings"].get("environment_setup"),
            "ok": cold["ok"] and cached["ok"],
        }
        print(json.dumps(row), flush=True)
        builds.append(row)
    by = {(r["sandbox"], r["concurrency"]): r for r in runs}
    ratios = {
        str(c): round(by[("local", c)]["trials_per_s"] / by[("docker", c)]["trials_per_s"], 2)
        for c in CONCURRENCY
        if by[("docker", c)]["trials_per_s"]
    }
    return {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "runs": runs,
        "local_over_docker": ratios,
        "builds": builds,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", default="8,16", help="trials at concurrency 1 and 4")
    parser.add_argument("--builds", type=int, default=3, help="cold/cached build pairs")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "docker_trials.json"))
    args = parser.parse_args()
    report = anyio.run(main, args)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({"local_over_docker": report["local_over_docker"]}))
