"""``serve --call-log``: one JSON line per tool call, as the server received it (over stdio)."""

from __future__ import annotations

import json
import sys

import pytest
from mcp import Client, StdioServerParameters

pytestmark = pytest.mark.anyio


async def test_the_call_log_records_client_arguments_progress_and_errors(tmp_path):
    log = tmp_path / "calls.jsonl"
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "rollwire", "serve", "--stdio", "--data-dir", str(tmp_path), "--call-log", str(log)],
    )  # fmt: skip

    async def on_progress(done, total, message):
        pass

    async with Client(params, read_timeout_seconds=60) as client:
        await client.call_tool("list_rollouts", {"status": "done"}, progress_callback=on_progress)
        await client.call_tool("list_rollouts", {})
        await client.call_tool("get_rollout", {"rollout_id": "nope"})
    first, second, third = (json.loads(line) for line in log.read_text().splitlines())
    assert first["client"] == {"name": "mcp", "version": first["client"]["version"]}
    assert (first["tool"], first["arguments"], first["progress"], first["ok"]) == (
        "list_rollouts",
        {"status": "done"},
        True,
        True,
    )
    assert (second["arguments"], second["progress"]) == ({}, False)
    assert third["ok"] is False and "no rollout 'nope'" in third["error"]
