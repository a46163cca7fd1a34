"""The MCP server as a subprocess (``python -m rollwire serve --stdio``) through the stdio client."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

from tests.fakes.serve import serve_in_thread
from tests.fakes.vllm import FakeVLLM
from tests.tools.every_tool import exercise_every_tool, make_slow_task, sleepers
from tests.tools.test_mcp_inmemory import TOOLS

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fake_url() -> Iterator[str]:
    with serve_in_thread(FakeVLLM(tool_call_every_turn=True).app) as url:
        yield url + "/v1"


def server_params(tmp_path: Path) -> StdioServerParameters:
    env = {
        **os.environ,
        "ROLLWIRE_TRIALS_DIR": str(tmp_path / "trials"),
        "HARBOR_TELEMETRY": "0",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    return StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "rollwire",
            "serve",
            "--stdio",
            "--data-dir",
            str(tmp_path / "collections"),
            "--dataset-root",
            str(tmp_path),
        ],
        env=env,
        cwd=str(ROOT),
    )


async def test_stdio_server_runs_env_and_harbor_rollouts(tmp_path, fake_url):
    progress: list[tuple[float, str | None]] = []

    async def on_progress(done, total, message):
        progress.append((done, message))

    async with Client(server_params(tmp_path), read_timeout_seconds=120) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert names == TOOLS

        page = (
            await client.call_tool("list_tasks", {"source": "examples/tasks", "query": "count"})
        ).structured_content
        assert [t["ref"] for t in page["tasks"]] == ["harbor:examples/tasks#count-errors"]

        oracle = (
            await client.call_tool(
                "run_rollout", {"task": page["tasks"][0]["ref"], "harness": "oracle"}
            )
        ).structured_content
        assert oracle["ok"] and oracle["reward"] == 1.0, oracle

        env = await client.call_tool(
            "run_rollout",
            {"task": "reasoning_gym:chain_sum", "llm_url": fake_url, "seed": 0},
            progress_callback=on_progress,
        )
        out = env.structured_content
        assert out["ok"] and out["tier"] == "tokens", out
        read = await client.read_resource(f"rollout://{out['rollout_id']}/document")
        assert len(json.loads(read.contents[0].text)["turns"]) == out["counts"]["turns"]

        bad = await client.call_tool("run_rollout", {"task": "nope:x", "llm_url": fake_url})
        assert bad.is_error and "task: " in bad.content[0].text
    # Over a real transport progress may arrive after the result; by now the session is closed.
    assert [p[0] for p in progress] == [0, 1, 2, 3, 4]


async def test_every_tool_over_stdio(tmp_path, fake_url):
    async with Client(server_params(tmp_path), read_timeout_seconds=120) as client:
        await exercise_every_tool(client, fake_url, make_slow_task(tmp_path))
    assert sleepers() == []
