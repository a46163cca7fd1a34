"""Rollouts as owned jobs: start/get/cancel/list, and cancellation that really cleans up (the
sandbox's processes and root are gone, the capture session is closed, nothing is stored)."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest
from mcp import Client

from rollwire.server.mcp_app import ServerState, build_server
from tests.fakes.serve import serve_in_thread
from tests.fakes.vllm import FakeVLLM

pytestmark = pytest.mark.anyio

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"
MARK = "317"  # the slow task sleeps this long: its process is findable by its command line


def sleepers() -> list[int]:
    """Host pids of the slow task's ``sleep``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if (proc / "cmdline").read_bytes() == f"sleep\0{MARK}\0".encode():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def sandbox_roots(sbx: Path) -> list[Path]:
    return sorted(sbx.glob("rollwire-sbx-*")) if sbx.exists() else []


@pytest.fixture
def slow_task(tmp_path) -> str:
    """A Harbor task whose solution sleeps: the oracle keeps its sandbox busy."""
    task = tmp_path / "slow-task"
    shutil.copytree(EXAMPLES / "count-errors", task)
    (task / "solution" / "solve.sh").write_text(f"#!/bin/bash\nsleep {MARK}\n")
    return f"harbor:{task}#slow-task"


@pytest.fixture
def sbx(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("ROLLWIRE_TRIALS_DIR", str(tmp_path / "trials"))
    monkeypatch.setenv("ROLLWIRE_SANDBOX_DIR", str(tmp_path / "sbx"))
    return tmp_path / "sbx"


@pytest.fixture(scope="module")
def fast_url() -> Iterator[str]:
    with serve_in_thread(FakeVLLM(tool_call_every_turn=True).app) as url:
        yield url + "/v1"


@pytest.fixture(scope="module")
def slow_url() -> Iterator[tuple[str, FakeVLLM]]:
    """An engine that takes 30 s per generation (certification's probes included)."""
    fake = FakeVLLM(tool_call_every_turn=True)
    with serve_in_thread(fake.app) as url:
        yield url + "/v1", fake


@pytest.fixture
async def served(sbx) -> AsyncIterator[tuple[Client, ServerState]]:
    async with (
        ServerState(dataset_roots=(sbx.parent,)) as state,
        Client(build_server(state)) as client,
    ):
        yield client, state


async def wait_for(predicate, timeout_s: float = 60.0, what: str = "condition") -> None:
    with anyio.fail_after(timeout_s):
        while not predicate():  # noqa: ASYNC110 - polls state outside the event loop
            await anyio.sleep(0.1)


async def status_of(client: Client, rollout_id: str) -> dict:
    return (await client.call_tool("get_rollout", {"rollout_id": rollout_id})).structured_content


async def test_start_rollout_returns_at_once_and_get_rollout_reports_the_result(served, fast_url):
    client, _ = served
    args = {"task": "reasoning_gym:chain_sum", "llm": fast_url, "seed": 5}
    started = (await client.call_tool("start_rollout", args)).structured_content
    assert started["status"] == "running" and started["result"] is None
    rollout_id = started["rollout_id"]
    with anyio.fail_after(60):
        while (now := await status_of(client, rollout_id))["status"] == "running":  # noqa: ASYNC110
            await anyio.sleep(0.05)
    assert now["status"] == "done" and now["progress"]["message"] == "done"
    assert now["progress"]["done"] == now["progress"]["total"] == 4
    assert now["result"]["ok"] and now["result"]["rollout_id"] == rollout_id
    assert now["result"]["seed"] == 5 and now["result"]["counts"]["turns"] >= 1
    graph = (
        await client.call_tool("get_rollout_graph", {"rollout_id": rollout_id})
    ).structured_content
    assert len(graph["nodes"]) == now["result"]["counts"]["turns"]
    listed = (await client.call_tool("list_rollouts", {})).structured_content
    assert [r["rollout_id"] for r in listed["rollouts"]] == [rollout_id]
    assert listed["counts"] == {"done": 1} and listed["rollouts"][0]["result"] is None


async def test_list_rollouts_shows_held_and_background_rollouts_newest_first(served, fast_url):
    client, _ = served
    args = {"task": "reasoning_gym:chain_sum", "llm_url": fast_url}
    held = (await client.call_tool("run_rollout", args)).structured_content
    background = (await client.call_tool("start_rollout", args)).structured_content
    with anyio.fail_after(60):
        while (await status_of(client, background["rollout_id"]))["status"] == "running":  # noqa: ASYNC110
            await anyio.sleep(0.05)
    listed = (await client.call_tool("list_rollouts", {"status": "done"})).structured_content
    ids = [r["rollout_id"] for r in listed["rollouts"]]
    assert ids == [background["rollout_id"], held["rollout_id"]]


async def test_get_and_cancel_of_unknown_rollouts_name_the_field(served):
    client, _ = served
    for tool in ("get_rollout", "cancel_rollout"):
        result = await client.call_tool(tool, {"rollout_id": "nope"})
        assert result.is_error and "rollout_id: no rollout 'nope'" in result.content[0].text
    bad = await client.call_tool("list_rollouts", {"status": "sleeping"})
    assert bad.is_error
    start_bad = await client.call_tool("start_rollout", {"task": "reasoning_gym:nope"})
    assert start_bad.is_error and "task: " in start_bad.content[0].text
    assert (await client.call_tool("list_rollouts", {})).structured_content["rollouts"] == []


async def test_cancel_rollout_stops_an_env_rollout_and_closes_its_capture_session(served, slow_url):
    client, state = served
    url, fake = slow_url
    cert = (await client.call_tool("validate_llm", {"llm_url": url})).structured_content
    assert cert["verdict"] == "TRAIN"
    fake.behavior.update(delay_s=30.0)
    try:
        args = {"task": "reasoning_gym:chain_sum", "llm_url": url}
        rollout_id = (await client.call_tool("start_rollout", args)).structured_content[
            "rollout_id"
        ]

        def sessions() -> list:
            return [s for e in state.pool._endpoints.values() for s in e.proxy.sessions.all()]

        await wait_for(lambda: len(sessions()) == 1, what="the capture session opens")
        with anyio.fail_after(20):  # far less than the engine's 30 s
            out = (
                await client.call_tool("cancel_rollout", {"rollout_id": rollout_id})
            ).structured_content
        assert out["status"] == "cancelled" and out["result"] is None
        assert sessions() == []  # the agent's key no longer works
        assert state.store.get(rollout_id) is None  # nothing half-written
        graph = await client.call_tool("get_rollout_graph", {"rollout_id": rollout_id})
        assert graph.is_error
    finally:
        fake.behavior.update(delay_s=0.0)


async def test_cancel_rollout_tears_down_the_harbor_sandbox(served, sbx, slow_task):
    client, state = served
    args = {"task": slow_task, "harness": "oracle"}
    rollout_id = (await client.call_tool("start_rollout", args)).structured_content["rollout_id"]
    await wait_for(lambda: sleepers() and sandbox_roots(sbx), what="the sandbox runs the task")
    out = (await client.call_tool("cancel_rollout", {"rollout_id": rollout_id})).structured_content
    assert out["status"] == "cancelled"
    assert sleepers() == [] and sandbox_roots(sbx) == []
    assert state.store.get(rollout_id) is None


async def test_cancelling_a_held_run_rollout_call_tears_down_the_sandbox(served, sbx, slow_task):
    """The client gives up on run_rollout (an MCP cancel): the tool is cancelled and Harbor
    tears the sandbox down."""
    client, state = served
    async with anyio.create_task_group() as tg:

        async def call() -> None:
            await client.call_tool("run_rollout", {"task": slow_task, "harness": "oracle"})

        tg.start_soon(call)
        await wait_for(lambda: sleepers() and sandbox_roots(sbx), what="the sandbox runs")
        tg.cancel_scope.cancel()
    await wait_for(lambda: not sleepers() and not sandbox_roots(sbx), 30, "the sandbox is gone")
    listed = (await client.call_tool("list_rollouts", {})).structured_content
    assert listed["counts"] == {"cancelled": 1} and len(state.store) == 0


async def test_leaving_the_server_cancels_and_cleans_up_running_rollouts(sbx, slow_task):
    async with ServerState(dataset_roots=(sbx.parent,)) as state:
        async with Client(build_server(state)) as client:
            args = {"task": slow_task, "harness": "oracle"}
            await client.call_tool("start_rollout", args)
            await client.call_tool("start_rollout", args)
            await wait_for(lambda: len(sleepers()) == 2, what="both sandboxes run")
        assert state.jobs.running == 2  # a client leaving does not stop background rollouts
    assert state.jobs.running == 0
    assert {j.status for j in state.jobs.jobs()} == {"cancelled"}
    assert sleepers() == [] and sandbox_roots(sbx) == []
