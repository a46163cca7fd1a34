"""collect_episodes with background=true: it returns at once, the same call again reports
progress and then the result; for clients whose tool calls time out before a collection ends."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator

import anyio
import pytest
from mcp import Client

from rollwire.server.mcp_app import ServerState, build_server
from tests.fakes.serve import serve_in_thread
from tests.fakes.vllm import FakeVLLM

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def slow_url() -> Iterator[str]:
    """An engine that takes 0.3 s a call: a 6-episode collection runs for seconds."""
    with serve_in_thread(FakeVLLM(tool_call_every_turn=True, delay_s=0.3).app) as url:
        yield url + "/v1"


@pytest.fixture
async def client(tmp_path) -> AsyncIterator[tuple[Client, ServerState]]:
    async with ServerState(data_dir=tmp_path / "data") as state:
        async with Client(build_server(state)) as c:
            yield c, state


def _args(url: str, **over) -> dict:
    return {
        "out_dir": "bg",
        "episodes": 6,
        "tasks": ["reasoning_gym:chain_sum"],
        "llm": {"url": url},
        "concurrency": 1,
        "background": True,
        **over,
    }


async def test_a_background_collection_returns_at_once_and_reports_progress_then_the_result(
    client, slow_url, tmp_path
):
    c, state = client
    first = await c.call_tool("collect_episodes", _args(slow_url))
    assert not first.is_error, first
    out = first.structured_content
    assert out["status"] == "running" and out["progress"]["total"] == 6
    assert out["progress"]["done"] < 6
    seen = [out["progress"]["done"]]
    with anyio.fail_after(120):
        while out["status"] == "running":
            await anyio.sleep(0.2)
            out = (await c.call_tool("collect_episodes", _args(slow_url))).structured_content
            if out["status"] == "running":
                seen.append(out["progress"]["done"])
    assert out["collected"] == 6 and len(out["episode_ids"]) == 6 and out["progress"] is None
    assert seen == sorted(seen) and max(seen) > 0  # progress moved while it ran
    lines = (tmp_path / "data" / "bg" / "episodes.jsonl").read_text().splitlines()
    assert len(lines) == 6
    assert state.collecting == {}  # the result was handed over once
    again = (await c.call_tool("collect_episodes", _args(slow_url))).structured_content
    assert again["status"] == "running"  # a new run: a resume that skips what is done
    with anyio.fail_after(60):
        while again["status"] == "running":
            await anyio.sleep(0.1)
            again = (await c.call_tool("collect_episodes", _args(slow_url))).structured_content
    assert again["collected"] == 0 and again["skipped_done"] == 6


async def test_a_call_with_other_arguments_while_one_runs_is_refused_naming_out_dir(
    client, slow_url
):
    c, _ = client
    await c.call_tool("collect_episodes", _args(slow_url))
    other = await c.call_tool("collect_episodes", _args(slow_url, episodes=8))
    assert other.is_error
    text = other.content[0].text
    assert "out_dir: 'bg' is being collected in the background" in text


async def test_a_blocking_call_joins_a_background_collection_and_reports_progress(client, slow_url):
    c, _ = client
    await c.call_tool("collect_episodes", _args(slow_url))
    progress: list[float] = []

    async def on_progress(done, total, message):
        progress.append(done)

    joined = await c.call_tool(
        "collect_episodes", _args(slow_url, background=False), progress_callback=on_progress
    )
    out = joined.structured_content
    assert not joined.is_error and out["status"] == "done" and out["collected"] == 6
    assert progress, "no progress while it waited"
    assert json.dumps(out)  # a plain result, as a blocking call returns


async def test_a_background_collection_that_fails_reports_its_error_on_the_next_call(client):
    c, _ = client
    bad = {**_args("http://127.0.0.1:9/v1"), "out_dir": "bad"}  # nothing listens on port 9
    first = await c.call_tool("collect_episodes", bad)
    assert first.structured_content["status"] == "running"
    with anyio.fail_after(60):
        while True:
            now = await c.call_tool("collect_episodes", bad)
            if now.is_error or now.structured_content["status"] != "running":
                break
            await anyio.sleep(0.1)
    assert now.is_error, now
    assert "CollectInputError: llm: http://127.0.0.1:9/v1 is NOT USABLE" in now.content[0].text
