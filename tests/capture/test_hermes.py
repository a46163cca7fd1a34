"""Hermes tool calls for templates without a tool section (pure functions)."""

from __future__ import annotations

import json

import pytest

from rollwire.capture.dialects.hermes import (
    ToolFormatError,
    call_text,
    parse_calls,
    prepare_messages,
)

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
]


def test_generated_call_is_parsed_into_openai_shape():
    text = (
        'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    )
    content, calls = parse_calls(text)
    assert content == "Sure."
    (call,) = calls
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert call["id"].startswith("chatcmpl-tool-")


def test_invalid_call_json_stays_text():
    text = "<tool_call>{not json}</tool_call>"
    assert parse_calls(text) == (text, [])


def test_history_call_renders_as_the_model_writes_it():
    call = {
        "id": "c",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    (msg,) = prepare_messages([{"role": "assistant", "content": None, "tool_calls": [call]}], None)
    assert msg["content"] == call_text("get_weather", {"city": "Paris"})
    assert parse_calls(msg["content"])[1][0]["function"]["arguments"] == '{"city": "Paris"}'


def test_tools_are_offered_in_the_system_message():
    msgs = prepare_messages([{"role": "user", "content": "hi"}], TOOLS)
    assert msgs[0]["role"] == "system" and '"get_weather"' in msgs[0]["content"]
    msgs = prepare_messages(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}], TOOLS
    )
    assert msgs[0]["content"].startswith("Be brief.") and len(msgs) == 2


def test_text_parts_are_joined_and_images_refused():
    (msg,) = prepare_messages(
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            }
        ],
        None,
    )
    assert msg["content"] == "ab"
    with pytest.raises(ToolFormatError, match=r"messages\[0\]"):
        prepare_messages(
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], None
        )
