"""Every MCP tool through the real MCP client, in memory: results, bad input, progress, store."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest
from mcp import Client, MCPError

from rollwire.server.mcp_app import ServerState, build_server
from rollwire.tools.tasks import EnvRef, HarborRef, format_harbor_ref, parse_task_ref
from tests.fakes.serve import serve_in_thread
from tests.fakes.vllm import FakeVLLM

pytestmark = pytest.mark.anyio

EXAMPLES = str(Path(__file__).resolve().parents[2] / "examples" / "tasks")
TOOLS = {
    "list_tasks",
    "validate_llm",
    "run_rollout",
    "start_rollout",
    "get_rollout",
    "cancel_rollout",
    "list_rollouts",
    "get_rollout_graph",
    "collect_episodes",
    "push_dataset",
    "info",
}


@pytest.fixture(scope="module")
def fake_url() -> Iterator[str]:
    with serve_in_thread(FakeVLLM(tool_call_every_turn=True).app) as url:
        yield url + "/v1"


@pytest.fixture
async def state(tmp_path, monkeypatch) -> AsyncIterator[ServerState]:
    monkeypatch.setenv("ROLLWIRE_TRIALS_DIR", str(tmp_path / "trials"))
    async with ServerState() as state:
        yield state


@pytest.fixture
async def client(state) -> AsyncIterator[Client]:
    async with Client(build_server(state)) as c:
        yield c


def error_text(result) -> str:
    assert result.is_error, result
    return " ".join(getattr(c, "text", "") for c in result.content)


def names_field(result, field: str) -> bool:
    """Our own errors start with ``field:``; the SDK's validation errors put it (or its dotted
    path, e.g. ``limits.max_turns``) on its own line."""
    return re.search(rf"(: {field}: |\n([\w]+\.)*{field}\n)", error_text(result)) is not None


async def test_serve_help_names_every_tool_the_server_lists(client):
    listed = {t.name for t in (await client.list_tools()).tools}
    shown = (
        await anyio.run_process([sys.executable, "-m", "rollwire", "serve", "--help"])
    ).stdout.decode()
    named = set(re.findall(r"[a-z]+(?:_[a-z]+)+|\binfo\b", shown))
    assert listed <= named, sorted(listed - named)


async def test_the_server_lists_its_tools_with_schemas(client):
    tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == TOOLS
    for tool in tools.values():
        assert tool.description and len(tool.description) > 60
        assert tool.output_schema is not None
    run = tools["run_rollout"].input_schema["properties"]
    contract = ("task", "harness", "sandbox", "llm", "sampling", "limits", "reward_key")
    assert set(contract) | {"include_tokens"} <= set(run)
    assert "ctx" not in run
    templates = (await client.list_resource_templates()).resource_templates
    assert sorted(t.uri_template for t in templates) == [
        "rollout://{rollout_id}/document",
        "rollout://{rollout_id}/graph",
    ]


def test_task_references_round_trip():
    ref = parse_task_ref("harbor:examples/tasks#count-errors")
    assert ref == HarborRef("examples/tasks", "count-errors")
    assert str(ref) == "harbor:examples/tasks#count-errors"
    assert parse_task_ref("harbor:a#b/c#d") == HarborRef("a#b/c", "d")  # the last # splits
    assert parse_task_ref("reasoning_gym:chain_sum") == EnvRef("reasoning_gym", "chain_sum")
    assert str(parse_task_ref("openspiel:tic_tac_toe")) == "openspiel:tic_tac_toe"


async def test_list_tasks_env_family_query_and_pages(client):
    first = (
        await client.call_tool(
            "list_tasks", {"source": "reasoning_gym", "limit": 1, "query": "SUM"}
        )
    ).structured_content
    assert first["total"] >= 2 and len(first["tasks"]) == 1 and first["next_offset"] == 1
    assert all(t["kind"] == "env" for t in first["tasks"])
    rest = (
        await client.call_tool(
            "list_tasks", {"source": "reasoning_gym", "offset": 1, "limit": 500, "query": "sum"}
        )
    ).structured_content
    refs = [t["ref"] for t in first["tasks"] + rest["tasks"]]
    assert rest["next_offset"] is None and len(refs) == first["total"] == len(set(refs))
    assert "reasoning_gym:chain_sum" in refs
    for ref in refs:
        assert str(parse_task_ref(ref)) == ref


async def test_list_tasks_of_a_harbor_dataset_gives_runnable_references(client):
    page = (await client.call_tool("list_tasks", {"source": EXAMPLES})).structured_content
    names = {t["name"] for t in page["tasks"]}
    assert {"count-errors", "sales-report"} <= names and page["total"] == len(names)
    for t in page["tasks"]:
        assert t["ref"] == format_harbor_ref(EXAMPLES, t["name"])
        assert parse_task_ref(t["ref"]) == HarborRef(EXAMPLES, t["name"])
        assert t["description"]


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ({"offset": -1}, "offset"),
        ({"limit": 0}, "limit"),
        ({"source": "/no/such/dataset"}, "source"),
    ],
)
async def test_list_tasks_bad_input_is_a_tool_error_naming_the_field(client, args, field):
    assert names_field(await client.call_tool("list_tasks", args), field)


async def test_validate_llm_certifies_and_reports_unusable_endpoints(client, state, fake_url):
    cert = (await client.call_tool("validate_llm", {"llm_url": fake_url})).structured_content
    assert cert["verdict"] == "TRAIN" and cert["capture_level"] == "tokens"
    dead = await client.call_tool("validate_llm", {"llm_url": "http://127.0.0.1:9/v1"})
    assert not dead.is_error
    assert dead.structured_content["verdict"] == "NOT USABLE"
    assert dead.structured_content["reachable"] is False


async def test_run_rollout_env_task_reports_progress_and_keeps_the_document(
    client, state, fake_url
):
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(done, total, message):
        progress.append((done, total, message))

    args = {
        "task": "reasoning_gym:chain_sum",
        "llm_url": fake_url,
        "seed": 3,
        "limits": {"max_turns": 4},
    }
    result = await client.call_tool("run_rollout", args, progress_callback=on_progress)
    out = result.structured_content
    assert not result.is_error and out["ok"], out
    assert out["task"] == "reasoning_gym:chain_sum" and out["seed"] == 3
    assert out["tier"] == "tokens" and out["rollout_type"] == "train"
    assert out["reward"] is not None and out["has_document"]
    assert out["counts"]["turns"] >= 1 and out["counts"]["trainable_tokens"] > 0
    assert out["sequences"] is None  # token arrays only on request
    assert [p[0] for p in progress] == [0, 1, 2, 3, 4]
    assert all(total == 4 for _, total, _ in progress) and progress[-1][2] == "done"

    graph = (
        await client.call_tool("get_rollout_graph", {"rollout_id": out["rollout_id"]})
    ).structured_content
    assert len(graph["nodes"]) == out["counts"]["turns"]
    node = graph["nodes"][0]
    assert node["prompt_tokens"] > 0 and node["completion_tokens"] > 0 and node["trainable"]
    assert graph["roles"] == {"agent": len(graph["nodes"])} and graph["mermaid"] is None
    mermaid = (
        await client.call_tool(
            "get_rollout_graph", {"rollout_id": out["rollout_id"], "format": "mermaid"}
        )
    ).structured_content["mermaid"]
    assert mermaid.startswith("flowchart TD\n") and node["node_id"] in mermaid

    read = await client.read_resource(f"rollout://{out['rollout_id']}/document")
    document = json.loads(read.contents[0].text)
    assert read.contents[0].mime_type == "application/json"
    assert document["version"] == "rollwire.rollout/1"
    assert len(document["turns"]) == out["counts"]["turns"]
    assert document["metadata"]["episode_id"] == out["rollout_id"]

    # A second rollout on the same endpoint neither re-certifies nor builds another proxy,
    # and include_tokens returns the aligned arrays.
    again = (
        await client.call_tool("run_rollout", {**args, "seed": 4, "include_tokens": True})
    ).structured_content
    assert again["ok"] and again["rollout_id"] != out["rollout_id"]
    assert state.pool.certify_calls == 1 and state.pool.n_proxies == 1
    seq = again["sequences"][0]
    assert len(seq["input_ids"]) == len(seq["loss_mask"]) == len(seq["logprobs"])
    assert sum(seq["loss_mask"]) == again["counts"]["trainable_tokens"]


async def test_run_rollout_harbor_oracle_needs_no_model(client, state):
    task = format_harbor_ref(EXAMPLES, "count-errors")
    out = (
        await client.call_tool("run_rollout", {"task": task, "harness": "oracle"})
    ).structured_content
    assert out["ok"], out
    assert out["reward"] == 1.0 and out["task"] == task and out["harness"] == "oracle"
    assert out["has_document"] is False and out["counts"]["turns"] == 0
    assert state.pool.certify_calls == 0
    graph = (
        await client.call_tool("get_rollout_graph", {"rollout_id": out["rollout_id"]})
    ).structured_content
    assert graph["nodes"] == [] and graph["edges"] == []
    with pytest.raises(MCPError, match="no document"):
        await client.read_resource(f"rollout://{out['rollout_id']}/document")


async def test_run_rollout_multi_reward_with_reward_key(client):
    task = format_harbor_ref(EXAMPLES, "sales-report")
    args = {"task": task, "harness": "oracle"}
    unpicked = (await client.call_tool("run_rollout", args)).structured_content
    assert not unpicked["ok"] and "reward_key" in unpicked["error"]
    picked = (
        await client.call_tool("run_rollout", {**args, "reward_key": "correct"})
    ).structured_content
    assert picked["ok"] and picked["reward"] == 1.0


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ({"task": "nosuchfamily:x", "llm_url": "http://127.0.0.1:9/v1"}, "task"),
        ({"task": "chain_sum", "llm_url": "http://127.0.0.1:9/v1"}, "task"),
        ({"task": "reasoning_gym:chain_sum"}, "llm_url"),
        (
            {
                "task": "reasoning_gym:chain_sum",
                "llm_url": "http://x/v1",
                "limits": {"max_turns": -1},
            },
            "max_turns",
        ),
        (
            {
                "task": "reasoning_gym:chain_sum",
                "llm": "http://x/v1",
                "sampling": {"max_tokens": 0},
            },
            "max_tokens",
        ),
        (
            {
                "task": "reasoning_gym:chain_sum",
                "llm_url": "http://x/v1",
                "sampling": {"temperature": -1},
            },
            "temperature",
        ),
        (
            {"task": "reasoning_gym:chain_sum", "llm_url": "http://x/v1", "sampling": {"top_q": 1}},
            "top_q",
        ),
        ({"task": "reasoning_gym:chain_sum", "llm_url": "http://x/v1", "limits": "soon"}, "limits"),
        ({"task": "reasoning_gym:chain_sum", "llm_url": "http://x/v1", "seed": "one"}, "seed"),
        ({"task": 7, "llm_url": "http://x/v1"}, "task"),
        ({"task": "reasoning_gym:no_such_task", "llm_url": "http://x/v1"}, "task"),
        (
            {"task": "reasoning_gym:chain_sum", "llm_url": "http://x/v1", "harness": "claude-code"},
            "harness",
        ),
        (
            {"task": "reasoning_gym:chain_sum", "llm_url": "http://x/v1", "sandbox": "docker"},
            "sandbox",
        ),
        (
            {"task": "reasoning_gym:chain_sum", "llm_url": "http://x/v1", "llm": "http://y/v1"},
            "llm",
        ),
        ({"task": f"harbor:{EXAMPLES}#count-errors", "harness": "claude"}, "harness"),
        (
            {"task": f"harbor:{EXAMPLES}#count-errors", "harness": "oracle", "sandbox": "moon"},
            "sandbox",
        ),
        ({"task": f"harbor:{EXAMPLES}#no-such-task", "harness": "oracle"}, "task"),
        ({"task": "harbor:/no/such/dir#t", "harness": "oracle"}, "task"),
        ({"task": f"harbor:{EXAMPLES}#count-errors"}, "llm_url"),
        ({"task": f"harbor:{EXAMPLES}#count-errors", "harness": "oracle", "seed": 1}, "seed"),
        (
            {
                "task": f"harbor:{EXAMPLES}#count-errors",
                "harness": "oracle",
                "task_config": {"a": 1},
            },
            "task_config",
        ),
        (
            {"task": f"harbor:{EXAMPLES}#count-errors", "harness": "oracle", "answer_mode": "text"},
            "answer_mode",
        ),
        (
            {
                "task": f"harbor:{EXAMPLES}#count-errors",
                "harness": "oracle",
                "sampling": {"top_logprobs": 3},
            },
            "sampling.top_logprobs",
        ),
        (
            {
                "task": "reasoning_gym:chain_sum",
                "llm_url": "http://x/v1",
                "sampling": {"top_logprobs": 21},
            },
            "top_logprobs",
        ),
        (
            {"task": "openspiel:tic_tac_toe", "llm_url": "http://x/v1", "answer_mode": "either"},
            "answer_mode",
        ),
        (
            {"task": "reasoning_gym:chain_sum", "llm_url": "http://x/v1", "answer_mode": "voice"},
            "answer_mode",
        ),
    ],
)
async def test_run_rollout_bad_arguments_are_tool_errors_naming_the_field(client, args, field):
    assert names_field(await client.call_tool("run_rollout", args), field)


async def test_run_rollout_on_an_unreachable_docker_daemon_is_a_tool_error_naming_sandbox(
    client, monkeypatch, tmp_path
):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-daemon.sock")
    args = {"task": f"harbor:{EXAMPLES}#count-errors", "harness": "oracle", "sandbox": "docker"}
    result = await client.call_tool("run_rollout", args)
    assert names_field(result, "sandbox") and "daemon" in error_text(result)


async def test_run_rollout_answer_mode_text_gets_a_verified_reward_from_a_text_reply(client):
    with serve_in_thread(FakeVLLM().app) as url:  # a model that answers in text, never by tool
        args = {"task": "reasoning_gym:chain_sum", "llm_url": url + "/v1", "seed": 2}
        by_tool = (await client.call_tool("run_rollout", args)).structured_content
        by_text = (
            await client.call_tool("run_rollout", {**args, "answer_mode": "text"})
        ).structured_content
    assert by_tool["reward"] is None and by_tool["stop_reason"] == "no_tool_call"
    assert by_tool["answer_mode"] == "tool"  # the default, stated in the result
    assert by_text["ok"] and by_text["reward"] == 0.0 and by_text["stop_reason"] == "text_answer"
    assert by_text["answer_mode"] == "text" and by_text["counts"]["tool_calls"] == 0


async def test_run_rollout_failures_are_results_not_errors(client, state, fake_url):
    dead = await client.call_tool(
        "run_rollout", {"task": "reasoning_gym:chain_sum", "llm_url": "http://127.0.0.1:9/v1"}
    )
    assert not dead.is_error
    out = dead.structured_content
    assert not out["ok"] and "endpoint not usable" in out["error"] and out["reward"] is None
    assert out["findings"][0]["level"] == "FATAL"
    assert state.pool.n_proxies == 0  # an unusable endpoint is not cached
    bad_config = await client.call_tool(
        "run_rollout",
        {"task": "reasoning_gym:chain_sum", "llm_url": fake_url, "task_config": {"nope": 1}},
    )
    assert not bad_config.is_error and not bad_config.structured_content["ok"]
    assert bad_config.structured_content["error"]


async def test_graph_and_document_of_unknown_rollouts(client):
    assert names_field(
        await client.call_tool("get_rollout_graph", {"rollout_id": "nope"}), "rollout_id"
    )
    with pytest.raises(MCPError, match="no rollout"):
        await client.read_resource("rollout://nope/document")


async def test_bad_graph_format_names_the_field(client, fake_url):
    out = (
        await client.call_tool(
            "run_rollout", {"task": "reasoning_gym:chain_sum", "llm_url": fake_url}
        )
    ).structured_content
    bad = await client.call_tool(
        "get_rollout_graph", {"rollout_id": out["rollout_id"], "format": "svg"}
    )
    assert names_field(bad, "format")


async def test_info_reports_what_can_run(client):
    report = (await client.call_tool("info", {})).structured_content
    harnesses = {h["name"]: h for h in report["harnesses"]}
    assert harnesses["oracle"]["available"]
    assert any(s["name"] == "local" for s in report["sandboxes"])
    assert report["env_families"]["reasoning_gym"]["available"]
    assert set(report) == {"sandboxes", "harnesses", "dialects", "datasets", "env_families"}
    assert "chat" in report["dialects"] and harnesses["terminus-2"]["dialect"] == "chat"


async def test_concurrent_rollouts_share_one_certification_and_proxy(client, state, fake_url):
    import anyio

    outs: list[dict] = []

    async def one(seed: int) -> None:
        args = {"task": "reasoning_gym:chain_sum", "llm_url": fake_url, "seed": seed}
        outs.append((await client.call_tool("run_rollout", args)).structured_content)

    async with anyio.create_task_group() as tg:
        for seed in range(4):
            tg.start_soon(one, seed)
    assert len(outs) == 4 and all(o["ok"] for o in outs)
    assert len({o["rollout_id"] for o in outs}) == 4 and len(state.store) == 4
    assert state.pool.certify_calls == 1 and state.pool.n_proxies == 1
