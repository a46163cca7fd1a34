"""The MCP server over streamable HTTP (uvicorn on loopback), with and without bearer auth."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import httpx2
import openai
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from rollwire.server import cli
from rollwire.server.mcp_app import ServerState, build_server, http_app
from rollwire.tools.endpoint import EndpointPool
from rollwire.tools.rollouts import LLMSpec
from tests.fakes.serve import serve_in_thread
from tests.fakes.vllm import FakeVLLM
from tests.tools.every_tool import exercise_every_tool, make_slow_task, sleepers

pytestmark = pytest.mark.anyio

EXAMPLES = str(Path(__file__).resolve().parents[2] / "examples" / "tasks")
TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def fake_url() -> Iterator[str]:
    with serve_in_thread(FakeVLLM(tool_call_every_turn=True).app) as url:
        yield url + "/v1"


@pytest.fixture
def served(tmp_path, monkeypatch) -> Iterator[tuple[str, ServerState]]:
    monkeypatch.setenv("ROLLWIRE_TRIALS_DIR", str(tmp_path / "trials"))
    state = ServerState(data_dir=tmp_path / "collections", dataset_roots=(tmp_path,))
    with serve_in_thread(http_app(build_server(state))) as url:
        yield url + "/mcp", state


@pytest.fixture
def served_with_token() -> Iterator[str]:
    with serve_in_thread(http_app(build_server(), token=TOKEN)) as url:
        yield url + "/mcp"


async def test_http_run_rollout_with_progress_graph_and_document(served, fake_url):
    url, state = served
    progress: list[float] = []

    async def on_progress(done, total, message):
        progress.append(done)

    async with Client(url) as client:
        result = await client.call_tool(
            "run_rollout",
            {"task": "reasoning_gym:chain_sum", "llm_url": fake_url, "include_tokens": True},
            progress_callback=on_progress,
        )
        out = result.structured_content
        assert out["ok"] and out["sequences"], out
        graph = (
            await client.call_tool(
                "get_rollout_graph", {"rollout_id": out["rollout_id"], "format": "mermaid"}
            )
        ).structured_content
        assert graph["mermaid"].startswith("flowchart TD")
        read = await client.read_resource(f"rollout://{out['rollout_id']}/document")
        assert json.loads(read.contents[0].text)["stats"]["turns"] == out["counts"]["turns"]

        oracle = (
            await client.call_tool(
                "run_rollout", {"task": f"harbor:{EXAMPLES}#count-errors", "harness": "oracle"}
            )
        ).structured_content
        assert oracle["ok"] and oracle["reward"] == 1.0

        bad = await client.call_tool("list_tasks", {"limit": -5})
        assert bad.is_error and "\nlimit\n" in bad.content[0].text
    assert 0 in progress and 4 in progress
    assert len(state.store) == 2


async def test_http_bearer_token_is_required_when_set(served_with_token):
    url = served_with_token
    async with httpx.AsyncClient() as plain:
        assert (await plain.post(url, json={})).status_code == 401
        wrong = await plain.post(url, json={}, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            page = (
                await client.call_tool("list_tasks", {"source": EXAMPLES, "limit": 2})
            ).structured_content
            assert len(page["tasks"]) == 2 and page["next_offset"] == 2


def test_off_loopback_serve_generates_and_prints_missing_secrets():
    token, admin, notes = cli.http_secrets("0.0.0.0", None, None)
    assert token and admin and token != admin and len(token) >= 32
    assert token in notes[0] and admin in notes[1]
    assert cli.http_secrets("0.0.0.0", "t", "a") == ("t", "a", [])
    assert cli.http_secrets("127.0.0.1", None, None) == (None, None, [])
    assert cli.http_secrets("127.0.0.1", "t", None) == ("t", "t", [])  # --token guards /capture


def test_serve_needs_a_transport(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["serve"])
    assert exc.value.code == 2


def test_rollwire_serve_http_process_requires_its_token(tmp_path):
    """``rollwire serve --http`` as a process: banner on stderr, nothing on stdout, 401 without
    the token, a working MCP session with it."""
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollwire", "serve", "--http", "--port", "0", "--token", TOKEN],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "ROLLWIRE_TRIALS_DIR": str(tmp_path / "trials")},
    )
    try:
        assert proc.stderr is not None
        seen = []
        for _ in range(20):
            line = proc.stderr.readline()
            seen.append(line)
            if "rollwire MCP server on" in line or not line:
                break
        banner = seen[-1]
        assert "rollwire MCP server on http://127.0.0.1:" in banner, seen
        url = banner.split(" on ", 1)[1].split()[0]
        assert url.endswith("/mcp")
        assert httpx.post(url, json={}).status_code == 401
        assert anyio.run(_tool_names_with_token, url) >= {"run_rollout", "list_tasks"}
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
    assert out == ""  # stdout stays clean: logs go to stderr


async def _tool_names_with_token(url: str) -> set[str]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            return {t.name for t in (await client.list_tools()).tools}


INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "0"},
    },
}


@pytest.mark.parametrize(("loopback", "status"), [(True, 421), (False, 200)])
def test_off_loopback_the_token_not_the_host_header_guards_the_server(loopback, status):
    """On loopback the SDK refuses foreign Host headers (DNS rebinding); off loopback a client
    reaches the server by a public name, and the bearer token is the guard."""
    headers = {
        "Host": "rollwire.example:8400",
        "Authorization": f"Bearer {TOKEN}",
        "Accept": "application/json, text/event-stream",
    }
    with serve_in_thread(http_app(build_server(), token=TOKEN, loopback=loopback)) as url:
        reply = httpx.post(url + "/mcp", json=INIT, headers=headers)
        assert reply.status_code == status, reply.text
        no_token = {k: v for k, v in headers.items() if k != "Authorization"}
        assert httpx.post(url + "/mcp", json=INIT, headers=no_token).status_code == 401


ADMIN = "admin-key"


@pytest.fixture
def served_with_default_llm(tmp_path, monkeypatch, fake_url) -> Iterator[tuple[str, ServerState]]:
    """``rollwire serve --http --llm-url <fake> --admin-key ...``, in a thread."""
    monkeypatch.setenv("ROLLWIRE_TRIALS_DIR", str(tmp_path / "trials"))
    state = ServerState(pool=EndpointPool(admin_key=ADMIN), default_llm=LLMSpec(url=fake_url))
    with serve_in_thread(http_app(build_server(state))) as url:
        yield url, state


async def test_http_server_hosts_health_and_the_default_engines_capture_proxy(
    served_with_default_llm,
):
    """One port: /mcp, /health, and the --llm-url engine's capture proxy at /capture, where an
    agent outside rollwire records its calls with a session key the control plane minted."""
    root, state = served_with_default_llm
    async with httpx.AsyncClient() as http:
        health = (await http.get(root + "/health")).json()
        assert health["status"] == "ok" and health["capture"] == "/capture/v1"
        async with Client(root + "/mcp") as client:  # no llm given: the server's default engine
            out = (
                await client.call_tool("run_rollout", {"task": "reasoning_gym:chain_sum"})
            ).structured_content
        assert out["ok"] and out["tier"] == "tokens", out

        capture = root + "/capture"
        assert (await http.post(capture + "/sessions", json={})).status_code == 401  # admin
        admin = {"Authorization": f"Bearer {ADMIN}"}
        key = (await http.post(capture + "/sessions", json={}, headers=admin)).json()["session_id"]
        agent = openai.AsyncOpenAI(base_url=capture + "/v1", api_key=key)
        reply = await agent.chat.completions.create(
            model="any", messages=[{"role": "user", "content": "Hi"}], max_tokens=8
        )
        assert reply.choices[0].message.content
        rollout = (await http.get(f"{capture}/sessions/{key}/rollout", headers=admin)).json()
        assert rollout["stats"]["turns"] == 1 and rollout["stats"]["trainable_tokens"] > 0
        stranger = openai.AsyncOpenAI(
            base_url=capture + "/v1", api_key="not-a-session", max_retries=0
        )
        with pytest.raises(openai.AuthenticationError):
            await stranger.chat.completions.create(
                model="any", messages=[{"role": "user", "content": "x"}]
            )
    assert state.pool.n_proxies == 1  # the MCP rollout and the agent share one proxy


def test_capture_without_a_default_engine_says_how_to_get_one():
    with serve_in_thread(http_app(build_server(ServerState()))) as root:
        reply = httpx.get(root + "/capture/v1/models")
        assert reply.status_code == 404 and "--llm-url" in reply.json()["error"]
        assert httpx.get(root + "/health").json()["capture"] is None


async def test_every_tool_over_http(served, fake_url, tmp_path):
    url, state = served
    async with Client(url) as client:
        await exercise_every_tool(client, fake_url, make_slow_task(tmp_path))
    assert sleepers() == [] and state.jobs.running == 0
