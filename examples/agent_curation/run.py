"""An agent curates a dataset through rollwire's MCP tools.

Claude Code gets rollwire as an MCP server (stdio, the config block of
docs/guides/mcp-clients.md) and the goal in ``goal.md``: find the task, certify the engine,
collect episodes filtered by reward, extend the collection until enough are kept, and push it
as a dry run. Its model is whatever Claude Code is set up with: Anthropic's API
(``ANTHROPIC_API_KEY``), or any Anthropic-compatible endpoint (``ANTHROPIC_BASE_URL``), e.g.
``rollwire proxy`` in front of a local vLLM (the proxy speaks the Messages API, and captures the
curating agent's own calls too). The rollouts run on ``--engine-url``.

Artefacts in ``--out``: ``transcript.jsonl`` (the agent's own stream-json transcript),
``calls.jsonl`` (every tool call as rollwire received it), ``collections/<out_dir>`` (the
dataset) and ``result.json`` (the agent's final line and the collection's counts).

    uv run rollwire agents install claude-code
    uv run python examples/agent_curation/run.py --engine-url http://127.0.0.1:8000/v1
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
TOOLS = ("list_tasks", "validate_llm", "collect_episodes", "push_dataset", "run_rollout", "info")


def claude_path() -> str:
    """PATH with the Claude Code rollwire installs (``rollwire agents install claude-code``)."""
    from rollwire.harnesses.harbor.installs import installed_here

    installed = installed_here("claude-code")
    extra = [str(p) for p in installed.bin_dirs] if installed else []
    return ":".join([*extra, os.environ.get("PATH", "")])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine-url", required=True, help="the engine rollouts run on (…/v1)")
    p.add_argument("--out", default="agent-curation", help="where the artefacts go")
    p.add_argument("--episodes", type=int, default=4, help="episodes to keep (default 4)")
    p.add_argument("--min-reward", type=float, default=1.0, help="reward to keep (default 1.0)")
    p.add_argument("--out-dir", default="curated", help="the collection's name")
    p.add_argument("--repo-id", default="me/chain-sum-curated", help="dry-run push target")
    p.add_argument("--model", default="claude-sonnet-4-5", help="Claude Code's --model")
    p.add_argument("--timeout", type=float, default=1800, help="seconds the agent may take")
    args = p.parse_args(argv)

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    server = [
        "uv", "run", "--directory", str(ROOT), "rollwire", "serve", "--stdio",
        "--data-dir", str(out / "collections"), "--call-log", str(out / "calls.jsonl"),
    ]  # fmt: skip
    config = out / "mcp.json"
    config.write_text(
        json.dumps({"mcpServers": {"rollwire": {"command": server[0], "args": server[1:]}}})
    )
    goal = (
        (HERE / "goal.md")
        .read_text()
        .format(
            episodes=args.episodes,
            min_reward=args.min_reward,
            engine_url=args.engine_url,
            out_dir=args.out_dir,
            repo_id=args.repo_id,
        )
    )
    command = [
        "claude", "-p", goal, "--mcp-config", str(config), "--strict-mcp-config",
        "--allowedTools", ",".join(f"mcp__rollwire__{t}" for t in TOOLS),
        "--output-format", "stream-json", "--verbose", "--model", args.model,
    ]  # fmt: skip
    env = {**os.environ, "PATH": claude_path()}
    env.setdefault("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
    print(f"agent-curation: Claude Code at work; transcript in {out}/transcript.jsonl", flush=True)
    with (out / "transcript.jsonl").open("w") as transcript:
        done = subprocess.run(
            command, env=env, cwd=out, stdout=transcript, stderr=subprocess.PIPE, text=True,
            timeout=args.timeout, check=False,
        )  # fmt: skip
    final = ""
    for line in (out / "transcript.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event.get("type") == "result":
            final = str(event.get("result", ""))
    manifest = out / "collections" / args.out_dir / "manifest.json"
    counts = json.loads(manifest.read_text()).get("counts") if manifest.exists() else None
    result = {"exit_code": done.returncode, "final": final, "collection": counts}
    (out / "result.json").write_text(json.dumps(result, indent=2))
    print(f"agent-curation: {final or '(no final answer)'}")
    if done.returncode != 0:
        print(f"agent-curation: Claude Code exited {done.returncode}: {done.stderr[-2000:]}",
              file=sys.stderr)  # fmt: skip
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
