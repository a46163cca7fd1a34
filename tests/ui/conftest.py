"""A real ``rollwire serve --http`` (its own process, with a token) over two fake vLLM engines,
with the rollouts the UI tests look at already run through its MCP endpoint:

* ``fragmented``: engine A has no ``/tokenize`` (so no token-in) and samples a word as two pieces
  that the next prompt re-tokenises as one: the conversation splits into two roots;
* ``token_in``: engine B takes token prompts: one spliced sequence, with top candidates kept;
* ``failed``: an engine nobody answers at: ok false, no document;
* a collection of six reasoning-gym episodes (two of them failed by engine B's 500s) under
  ``--data-dir``;
* and, for the tests that ask for them (``evals``), three ``rollwire eval`` folders under
  ``--data-dir``'s ``evals/``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from starlette.responses import JSONResponse

from tests.fakes.serve import serve_in_thread
from tests.fakes.vllm import FakeVLLM

TOKEN = "ui-test-token-0123456789"
ROOT = Path(__file__).resolve().parents[2]
TASK = "textarena:GuessTheNumber-v0"


def without_tokenize(app: Any) -> Any:
    """The engine as a server without ``/tokenize`` (404, as vLLM answers an unknown route)."""

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/tokenize":
            await JSONResponse({"detail": "Not Found"}, 404)(scope, receive, send)
            return
        await app(scope, receive, send)

    return asgi


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class UIServer:
    root: str
    engine_a: str
    engine_b: str
    fake_b: FakeVLLM
    rollouts: dict[str, dict[str, Any]]
    collection: str
    data_dir: Path
    proc: subprocess.Popen[str]


async def _mcp(root: str, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    out = []
    async with httpx2.AsyncClient(headers=headers, timeout=300) as http:
        async with Client(streamable_http_client(f"{root}/mcp", http_client=http)) as client:
            for name, args in calls:
                result = await client.call_tool(name, args)
                out.append(result)
    return out


@pytest.fixture(scope="package")
def ui_server(tmp_path_factory) -> Iterator[UIServer]:
    tmp = tmp_path_factory.mktemp("ui")
    fake_b = FakeVLLM()
    with (
        serve_in_thread(without_tokenize(FakeVLLM(noncanonical_split=True).app)) as a,
        serve_in_thread(fake_b.app) as b,
    ):
        port = free_port()
        env = {**os.environ, "ROLLWIRE_TRIALS_DIR": str(tmp / "trials")}
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rollwire",
                "serve",
                "--http",
                "--port",
                str(port),
                "--token",
                TOKEN,
                "--data-dir",
                str(tmp / "collections"),
                "--llm-url",
                f"{b}/v1",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        root = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                try:
                    if httpx.get(f"{root}/health", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "rollwire serve --http did not start"
                time.sleep(0.1)
            common = {"task": TASK, "answer_mode": "text", "limits": {"max_turns": 3}}
            fragmented, token_in, failed = anyio.run(
                _mcp,
                root,
                [
                    ("run_rollout", {**common, "llm_url": f"{a}/v1"}),
                    (
                        "run_rollout",
                        {**common, "llm_url": f"{b}/v1", "sampling": {"top_logprobs": 3}},
                    ),
                    ("run_rollout", {**common, "llm_url": "http://127.0.0.1:9/v1"}),
                ],
            )
            fake_b.behavior.update(
                fail_status=500, fail_count=2
            )  # the collection's first two calls
            (collected,) = anyio.run(
                _mcp,
                root,
                [
                    (
                        "collect_episodes",
                        {
                            "out_dir": "gsm-like",
                            "episodes": 6,
                            "tasks": ["reasoning_gym:chain_sum"],
                            "answer_mode": "text",
                            "concurrency": 1,
                            "llm_url": f"{b}/v1",
                        },
                    )
                ],
            )
            assert not collected.is_error, collected.content
            rollouts = {
                "fragmented": fragmented.structured_content,
                "token_in": token_in.structured_content,
                "failed": failed.structured_content,
            }
            yield UIServer(
                root=root,
                engine_a=f"{a}/v1",
                engine_b=f"{b}/v1",
                fake_b=fake_b,
                rollouts=rollouts,
                collection="gsm-like",
                data_dir=tmp / "collections",
                proc=proc,
            )
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def authed() -> httpx.Client:
    return httpx.Client(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)


#: ``rollwire eval`` runs over the bundled Harbor tasks (no engine: the harness is the agent), two
#: samples per problem, pass@1 and pass@2
EVAL_RUNS = {
    # count-errors, fix-median, inventory-steps, organize-files: every reward 0
    "nop": ["--tasks", "[cfio]*", "--harness", "nop"],
    # the same four problems solved: every reward 1
    "oracle": ["--tasks", "[cfio]*", "--harness", "oracle"],
    # sales-report too, scored by a reward only it has: one problem passes, the four others'
    # eight samples are failed attempts by one cause; other tasks than nop's, so no pairing
    "mixed": ["--tasks", "[cfios]*", "--harness", "oracle", "--reward-key", "correct"],
}


@pytest.fixture(scope="package")
def evals(ui_server, tmp_path_factory) -> dict[str, str]:
    """The :data:`EVAL_RUNS` as eval folders ``evals/<name>`` in the server's data directory
    (made by ``rollwire eval`` itself, side by side, ~3 s); their names as the UI shows them."""
    tmp = tmp_path_factory.mktemp("evals")
    procs = {
        name: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rollwire",
                "eval",
                "--dataset",
                "examples/tasks",  # relative to cwd: the family is harbor:examples/tasks
                *args,
                "--samples",
                "2",
                "--k",
                "1,2",
                "--out",
                str(ui_server.data_dir / "evals" / name),
                "--no-progress",
            ],
            cwd=ROOT,
            env={**os.environ, "ROLLWIRE_TRIALS_DIR": str(tmp / name)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, args in EVAL_RUNS.items()
    }
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, (name, out, err)
    return {name: f"evals/{name}" for name in EVAL_RUNS}
