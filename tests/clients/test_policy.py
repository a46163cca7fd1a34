"""The scripted model the client matrix uses: what it answers to each kind of request."""

from __future__ import annotations

import json

from tests.clients.policy import ScriptedPolicy, Step
from tests.fakes.vllm import tool_call_text


def _tools(*names: str) -> list[dict]:
    return [{"type": "function", "function": {"name": n, "parameters": {}}} for n in names]


def _call(name: str, arguments: dict, call_id: str) -> dict:
    fn = {"name": name, "arguments": json.dumps(arguments)}
    return {
        "role": "assistant",
        "tool_calls": [{"id": call_id, "type": "function", "function": fn}],
    }


def test_it_calls_the_next_step_under_the_name_the_client_offers():
    policy = ScriptedPolicy([Step("list_tasks", {"limit": 2})])
    body = {
        "messages": [{"role": "user", "content": "go"}],
        "tools": _tools("mcp_rollwire_list_tasks"),
    }
    assert policy(body) == tool_call_text("mcp_rollwire_list_tasks", {"limit": 2})
    assert policy.sent == [("list_tasks", {"limit": 2})]


def test_it_waits_for_a_server_that_is_still_connecting():
    policy = ScriptedPolicy([Step("list_tasks")])
    body = {
        "messages": [{"role": "user", "content": "go"}],
        "tools": _tools("Bash", "WaitForMcpServers"),
    }
    assert policy(body) == tool_call_text("WaitForMcpServers", {"servers": ["rollwire"]})
    assert policy.sent == []


def test_it_searches_for_deferred_tools_then_calls_through_the_generic_tool():
    policy = ScriptedPolicy([Step("info")])
    first = {
        "messages": [{"role": "user", "content": "go"}],
        "tools": _tools("tool_search", "tool_call"),
    }
    assert json.loads(policy(first).split("\n")[1])["name"] == "tool_search"
    searched = {
        **first,
        "messages": [*first["messages"], _call("tool_search", {"query": "+rollwire"}, "c1"),
                     {"role": "tool", "tool_call_id": "c1", "content": "mcp__rollwire__info"}],
    }  # fmt: skip
    assert policy(searched) == tool_call_text(
        "tool_call", {"name": "mcp__rollwire__info", "arguments": {}}
    )


def test_a_polling_step_repeats_until_its_result_says_done_then_the_plan_ends():
    policy = ScriptedPolicy(
        [Step("collect_episodes", {"out_dir": "x"}, until=lambda t: "done" in t)], final="END"
    )
    tools = _tools("collect_episodes")
    running = [
        {"role": "user", "content": "go"},
        _call("collect_episodes", {"out_dir": "x"}, "c1"),
        {"role": "tool", "tool_call_id": "c1", "content": '{"status": "running"}'},
    ]
    assert policy({"messages": running, "tools": tools}) == tool_call_text(
        "collect_episodes", {"out_dir": "x"}
    )
    finished = [
        *running,
        _call("collect_episodes", {"out_dir": "x"}, "c2"),
        {"role": "tool", "tool_call_id": "c2", "content": '{"status": "done"}'},
    ]
    assert policy({"messages": finished, "tools": tools}) == "END"


def test_a_request_without_tools_gets_text():
    assert ScriptedPolicy([Step("info")])(
        {"messages": [{"role": "user", "content": "title?"}]}
    ) == ("rollwire session")
