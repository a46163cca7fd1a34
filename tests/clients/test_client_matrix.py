"""Real MCP clients drive rollwire's tools: Claude Code, Gemini CLI, Qwen Code, opencode and
Codex (each from npm, as rollwire installs them for Harbor) and the MCP Inspector's CLI.

Every client gets the config block the docs show (``examples/mcp_clients``), over stdio and
over streamable HTTP with a bearer token, and its model is a scripted policy behind the capture
proxy, reached in the wire dialect the client speaks. What arrived is read from rollwire's side
(``serve --call-log``: each call's client, tool and arguments as received) and what the model
saw from the client's own requests to its model (every tool result it read).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from rollwire.capture.proxy import CaptureProxy, ProxyConfig
from rollwire.capture.rollout import CaptureLevel
from rollwire.harnesses.harbor.installs import Installed, ensure_installed
from tests.clients.matrix import CLIENTS, INSPECTOR, ROOT, Launch, transcript_results
from tests.clients.policy import ScriptedPolicy, Step, bare_tool, field_in_results
from tests.fakes.serve import serve_in_thread
from tests.fakes.vllm import FakeVLLM
from tests.tools.test_mcp_inmemory import TOOLS

pytestmark = pytest.mark.slow

TOKEN = "matrix-token-0123456789"
ADMIN = "matrix-admin-key"
PROMPT = "Use the rollwire MCP server: find chain_sum, run it, collect a small dataset."
UNKNOWN_FAMILY = "unknown env family 'no_such_family'"


def _done(text: str) -> bool:
    return re.search(r"status\W+done", text) is not None


def plan(engine: str) -> list[Step]:
    """The six tools of the issue, an error on the way, and a background collection polled to
    its end; get_rollout_graph's id is read from run_rollout's result as the model saw it."""
    llm = {"url": engine}
    chain = ["reasoning_gym:chain_sum"]
    return [
        Step("list_tasks", {"source": "reasoning_gym", "query": "chain_sum", "limit": 5}),
        Step("validate_llm", {"llm_url": engine}),
        Step("run_rollout", {"task": chain[0], "llm": llm, "seed": 3}),
        Step(
            "get_rollout_graph",
            lambda r: {"rollout_id": field_in_results("rollout_id")(r), "format": "mermaid"},
        ),
        Step("run_rollout", {"task": "no_such_family:x", "llm": llm}),
        Step("collect_episodes", {"out_dir": "matrix", "episodes": 2, "tasks": chain, "llm": llm}),
        Step(
            "collect_episodes",
            {"out_dir": "matrix-bg", "episodes": 2, "tasks": chain, "llm": llm, "background": True},
            until=_done,
        ),
        Step("push_dataset", {"out_dir": "matrix", "repo_id": "me/matrix", "dry_run": True}),
    ]


@pytest.fixture(scope="module")
def installs() -> dict[str, Installed]:
    """Every client, installed once per host (the Harbor tests share these installs)."""

    async def all_of_them() -> dict[str, Installed]:
        out = {}
        for name, client in CLIENTS.items():
            out[name] = await ensure_installed(client.package)
        out["inspector"] = await ensure_installed(INSPECTOR)
        return out

    return anyio.run(all_of_them)


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    """The engine the rollouts run on (not the clients' model)."""
    with serve_in_thread(FakeVLLM(tool_call_every_turn=True).app) as url:
        yield url + "/v1"


def _path(installed: Installed) -> str:
    return ":".join([*(str(p) for p in installed.bin_dirs), os.environ.get("PATH", "")])


def _server_args(tmp: Path) -> list[str]:
    return ["--data-dir", str(tmp / "collections"), "--call-log", str(tmp / "calls.jsonl")]


class HttpServer:
    """``rollwire serve --http`` on a free loopback port, with a bearer token."""

    def __init__(self, tmp: Path) -> None:
        argv = [sys.executable, "-m", "rollwire", "serve", "--http", "--port", "0"]
        self.proc = subprocess.Popen(
            [*argv, "--token", TOKEN, *_server_args(tmp)],
            cwd=ROOT,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stderr is not None
        line = ""
        deadline = time.monotonic() + 60
        while "MCP server on" not in line:
            line = self.proc.stderr.readline()
            if (not line and self.proc.poll() is not None) or time.monotonic() > deadline:
                raise AssertionError(f"serve --http did not start: {line!r}")
        m = re.search(r"(http://\S+/mcp)", line)
        assert m is not None, line
        self.url = m.group(1)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


@pytest.fixture
def model() -> Iterator[tuple[ScriptedPolicy, str, str]]:
    """A capture proxy in front of a fake engine whose replies a scripted policy writes; the
    policy's plan is set by the test. Yields the policy, the proxy's URL and a session key."""
    policy = ScriptedPolicy([])
    brain = FakeVLLM(policy=policy, max_model_len=1_000_000)
    with serve_in_thread(brain.app) as brain_url:
        proxy = CaptureProxy(
            ProxyConfig(
                llm_url=brain_url + "/v1", capture_level=CaptureLevel.TOKENS, admin_key=ADMIN
            )
        )
        with serve_in_thread(proxy.app) as url:
            session = httpx.post(
                f"{url}/sessions", headers={"Authorization": f"Bearer {ADMIN}"}
            ).json()["session_id"]
            yield policy, url, session


def run_client(
    name: str, transport: str, tmp: Path, installed: Installed, policy_url: str, key: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    client = CLIENTS[name]
    work, home = tmp / "work", tmp / "home"
    work.mkdir()
    home.mkdir()
    server = HttpServer(tmp) if transport == "http" else None
    try:
        launch = Launch(
            work=work,
            home=home,
            transport=transport,
            extra_args=tuple(_server_args(tmp)),
            mcp_url=server.url if server else None,
            token=TOKEN if server else None,
            model_url=policy_url,
            key=key,
            prompt=PROMPT,
            tools=tuple(sorted(TOOLS)),
        )
        argv, env = client.launch(launch)
        env["PATH"] = _path(installed)
        done = subprocess.run(
            argv, env=env, cwd=work, capture_output=True, text=True, timeout=300, check=False
        )
    finally:
        if server is not None:
            server.stop()
    return done, tmp / "calls.jsonl"


def _log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _offered(requests: list[dict[str, Any]]) -> set[str]:
    """rollwire tools the model was offered by name, or shown by a tool search."""
    seen: set[str] = set()
    for body in requests:
        for tool in body.get("tools") or ():
            seen.add(bare_tool("rollwire", str((tool.get("function") or {}).get("name")), {}))
        for message in body.get("messages") or ():
            if message.get("role") == "tool":
                text = json.dumps(message.get("content"))
                seen.update(t for t in TOOLS if f"rollwire__{t}" in text)
    return seen & TOOLS


CALLING = [
    (name, transport)
    for name, client in CLIENTS.items()
    if client.calls_tools
    for transport in ("stdio", "http")
]


@pytest.mark.parametrize(("name", "transport"), CALLING, ids=[f"{n}-{t}" for n, t in CALLING])
def test_a_client_drives_every_tool_and_its_model_reads_every_result(
    name, transport, installs, engine, model, tmp_path
):
    policy, url, key = model
    policy.steps = plan(engine)
    done, log_path = run_client(name, transport, tmp_path, installs[name], url, key)
    (tmp_path / "model_requests.json").write_text(json.dumps(policy.requests, default=str))
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert "DONE" in done.stdout  # the model's final answer reached the client's output

    # rollwire's side: every call, from this client, with the arguments the model wrote
    log = _log(log_path)
    assert [(e["tool"], e["arguments"]) for e in log] == policy.sent
    assert {e["client"]["name"] for e in log} == {CLIENTS[name].client_info}
    assert all(e["progress"] for e in log)  # each call carries a progress token
    assert [e["tool"] for e in log if not e["ok"]] == ["run_rollout"]
    assert UNKNOWN_FAMILY in next(e["error"] for e in log if not e["ok"])
    assert sum(e["tool"] == "collect_episodes" for e in log) >= 3  # a blocking one, then polls

    # the model's side: what it was offered and what it read
    assert _offered(policy.requests) == TOOLS
    results = transcript_results(policy.requests)
    assert any(UNKNOWN_FAMILY in r for r in results)  # the error is readable
    assert any(re.search(r"status\W+running", r) for r in results)
    assert any(_done(r) for r in results)
    assert any("data/train-00000-of-00001.parquet" in r for r in results)  # the dry run's plan
    for out_dir in ("matrix", "matrix-bg"):
        lines = (tmp_path / "collections" / out_dir / "episodes.jsonl").read_text().splitlines()
        assert len(lines) == 2, out_dir


def _inspector(installs, *args: str, target: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": _path(installs["inspector"])}
    argv = ["mcp-inspector", "--cli", *target, *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180, cwd=ROOT)


@pytest.fixture(params=["stdio", "http"])
def inspector_target(request, tmp_path) -> Iterator[tuple[list[str], Path]]:
    if request.param == "stdio":
        yield (
            [sys.executable, "-m", "rollwire", "serve", "--stdio", *_server_args(tmp_path)],
            (tmp_path / "calls.jsonl"),
        )
        return
    server = HttpServer(tmp_path)
    try:
        yield [server.url, "--header", f"Authorization: Bearer {TOKEN}"], tmp_path / "calls.jsonl"
    finally:
        server.stop()


def test_the_inspector_finds_no_schema_error_and_warns_only_on_nullable_outputs(
    installs, inspector_target
):
    """``--strict`` exits 6 on an error-severity portability problem. Its warnings are all of
    one kind: a nullable output field written as a list of types (no input schema has one,
    and no client in the matrix rejects them; docs/guides/mcp-clients.md says so)."""
    target, _ = inspector_target
    done = _inspector(installs, "--method", "tools/list", "--strict", target=target)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"\b0 errors, \d+ warnings", done.stderr), done.stderr[-3000:]
    paths = re.findall(r"Path: (\S+)", done.stderr)
    issues = re.findall(r"Issue: (.*)", done.stderr)
    assert paths and all(p.startswith("outputSchema.properties.") for p in paths), paths
    assert all(i.startswith("`type` is an array") and '"null"]' in i for i in issues), issues
    assert {t["name"] for t in json.loads(done.stdout)["tools"]} == TOOLS


def test_the_inspector_calls_each_tool_with_arguments_intact(installs, inspector_target, engine):
    target, log_path = inspector_target
    calls: list[tuple[str, list[str]]] = [
        ("list_tasks", ["source=reasoning_gym", "query=chain_sum"]),
        ("validate_llm", [f"llm_url={engine}"]),
        ("run_rollout", ["task=reasoning_gym:chain_sum", f"llm_url={engine}", "seed=3"]),
        (
            "collect_episodes",
            [
                "out_dir=insp",
                "episodes=2",
                'tasks=["reasoning_gym:chain_sum"]',
                f"llm_url={engine}",
            ],
        ),
        ("push_dataset", ["out_dir=insp", "repo_id=me/insp", "dry_run=true"]),
    ]
    outputs = {}
    for tool, pairs in calls:
        done = _inspector(
            installs, "--method", "tools/call", "--tool-name", tool, "--tool-arg", *pairs,
            target=target,
        )  # fmt: skip
        assert done.returncode == 0, (tool, done.stdout[-2000:], done.stderr[-2000:])
        outputs[tool] = json.loads(done.stdout)
        assert not outputs[tool].get("isError"), outputs[tool]
    rollout = outputs["run_rollout"]["structuredContent"]
    graph = _inspector(
        installs, "--method", "tools/call", "--tool-name", "get_rollout_graph",
        "--tool-arg", f"rollout_id={rollout['rollout_id']}", target=target,
    )  # fmt: skip
    if "--header" in target:  # one HTTP server holds the rollout between calls
        got = json.loads(graph.stdout)["structuredContent"]
        assert got["rollout_id"] == rollout["rollout_id"]
    else:  # each stdio call is a new server process: the rollout is not in its memory
        assert f"rollout_id: no rollout {rollout['rollout_id']!r}" in graph.stdout + graph.stderr
    bad = _inspector(
        installs, "--method", "tools/call", "--tool-name", "run_rollout",
        "--tool-arg", "task=no_such_family:x", target=target,
    )  # fmt: skip
    assert UNKNOWN_FAMILY in bad.stdout + bad.stderr
    log = _log(log_path)
    assert [e["tool"] for e in log] == [
        *(tool for tool, _ in calls),
        "get_rollout_graph",
        "run_rollout",
    ]
    assert log[2]["arguments"] == {
        "task": "reasoning_gym:chain_sum",
        "llm_url": engine,
        "seed": 3,
    }  # numbers typed as numbers, strings as strings
    assert log[3]["arguments"]["tasks"] == ["reasoning_gym:chain_sum"]
    assert outputs["collect_episodes"]["structuredContent"]["collected"] == 2
