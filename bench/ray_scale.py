"""Collections on Ray: episodes/s with one node and with two, and Ray's overhead per episode
against the in-process collection at the same concurrency.

A real Ray cluster on 127.0.0.1 (``ray.cluster_utils.Cluster``: a head, then a second node
process), the vLLM-shaped fake engine in its own process, and ``reasoning_gym:chain_sum``
(``max_turns`` 2, one tool call per turn) through the whole path: ``collect`` -> (Ray: the node
worker actor) -> ``attempt`` -> the env tool loop -> the node's capture proxy -> the engine ->
the verdict -> back to the driver -> ``EpisodeStore``.

Each configuration runs ``--episodes`` episodes at ``--concurrency`` into a fresh directory,
``--rounds`` times, alternating in-process and Ray so noise hits both. Two engine latencies:
``delay_s`` 0 (the fake answers at once: the worst case for any per-episode overhead) and
0.05 s per call (closer to a real engine, whose calls take tens to hundreds of ms).

Reported per run: ``start_s`` (the call to the first episode written: certification, and for
Ray the node workers' start) and steady episodes/s over the rest (episodes after the first,
divided by the time from the first to the last). The overhead is in-process episodes/s over
Ray-on-one-node episodes/s (target <= 1.3); the scaling is two nodes over one.

    UV_PYTHON_DOWNLOADS=never uv run python bench/ray_scale.py            # ~5 min
    UV_PYTHON_DOWNLOADS=never uv run python bench/ray_scale.py --quick    # ~2 min

Results: a markdown table on stdout and ``bench/results/ray_scale.json``.
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # a loopback-only cluster
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

import argparse
import datetime as dt
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fakes.spawn import fake_engine  # noqa: E402

from rollwire.collect.collection import CollectConfig, CollectProgress, collect  # noqa: E402
from rollwire.tools.endpoint import EndpointPool  # noqa: E402
from rollwire.tools.rollouts import Limits, LLMSpec  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "ray_scale.json"


async def one_run(url: str, n: int, concurrency: int, out: Path, ray: str | None) -> dict:
    cfg = CollectConfig(
        tasks=["reasoning_gym:chain_sum"],
        episodes=n,
        llm=LLMSpec(url=url),
        limits=Limits(max_turns=2),
        concurrency=concurrency,
    )
    first: list[float] = []

    def on_progress(p: CollectProgress) -> None:
        if p.done >= 1 and not first:
            first.append(time.perf_counter())

    pool = EndpointPool()
    t0 = time.perf_counter()
    try:
        result = await collect(cfg, out, pool=pool, on_progress=on_progress, ray_address=ray)
    finally:
        await pool.aclose()
    t1 = time.perf_counter()
    assert result.collected + result.failed == n, result
    return {
        "collected": result.collected,
        "failed": result.failed,
        "start_s": round(first[0] - t0, 3),
        "episodes_per_s": round((n - 1) / (t1 - first[0]), 2),
        "wall_s": round(t1 - t0, 3),
        "nodes": len(result.nodes) or None,
    }


async def phase(
    args: argparse.Namespace, url: str, ray: str, nodes: int, engine: Any, rows: list[dict]
) -> None:
    for delay in args.delays:
        engine.behave(delay_s=delay)
        for r in range(args.rounds):
            order = ["in-process", "ray"] if r % 2 == 0 else ["ray", "in-process"]
            for mode in order:
                with tempfile.TemporaryDirectory() as tmp:
                    row = await one_run(
                        url,
                        args.episodes,
                        args.concurrency,
                        Path(tmp) / "c",
                        ray if mode == "ray" else None,
                    )
                row.update(mode=mode, cluster_nodes=nodes, delay_s=delay, round=r)
                rows.append(row)
                print(json.dumps(row), flush=True)


def summarise(rows: list[dict], delays: list[float]) -> list[dict]:
    def med(mode: str, nodes: int, delay: float) -> float:
        vals = [
            r["episodes_per_s"]
            for r in rows
            if r["mode"] == mode and r["cluster_nodes"] == nodes and r["delay_s"] == delay
        ]
        return statistics.median(vals)

    table = []
    for delay in delays:
        inproc = med("in-process", 1, delay)
        one, two = med("ray", 1, delay), med("ray", 2, delay)
        table.append(
            {
                "engine delay_s": delay,
                "in-process eps/s": inproc,
                "ray 1 node eps/s": one,
                "ray 2 nodes eps/s": two,
                "in-process eps/s (during the 2-node runs)": med("in-process", 2, delay),
                "overhead (in-process / ray 1 node)": round(inproc / one, 3),
                "scaling (2 nodes / 1 node)": round(two / one, 3),
            }
        )
    return table


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False},
    )
    rows: list[dict] = []
    try:
        with fake_engine(tool_call_every_turn=True) as engine:
            await phase(args, engine.url, cluster.address, 1, engine, rows)
            cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
            cluster.wait_for_nodes()
            await phase(args, engine.url, cluster.address, 2, engine, rows)
    finally:
        ray.shutdown()
        cluster.shutdown()
    return {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "load_before": os.getloadavg(),
        "episodes": args.episodes,
        "concurrency": args.concurrency,
        "rounds": args.rounds,
        "summary": summarise(rows, args.delays),
        "runs": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--delays", type=float, nargs="+", default=[0.0, 0.05])
    parser.add_argument("--quick", action="store_true", help="100 episodes, 1 round")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.quick:
        args.episodes, args.rounds = 100, 1
    report = anyio.run(main_async, args)
    report["commit"] = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    keys = list(report["summary"][0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in report["summary"]:
        print("| " + " | ".join(str(row[k]) for k in keys) + " |")
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
