"""A scripted "agent curating data": it decides from tool outputs alone, and those outputs stay
compact (a 20-turn rollout's result without tokens is a few KB)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator

import pytest
from mcp import Client

from rollwire.server.mcp_app import ServerState, build_server
from tests.fakes.serve import serve_in_thread
from tests.fakes.vllm import FakeVLLM

pytestmark = pytest.mark.anyio

TURNS = 20
# A call of a tool the env does not offer: an error result, and the episode goes on.
WRONG_CALL = '<tool_call>\n{"name": "scratchpad", "arguments": {"note": "think"}}\n</tool_call>'
ANSWER = '<tool_call>\n{"name": "answer", "arguments": {"answer": "42"}}\n</tool_call>'
MAX_RESULT_BYTES = 4096


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[FakeVLLM, str]]:
    vllm = FakeVLLM()
    with serve_in_thread(vllm.app) as url:
        yield vllm, url + "/v1"


@pytest.fixture
async def client(tmp_path, monkeypatch) -> AsyncIterator[Client]:
    monkeypatch.setenv("ROLLWIRE_TRIALS_DIR", str(tmp_path / "trials"))
    async with ServerState() as state, Client(build_server(state)) as c:
        yield c


async def call(client: Client, tool: str, args: dict) -> tuple[dict, int]:
    """The structured result and the size of what the tool returned as text."""
    result = await client.call_tool(tool, args)
    assert not result.is_error, result
    text = "".join(getattr(c, "text", "") for c in result.content)
    return result.structured_content, len(text.encode())


async def test_an_agent_curates_a_20_turn_rollout_from_compact_tool_outputs(client, fake):
    vllm, url = fake
    # 1. What is there to run?
    page, _ = await call(client, "list_tasks", {"source": "reasoning_gym", "query": "chain_sum"})
    task = next(t["ref"] for t in page["tasks"] if t["name"] == "chain_sum")
    # 2. Is this engine good for training data?
    cert, _ = await call(client, "validate_llm", {"llm_url": url})
    assert cert["verdict"] == "TRAIN"  # an agent would stop here on EVAL ONLY / NOT USABLE
    # 3. Run one long episode.
    vllm.behavior.update(scripted_replies=[WRONG_CALL] * (TURNS - 1) + [ANSWER])
    out, size = await call(
        client,
        "run_rollout",
        {"task": task, "llm_url": url, "seed": 1, "limits": {"max_turns": TURNS}},
    )
    assert out["counts"]["turns"] == TURNS and out["counts"]["tool_calls"] == TURNS
    assert out["stop_reason"] == "done" and out["sequences"] is None
    assert size < MAX_RESULT_BYTES, f"run_rollout result is {size} bytes"
    assert len(json.dumps(out).encode()) < MAX_RESULT_BYTES  # the structured copy too
    # 4. Inspect: one unbroken agent sequence, or fragments?
    graph, _ = await call(client, "get_rollout_graph", {"rollout_id": out["rollout_id"]})
    assert graph["roles"] == {"agent": TURNS}
    assert graph["retokenized"] == [] and graph["discarded"] == []
    # 5. Decide, from those outputs alone.
    fatal = [f for f in out["findings"] if f["level"] == "FATAL"]
    keep = (
        out["ok"]
        and out["reward"] is not None
        and out["counts"]["trainable_sequences"] == 1
        and not fatal
        and not graph["retokenized"]
    )
    assert keep, json.dumps(out, indent=1)
    assert out["reward"] == 0.0  # "42" is wrong: a real, verified zero, kept for training
