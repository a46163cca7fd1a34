"""One pass over every tool and resource, shared by the transport tests (stdio, HTTP)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import anyio
from mcp import Client

from tests.tools.test_mcp_inmemory import TOOLS

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"
MARK = "318"


def sleepers() -> list[int]:
    """Host pids of the slow task's ``sleep``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if (
                proc.name.isdigit()
                and (proc / "cmdline").read_bytes() == f"sleep\0{MARK}\0".encode()
            ):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def make_slow_task(root: Path) -> str:
    """A Harbor task whose oracle solution sleeps; its reference."""
    task = root / "slow-task"
    shutil.copytree(EXAMPLES / "count-errors", task)
    (task / "solution" / "solve.sh").write_text(f"#!/bin/bash\nsleep {MARK}\n")
    return f"harbor:{task}#slow-task"


async def _until(predicate, timeout_s: float = 60.0) -> None:
    with anyio.fail_after(timeout_s):
        while not predicate():  # noqa: ASYNC110 - polls processes outside the event loop
            await anyio.sleep(0.1)


async def exercise_every_tool(client: Client, llm_url: str, slow_task: str) -> None:
    """Call every tool once (and read both resources), asserting each answer's shape; then
    cancel a held run_rollout mid-trial and check its sandbox's processes are gone."""
    assert {t.name for t in (await client.list_tools()).tools} == TOOLS
    page = await client.call_tool("list_tasks", {"source": "reasoning_gym", "limit": 3})
    assert len(page.structured_content["tasks"]) == 3
    cert = (await client.call_tool("validate_llm", {"llm_url": llm_url})).structured_content
    assert cert["verdict"] == "TRAIN"
    info = (await client.call_tool("info", {})).structured_content
    assert any(s["name"] == "local" and s["available"] for s in info["sandboxes"])

    args = {"task": "reasoning_gym:chain_sum", "llm": {"url": llm_url}, "seed": 2}
    held = (await client.call_tool("run_rollout", args)).structured_content
    assert held["ok"] and held["counts"]["turns"] >= 1
    started = (await client.call_tool("start_rollout", args)).structured_content
    with anyio.fail_after(60):
        while True:
            now = (
                await client.call_tool("get_rollout", {"rollout_id": started["rollout_id"]})
            ).structured_content
            if now["status"] != "running":
                break
            await anyio.sleep(0.05)
    assert now["status"] == "done" and now["result"]["ok"]
    graph = (
        await client.call_tool(
            "get_rollout_graph", {"rollout_id": held["rollout_id"], "format": "mermaid"}
        )
    ).structured_content
    assert graph["mermaid"].startswith("flowchart TD")
    for kind in ("document", "graph"):
        read = await client.read_resource(f"rollout://{held['rollout_id']}/{kind}")
        assert json.loads(read.contents[0].text)

    out_dir = "every-tool"  # a name inside the server's --data-dir
    collected = (
        await client.call_tool(
            "collect_episodes",
            {
                "out_dir": out_dir,
                "episodes": 2,
                "tasks": ["reasoning_gym:chain_sum"],
                "llm": llm_url,
            },
        )
    ).structured_content
    assert collected["collected"] == 2 and len(collected["episode_ids"]) == 2
    dry = await client.call_tool(
        "push_dataset", {"out_dir": out_dir, "repo_id": "me/rollouts", "dry_run": True}
    )
    assert dry.structured_content["sent"] is False and dry.structured_content["plan"]["n_rows"] == 2

    background = (
        await client.call_tool("start_rollout", {"task": slow_task, "harness": "oracle"})
    ).structured_content
    await _until(lambda: len(sleepers()) == 1)
    cancelled = (
        await client.call_tool("cancel_rollout", {"rollout_id": background["rollout_id"]})
    ).structured_content
    assert cancelled["status"] == "cancelled" and sleepers() == []

    async with anyio.create_task_group() as tg:  # a client giving up on a held call

        async def hold() -> None:
            await client.call_tool("run_rollout", {"task": slow_task, "harness": "oracle"})

        tg.start_soon(hold)
        await _until(lambda: len(sleepers()) == 1)
        tg.cancel_scope.cancel()
    await _until(lambda: not sleepers(), 30)
    with anyio.fail_after(30):  # over a real transport the cancel is a notification: async
        while True:
            listed = (await client.call_tool("list_rollouts", {})).structured_content
            if "running" not in listed["counts"]:
                break
            await anyio.sleep(0.1)
    assert listed["counts"] == {"done": 2, "cancelled": 2}, listed
