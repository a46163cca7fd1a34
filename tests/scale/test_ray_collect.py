"""Collections on a real Ray cluster (head + a second node process on 127.0.0.1) with two
engines (the vLLM-shaped fake, each its own process): spread over both nodes and both engines
exactly once; a node killed mid-collection loses and duplicates nothing; a killed engine fails
only its rollouts; a killed driver resumes."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import anyio
import pytest

from rollwire.collect.collection import CollectConfig, CollectProgress, collect
from rollwire.tools.endpoint import EndpointPool
from rollwire.tools.rollouts import Limits, LLMSpec
from tests.fakes.spawn import fake_engine, sigkill_once_written, two_engines

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TASKS = ["reasoning_gym:chain_sum", "reasoning_gym:basic_arithmetic"]


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def config(urls: list[str], n: int, concurrency: int = 8) -> CollectConfig:
    return CollectConfig(
        tasks=TASKS,
        episodes=n,
        group_size=2,
        llm=[LLMSpec(url=u) for u in urls],
        limits=Limits(max_turns=2),
        concurrency=concurrency,
    )


async def run(cfg: CollectConfig, out: Path, address: str, on_progress=None):
    pool = EndpointPool()
    try:
        with anyio.fail_after(300):  # never hangs
            return await collect(cfg, out, pool=pool, on_progress=on_progress, ray_address=address)
    finally:
        await pool.aclose()


def exactly_once(out: Path, n: int) -> list[dict]:
    episodes = lines(out / "episodes.jsonl")
    ids = [e["episode_id"] for e in episodes]
    assert len(ids) == len(set(ids)) == n
    return episodes


async def test_a_collection_spreads_over_both_nodes_and_both_engines_exactly_once(
    ray_cluster, tmp_path
):
    n = 48
    with two_engines() as (a, b):
        result = await run(config([a.url, b.url], n), tmp_path / "c", ray_cluster.address)
    assert result.collected == n and result.failed == 0 and result.retried == 0
    episodes = exactly_once(tmp_path / "c", n)
    nodes = {u.node_id: u for u in result.nodes}
    assert len(nodes) == 2 and all(u.episodes > 0 and u.lost is None for u in nodes.values())
    assert Counter(e["node"] for e in episodes) == {k: u.episodes for k, u in nodes.items()}
    by_engine = Counter(e["engine"] for e in episodes)
    assert by_engine[a.url] > 0 and by_engine[b.url] > 0 and sum(by_engine.values()) == n
    # token-exact through the node's capture proxy: every episode trains
    assert all(e["n_trainable_tokens"] > 0 and e["capture_level"] == "tokens" for e in episodes)


async def test_a_killed_engine_fails_only_its_rollouts_on_the_cluster(ray_cluster, tmp_path):
    n = 48
    with two_engines() as (a, b):

        def kill_b(p: CollectProgress) -> None:
            if p.done >= 8:
                b.kill()

        result = await run(config([a.url, b.url], n), tmp_path / "c", ray_cluster.address, kill_b)
    failures = lines(tmp_path / "c" / "failures.jsonl")
    episodes = lines(tmp_path / "c" / "episodes.jsonl")
    assert result.halted is None and result.collected + result.failed == n
    assert result.failed >= 1 and len(failures) == result.failed
    assert all(f["engine"] == b.url for f in failures)  # only b's rollouts failed
    assert Counter(e["engine"] for e in episodes)[a.url] >= n - 8 - result.failed


async def test_mcp_collect_episodes_runs_on_the_cluster_with_a_list_of_engines(
    ray_cluster, tmp_path
):
    from mcp import Client

    from rollwire.server.mcp_app import ServerState, build_server

    with two_engines() as (a, b):
        state = ServerState(data_dir=tmp_path / "data", ray_address=ray_cluster.address)
        async with state, Client(build_server(state)) as client:
            args = {
                "out_dir": "ray",
                "episodes": 24,
                "tasks": TASKS,
                "llm": [a.url, {"url": b.url}],
                "limits": {"max_turns": 2},
                "concurrency": 8,
            }
            with anyio.fail_after(300):
                result = await client.call_tool("collect_episodes", args)
    out = result.structured_content
    assert not result.is_error and out["collected"] == 24, out
    assert len(out["nodes"]) == 2 and all(node["episodes"] > 0 for node in out["nodes"])
    assert {e["url"] for e in out["engines"] if e["rollouts"] > 0} == {a.url, b.url}
    exactly_once(tmp_path / "data" / "ray", 24)


async def test_harbor_trials_run_in_each_nodes_own_sandbox(ray_cluster, tmp_path):
    """The oracle harness in the local sandbox (bubblewrap): a Harbor trial on each node."""
    task = f"harbor:{ROOT / 'examples' / 'tasks'}#count-errors"
    cfg = CollectConfig(tasks=[task], episodes=6, harness="oracle", concurrency=4)
    result = await run(cfg, tmp_path / "c", ray_cluster.address)
    assert result.collected == 6 and result.failed == 0, result
    episodes = exactly_once(tmp_path / "c", 6)
    assert all(e["reward"] == 1.0 and e["sandbox"] == "local" for e in episodes)
    assert len({e["node"] for e in episodes}) == 2  # both nodes ran trials


def _driver(address: str, url: str, out: Path, n: int) -> list[str]:
    return [
        sys.executable, "-m", "rollwire", "collect", "--ray", address, "--llm-url", url,
        "--task", TASKS[0], "--task", TASKS[1], "-n", str(n), "--group-size", "2",
        "--concurrency", "8", "--max-turns", "2", "--out", str(out), "--no-progress",
    ]  # fmt: skip


def test_a_killed_driver_resumes_with_every_episode_exactly_once(ray_cluster, tmp_path):
    n = 60
    out = tmp_path / "c"
    with fake_engine(tool_call_every_turn=True, delay_s=0.1) as a:
        cmd = _driver(ray_cluster.address, a.url, out, n)
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        killed_at = sigkill_once_written(proc, out / "episodes.jsonl", 10, timeout_s=180)
        assert 10 <= killed_at < n, killed_at
        done = subprocess.run(
            [*cmd, "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300
        )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    exactly_once(out, n)
    assert result["skipped_done"] >= killed_at
    assert result["collected"] == n - result["skipped_done"]
    assert len(result["nodes"]) == 2


async def test_a_node_killed_mid_collection_loses_and_duplicates_nothing(ray_cluster, tmp_path):
    """Last in this module: the cluster loses its second node for good."""
    n = 60
    victim = ray_cluster.cluster.list_all_nodes()[-1]
    victim_id = victim.node_id
    with fake_engine(tool_call_every_turn=True, delay_s=0.1) as a:
        killed: list[int] = []

        def kill_node(p: CollectProgress) -> None:
            if p.done >= 12 and not killed:
                killed.append(p.done)
                ray_cluster.kill_node(victim)

        result = await run(config([a.url], n), tmp_path / "c", ray_cluster.address, kill_node)
    assert killed
    assert result.collected == n and result.failed == 0 and result.halted is None
    episodes = exactly_once(tmp_path / "c", n)
    nodes = {u.node_id: u for u in result.nodes}
    assert nodes[victim_id].lost  # given up on, and said why
    assert result.retried >= 1  # what it had in flight ran again elsewhere
    on_victim = sum(e["node"] == victim_id for e in episodes)
    assert on_victim == nodes[victim_id].episodes
    assert sum(u.episodes for u in nodes.values()) == n
