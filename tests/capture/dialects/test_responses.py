"""The Responses dialect: pure translation properties, and the official openai SDK's Responses
API end to end (SDK -> capture proxy (uvicorn) -> fake vLLM (uvicorn))."""

from __future__ import annotations

import itertools
from typing import Any

import httpx
import openai
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from rollwire.capture.dialects import load_dialects
from rollwire.capture.dialects.base import DialectError, Translated
from rollwire.capture.dialects.responses import (
    DIALECT,
    count_tokens,
    error,
    reasoning_token,
    reply,
    session_key,
    sse,
    translate,
)
from tests.capture.conftest import Proxy
from tests.fakes.vllm import TOKENIZER

EVENT = TypeAdapter(ResponseStreamEvent)
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
    "strict": True,
}


def parse_sse(raw: bytes) -> list[dict[str, Any]]:
    """The events of a Responses SSE stream; each ``event:`` line names its data's type."""
    events = []
    for block in raw.split(b"\n\n"):
        if not block:
            continue
        name, data = block.split(b"\n")
        assert name.startswith(b"event: ") and data.startswith(b"data: ")
        event = orjson.loads(data[len(b"data: ") :])
        assert event["type"] == name[len(b"event: ") :].decode()
        events.append(event)
    return events


def replay(response: dict[str, Any], translated: Translated) -> list[dict[str, Any]]:
    return parse_sse(b"".join(sse(response, translated)))


# ------------------------------------------------------------------------ request strategies

texts = st.text(max_size=12)
names = st.from_regex(r"[a-z][a-z_]{0,8}", fullmatch=True)


@st.composite
def conversations(draw) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(Responses input items, the chat messages each agent reply must become): rounds of a
    user (or system/developer) message and agent steps; a step is an optional reasoning item, an
    optional text message and function calls followed by their outputs, as codex resends them."""
    items: list[dict[str, Any]] = []
    expected: list[dict[str, Any]] = []
    counter = 0
    for _ in range(draw(st.integers(1, 3))):
        role = draw(st.sampled_from(["user", "user", "system", "developer"]))
        text = draw(texts)
        if draw(st.booleans()):
            items.append({"type": "message", "role": role, "content": text})
        else:
            items.append({"role": role, "content": [{"type": "input_text", "text": text}]})
        expected.append({"role": "system" if role == "developer" else role, "content": text})
        steps = draw(st.integers(0, 3))
        for step in range(steps):
            last = step == steps - 1
            n_calls = draw(st.integers(0 if last else 1, 3))
            reasoning = draw(st.none() | texts)
            text = draw(st.none() | texts) if n_calls else draw(texts)
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if reasoning is not None:
                message["reasoning_content"] = reasoning
                content = [{"type": "reasoning_text", "text": reasoning}]
                if draw(st.booleans()):  # codex: text only in encrypted_content
                    rs = {"summary": [], "encrypted_content": reasoning_token(reasoning)}
                else:
                    rs = {"summary": [], "content": content}
                items.append({"type": "reasoning", "id": f"rs_{counter}", **rs})
            if text is not None:
                part = {"type": "output_text", "text": text, "annotations": []}
                items.append(
                    {
                        "type": "message",
                        "role": "assistant",
                        "id": f"msg_{counter}",
                        "status": "completed",
                        "content": [part],
                    }
                )
            calls, outputs = [], []
            for _ in range(n_calls):
                counter += 1
                call_id, name = f"call_{counter}", draw(names)
                arguments = orjson.dumps({"x": draw(texts)}).decode()
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call_id,
                        "name": name,
                        "arguments": arguments,
                    }
                )
                calls.append(
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": arguments},
                    }
                )
                output = draw(texts)
                outputs.append(
                    {"type": "function_call_output", "call_id": call_id, "output": output}
                )
                expected_output = {"role": "tool", "tool_call_id": call_id, "content": output}
                outputs[-1]["_expected"] = expected_output
            if calls:
                message["tool_calls"] = calls
            expected.append(message)
            for out in outputs:
                expected.append(out.pop("_expected"))
                items.append(out)
            counter += 1
    return items, expected


@st.composite
def requests(draw) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    items, expected = draw(conversations())
    body: dict[str, Any] = {"model": draw(names), "input": items, "store": False}
    tool_names = draw(st.lists(names, max_size=3, unique=True))
    if tool_names:
        body["tools"] = [
            {
                "type": "function",
                "name": n,
                "parameters": {"type": "object", "properties": {}},
                "strict": draw(st.none() | st.booleans()),
            }
            for n in tool_names
        ]
        body["tool_choice"] = draw(
            st.sampled_from(["auto", "none", "required"])
            | st.sampled_from(tool_names).map(lambda n: {"type": "function", "name": n})
        )
        body["parallel_tool_calls"] = draw(st.booleans())
    instructions = draw(st.none() | texts)
    if instructions is not None:
        body["instructions"] = instructions
        expected = (
            [{"role": "system", "content": instructions}, *expected] if instructions else expected
        )
    for key, values in (
        ("temperature", st.floats(0, 2)),
        ("top_p", st.floats(0.01, 1)),
        ("max_output_tokens", st.integers(1, 4096)),
    ):
        value = draw(st.none() | values)
        if value is not None:
            body[key] = value
    body["stream"] = draw(st.booleans())
    return body, expected


# --------------------------------------------------------------------- translation properties


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_random_requests_translate_without_loss(case):
    body, expected = case
    out = translate(body, None)
    chat = out.chat
    assert chat["messages"] == expected
    assert out.stream is body["stream"] and "stream" not in chat
    if body.get("instructions"):
        assert chat["messages"][0] == {"role": "system", "content": body["instructions"]}
    # every function_call in an assistant tool_calls entry, every output in its tool message
    calls = [c for m in chat["messages"] for c in m.get("tool_calls", [])]
    fc_items = [i for i in body["input"] if i.get("type") == "function_call"]
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        (i["call_id"], i["name"], i["arguments"]) for i in fc_items
    ]
    tool_messages = [m for m in chat["messages"] if m["role"] == "tool"]
    outputs = [i for i in body["input"] if i.get("type") == "function_call_output"]
    assert [(m["tool_call_id"], m["content"]) for m in tool_messages] == [
        (o["call_id"], o["output"]) for o in outputs
    ]
    assert all(isinstance(c["id"], str) and c["id"] for c in calls)
    for key in ("temperature", "top_p"):
        assert chat.get(key) == body.get(key)
    assert chat.get("max_tokens") == body.get("max_output_tokens")
    if body.get("tools"):
        assert [t["function"]["name"] for t in chat["tools"]] == [t["name"] for t in body["tools"]]
        assert chat["parallel_tool_calls"] == body["parallel_tool_calls"]
        choice = body["tool_choice"]
        assert chat["tool_choice"] == (
            choice
            if isinstance(choice, str)
            else {"type": "function", "function": {"name": choice["name"]}}
        )
    else:
        assert "tools" not in chat and "tool_choice" not in chat
    assert out.context["notes"] == []


@pytest.mark.parametrize("field", DIALECT.sampling_fields)
def test_every_sampling_field_is_carried_to_chat(field):
    value = {"stop": ["END"], "max_output_tokens": 64, "top_logprobs": 3, "seed": 5}.get(field, 0.5)
    chat = translate({"input": "hi", field: value}, None).chat
    target = {"max_output_tokens": "max_tokens"}.get(field, field)
    assert chat[target] == value
    if field == "top_logprobs":
        assert chat["logprobs"] is True


def test_a_reply_with_text_and_calls_comes_back_as_one_assistant_message():
    items = [
        {"role": "user", "content": "go"},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "hm"}],
        },
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "ok"}],
        },
        {"type": "function_call", "call_id": "c1", "name": "a", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "b", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2", "output": "two"},
    ]
    messages = translate({"input": items}, None).chat["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool"]
    assert messages[1]["content"] == "ok" and messages[1]["reasoning_content"] == "hm"
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["c1", "c2"]


def test_reasoning_whose_text_is_unknown_is_dropped_with_a_note():
    items = [
        {"role": "user", "content": "go"},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "s"}]},
        {"type": "message", "role": "assistant", "content": "done"},
    ]
    out = translate({"input": items}, None)
    assert out.chat["messages"][1] == {"role": "assistant", "content": "done"}
    (note,) = out.context["notes"]
    assert note.startswith("input[1]") and "dropped" in note


def test_non_text_parts_of_system_developer_and_tool_messages_are_kept():
    image = {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"}
    body = {
        "instructions": "be brief",
        "input": [
            {"role": "developer", "content": [{"type": "input_text", "text": "rules"}, image]},
            {"role": "user", "content": [image]},
            {"type": "function_call", "call_id": "c1", "name": "look", "arguments": "{}"},
            {
                "type": "function_call_output",
                "call_id": "c1",
                "output": [{"type": "input_text", "text": "see"}, image],
            },
        ],
    }
    messages = translate(body, None).chat["messages"]
    chat_image = {"type": "image_url", "image_url": {"url": image["image_url"], "detail": "low"}}
    assert messages[0] == {"role": "system", "content": "be brief"}
    assert messages[1] == {
        "role": "system",
        "content": [{"type": "text", "text": "rules"}, chat_image],
    }
    assert messages[2] == {"role": "user", "content": [chat_image]}
    assert messages[4]["content"] == [{"type": "text", "text": "see"}, chat_image]


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id", "stateless"),
        ({"conversation": "conv_1"}, "conversation", "stateless"),
        ({"tools": [{"type": "local_shell"}, WEATHER]}, "tools", "local_shell"),
        ({"tools": [{"type": "local_shell"}]}, "tools", "local_shell"),
        (
            {"tool_choice": {"type": "web_search_preview"}, "tools": [WEATHER]},
            "tool_choice",
            "web_search",
        ),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]", "stateless"),
        ({"input": [{"type": "local_shell_call", "id": "x"}]}, "input[0]", "local_shell_call"),
        (
            {"input": [{"type": "function_call", "call_id": None, "name": "a", "arguments": "{}"}]},
            "input[0].call_id",
            "call_id",
        ),
        (
            {"input": [{"type": "function_call_output", "call_id": None, "output": "x"}]},
            "input[0].call_id",
            "call",
        ),
        ({"input": []}, "input", "required"),
    ],
)
def test_requests_the_proxy_cannot_serve_are_refused_by_name(body, param, words):
    with pytest.raises(DialectError) as info:
        translate({"input": "hi", **body}, None)
    assert info.value.param == param and words in info.value.message


# ---------------------------------------------------------------------- reply / SSE properties

tool_calls = st.lists(
    st.fixed_dictionaries(
        {
            "id": st.none() | st.from_regex(r"chatcmpl-tool-[0-9a-f]{6}", fullmatch=True),
            "type": st.just("function"),
            "function": st.fixed_dictionaries(
                {
                    "name": names,
                    "arguments": st.dictionaries(names, texts, max_size=3).map(
                        lambda d: orjson.dumps(d).decode()
                    ),
                }
            ),
        }
    ),
    max_size=3,
    unique_by=lambda c: c["id"] or id(c),
)
logprob_entries = st.lists(
    st.fixed_dictionaries(
        {
            "token": st.from_regex(r"token_id:[0-9]{1,5}", fullmatch=True),
            "logprob": st.floats(-20, 0),
            "bytes": st.lists(st.integers(0, 255), max_size=4),
            "top_logprobs": st.just([]),
        }
    ),
    max_size=4,
)


@st.composite
def chat_replies(draw) -> dict[str, Any]:
    message = {
        "role": "assistant",
        "content": draw(st.none() | st.text(max_size=40)),
        "tool_calls": draw(tool_calls),
        "reasoning_content": draw(st.none() | st.text(min_size=1, max_size=30)),
        "refusal": draw(st.none() | st.just("no")),
    }
    usage = draw(
        st.none()
        | st.fixed_dictionaries(
            {"prompt_tokens": st.integers(0, 999), "completion_tokens": st.integers(0, 99)}
        ).map(lambda u: {**u, "total_tokens": u["prompt_tokens"] + u["completion_tokens"]})
    )
    return {
        "id": draw(st.none() | st.just("chatcmpl-abc123")),
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "smol",
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": draw(st.none() | logprob_entries.map(lambda c: {"content": c})),
                "finish_reason": draw(
                    st.sampled_from(["stop", "length", "tool_calls", "content_filter"])
                ),
            }
        ],
        "usage": usage,
    }


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chat_replies(), st.booleans(), st.booleans())
def test_random_replies_and_streams_validate_against_the_sdk_types(chat_reply, logprobs, encrypt):
    include = ["reasoning.encrypted_content"] if encrypt else []
    body = {"model": "asked", "input": "hi", "tools": [WEATHER], "include": include, "stream": True}
    if logprobs:
        body["top_logprobs"] = 2
    translated = translate(body, None)
    response = reply(chat_reply, translated)
    parsed = Response.model_validate(response)
    assert parsed.model == "asked" and parsed.tools[0].name == "get_weather"
    message = chat_reply["choices"][0]["message"]
    calls = [o for o in parsed.output if o.type == "function_call"]
    assert [(c.name, c.arguments) for c in calls] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]
    ]
    assert all(isinstance(c.call_id, str) and c.call_id for c in calls)
    for call, chat_call in zip(calls, message["tool_calls"], strict=True):
        if chat_call["id"] is not None:
            assert call.call_id == chat_call["id"]
    assert parsed.output_text == (message["content"] or "")
    assert parsed.output, "every reply leaves at least one item in the caller's history"
    finish = chat_reply["choices"][0]["finish_reason"]
    assert parsed.status == (
        "incomplete" if finish in ("length", "content_filter") else "completed"
    )
    if finish == "length":
        assert parsed.incomplete_details.reason == "max_output_tokens"

    events = replay(response, translated)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    state = ResponseStreamState(input_tools=[WEATHER], text_format=openai.omit)
    for event in events:
        state.handle_event(EVENT.validate_python(event))
    final = state._completed_response
    assert final is not None and final.output_text == parsed.output_text
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == parsed.output_text
    for i, item in enumerate(parsed.output):
        if item.type == "function_call":
            streamed = "".join(
                e["delta"]
                for e in events
                if e["type"] == "response.function_call_arguments.delta" and e["output_index"] == i
            )
            assert streamed == item.arguments
    # the reasoning text comes back when the caller resends the item the way codex does
    reasoning = [o for o in parsed.output if o.type == "reasoning"]
    if reasoning and encrypt:
        resent = reasoning[0].model_dump(exclude={"content"}, exclude_none=True)
        items = [{"role": "user", "content": "hi"}, resent, {"role": "assistant", "content": "x"}]
        back = translate({"input": items}, None).chat["messages"][1]
        assert back["reasoning_content"] == message["reasoning_content"]


@pytest.mark.parametrize("name", ["shell", "local_shell", "execute"])
def test_a_tool_call_is_never_turned_into_a_shell_call(name):
    translated = translate({"input": "hi", "tools": [{**WEATHER, "name": name}]}, None)
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": name, "arguments": '{"cmd": "ls"}'},
    }
    chat_reply = {
        "id": "chatcmpl-x",
        "choices": [
            {"message": {"content": None, "tool_calls": [call]}, "finish_reason": "tool_calls"}
        ],
    }
    (item,) = reply(chat_reply, translated)["output"]
    assert item["type"] == "function_call" and item["name"] == name
    assert item["arguments"] == '{"cmd": "ls"}'


def test_session_key_errors_and_count_shapes():
    assert session_key({"authorization": "Bearer sess-1"}, {}) == "sess-1"
    assert session_key({"x-api-key": "sess-1"}, {}) is None
    assert error(400, "bad", "tools") == {
        "error": {"message": "bad", "type": "invalid_request_error", "param": "tools", "code": None}
    }
    assert error(401, "who", None)["error"]["type"] == "authentication_error"
    counted = count_tokens({"instructions": "x" * 400, "input": "hello", "tools": [WEATHER]})
    assert counted["object"] == "response.input_tokens" and counted["input_tokens"] > 100
    assert DIALECT in load_dialects()


# ----------------------------------------------------------------- the SDK through the proxy


def _codex_turn(client: openai.OpenAI, items: list[dict[str, Any]], **kw) -> Any:
    """One codex-style call: the whole history, store=false, streamed; the items of the
    completed response, as codex appends them to its history."""
    stream = client.responses.create(
        model="gpt-local",
        instructions="You are a coding agent.",
        input=items,
        tools=[WEATHER],
        tool_choice="auto",
        parallel_tool_calls=False,
        store=False,
        stream=True,
        include=["reasoning.encrypted_content"],
        **kw,
    )
    events = list(stream)
    assert events[-1].type == "response.completed"
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [i.model_dump() for i in done] == [o.model_dump() for o in events[-1].response.output]
    return events[-1].response


def codex_conversation(client: openai.OpenAI) -> list[list[str]]:
    """Two questions the way codex asks them (each tool call answered, then the next
    question); the output item types of every response."""
    items: list[dict[str, Any]] = [{"role": "user", "content": "weather in two cities?"}]
    kinds = []
    for question in ("and tomorrow?", None):
        while True:
            response = _codex_turn(client, items)
            kinds.append([o.type for o in response.output])
            items += [o.model_dump(exclude_none=True) for o in response.output]
            calls = [o for o in response.output if o.type == "function_call"]
            if not calls:
                break
            for call in calls:
                items.append(
                    {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
                )
        if question:
            items.append({"role": "user", "content": question})
    return kinds


def test_codex_style_tool_conversation_is_one_trainable_sequence(proxy: Proxy):
    proxy.upstream.fake.behavior.tool_call_every_turn = True
    sid = proxy.open_session()
    kinds = codex_conversation(proxy.client(sid))
    assert kinds == [["function_call"], ["message"], ["function_call"], ["message"]]
    doc = proxy.rollout(sid)
    stats = doc["stats"]
    assert stats["turns"] == 4 and stats["roots"] == 1 and stats["retokenized"] == 0
    assert stats["trainable_sequences"] == 1
    turns = doc["turns"]
    for parent, child in itertools.pairwise(turns):
        assert child["parent_id"] == parent["node_id"]
        prefix = parent["prompt_token_ids"] + parent["completion_token_ids"]
        assert child["prompt_token_ids"][: len(prefix)] == prefix
    (seq,) = [s for s in doc["sequences"] if s["trainable"]]
    assert [s["node_id"] for s in seq["turn_spans"]] == [t["node_id"] for t in turns]
    # what went upstream: instructions first, calls as tool_calls with the engine's ids
    last = proxy.upstream.fake.requests[-1]
    assert last["messages"][0] == {"role": "system", "content": "You are a coding agent."}
    assert all(body["stream"] is False for body in proxy.upstream.fake.requests)


def test_non_streamed_and_streamed_replies_agree_in_the_sdk(proxy: Proxy):
    sid = proxy.open_session()
    client = proxy.client(sid)
    plain = client.responses.create(model="m", input="tell me about the sea")
    assert plain.status == "completed" and plain.model == "m"
    (turn,) = proxy.rollout(sid)["turns"]
    assert plain.output_text == TOKENIZER.decode(turn["completion_token_ids"])
    assert plain.usage.output_tokens == len(turn["completion_token_ids"])
    with client.responses.stream(model="m", input="tell me about the sea") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert len(deltas) > 1 and "".join(deltas) == plain.output_text == final.output_text

    tools = [WEATHER]
    proxy.upstream.fake.behavior.tool_call_every_turn = True
    called = client.responses.create(model="m", input="weather?", tools=tools)
    with client.responses.stream(model="m", input="weather?", tools=tools) as stream:
        args = "".join(
            e.delta for e in stream if e.type == "response.function_call_arguments.delta"
        )
        streamed = stream.get_final_response()
    (call,) = called.output
    (scall,) = streamed.output
    assert call.type == scall.type == "function_call" and call.name == "get_weather"
    assert args == scall.arguments == call.arguments
    assert scall.parsed_arguments == orjson.loads(call.arguments)


def test_max_output_tokens_gives_an_incomplete_response(proxy: Proxy):
    client = proxy.client(proxy.open_session())
    r = client.responses.create(model="m", input="long story", max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert proxy.upstream.fake.requests[-1]["max_tokens"] == 3
    events = list(
        client.responses.create(model="m", input="long story", max_output_tokens=3, stream=True)
    )
    assert events[-1].type == "response.completed" and events[-1].response.status == "incomplete"


def test_refusals_and_counts_are_answered_in_the_openai_shape_and_never_recorded(proxy: Proxy):
    sid = proxy.open_session()
    client = proxy.client(sid)
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="m", input="hi", previous_response_id="resp_1")
    assert info.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="m", input="hi", tools=[{"type": "local_shell"}])
    assert "local_shell" in info.value.message
    counted = client.responses.input_tokens.count(
        model="m", input="hello there", instructions="be brief"
    )
    assert counted.object == "response.input_tokens" and counted.input_tokens > 0
    with pytest.raises(openai.AuthenticationError):
        proxy.client("not-a-session").responses.create(model="m", input="hi")
    assert proxy.rollout(sid)["stats"]["turns"] == 0
    assert httpx.post(f"{proxy.url}/v1/responses", json={"input": "hi"}).status_code == 401


def test_requested_logprobs_come_back_on_the_output_text(proxy: Proxy):
    sid = proxy.open_session()
    r = proxy.client(sid).responses.create(
        model="m", input="hello", top_logprobs=2, include=["message.output_text.logprobs"]
    )
    (turn,) = proxy.rollout(sid)["turns"]
    logprobs = r.output[0].content[0].logprobs
    assert [lp.logprob for lp in logprobs] == pytest.approx(turn["logprobs"])
    assert all(len(lp.top_logprobs) == 2 for lp in logprobs)


def test_codex_namespace_tools_are_flattened_and_web_search_is_dropped_with_a_note():
    """codex 0.17x declares its multi-agent tools in a namespace and web_search by default."""
    body = {
        "input": "hi",
        "tools": [
            WEATHER,
            {
                "type": "namespace",
                "name": "multi_agent_v1",
                "description": "sub-agents",
                "tools": [
                    {"type": "function", "name": "close_agent", "parameters": {"type": "object"}}
                ],
            },
            {"type": "web_search", "external_web_access": True},
        ],
    }
    translated = translate(body, None)
    names = [t["function"]["name"] for t in translated.chat["tools"]]
    assert names == [WEATHER["name"], "close_agent"]
    assert any("web_search" in n for n in translated.context["notes"])


MCP_NAMESPACE = {
    "type": "namespace",
    "name": "mcp__rollwire__",
    "description": "Tools of the rollwire MCP server",
    "tools": [
        {"type": "function", "name": "list_tasks", "parameters": {"type": "object"}},
        {"type": "function", "name": "run_rollout", "parameters": {"type": "object"}},
    ],
}


def _chat_reply_calling(name: str) -> dict[str, Any]:
    call = {"id": "call_1", "type": "function", "function": {"name": name, "arguments": "{}"}}
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    return {"id": "x", "created": 1, "model": "m", "choices": [{"index": 0, "message": message,
            "finish_reason": "tool_calls"}], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}  # fmt: skip


def test_a_call_to_a_namespaced_tool_comes_back_naming_its_namespace():
    """codex declares each MCP server's tools in a namespace and routes a call by it: a call
    without one is 'unsupported call: list_tasks' (found by the client matrix)."""
    translated = translate({"input": "hi", "tools": [WEATHER, MCP_NAMESPACE]}, None)
    out = reply(_chat_reply_calling("list_tasks"), translated)["output"]
    assert [(o["name"], o.get("namespace")) for o in out] == [("list_tasks", "mcp__rollwire__")]
    plain = reply(_chat_reply_calling(WEATHER["name"]), translated)["output"]
    assert "namespace" not in plain[0]


def test_a_namespaced_call_in_history_becomes_the_tool_call_the_engine_saw():
    items = [
        {"type": "message", "role": "user", "content": "hi"},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "list_tasks",
            "namespace": "mcp__rollwire__",
            "arguments": "{}",
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "[]"},
    ]
    chat = translate({"input": items, "tools": [MCP_NAMESPACE]}, None).chat
    assert chat["messages"][1]["tool_calls"][0]["function"]["name"] == "list_tasks"
    assert chat["messages"][2] == {"role": "tool", "tool_call_id": "call_1", "content": "[]"}


def test_one_tool_name_in_two_namespaces_is_refused_naming_it():
    other = {**MCP_NAMESPACE, "name": "mcp__other__"}
    with pytest.raises(DialectError, match="'list_tasks', 'run_rollout' declared twice"):
        translate({"input": "hi", "tools": [MCP_NAMESPACE, other]}, None)
