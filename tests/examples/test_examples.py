"""The examples work as shipped: ``examples/eval_client.py`` against a real ``rollwire serve
--http`` process, and ``examples/claude_desktop_config.json`` spawned exactly as written."""

from __future__ import annotations

import json
import os
import re
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


@pytest.fixture(scope="module")
def server(fake, tmp_path_factory) -> Iterator[ServeProcess]:
    tmp = tmp_path_factory.mktemp("serve")  # its data dir too: nothing lands in the clone
    served = ServeProcess(tmp, fake[1], TOKEN, data_dir=tmp / "data")
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


def metrics_table(stdout: str) -> dict[str, list[str]]:
    """The client's table: family -> [problems, samples, failed, mean reward, pass@k ...]."""
    lines = stdout.splitlines()
    rows = {}
    for line in lines[1:]:
        if line.startswith("failed attempts"):
            break
        cells = re.split(r"\s{2,}", line.strip())
        rows[cells[0]] = cells[1:]
    return rows


def test_eval_client_env_task_on_the_servers_default_engine(server, fake):
    before = len(fake[0].requests)
    done = eval_client(
        server, "--tasks", "reasoning_gym", "--query", "chain_sum", "--limit", "1",
        "--problems", "2", "--samples", "2", "--k", "1,2", "--concurrency", "2",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].split() == [
        "family", "problems", "samples", "failed", "mean", "reward", "pass@1", "pass@2",
    ]  # fmt: skip
    rows = metrics_table(done.stdout)
    assert set(rows) == {"reasoning_gym:chain_sum", "overall"}
    assert rows["overall"][:2] == ["2", "4"]
    assert "[4/4]" in done.stderr and "eval folder: " in done.stderr
    assert len(fake[0].requests) > before  # no --llm-url: the server's default engine ran them


def test_eval_client_json_metrics_after_validating_the_engine(server, fake):
    done = eval_client(
        server, "--llm-url", fake[1], "--tasks", "reasoning_gym", "--query", "chain_sum",
        "--limit", "1", "--max-turns", "2", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"{fake[1]}: TRAIN (tier tokens, model smol)" in done.stderr
    metrics = json.loads(done.stdout)
    overall = metrics["overall"]
    assert (overall["problems"], overall["samples"]) == (1, 1) and metrics["ks"] == [1]
    assert [f["family"] for f in metrics["families"]] == ["reasoning_gym:chain_sum"]


def test_eval_client_refuses_a_task_with_several_rewards_and_no_reward_key(server):
    done = eval_client(
        server, "--tasks", "examples/tasks", "--harness", "oracle", "--limit", "10",
        "--concurrency", "3",
    )  # fmt: skip
    assert done.returncode == 1 and done.stdout == ""
    assert "sales-report' declares several rewards" in done.stderr


def test_eval_client_counts_failed_rollouts_as_failed_attempts_by_cause(server):
    """--reward-key correct: sales-report passes, every other bundled task has no such reward
    and fails; the failures are attempts, counted and grouped by cause (exit code 1)."""
    done = eval_client(
        server, "--tasks", "examples/tasks", "--harness", "oracle", "--limit", "10",
        "--reward-key", "correct", "--concurrency", "3", "--json",
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    metrics = json.loads(done.stdout)
    overall = metrics["overall"]
    assert (overall["problems"], overall["samples"], overall["passed"]) == (6, 6, 1)
    assert overall["failed"] == 5 and overall["pass_at"][0]["estimate"] == pytest.approx(1 / 6)
    ((cause, n),) = metrics["causes"].items()
    assert n == 5 and "reward_key 'correct' is not among the rewards" in cause


def test_eval_client_zero_reward_is_not_a_failure(server):
    done = eval_client(server, "--tasks", "examples/tasks", "--query", "count", "--harness", "nop")
    assert done.returncode == 0, done.stderr
    rows = metrics_table(done.stdout)
    assert rows["overall"] == ["1", "1", "0", "0.000", "0.000"]


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
