"""Env episodes per second through the whole path: tool loop + in-process capture proxy + fake vLLM.

For reasoning-gym (chain_sum) and OpenSpiel (tic_tac_toe), at concurrency 1 and 16. Baseline in
the same run: the same episodes played by a scripted policy straight against the session (no
model, no proxy), so the ratio shows what the capture path costs. The fake vLLM runs in its own
process (pinned to CPU 0 when taskset exists) and calls the first tool on every user turn.
Target: >= 25 episodes/s at concurrency 16 on 2 cores.

    uv run python bench/env_episodes.py [--episodes 200] [--concurrency 1,16]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import anyio

from measure import free_port, start_fake
from rollwire.capture.proxy import CaptureProxy, ProxyConfig
from rollwire.capture.rollout import CaptureLevel
from rollwire.capture.upstream import Upstream
from rollwire.harnesses.envs.registry import resolve
from rollwire.harnesses.envs.run import run_env_rollout
from rollwire.sessions.toolloop import LoopLimits

TASKS = {
    "reasoning_gym:chain_sum": {"min_terms": 2, "max_terms": 3},
    "openspiel:tic_tac_toe": {"opponent": "first_legal"},
}


async def scripted_episode(task: str, seed: int) -> float | None:
    """The baseline: one episode with no model: call the first tool with a plausible argument."""
    adapter, name = resolve(task)
    session = adapter.make_session(name, dict(TASKS[task]), seed=seed, episode_id=f"s{seed}")
    try:
        await session.initial_messages()
        tool = session.list_tools()[0]
        props = tool.input_schema.get("properties", {})
        arg = next(iter(props), None)
        for move in range(9):
            result = await session.call_tool(tool.name, {arg: str(move)} if arg else {})
            if result.done:
                break
        return (await session.verify()).reward
    finally:
        await session.close()


async def run_many(n: int, concurrency: int, episode: Any) -> tuple[float, list[Any]]:
    limiter = anyio.Semaphore(concurrency)
    out: list[Any] = []

    async def one(i: int) -> None:
        async with limiter:
            out.append(await episode(i))

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    return time.perf_counter() - start, out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    fake = start_fake(port, {"tool_call_every_turn": True}, reply_tokens=24, cpu=0, timeout_s=30)
    url = f"http://127.0.0.1:{port}"
    upstream = Upstream(url)
    proxy = CaptureProxy(
        ProxyConfig(llm_url=url, model="smol", capture_level=CaptureLevel.TOKENS), upstream=upstream
    )
    rows: list[dict[str, Any]] = []
    try:
        for task in TASKS:
            # Warm up outside the timing: imports (reasoning_gym takes seconds), first connections.
            await scripted_episode(task, 0)
            await run_env_rollout(task, proxy=proxy, config=dict(TASKS[task]), seed=0)
            for conc in args.concurrency:
                base_s, _ = await run_many(
                    args.episodes, conc, lambda i, t=task: scripted_episode(t, i)
                )

                async def full(i: int, t: str = task) -> Any:
                    limits = LoopLimits(seed=i, max_turns=4, max_tokens=64)
                    return (
                        await run_env_rollout(
                            t, proxy=proxy, config=dict(TASKS[t]), seed=i, limits=limits
                        )
                    ).result

                full_s, results = await run_many(args.episodes, conc, full)
                ok = sum(r.ok for r in results)
                rows.append(
                    {
                        "task": task,
                        "concurrency": conc,
                        "episodes": args.episodes,
                        "scripted_eps_per_s": args.episodes / base_s,
                        "full_path_eps_per_s": args.episodes / full_s,
                        "ok": ok,
                        "model_calls_per_episode": sum(r.n_turns for r in results) / len(results),
                        "trainable_tokens_per_episode": sum(r.n_trainable_tokens for r in results)
                        / len(results),
                    }
                )
    finally:
        await upstream.aclose()
        fake.terminate()
        fake.wait(10)
    return {"rows": rows, "loadavg": os.getloadavg()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument(
        "--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16]
    )
    args = parser.parse_args()
    report = anyio.run(main_async, args)
    print(f"\nload average at the end: {report['loadavg'][0]:.2f}\n")
    print(
        "| task | conc | episodes | ok | calls/episode | scripted eps/s | full path eps/s | target |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for r in report["rows"]:
        target = (
            ("met" if r["full_path_eps_per_s"] >= 25 else "MISSED")
            if r["concurrency"] >= 16
            else "-"
        )
        print(
            f"| {r['task']} | {r['concurrency']} | {r['episodes']} | {r['ok']} | "
            f"{r['model_calls_per_episode']:.2f} | {r['scripted_eps_per_s']:.0f} | "
            f"{r['full_path_eps_per_s']:.1f} | {target} |"
        )
    out = Path(__file__).parent / "results" / "env_episodes.json"
    out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
