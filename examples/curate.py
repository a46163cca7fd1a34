"""An agent-style curation loop over the rollwire MCP server, deciding from tool outputs only.

list_tasks -> validate_llm (stop unless TRAIN) -> collect_episodes -> read the collection's
counts and rewards -> probe one rollout (run_rollout + get_rollout_graph: findings,
re-tokenisation) -> keep or drop -> push_dataset(dry_run=True) -> print the plan.

    python examples/curate.py --llm-url http://127.0.0.1:8000/v1 --tasks reasoning_gym \\
        --query chain_sum --limit 2 --group-size 4 --out-dir chain-sum --repo-id you/chain-sum

Nothing is published: the push is a dry run that shows what would be sent. Exit code 0 when
the plan is to push, 1 when the collection is dropped or the loop stopped early.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

CALL_TIMEOUT_S = 3600.0  # collect_episodes and run_rollout hold the call open until done


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Curate a rollout collection over rollwire's MCP.")
    p.add_argument("--server", default="http://127.0.0.1:8400/mcp", help="the server's /mcp URL")
    p.add_argument("--token", default=os.environ.get("ROLLWIRE_TOKEN"), help="bearer token")
    p.add_argument("--llm-url", required=True, help="the engine to certify and sample")
    p.add_argument("--tasks", help="list_tasks source: an env family or a Harbor dataset path")
    p.add_argument("--query", help="keep tasks whose reference or description contains it")
    p.add_argument("--limit", type=int, default=2, help="number of tasks (default 2)")
    p.add_argument("--group-size", type=int, default=4, help="samples per task instance")
    p.add_argument("--groups", type=int, default=1, help="task instances per task (default 1)")
    p.add_argument("--max-turns", type=int, default=4, help="agent turns per rollout")
    p.add_argument("--min-reward", type=float, help="keep only episodes with reward >= this")
    p.add_argument("--max-failed", type=float, default=0.25, help="drop above this failed share")
    p.add_argument("--max-retokenized", type=float, default=0.5, help="drop above this share")
    p.add_argument("--out-dir", default="curated", help="collection name on the server")
    p.add_argument("--repo-id", default="you/curated", help="dataset repo for the (dry-run) push")
    return p.parse_args(argv)


class Stop(Exception):
    """The loop cannot go on; the message says why."""


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def call(client: Client, name: str, args: dict[str, Any]) -> dict[str, Any]:
    """One tool call; its structured result (a tool error stops the loop)."""

    async def progress(done: float, total: float | None, message: str | None) -> None:
        say(f"  {name}: {done:g}/{total:g} {message or ''}" if total else f"  {name}: {message}")

    result = await client.call_tool(
        name, args, read_timeout_seconds=CALL_TIMEOUT_S, progress_callback=progress
    )
    if result.is_error:
        text = " ".join(getattr(c, "text", "") for c in result.content).strip()
        raise Stop(f"{name}: {text}")
    return result.structured_content


async def curate(client: Client, a: argparse.Namespace) -> int:
    # 1. What can run?
    query = {"source": a.tasks, "query": a.query, "limit": a.limit}
    page = await call(client, "list_tasks", {k: v for k, v in query.items() if v is not None})
    tasks = [t["ref"] for t in page["tasks"]]
    if not tasks:
        raise Stop(f"list_tasks: nothing matches (source {a.tasks}, query {a.query})")
    say(f"list_tasks: {', '.join(tasks)} (of {page['total']})")

    # 2. Is the engine trainable? EVAL ONLY data would never train anything: stop here.
    cert = await call(client, "validate_llm", {"llm_url": a.llm_url})
    say(f"validate_llm: {cert['verdict']} (tier {cert['capture_level']}, model {cert['model']})")
    if cert["verdict"] != "TRAIN":
        raise Stop("; ".join(f"{f['code']}: {f['message']}" for f in cert["findings"]))

    # 3. Collect: group_size samples per task instance, only trainable episodes kept.
    args: dict[str, Any] = {
        "out_dir": a.out_dir,
        "episodes": len(tasks) * a.groups * a.group_size,
        "tasks": tasks,
        "group_size": a.group_size,
        "llm": a.llm_url,
        "limits": {"max_turns": a.max_turns},
        "trainable_only": True,
    }
    if a.min_reward is not None:
        args["min_reward"] = a.min_reward
    col = await call(client, "collect_episodes", args)
    ran = col["collected"] + col["filtered"] + col["failed"]
    mean, std = col["reward_mean"], col["reward_std"]
    print(
        f"collection {a.out_dir}: {col['collected']} kept, {col['filtered']} filtered, "
        f"{col['failed']} failed, {col['skipped_done']} already there; "
        f"mean reward {'-' if mean is None else f'{mean:.3f}'} "
        f"(std {'-' if std is None else f'{std:.3f}'}); {col['trainable_tokens']} trainable "
        f"tokens; {len(col['episode_ids'])} new episode ids"
    )

    # 4. Decide from what the tools said.
    drop: list[str] = []
    notes: list[str] = []
    if ran and col["failed"] / ran > a.max_failed:
        drop.append(f"{col['failed']} of {ran} rollouts failed (> {a.max_failed:.0%})")
    if col["totals"].get("collected", col["collected"]) == 0:
        drop.append("no episode kept")
    if std is not None and std == 0.0:
        notes.append("every kept reward is equal: GRPO groups carry no learning signal")

    # One more rollout of the first task, to read its findings and its call graph.
    probe = await call(
        client,
        "run_rollout",
        {"task": tasks[0], "llm": a.llm_url, "limits": {"max_turns": a.max_turns}},
    )
    graph = await call(client, "get_rollout_graph", {"rollout_id": probe["rollout_id"]})
    nodes, retok = len(graph["nodes"]), len(graph["retokenized"])
    codes = sorted({f"{f['level']}:{f['code']}" for f in probe["findings"]})
    print(
        f"probe {probe['rollout_id']}: ok {probe['ok']}, {probe['counts']['turns']} turns, "
        f"{probe['counts']['roots']} roots, {retok} of {nodes} calls re-tokenised, "
        f"findings: {', '.join(codes) or '-'}"
    )
    if any(f["level"] == "FATAL" for f in probe["findings"]):
        drop.append("the probe rollout has FATAL findings")
    if nodes and retok / nodes > a.max_retokenized:
        drop.append(f"fragmented: {retok} of {nodes} calls re-tokenised an earlier reply")
    elif retok:
        notes.append(f"{retok} re-tokenised call(s): each becomes a sequence of its own")

    # 5. The plan: drop, or what a push would send (dry run: nothing leaves the server).
    for note in notes:
        print(f"note: {note}")
    if drop:
        print("plan: DROP " + a.out_dir + ": " + "; ".join(drop))
        return 1
    push = await call(
        client, "push_dataset", {"out_dir": a.out_dir, "repo_id": a.repo_id, "dry_run": True}
    )
    plan = push["plan"]
    files = ", ".join(f"{f['path_in_repo']} ({f['size']} B)" for f in plan["files"])
    print(f"plan: PUSH {plan['n_rows']} episodes to {plan['endpoint']}/datasets/{plan['repo_id']}")
    print(f"  {'private' if plan['private'] else 'public'}; files: {files}")
    print(f"  token {'found' if plan['token_found'] else 'NOT FOUND (set HF_TOKEN on the server)'}")
    return 0


async def main(a: argparse.Namespace) -> int:
    headers = {"Authorization": f"Bearer {a.token}"} if a.token else None
    timeout = httpx2.Timeout(30.0, read=CALL_TIMEOUT_S)
    statuses: set[int] = set()

    async def seen(response: httpx2.Response) -> None:
        statuses.add(response.status_code)

    hooks = {"response": [seen]}
    try:
        async with httpx2.AsyncClient(headers=headers, timeout=timeout, event_hooks=hooks) as http:
            async with Client(streamable_http_client(a.server, http_client=http)) as client:
                return await curate(client, a)
    except Exception as exc:
        while isinstance(exc, BaseExceptionGroup):
            exc = exc.exceptions[0]
        if isinstance(exc, Stop):
            say(f"stopped: {exc}")
        elif 401 in statuses:
            say(f"{a.server}: 401 Unauthorized: pass the server's --token (or ROLLWIRE_TOKEN)")
        else:
            say(f"{a.server}: {exc!r}")
        return 1


if __name__ == "__main__":
    sys.exit(anyio.run(main, parse_args()))
