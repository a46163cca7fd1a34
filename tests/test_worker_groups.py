"""How the README's two-worker test run splits the suite (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import SHARED_RESOURCES, worker_group

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
