"""The examples work as shipped: ``examples/eval_client.py`` against a real ``rollwire serve
--http`` process, and ``examples/claude_desktop_config.json`` spawned exactly as written."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

from tests.examples.conftest import ServeProcess
from tests.tools.test_mcp_inmemory import TOOLS

ROOT = Path(__file__).resolve().parents[2]
EVAL_CLIENT = ROOT / "examples" / "eval_client.py"
DESKTOP_CONFIG = ROOT / "examples" / "claude_desktop_config.json"
PLACEHOLDER_DIR = "/path/to/rollwire"
PLACEHOLDER_LLM = "http://127.0.0.1:8000/v1"
TOKEN = "eval-token"
HEADER = ["task", "sample", "reward", "ok", "tier", "turns", "trainable", "error"]


@pytest.fixture(scope="module")
def server(fake, tmp_path_factory) -> Iterator[ServeProcess]:
    served = ServeProcess(tmp_path_factory.mktemp("serve"), fake[1], TOKEN)
    try:
        yield served
    finally:
        served.stop()


def eval_client(server: ServeProcess, *args: str, token: str | None = TOKEN):
    env = {k: v for k, v in os.environ.items() if k != "ROLLWIRE_TOKEN"}
    auth = ["--token", token] if token else []
    done = subprocess.run(
        [sys.executable, str(EVAL_CLIENT), "--server", server.url, *auth, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert server.stdout_text() == ""  # the server's stdout stays clean
    return done


def table(stdout: str) -> tuple[list[list[str]], str]:
    """The table's rows (split on runs of spaces, error last) and the summary line."""
    *lines, summary = stdout.strip().splitlines()
    assert lines[0].split() == HEADER, stdout
    return [line.split(maxsplit=len(HEADER) - 1) for line in lines[1:]], summary


def test_eval_client_env_task_on_the_servers_default_engine(server, fake):
    before = len(fake[0].requests)
    done = eval_client(
        server, "--tasks", "reasoning_gym", "--query", "chain_sum", "--limit", "1",
        "--samples", "2", "--seed", "0", "--concurrency", "2",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows, summary = table(done.stdout)
    assert [r[:2] for r in rows] == [
        ["reasoning_gym:chain_sum", "0"],
        ["reasoning_gym:chain_sum", "1"],
    ]
    for _, _, reward, ok, tier, turns, trainable, error in rows:
        assert float(reward) in (0.0, 1.0) and ok == "yes" and tier == "tokens" and error == "-"
        assert int(turns) >= 1 and int(trainable) > 0
    assert summary.endswith("over 2 rewarded rollouts; 2 ok, 0 failed"), summary
    assert "[2/2] reasoning_gym:chain_sum" in done.stderr
    assert len(fake[0].requests) > before  # no --llm-url: the server's default engine ran them


def test_eval_client_json_rows_after_validating_the_engine(server, fake):
    done = eval_client(
        server, "--llm-url", fake[1], "--tasks", "reasoning_gym", "--query", "chain_sum",
        "--limit", "1", "--max-turns", "2", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"{fake[1]}: TRAIN (tier tokens, model smol)" in done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(rows) == 1 and rows[0]["task"] == "reasoning_gym:chain_sum"
    assert rows[0]["ok"] and rows[0]["tier"] == "tokens" and rows[0]["trainable"] > 0
    assert 1 <= rows[0]["turns"] <= 2 and len(rows[0]["rollout_id"]) == 32
    assert "1 ok, 0 failed" in done.stderr


def test_eval_client_harbor_oracle_and_a_failed_rollout(server):
    """The bundled dataset with the oracle: five tasks pass; the multi-reward task without
    --reward-key fails, so the exit code is 1."""
    done = eval_client(
        server, "--tasks", "examples/tasks", "--harness", "oracle", "--limit", "10",
        "--concurrency", "3",
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    rows, summary = table(done.stdout)
    by_task = {r[0].removeprefix("harbor:examples/tasks#"): r for r in rows}
    assert sorted(by_task) == [
        "count-errors", "fix-median", "inventory-steps", "organize-files", "sales-report",
        "token-relay",
    ]  # fmt: skip
    failed = by_task.pop("sales-report")
    assert failed[2:4] == ["-", "NO"] and "no reward_key" in failed[7]
    for row in by_task.values():
        assert row[1:] == ["0", "1.000", "yes", "text", "0", "0", "-"], row
    assert summary == "mean reward 1.000 over 5 rewarded rollouts; 5 ok, 1 failed"


def test_eval_client_zero_reward_is_not_a_failure(server):
    done = eval_client(server, "--tasks", "examples/tasks", "--query", "count", "--harness", "nop")
    assert done.returncode == 0, done.stderr
    rows, summary = table(done.stdout)
    assert [r[:4] for r in rows] == [["harbor:examples/tasks#count-errors", "0", "0.000", "yes"]]
    assert summary == "mean reward 0.000 over 1 rewarded rollouts; 1 ok, 0 failed"


def test_eval_client_without_the_token_is_refused(server):
    done = eval_client(server, "--tasks", "examples/tasks", "--harness", "oracle", token=None)
    assert done.returncode == 1
    assert done.stdout == ""
    assert "401 Unauthorized" in done.stderr and "--token" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.anyio
async def test_claude_desktop_config_starts_a_working_server(fake, tmp_path):
    """Spawn exactly the command, args and env of the config (placeholders filled in), from an
    unrelated directory, as Claude Desktop would; run a rollout on its default engine."""
    config = json.loads(DESKTOP_CONFIG.read_text())
    readme = (ROOT / "README.md").read_text()
    shown = readme.split("```json\n", 1)[1].split("```", 1)[0]
    assert json.loads(shown) == config  # the README shows the file as it is
    entry = config["mcpServers"]["rollwire"]
    assert set(entry) == {"command", "args", "env"}
    assert PLACEHOLDER_DIR in entry["args"] and PLACEHOLDER_LLM in entry["args"]
    assert shutil.which(entry["command"]), f"{entry['command']} is not on PATH"
    fill = {PLACEHOLDER_DIR: str(ROOT), PLACEHOLDER_LLM: fake[1]}
    params = StdioServerParameters(
        command=entry["command"],
        args=[fill.get(a, a) for a in entry["args"]],
        env=entry["env"],  # merged over the SDK's minimal inherited set (PATH, HOME, ...)
        cwd=str(tmp_path),
    )
    before = len(fake[0].requests)
    async with Client(params, read_timeout_seconds=120) as client:
        assert {t.name for t in (await client.list_tools()).tools} == TOOLS
        result = await client.call_tool("run_rollout", {"task": "reasoning_gym:chain_sum"})
        out = result.structured_content
        assert not result.is_error and out["ok"] and out["tier"] == "tokens", result
        assert out["counts"]["trainable_tokens"] > 0
        page = (
            await client.call_tool("list_tasks", {"source": "examples/tasks", "query": "count"})
        ).structured_content  # relative to --directory, not to where the client started it
        assert [t["ref"] for t in page["tasks"]] == ["harbor:examples/tasks#count-errors"]
    assert len(fake[0].requests) > before
