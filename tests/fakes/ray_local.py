"""A real Ray cluster on 127.0.0.1: a head and a second node, each its own raylet process (Ray's
own ``ray.cluster_utils.Cluster``, as Ray's tests start one), for the scale-out tests and the
chaos run.

Ray rewrites a loopback address to the machine's outward address unless
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``; the cluster here binds 127.0.0.1 only (tests may only
reach loopback), so the variable is set before Ray is imported, for this process and for the
drivers it starts. Ray's ``uv run`` propagation is off, as ``rollwire.collect.cluster``
turns it off (the nodes run the installed rollwire). Import this module before Ray.
"""

from __future__ import annotations

import os

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"  # as rollwire.collect.cluster.connect sets

import contextlib
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psutil

SYSTEM_CONFIG = {
    # a killed node is declared dead within a few seconds, not the default ~30
    "health_check_initial_delay_ms": 1000,
    "health_check_period_ms": 1000,
    "health_check_failure_threshold": 3,
}


@dataclass
class LocalCluster:
    cluster: Any
    address: str

    def add_node(self) -> Any:
        node = self.cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
        self.cluster.wait_for_nodes()
        return node

    def kill_node(self, node: Any) -> None:
        """SIGKILL the node's raylet and every process under it (its workers, our actor), as
        when a machine dies."""
        pids: list[int] = []
        for procs in node.all_processes.values():
            for info in procs:
                with contextlib.suppress(psutil.NoSuchProcess):
                    pids += [c.pid for c in psutil.Process(info.process.pid).children(True)]
                pids.append(info.process.pid)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.cluster.remove_node(node, allow_graceful=False)


@contextlib.contextmanager
def local_cluster() -> Iterator[LocalCluster]:
    """A head and a second node on 127.0.0.1, shut down on exit."""
    import ray
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    assert not ray_constants.ENABLE_RAY_CLUSTER, "Ray was imported before the loopback setting"
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "node_ip_address": "127.0.0.1",
            "include_dashboard": False,
            "_system_config": SYSTEM_CONFIG,
        },
    )
    local = LocalCluster(cluster, cluster.address)
    try:
        local.add_node()
        yield local
    finally:
        ray.shutdown()
        cluster.shutdown()
