"""Collections on a Ray cluster: episodes run on the nodes, the driver writes the store.

``rollwire collect --ray ADDRESS`` (and ``rollwire serve --ray ADDRESS`` for MCP
``collect_episodes``) connects this process to the cluster as a Ray driver and starts one
:class:`NodeWorker` actor on every live node. Each worker owns what a rollout needs on its node:
its own :class:`~rollwire.tools.endpoint.EndpointPool` (the engines certified there, one capture
proxy per engine, so model calls never cross nodes twice) and the node's sandboxes. The driver
keeps what must have one owner: the plan, the :class:`~rollwire.datasets.store.EpisodeStore`
(the only writer: append, fsync, resume exactly as in-process) and the counts.

The driver hands each episode to the live node with the fewest episodes in flight and awaits its
result (:class:`~rollwire.result.RolloutResult`, tokens included). A node lost mid-run
(its actor dies or becomes unreachable) is given up on for the rest of the run; the episodes it
had in flight are run again on another node and counted (``retried``). Nothing is lost, since an
episode is written only when a result comes back, and nothing is duplicated, since a given-up
node's late result is never read and the store refuses a second write of an episode id. Ray's
own retries are off (``max_restarts=0``, ``max_task_retries=0``): the driver decides.

A killed driver kills its job's actors with it; run the same command again and the collection
resumes from the store like any other.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

import anyio

from rollwire.collect.collection import (
    CollectConfig,
    CollectInputError,
    HaltCollection,
    NodeUse,
    Ran,
    run_pinned,
)
from rollwire.extras import install_hint
from rollwire.tools.endpoint import EndpointPool
from rollwire.tools.engines import EnginesDiffer, EngineSet, EngineUse, NoEngineLeft
from rollwire.tools.rollouts import Plan, RolloutRequest, failed_result

log = logging.getLogger("rollwire.ray")

#: seconds for every node's worker to start and certify its engines
START_TIMEOUT_S = 300.0
#: seconds a worker gets to stop (sandboxes down, proxies closed) before it is killed
STOP_TIMEOUT_S = 20.0
NAMESPACE = "rollwire"


class RayUnavailable(CollectInputError):
    """Ray is not installed, or the address does not answer; the message starts with ``ray``."""


def _host_port(address: str) -> tuple[str, int]:
    body = address.removeprefix("ray://")
    host, sep, port = body.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise RayUnavailable(f"ray: {address!r} is not HOST:PORT (the head's GCS address)")
    return host.strip("[]"), int(port)


def connect(address: str) -> None:
    """Join the cluster at ``address`` as a driver (once per process; blocking).

    The head must answer on ``address`` within 10 s, else :class:`RayUnavailable` (``ray.init``
    itself would wait for minutes). The nodes run the rollwire installed on them: Ray's
    propagation of a ``uv run`` driver's environment (which packages the working directory and
    re-resolves it on every worker) is off unless ``RAY_ENABLE_UV_RUN_RUNTIME_ENV=1``."""
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")  # read when Ray is imported
    try:
        import ray
    except ImportError:
        raise RayUnavailable(f"ray: Ray is not installed; {install_hint('ray')}") from None
    if ray.is_initialized():
        return
    host, port = _host_port(address)
    try:
        socket.create_connection((host, port), timeout=10).close()
    except OSError as exc:
        raise RayUnavailable(
            f"ray: nothing answers at {address} ({exc}); start the head with `ray start --head` "
            "and give its address"
        ) from None
    ray.init(
        address=address,
        namespace=NAMESPACE,
        log_to_driver=False,  # each node's worker logs stay in that node's Ray log directory
        logging_level=logging.WARNING,
    )


class NodeWorker:
    """One node's share of a collection (a Ray actor, pinned to its node): its own endpoint
    pool, engines and sandboxes."""

    def __init__(
        self, specs: list[tuple[str, str | None, str | None]], pool_settings: dict[str, Any]
    ) -> None:
        self.specs = specs
        self.pool_settings = pool_settings
        self.pool: EndpointPool | None = None
        self.engines: EngineSet | None = None
        self._stop: Any = None
        self._holder: Any = None

    async def start(self) -> dict[str, Any]:
        """Open the pool and certify the engines on this node; says where it runs."""
        import asyncio

        import ray

        self.pool = EndpointPool(**self.pool_settings)
        entered = asyncio.Event()
        self._stop = asyncio.Event()
        pool = self.pool

        async def hold() -> None:  # the pool's task group lives in this one task
            async with pool:
                entered.set()
                await self._stop.wait()

        self._holder = asyncio.get_running_loop().create_task(hold())
        await entered.wait()
        info = {
            "node_id": ray.get_runtime_context().get_node_id(),
            "address": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
        }
        if self.specs:
            try:
                self.engines = await EngineSet.certify(self.pool, self.specs)
            except EnginesDiffer as exc:
                return {**info, "error": str(exc)}
        return info

    async def run(self, request: RolloutRequest, plan: Plan, episode_id: str) -> tuple[Any, ...]:
        """One episode: ("ran", result, engine url) or ("no_engine", why)."""
        assert self.pool is not None, "start() first"
        try:
            ran = await run_pinned(self.pool, self.engines, request, plan, episode_id)
        except NoEngineLeft as exc:
            return ("no_engine", str(exc))
        return ("ran", ran.result, ran.engine)

    async def stop(self) -> None:
        """Close the pool (its proxies' servers and upstream clients)."""
        if self._stop is not None:
            self._stop.set()
            await self._holder


@dataclass
class _Node:
    index: int
    node_id: str
    address: str | None
    handle: Any
    in_flight: int = 0
    episodes: int = 0
    lost: str | None = None


class RayRunner:
    """Episodes on the cluster's nodes (an :class:`~rollwire.collect.collection.EpisodeRunner`);
    an async context manager that starts and stops the node workers."""

    def __init__(
        self, address: str, config: CollectConfig, pool: EndpointPool, *, concurrency: int
    ) -> None:
        self.address = address
        self.specs = [(s.url, s.model, s.api_key) for s in config.llms()]
        self.pool_settings = {
            "admin_key": pool.admin_key,
            "token_in": pool.token_in,
            **pool.proxy_settings,
        }
        self.concurrency = concurrency
        self.nodes: list[_Node] = []
        self._retried = 0
        self._engines: dict[str, EngineUse] = {s[0]: EngineUse(url=s[0]) for s in self.specs}

    @property
    def retried(self) -> int:
        return self._retried

    async def __aenter__(self) -> RayRunner:
        await anyio.to_thread.run_sync(connect, self.address)
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        alive = [n for n in ray.nodes() if n.get("Alive")]
        actor = ray.remote(NodeWorker)
        for i, n in enumerate(alive):
            handle = actor.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False),
                max_concurrency=self.concurrency + 4,
                max_restarts=0,
                max_task_retries=0,
                num_cpus=0,
            ).remote(self.specs, self.pool_settings)
            self.nodes.append(_Node(i, n["NodeID"], n.get("NodeManagerAddress"), handle))
        try:
            await self._start_all()
        except BaseException:
            await self._stop_all()
            raise
        return self

    async def _start_all(self) -> None:
        errors: list[str] = []

        async def start(node: _Node) -> None:
            try:
                with anyio.fail_after(START_TIMEOUT_S):
                    info = await node.handle.start.remote()
            except TimeoutError:
                node.lost = f"its worker did not start within {START_TIMEOUT_S:g} s"
                return
            except Exception as exc:  # the actor could not be placed or died starting
                node.lost = f"its worker did not start: {type(exc).__name__}: {exc}"
                return
            if "error" in info:
                errors.append(f"{info['error']} (on Ray node {info['address']})")
            node.address = info["address"]

        async with anyio.create_task_group() as tg:
            for node in self.nodes:
                tg.start_soon(start, node)
        if errors:
            raise CollectInputError(errors[0])
        for node in self.nodes:
            if node.lost:
                log.warning("Ray node %s left out: %s", node.node_id, node.lost)
        if not any(n.lost is None for n in self.nodes):
            lost = "; ".join(f"{n.node_id}: {n.lost}" for n in self.nodes) or "no live node"
            raise CollectInputError(f"ray: no node of {self.address} can run episodes ({lost})")
        log.info("collecting on %d Ray nodes", sum(n.lost is None for n in self.nodes))

    async def run(self, request: RolloutRequest, plan: Plan, episode_id: str) -> Ran:
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        while True:
            live = [n for n in self.nodes if n.lost is None]
            if not live:
                lost = "; ".join(f"{n.node_id[:12]}: {n.lost}" for n in self.nodes)
                raise HaltCollection(f"every Ray node is lost ({lost})")
            node = min(live, key=lambda n: (n.in_flight, n.index))
            node.in_flight += 1
            started = time.perf_counter()
            ref = node.handle.run.remote(request, plan, episode_id)
            try:
                out = await ref
            except RayActorError as exc:
                self._lose(node, f"{type(exc).__name__}: {str(exc)[:300]}")
                self._retried += 1
                log.warning("episode %s runs again: node %s lost", episode_id, node.node_id)
                continue
            except RayTaskError as exc:  # a bug in the worker: a result, not a retry
                error = f"on Ray node: {exc}"
                out = ("ran", failed_result(request, plan, episode_id, error, started), None)
            except BaseException:
                # cancelled: the node stops this episode (its cleanup runs)
                with contextlib.suppress(Exception):
                    ray.cancel(ref)
                raise
            finally:
                node.in_flight -= 1
            if out[0] == "no_engine":
                for use in self._engines.values():
                    use.drained = use.drained or f"on node {node.address}: {out[1]}"
                raise NoEngineLeft(out[1])
            node.episodes += 1
            result, engine = out[1], out[2]
            if engine is not None:
                use = self._engines.setdefault(engine, EngineUse(url=engine))
                use.rollouts += 1
                use.failed += 0 if result.ok else 1
            return Ran(result, engine=engine, node=node.node_id)

    def _lose(self, node: _Node, why: str) -> None:
        if node.lost is None:
            node.lost = why
            log.error("Ray node %s (%s) lost: %s", node.node_id, node.address, why)

    def engines_use(self) -> list[EngineUse]:
        return list(self._engines.values())

    def nodes_use(self) -> list[NodeUse]:
        return [
            NodeUse(node_id=n.node_id, address=n.address, episodes=n.episodes, lost=n.lost)
            for n in self.nodes
        ]

    async def __aexit__(self, *exc: object) -> None:
        with anyio.CancelScope(shield=True):
            await self._stop_all()

    async def _stop_all(self) -> None:
        import ray

        async def stop(node: _Node) -> None:
            if node.lost is None:
                with anyio.move_on_after(STOP_TIMEOUT_S):
                    try:
                        await node.handle.stop.remote()
                    except Exception as exc:
                        log.warning("Ray node %s did not stop cleanly: %s", node.node_id, exc)
            try:
                ray.kill(node.handle, no_restart=True)
            except Exception as exc:  # already gone with its node
                log.debug("Ray node %s: kill: %s", node.node_id, exc)

        async with anyio.create_task_group() as tg:
            for node in self.nodes:
                tg.start_soon(stop, node)


__all__ = ["NodeWorker", "RayRunner", "RayUnavailable", "connect"]
