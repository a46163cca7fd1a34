"""An eval over the rollwire MCP server: problems x samples, mean reward and pass@k with errors.

Start a server (``rollwire serve --http --llm-url http://127.0.0.1:8000/v1``), then:

    python examples/eval_client.py --tasks reasoning_gym --query chain_sum --limit 1 \
        --problems 20 --samples 4 --k 1,4
    python examples/eval_client.py --tasks examples/tasks --query count --harness oracle

A thin client: it lists the tasks (``list_tasks``), certifies ``--llm-url`` when given
(``validate_llm``) and makes one ``collect_episodes`` call with ``eval: true`` into ``--out``
(under the server's data directory; the same command again resumes). It prints the metrics
block of that call's result: per task family and overall, problems, samples, failed attempts,
mean reward ± standard error and pass@k ± standard error over problems, then the failed
attempts by cause (``--json``: the block as JSON). Progress goes to stderr. Exit code 0 when
every rollout ran (whatever its reward), 1 when any failed or the call was refused.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

CALL_TIMEOUT_S = 3600.0  # collect_episodes holds the call open until the eval ends


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="An eval over the rollwire MCP server.")
    p.add_argument("--server", default="http://127.0.0.1:8400/mcp", help="the server's /mcp URL")
    p.add_argument("--token", default=os.environ.get("ROLLWIRE_TOKEN"), help="bearer token")
    p.add_argument("--llm-url", help="the engine (default: the server's --llm-url)")
    p.add_argument("--tasks", help="list_tasks source: an env family or a Harbor dataset path")
    p.add_argument("--query", help="keep tasks whose reference or description contains it")
    p.add_argument("--limit", type=int, default=5, help="number of tasks (default 5)")
    p.add_argument("--problems", type=int, default=1, help="instances per env task (default 1)")
    p.add_argument("--samples", type=int, default=1, help="samples per problem (default 1)")
    p.add_argument("--k", default="1", help="pass@k for these k, each <= --samples (default 1)")
    p.add_argument("--pass-threshold", type=float, default=1.0, help="reward that passes")
    p.add_argument("--concurrency", type=int, default=4, help="rollouts at once (default 4)")
    p.add_argument("--harness", help="Harbor tasks: terminus-2 (default), oracle, nop, ...")
    p.add_argument("--max-turns", type=int, help="agent turns per rollout")
    p.add_argument("--reward-key", help="which reward of a multi-reward verifier to score")
    p.add_argument("--seed", type=int, default=0, help="first task seed (default 0)")
    p.add_argument(
        "--out", help="eval folder on the server (default: evals/<a hash of what is evaluated>)"
    )
    p.add_argument("--json", action="store_true", help="print the metrics block as JSON")
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


async def evaluate(client: Client, args: argparse.Namespace) -> dict[str, Any]:
    """The tasks, then one collect_episodes call with eval on: its result."""
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
    problems = 1 if tasks[0].startswith("harbor:") else args.problems
    episodes = len(tasks) * problems * args.samples
    say(f"{episodes} rollouts: {len(tasks)} tasks x {problems} problems x {args.samples} samples")
    call: dict[str, Any] = {
        "out_dir": args.out,
        "tasks": tasks,
        "episodes": episodes,
        "group_size": args.samples,
        "eval": True,
        "k": [int(k) for k in args.k.split(",")],
        "pass_threshold": args.pass_threshold,
        "seed": args.seed,
        "concurrency": args.concurrency,
    }
    optional = {"llm_url": args.llm_url, "harness": args.harness, "reward_key": args.reward_key}
    call.update({k: v for k, v in optional.items() if v is not None})
    if args.max_turns:
        call["limits"] = {"max_turns": args.max_turns}
    if args.out is None:  # the same eval resumes in its folder; another gets its own
        same = {k: v for k, v in call.items() if k not in ("out_dir", "concurrency", "k")}
        same["server"] = args.server  # its default engine is part of what is evaluated
        digest = hashlib.sha256(json.dumps(same, sort_keys=True).encode()).hexdigest()
        call["out_dir"] = f"evals/{digest[:12]}"

    async def progress(done: float, total: float | None, message: str | None) -> None:
        say(f"[{int(done)}/{int(total or 0)}] {message or ''}")

    result = await client.call_tool(
        "collect_episodes", call, read_timeout_seconds=CALL_TIMEOUT_S, progress_callback=progress
    )
    if result.is_error:
        raise Abort(f"collect_episodes: {error_text(result)}")
    return result.structured_content


def pm(value: float | None, se: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" + ("" if se is None else f" ± {se:.3f}")


def print_metrics(metrics: dict[str, Any]) -> None:
    """The metrics block as a table: one row per task family, then overall."""
    header = ["family", "problems", "samples", "failed", "mean reward"]
    header += [f"pass@{k}" for k in metrics["ks"]]
    rows = [header]
    for f in [*metrics["families"], metrics["overall"]]:
        rows.append(
            [f["family"], str(f["problems"]), str(f["samples"]), str(f["failed"])]
            + [pm(f["reward_mean"], f["reward_se"])]
            + [pm(p["estimate"], p["se"]) for p in f["pass_at"]]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
    if metrics["causes"]:
        print(f"failed attempts ({metrics['overall']['failed']}), by cause:")
        for cause, n in metrics["causes"].items():
            print(f"  {n:>5}  {cause}")


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
                result = await evaluate(client, args)
    except Exception as exc:
        cause = leaf(exc)
        if 401 in statuses:
            say(f"{args.server}: 401 Unauthorized: pass the server's --token (or ROLLWIRE_TOKEN)")
        else:
            say(str(cause) if isinstance(cause, Abort) else f"{args.server}: {cause!r}")
        return 1
    metrics = result["metrics"]
    if args.json:
        print(json.dumps(metrics, indent=2))
    else:
        print_metrics(metrics)
    say(f"eval folder: {result['out_dir']}")
    return 1 if result["totals"].get("failed") else 0


if __name__ == "__main__":
    sys.exit(anyio.run(main, parse_args()))
