"""A small eval over the rollwire MCP server: K rollouts of each of N tasks, a table of results.

Start a server (``rollwire serve --http --llm-url http://127.0.0.1:8000/v1``), then:

    python examples/eval_client.py --tasks reasoning_gym --query chain_sum --limit 2 --samples 4
    python examples/eval_client.py --tasks examples/tasks --harness oracle

Every rollout is one ``run_rollout`` call over one MCP session (streamable HTTP), at most
``--concurrency`` at a time. Progress goes to stderr, the table (or ``--json`` rows) to stdout.
Exit code 0 when every rollout ran (whatever its reward), 1 when any failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

COLUMNS = ("task", "sample", "reward", "ok", "tier", "turns", "trainable", "error")
CALL_TIMEOUT_S = 3600.0  # run_rollout holds the call open until the rollout ends


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="A small eval over the rollwire MCP server.")
    p.add_argument("--server", default="http://127.0.0.1:8400/mcp", help="the server's /mcp URL")
    p.add_argument("--token", default=os.environ.get("ROLLWIRE_TOKEN"), help="bearer token")
    p.add_argument("--llm-url", help="the engine (default: the server's --llm-url)")
    p.add_argument("--tasks", help="list_tasks source: an env family or a Harbor dataset path")
    p.add_argument("--query", help="keep tasks whose reference or description contains it")
    p.add_argument("--limit", type=int, default=5, help="number of tasks (default 5)")
    p.add_argument("--samples", type=int, default=1, help="rollouts per task (default 1)")
    p.add_argument("--concurrency", type=int, default=4, help="rollouts at once (default 4)")
    p.add_argument("--harness", help="Harbor tasks: terminus-2 (default), oracle, nop, ...")
    p.add_argument("--max-turns", type=int, help="agent turns per rollout")
    p.add_argument("--reward-key", help="which reward of a multi-reward verifier to report")
    p.add_argument("--seed", type=int, help="seed of sample 0; sample k uses seed+k")
    p.add_argument("--json", action="store_true", help="one JSON row per rollout on stdout")
    return p.parse_args(argv)


class Abort(Exception):
    """The eval cannot go on; the message says why."""


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def error_text(result: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content).strip() or "tool error"


async def validate(client: Client, llm_url: str) -> bool:
    """Certify the engine once; the rollouts reuse the certification."""
    result = await client.call_tool("validate_llm", {"llm_url": llm_url})
    if result.is_error:
        say(f"validate_llm: {error_text(result)}")
        return False
    cert = result.structured_content
    say(f"{llm_url}: {cert['verdict']} (tier {cert['capture_level']}, model {cert['model']})")
    return cert["verdict"] != "NOT USABLE"


async def rollout(client: Client, args: argparse.Namespace, task: str, k: int) -> dict[str, Any]:
    """One run_rollout call, as a table row (a tool error is a failed row)."""
    call: dict[str, Any] = {"task": task}
    if args.llm_url:
        call["llm_url"] = args.llm_url
    if args.harness:
        call["harness"] = args.harness
    if args.max_turns:
        call["limits"] = {"max_turns": args.max_turns}
    if args.reward_key:
        call["reward_key"] = args.reward_key
    if args.seed is not None:
        call["seed"] = args.seed + k
    row: dict[str, Any] = {**dict.fromkeys(COLUMNS), "task": task, "sample": k}
    result = await client.call_tool("run_rollout", call, read_timeout_seconds=CALL_TIMEOUT_S)
    if result.is_error:
        return {**row, "ok": False, "reward": None, "error": error_text(result)}
    out = result.structured_content
    return {
        **row,
        "ok": out["ok"],
        "reward": out["reward"],
        "tier": out["tier"],
        "turns": out["counts"]["turns"],
        "trainable": out["counts"]["trainable_tokens"],
        "error": out["error"],
        "rollout_id": out["rollout_id"],
    }


async def evaluate(client: Client, args: argparse.Namespace) -> list[dict[str, Any]]:
    page = await client.call_tool(
        "list_tasks", {"source": args.tasks, "query": args.query, "limit": args.limit}
    )
    if page.is_error:
        raise Abort(f"list_tasks: {error_text(page)}")
    tasks = [t["ref"] for t in page.structured_content["tasks"]]
    if not tasks:
        raise Abort(f"list_tasks: no task matches (source {args.tasks}, query {args.query})")
    needs_model = args.harness not in ("oracle", "nop")
    if args.llm_url and needs_model and not await validate(client, args.llm_url):
        raise Abort(f"{args.llm_url} is not usable")
    jobs = [(task, k) for task in tasks for k in range(args.samples)]
    say(f"{len(jobs)} rollouts: {len(tasks)} tasks x {args.samples} samples")
    rows: list[dict[str, Any]] = []
    limiter = anyio.Semaphore(args.concurrency)

    async def one(task: str, k: int) -> None:
        async with limiter:
            row = await rollout(client, args, task, k)
        rows.append(row)
        status = "ok" if row["ok"] else f"FAILED: {row['error']}"
        say(f"[{len(rows)}/{len(jobs)}] {task} #{k}: reward {row['reward']} {status}")

    async with anyio.create_task_group() as tg:
        for task, k in jobs:
            tg.start_soon(one, task, k)
    order = {job: i for i, job in enumerate(jobs)}
    return sorted(rows, key=lambda r: order[(r["task"], r["sample"])])


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def print_table(rows: list[dict[str, Any]]) -> None:
    table = [list(COLUMNS)] + [[cell(row.get(c)) for c in COLUMNS] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS) - 1)]
    for line in table:
        print("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=False)) + "  " + line[-1])


def summary(rows: list[dict[str, Any]]) -> str:
    rewards = [r["reward"] for r in rows if r["reward"] is not None]
    mean = f"{sum(rewards) / len(rewards):.3f}" if rewards else "-"
    failed = sum(not r["ok"] for r in rows)
    return (
        f"mean reward {mean} over {len(rewards)} rewarded rollouts; "
        f"{len(rows) - failed} ok, {failed} failed"
    )


def leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


async def main(args: argparse.Namespace) -> int:
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else None
    timeout = httpx2.Timeout(30.0, read=CALL_TIMEOUT_S)
    statuses: set[int] = set()

    async def seen(response: httpx2.Response) -> None:
        statuses.add(response.status_code)

    hooks = {"response": [seen]}
    try:
        async with httpx2.AsyncClient(headers=headers, timeout=timeout, event_hooks=hooks) as http:
            async with Client(streamable_http_client(args.server, http_client=http)) as client:
                rows = await evaluate(client, args)
    except Exception as exc:
        cause = leaf(exc)
        if 401 in statuses:
            say(f"{args.server}: 401 Unauthorized: pass the server's --token (or ROLLWIRE_TOKEN)")
        else:
            say(str(cause) if isinstance(cause, Abort) else f"{args.server}: {cause!r}")
        return 1
    if args.json:
        for row in rows:
            print(json.dumps(row))
        say(summary(rows))
    else:
        print_table(rows)
        print(summary(rows))
    return 1 if any(not r["ok"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(anyio.run(main, parse_args()))
