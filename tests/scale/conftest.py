"""The scale-out tests' Ray cluster: ``tests/fakes/ray_local.py`` (imported first: it sets the
loopback variables before Ray is imported)."""

from __future__ import annotations

from tests.fakes.ray_local import LocalCluster, local_cluster  # isort: skip (before Ray)

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="package")
def ray_cluster() -> Iterator[LocalCluster]:
    with local_cluster() as cluster:
        yield cluster
