"""The built-in tool loop: stops, limits, no orphan tool-call ids, the text tool format."""

from __future__ import annotations

import json

import pytest

from rollwire.sessions.toolloop import LoopLimits, run_tool_loop
from tests.sessions.conftest import ScriptedChat, call, counter_session

pytestmark = pytest.mark.anyio


async def _run(replies, **limits):
    chat = ScriptedChat(list(replies))
    client = chat.client()
    try:
        out = await run_tool_loop(counter_session(), client, LoopLimits(**limits))
    finally:
        await client.aclose()
    return out, chat


def _tool_results(messages):
    return {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}


async def test_loop_stops_when_a_tool_result_is_done():
    out, chat = await _run(
        [{"content": "", "tool_calls": [call("add", {"n": 3}, "a")]}, {"content": "unused"}]
    )
    assert out.stop_reason == "done" and out.model_calls == 1 and out.tool_calls == 1
    assert chat.requests[0]["tools"][0]["function"]["name"] == "add"


async def test_loop_stops_on_a_reply_with_no_tool_call():
    out, _ = await _run([{"content": "I give up."}])
    assert out.stop_reason == "no_tool_call" and out.messages[-1] == {
        "role": "assistant",
        "content": "I give up.",
    }


async def test_loop_stops_at_max_turns():
    replies = [{"content": "", "tool_calls": [call("add", {"n": 0}, f"c{i}")]} for i in range(5)]
    out, _ = await _run(replies, max_turns=2)
    assert out.stop_reason == "max_turns" and out.model_calls == 2


async def test_fifty_calls_in_one_turn_run_only_the_limit_and_leave_no_orphan_ids():
    calls = [call("add", {"n": 0}, f"c{i}") for i in range(50)]
    out, _ = await _run(
        [{"content": "", "tool_calls": calls}, {"content": "done"}], max_tool_calls_per_turn=4
    )
    results = _tool_results(out.messages)
    assert set(results) == {f"c{i}" for i in range(50)}  # every id answered
    assert out.tool_calls == 4
    assert sum("not executed: max_tool_calls_per_turn" in r for r in results.values()) == 46


async def test_total_tool_call_budget_ends_the_loop():
    replies = [
        {
            "content": "",
            "tool_calls": [call("add", {"n": 0}, f"c{i}"), call("add", {"n": 0}, f"d{i}")],
        }
        for i in range(5)
    ]
    out, _ = await _run(replies, max_total_tool_calls=3)
    assert out.stop_reason == "max_total_tool_calls" and out.tool_calls == 3
    assert "not executed: max_total_tool_calls" in _tool_results(out.messages)["d1"]


async def test_invalid_json_arguments_are_a_tool_error_the_agent_reads():
    out, _ = await _run(
        [{"content": "", "tool_calls": [call("add", "{n: 1", "x")]}, {"content": "ok"}]
    )
    assert "not valid JSON" in _tool_results(out.messages)["x"] and out.tool_errors == 1


async def test_model_error_ends_the_loop_as_a_result():
    out, _ = await _run([])
    assert out.stop_reason == "model_error" and "script exhausted" in out.errors[0]


async def test_text_format_reads_calls_from_the_reply_and_answers_in_json():
    text = '<tool_call>\n{"name": "add", "arguments": {"n": 3}}\n</tool_call>'
    out, chat = await _run([{"content": text}], tool_format="text")
    assert out.stop_reason == "done"
    assert "tools" not in chat.requests[0] and '"add"' in chat.requests[0]["messages"][0]["content"]
    assert out.messages[-2] == {
        "role": "assistant",
        "content": text,
    }  # verbatim: keeps the token prefix
    response = out.messages[-1]["content"]
    assert response.startswith("<tool_response>\n")
    assert json.loads(response.split("\n")[1]) == {"name": "add", "content": "counter = 3"}


async def test_text_calls_are_read_even_when_tools_were_offered_natively():
    text = '<tool_call>{"name": "add", "arguments": {"n": 3}}</tool_call>'
    out, _ = await _run([{"content": text}])
    assert out.stop_reason == "done" and out.tool_calls == 1


async def test_tool_output_with_quotes_and_braces_survives_the_json_encoding():
    out, _ = await _run(
        [{"content": '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'}, {"content": "x"}],
        tool_format="text",
    )
    payload = json.loads(out.messages[3]["content"].split("\n")[1])
    assert "unknown tool 'nope'" in payload["content"]


async def test_seeds_advance_per_turn():
    replies = [{"content": "", "tool_calls": [call("add", {"n": 1}, f"c{i}")]} for i in range(3)]
    _, chat = await _run(replies, seed=10)
    assert [r["seed"] for r in chat.requests] == [10, 11, 12]


async def test_a_reset_that_hangs_is_bounded_by_the_wall_clock():
    import anyio

    session = counter_session()

    async def hang():
        await anyio.sleep(30)

    session.initial_messages = hang  # type: ignore[method-assign]
    chat = ScriptedChat([])
    client = chat.client()
    try:
        out = await run_tool_loop(session, client, LoopLimits(wall_clock_s=0.2))
    finally:
        await client.aclose()
    assert out.stop_reason == "wall_clock" and out.model_calls == 0
