"""terminus-2 on a Harbor task through the MCP run_rollout tool, against the fake vLLM (slow:
importing terminus-2 pulls in litellm)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from mcp import Client

from rollwire.server.mcp_app import ServerState, build_server
from tests.fakes.serve import serve_in_thread
from tests.fakes.vllm import FakeVLLM
from tests.harbor.test_rollout import COUNT_ERRORS

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

EXAMPLES = str(Path(__file__).resolve().parents[2] / "examples" / "tasks")


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[FakeVLLM, str]]:
    vllm = FakeVLLM()
    with serve_in_thread(vllm.app) as url:
        yield vllm, url + "/v1"


@pytest.fixture
async def client(tmp_path, monkeypatch) -> AsyncIterator[tuple[Client, ServerState]]:
    monkeypatch.setenv("ROLLWIRE_TRIALS_DIR", str(tmp_path / "trials"))
    async with ServerState() as state, Client(build_server(state), read_timeout_seconds=240) as c:
        yield c, state


async def test_terminus2_harbor_rollout_through_mcp_is_trainable_and_linked(client, fake):
    c, state = client
    vllm, url = fake
    # Certify first: the certification probes must not eat the scripted replies.
    cert = (await c.call_tool("validate_llm", {"llm_url": url})).structured_content
    assert cert["verdict"] == "TRAIN"
    vllm.reset()
    vllm.behavior.update(scripted_replies=list(COUNT_ERRORS))
    task = f"harbor:{EXAMPLES}#count-errors"
    args = {"task": task, "llm_url": url, "limits": {"max_turns": 6}, "include_tokens": True}
    out = (await c.call_tool("run_rollout", args)).structured_content
    assert out["ok"], out
    assert out["reward"] == 1.0 and out["task"] == task and out["harness"] == "terminus-2"
    assert out["tier"] == "tokens" and out["counts"]["turns"] == 3
    assert out["counts"]["trainable_sequences"] == 1 and len(out["sequences"]) == 1
    assert state.pool.certify_calls == 1  # validate_llm's certification was reused
    graph = (
        await c.call_tool("get_rollout_graph", {"rollout_id": out["rollout_id"]})
    ).structured_content
    assert [(e["source"], e["target"]) for e in graph["edges"]] == [("t1", "t2"), ("t2", "t3")]
    assert graph["retokenized"] == [] and graph["discarded"] == []
