"""How the README's two-worker test run splits the suite (tests/conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SHARED_RESOURCES, STARTING_CPUS, worker_cpus, worker_group

ROOT = Path(__file__).resolve().parents[1]


def test_tests_of_one_file_share_a_worker():
    a = worker_group("tests/capture/test_proxy.py::test_one")
    b = worker_group("tests/capture/test_proxy.py::TestX::test_two[p]")
    assert a == b == "tests/capture/test_proxy.py"
    assert worker_group("tests/capture/test_graph.py::test_one") != a


def test_every_docker_file_shares_the_docker_worker():
    groups = {worker_group(f"{path}::test_x") for path in SHARED_RESOURCES["docker"]}
    assert groups == {"docker"}


def test_the_ray_extra_case_runs_beside_the_ray_clusters_not_beside_other_extras():
    extras = "tests/packaging/test_extras.py::test_extra_installs_alone_and_works_alone"
    assert worker_group(f"{extras}[ray]") == worker_group("tests/scale/test_ray_collect.py::t")
    assert worker_group(f"{extras}[engine]") == "tests/packaging/test_extras.py"


def test_every_shared_resource_names_files_that_exist():
    for prefixes in SHARED_RESOURCES.values():
        for prefix in prefixes:
            assert (ROOT / prefix.split("::", 1)[0]).exists(), prefix


def test_workers_get_every_other_cpu_from_their_index():
    assert worker_cpus("gw0", 2, {0, 1}) == {0}
    assert worker_cpus("gw1", 2, {0, 1}) == {1}
    assert worker_cpus("gw1", 2, {2, 3, 4, 5, 6}) == {3, 5}
    assert worker_cpus("gw0", 2, {2, 3, 4, 5, 6}) == {2, 4, 6}


def test_workers_stay_unpinned_with_fewer_cpus_than_workers_or_outside_xdist():
    assert worker_cpus("gw0", 2, {0}) is None
    assert worker_cpus("gw2", 4, {0, 1, 2}) is None
    assert worker_cpus("master", 2, {0, 1}) is None
    assert worker_cpus("", 0, {0, 1}) is None


PROBE = """
import json, os, subprocess, sys

def test_probe():
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
        capture_output=True, text=True, check=True,
    ).stdout
    out = os.path.join(os.environ["PROBE_OUT"], os.environ["PYTEST_XDIST_WORKER"])
    with open(out, "w") as f:
        json.dump({"worker": sorted(os.sched_getaffinity(0)), "child": json.loads(child)}, f)
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux affinity calls only")
def test_two_workers_and_their_children_run_on_disjoint_cpus(tmp_path: Path):
    """A real ``pytest -n 2`` with this conftest: each worker, and a process it starts, sees the
    CPUs ``worker_cpus`` gives it (two files, so each worker gets one)."""
    for name in ("test_a.py", "test_b.py"):
        (tmp_path / name).write_text(PROBE)
    out = tmp_path / "out"
    out.mkdir()
    argv = [sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "tests.conftest"]
    argv += ["-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)]
    env = {**os.environ, "PROBE_OUT": str(out)}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_XDIST_WORKER_COUNT", None)
    done = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
        # from the CPUs this run started with: when this test itself runs on a pinned worker
        preexec_fn=lambda: os.sched_setaffinity(0, STARTING_CPUS),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    seen = {p.name: json.loads(p.read_text()) for p in out.iterdir()}
    assert sorted(seen) == ["gw0", "gw1"]
    for worker, cpus in seen.items():
        want = worker_cpus(worker, 2, STARTING_CPUS) or STARTING_CPUS
        assert set(cpus["worker"]) == set(cpus["child"]) == want, (worker, cpus)
    if len(STARTING_CPUS) >= 2:  # two workers never share a core
        assert not set(seen["gw0"]["worker"]) & set(seen["gw1"]["worker"])
