"""The Anthropic Messages dialect: pure translation properties, and the official ``anthropic`` SDK
(sync and async) -> capture proxy (uvicorn) -> fake vLLM (uvicorn), driven like claude-code."""

from __future__ import annotations

import base64
import json
import string
from typing import Any

import anthropic
import anyio
import httpx
import httpx2
import orjson
import pydantic
import pytest
from anthropic.types import Message, ModelInfo, RawMessageStreamEvent
from hypothesis import given, settings
from hypothesis import strategies as st

from rollwire.capture.dialects import anthropic as dialect
from rollwire.capture.dialects.base import DialectError, Translated
from tests.capture.conftest import Proxy

MODEL = "claude-sonnet-4-6"
TOOLS = [
    {
        "name": "get_weather",
        "description": "The weather in a city.",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]
EVENT_ADAPTER = pydantic.TypeAdapter(RawMessageStreamEvent)


def sdk(proxy: Proxy, sid: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key=sid, max_retries=0)


def tool_loop_enabled(proxy: Proxy) -> None:
    proxy.upstream.fake.behavior.update(tool_call_every_turn=True)


def no_turns(proxy: Proxy, sid: str) -> bool:
    return proxy.rollout(sid)["stats"]["turns"] == 0


# --------------------------------------------------------------------------- SDK end to end


def test_sdk_message_is_parsed_and_captured(proxy: Proxy):
    sid = proxy.open_session()
    msg = sdk(proxy, sid).messages.create(
        model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "hello"}]
    )
    assert msg.model == MODEL and msg.stop_reason == "end_turn"
    assert msg.content[0].type == "text" and msg.content[0].text
    (turn,) = proxy.rollout(sid)["turns"]
    assert msg.usage.input_tokens == len(turn["prompt_token_ids"])
    assert msg.usage.output_tokens == len(turn["completion_token_ids"])


def test_sdk_stream_final_message_equals_the_unstreamed_one(proxy: Proxy):
    sid = proxy.open_session()
    client = sdk(proxy, sid)
    request = {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
    plain = client.messages.create(**request)
    with client.messages.stream(**request) as stream:
        streamed_text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed_text == plain.content[0].text
    same = Message.model_validate(final.to_dict())
    assert same.model_copy(update={"id": plain.id}) == plain
    assert proxy.rollout(sid)["stats"]["turns"] == 2


def test_sdk_raw_stream_has_the_anthropic_event_grammar(proxy: Proxy):
    tool_loop_enabled(proxy)
    sid = proxy.open_session()
    events = list(
        sdk(proxy, sid).messages.create(
            model=MODEL,
            max_tokens=128,
            tools=TOOLS,
            messages=[{"role": "user", "content": "weather in Paris?"}],
            stream=True,
        )
    )
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds[1:-2] == ["content_block_start"] + ["content_block_delta"] * (len(kinds) - 5) + [
        "content_block_stop"
    ]
    assert events[1].content_block.type == "tool_use"
    partial = "".join(e.delta.partial_json for e in events if e.type == "content_block_delta")
    assert "city" in json.loads(partial)
    assert events[-2].delta.stop_reason == "tool_use"


def _claude_code_loop(client: anthropic.Anthropic, questions: list[str]) -> list[Message]:
    """What claude-code does: stream every call, send the whole history each turn, answer each
    tool_use with a tool_result, and ask the next question after a text answer."""
    system = [
        {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}}
    ]
    history: list[dict[str, Any]] = [{"role": "user", "content": questions[0]}]
    replies = []
    pending = list(questions[1:])
    while True:
        with client.messages.stream(
            model=MODEL,
            max_tokens=256,
            system=system,
            tools=TOOLS,
            messages=history,
            metadata={"user_id": "session-1"},
        ) as stream:
            msg = stream.get_final_message()
        replies.append(msg)
        history.append({"role": "assistant", "content": [b.to_dict() for b in msg.content]})
        if msg.stop_reason == "tool_use":
            results = [
                {"type": "tool_result", "tool_use_id": b.id, "content": f"sunny in {b.input}"}
                for b in msg.content
                if b.type == "tool_use"
            ]
            history.append({"role": "user", "content": results})
        elif pending:
            history.append({"role": "user", "content": [{"type": "text", "text": pending.pop(0)}]})
        else:
            return replies


def test_claude_code_tool_loop_is_one_trainable_sequence(proxy: Proxy):
    tool_loop_enabled(proxy)
    sid = proxy.open_session()
    replies = _claude_code_loop(sdk(proxy, sid), ["weather in Oslo?", "and in Rome?"])
    assert [r.stop_reason for r in replies] == ["tool_use", "end_turn"] * 2
    stats = proxy.rollout(sid)["stats"]
    assert stats["turns"] == 4 and stats["roots"] == 1 and stats["retokenized"] == 0
    assert stats["sequences"] == 1 and stats["trainable_sequences"] == 1
    last = proxy.upstream.fake.requests[-1]["messages"]
    assert [m["role"] for m in last].count("tool") == 2


def test_async_sdk_tool_loop_is_one_trainable_sequence(proxy: Proxy):
    tool_loop_enabled(proxy)
    sid = proxy.open_session()

    async def main() -> list[str]:
        stops = []
        history: list[dict[str, Any]] = [{"role": "user", "content": "weather in Lima?"}]
        async with anthropic.AsyncAnthropic(
            base_url=proxy.url, api_key=sid, max_retries=0
        ) as client:
            for _ in range(2):
                async with client.messages.stream(
                    model=MODEL, max_tokens=256, tools=TOOLS, messages=history
                ) as stream:
                    msg = await stream.get_final_message()
                stops.append(msg.stop_reason)
                history.append({"role": "assistant", "content": msg.to_dict()["content"]})
                history.append(
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": b.id, "content": "ok"}
                            for b in msg.content
                            if b.type == "tool_use"
                        ]
                        or "thanks",
                    }
                )
        return stops

    assert anyio.run(main) == ["tool_use", "end_turn"]
    stats = proxy.rollout(sid)["stats"]
    assert stats["roots"] == 1 and stats["trainable_sequences"] == 1
    assert stats["retokenized"] == 0


def test_count_tokens_answers_and_records_no_turn(proxy: Proxy):
    sid = proxy.open_session()
    counted = sdk(proxy, sid).messages.count_tokens(
        model=MODEL,
        system="be brief",
        tools=TOOLS,
        messages=[{"role": "user", "content": "how many tokens is this?"}],
    )
    assert counted.input_tokens > 10
    assert no_turns(proxy, sid) and proxy.upstream.fake.requests == []


def test_unknown_key_gets_401_in_anthropic_shape(proxy: Proxy):
    with pytest.raises(anthropic.AuthenticationError) as err:
        sdk(proxy, "rw-not-a-session").messages.create(
            model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "x"}]
        )
    assert err.value.status_code == 401
    assert err.value.body["type"] == "error"
    assert err.value.body["error"]["type"] == "authentication_error"
    assert proxy.upstream.fake.requests == []


def test_bearer_token_is_a_session_key(proxy: Proxy):
    sid = proxy.open_session()
    client = anthropic.Anthropic(base_url=proxy.url, auth_token=sid, api_key=None, max_retries=0)
    client.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "x"}])
    assert proxy.rollout(sid)["stats"]["turns"] == 1


def test_untranslatable_request_is_a_400_and_nothing_is_forwarded(proxy: Proxy):
    sid = proxy.open_session()
    with pytest.raises(anthropic.BadRequestError) as err:
        sdk(proxy, sid).messages.create(
            model=MODEL,
            max_tokens=8,
            tools=[{"type": "web_search_20250305", "name": "web_search"}],
            messages=[{"role": "user", "content": "x"}],
        )
    assert err.value.body["error"]["type"] == "invalid_request_error"
    assert "web_search_20250305" in err.value.body["error"]["message"]
    assert proxy.upstream.fake.requests == [] and no_turns(proxy, sid)


def test_upstream_failure_reaches_the_sdk_in_anthropic_shape(proxy: Proxy):
    sid = proxy.open_session()
    proxy.upstream.fake.behavior.update(fail_status=500, fail_count=1)
    with pytest.raises(anthropic.InternalServerError) as err:
        sdk(proxy, sid).messages.create(
            model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "x"}]
        )
    assert err.value.body["error"]["type"] == "api_error"


def test_anthropic_route_and_openai_route_share_the_session(proxy: Proxy):
    sid = proxy.open_session()
    resp = httpx.post(
        f"{proxy.url}/v1/messages",
        headers={"x-api-key": sid, "anthropic-version": "2023-06-01"},
        json={"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]},
    )
    assert resp.status_code == 200 and resp.json()["type"] == "message"
    proxy.client(sid).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "y"}]
    )
    assert proxy.rollout(sid)["stats"]["turns"] == 2


# --------------------------------------------------------------------------- strategies

texts = st.text(max_size=16)
nonempty = st.text(min_size=1, max_size=16)
names = st.from_regex(r"[a-z][a-z_]{0,7}", fullmatch=True)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
inputs = st.dictionaries(texts, json_values, max_size=4)
extras = st.sampled_from([{}, {"cache_control": {"type": "ephemeral"}}])
text_blocks = st.builds(lambda t, x: {"type": "text", "text": t, **x}, texts, extras)
images = st.one_of(
    st.builds(
        lambda media, data: {
            "type": "image",
            "source": {"type": "base64", "media_type": media, "data": data},
        },
        st.sampled_from(["image/png", "image/jpeg", "image/gif", "image/webp"]),
        st.text(alphabet=string.ascii_letters + string.digits + "+/=", max_size=24),
    ),
    st.builds(
        lambda path: {
            "type": "image",
            "source": {"type": "url", "url": f"https://img.test/{path}"},
        },
        st.text(alphabet=string.ascii_lowercase, max_size=8),
    ),
)
user_parts = text_blocks | images


@st.composite
def tools(draw: st.DrawFn) -> list[dict[str, Any]]:
    out = []
    for name in draw(st.lists(names, max_size=3, unique=True)):
        tool: dict[str, Any] = {
            "name": name,
            "input_schema": {
                "type": "object",
                "properties": {p: {"type": "string"} for p in draw(st.lists(names, max_size=2))},
            },
        }
        if draw(st.booleans()):
            tool["description"] = draw(texts)
        if draw(st.booleans()):
            tool["strict"] = draw(st.booleans())
        if draw(st.booleans()):
            tool["type"] = "custom"
        out.append(tool)
    return out


@st.composite
def tool_results(draw: st.DrawFn, tool_use_id: str) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_use_id}
    content = draw(st.none() | texts | st.lists(user_parts, max_size=2))
    if content is not None:
        block["content"] = content
    is_error = draw(st.sampled_from([None, False, True]))
    if is_error is not None:
        block["is_error"] = is_error
    return block


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    declared = draw(tools())
    tool_names = [t["name"] for t in declared]
    messages: list[dict[str, Any]] = []
    pending: list[str] = []
    rounds = draw(st.integers(1, 4))
    for r in range(rounds):
        if pending:
            results = [draw(tool_results(i)) for i in pending]
            content = draw(st.permutations(results + draw(st.lists(user_parts, max_size=2))))
            messages.append({"role": "user", "content": content})
        else:
            messages.append(
                {"role": "user", "content": draw(texts | st.lists(user_parts, max_size=3))}
            )
        if r == rounds - 1:
            break
        blocks: list[dict[str, Any]] = []
        if draw(st.booleans()):
            signature = draw(
                st.sampled_from(["sig", "rollwire:reasoning", "rollwire:reasoning_content"])
            )
            blocks.append({"type": "thinking", "thinking": draw(texts), "signature": signature})
        blocks += [{"type": "text", "text": t} for t in draw(st.lists(nonempty, max_size=2))]
        calls = [
            {
                "type": "tool_use",
                "id": f"toolu_{r}_{j}",
                "name": draw(st.sampled_from(tool_names) if tool_names else names),
                "input": draw(inputs),
            }
            for j in range(draw(st.integers(0, 2)))
        ]
        pending = [c["id"] for c in calls]
        blocks += calls
        if len(blocks) == 1 and blocks[0]["type"] == "text" and draw(st.booleans()):
            messages.append({"role": "assistant", "content": blocks[0]["text"]})
        else:
            messages.append({"role": "assistant", "content": blocks})
    body: dict[str, Any] = {
        "model": draw(st.sampled_from([MODEL, "claude-haiku-4-5"])),
        "max_tokens": draw(st.integers(1, 10**6)),
        "messages": messages,
    }
    system = draw(st.none() | texts | st.lists(text_blocks | images, max_size=3))
    if system is not None:
        body["system"] = system
    if declared:
        body["tools"] = declared
        choice = draw(
            st.sampled_from([None, {"type": "auto"}, {"type": "any"}, {"type": "none"}])
            | st.builds(lambda n: {"type": "tool", "name": n}, st.sampled_from(tool_names))
        )
        if choice is not None:
            if choice["type"] != "none" and draw(st.booleans()):
                choice["disable_parallel_tool_use"] = draw(st.booleans())
            body["tool_choice"] = choice
    for key, values in (
        ("temperature", st.floats(0, 1)),
        ("top_p", st.floats(0, 1)),
        ("top_k", st.integers(1, 500)),
        ("stop_sequences", st.lists(nonempty, min_size=1, max_size=3)),
        ("stream", st.booleans()),
        ("metadata", st.just({"user_id": "u1"})),
        ("thinking", st.just({"type": "enabled", "budget_tokens": 2048})),
        ("service_tier", st.just("auto")),
    ):
        if draw(st.booleans()):
            body[key] = draw(values)
    return body


# --------------------------------------------------------------------------- request properties


def _canon_part(block: dict[str, Any]) -> dict[str, Any]:
    if block["type"] == "text":
        return {"type": "text", "text": block["text"]}
    return {"type": "image", "source": block["source"]}


def _canon_content(content: Any) -> Any:
    return content if isinstance(content, str) else [_canon_part(b) for b in content]


def canon(body: dict[str, Any]) -> dict[str, Any]:
    """What must survive translation, in the one order a chat request can carry it."""
    out: dict[str, Any] = {"model": body["model"], "max_tokens": body["max_tokens"]}
    if body.get("system"):
        out["system"] = _canon_content(body["system"])
    messages = []
    for m in body["messages"]:
        content = m["content"]
        if m["role"] == "user":
            if not isinstance(content, str):
                results = [
                    {
                        "type": "tool_result",
                        "tool_use_id": b["tool_use_id"],
                        "content": _canon_content(b.get("content", "")),
                        **({"is_error": True} if b.get("is_error") else {}),
                    }
                    for b in content
                    if b["type"] == "tool_result"
                ]
                content = results + [_canon_part(b) for b in content if b["type"] != "tool_result"]
        else:
            blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
            content = [
                *(
                    {"type": "thinking", "thinking": b["thinking"]}
                    for b in blocks
                    if b["type"] == "thinking"
                ),
                *({"type": "text", "text": b["text"]} for b in blocks if b["type"] == "text"),
                *(
                    {k: b[k] for k in ("type", "id", "name", "input")}
                    for b in blocks
                    if b["type"] == "tool_use"
                ),
            ]
        messages.append({"role": m["role"], "content": content})
    out["messages"] = messages
    if body.get("tools"):
        out["tools"] = [
            {k: t[k] for k in ("name", "description", "input_schema", "strict") if k in t}
            for t in body["tools"]
        ]
        if body.get("tool_choice"):
            out["tool_choice"] = body["tool_choice"]
    for key in ("temperature", "top_p", "top_k", "stop_sequences"):
        if key in body:
            out[key] = body[key]
    return out


def _back_part(part: dict[str, Any]) -> dict[str, Any]:
    if part["type"] == "text":
        return {"type": "text", "text": part["text"]}
    url = part["image_url"]["url"]
    if url.startswith("data:"):
        media, _, data = url.removeprefix("data:").partition(";base64,")
        return {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def _back_content(content: Any) -> Any:
    return content if isinstance(content, str) else [_back_part(p) for p in content]


def _back_assistant(m: dict[str, Any]) -> list[dict[str, Any]]:
    blocks = []
    for key in ("reasoning_content", "reasoning"):
        if key in m:
            blocks.append({"type": "thinking", "thinking": m[key]})
    content = m["content"]
    if isinstance(content, str) and content:
        blocks.append({"type": "text", "text": content})
    elif isinstance(content, list):
        blocks += [{"type": "text", "text": p["text"]} for p in content]
    for call in m.get("tool_calls", []):
        fn = call["function"]
        blocks.append(
            {
                "type": "tool_use",
                "id": call["id"],
                "name": fn["name"],
                "input": json.loads(fn["arguments"]),
            }
        )
    return blocks


def back(chat: dict[str, Any]) -> dict[str, Any]:
    """The inverse of the translation (for requests without consecutive same-role messages)."""
    out: dict[str, Any] = {"model": chat["model"], "max_tokens": chat["max_tokens"]}
    msgs = list(chat["messages"])
    if msgs[0]["role"] == "system":
        out["system"] = _back_content(msgs.pop(0)["content"])
    messages: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []
    for m in msgs:
        if m["role"] == "tool":
            pending.append(
                {
                    "type": "tool_result",
                    "tool_use_id": m["tool_call_id"],
                    "content": _back_content(m["content"]),
                    **({"is_error": True} if m.get("is_error") else {}),
                }
            )
        elif m["role"] == "user":
            content = _back_content(m["content"])
            messages.append({"role": "user", "content": pending + content if pending else content})
            pending = []
        else:
            if pending:
                messages.append({"role": "user", "content": pending})
                pending = []
            messages.append({"role": "assistant", "content": _back_assistant(m)})
    if pending:
        messages.append({"role": "user", "content": pending})
    out["messages"] = messages
    if "tools" in chat:
        out["tools"] = []
        for t in chat["tools"]:
            fn = t["function"]
            tool = {"name": fn["name"], "input_schema": fn["parameters"]}
            tool.update({k: fn[k] for k in ("description", "strict") if k in fn})
            out["tools"].append(tool)
    if "tool_choice" in chat:
        choice = chat["tool_choice"]
        kinds = {"auto": {"type": "auto"}, "required": {"type": "any"}, "none": {"type": "none"}}
        out["tool_choice"] = (
            dict(kinds[choice])
            if isinstance(choice, str)
            else {"type": "tool", "name": choice["function"]["name"]}
        )
        if "parallel_tool_calls" in chat:
            out["tool_choice"]["disable_parallel_tool_use"] = not chat["parallel_tool_calls"]
    for key in ("temperature", "top_p", "top_k"):
        if key in chat:
            out[key] = chat[key]
    if "stop" in chat:
        out["stop_sequences"] = chat["stop"]
    return out


@settings(max_examples=100, deadline=None)
@given(requests())
def test_requests_translate_without_loss(body: dict[str, Any]):
    translated = dialect.translate(body)
    assert back(translated.chat) == canon(body)
    assert translated.stream is bool(body.get("stream"))
    assert "stream" not in translated.chat
    for key in ("metadata", "thinking", "service_tier"):
        assert (key in body) == (key in translated.context["ignored"])


@settings(max_examples=60, deadline=None)
@given(requests())
def test_thinking_keeps_the_reasoning_key_its_signature_names(body: dict[str, Any]):
    chat = dialect.translate(body).chat
    assistants = [m for m in body["messages"] if m["role"] == "assistant"]
    translated = [m for m in chat["messages"] if m["role"] == "assistant"]
    for original, message in zip(assistants, translated, strict=True):
        blocks = original["content"] if isinstance(original["content"], list) else []
        for block in blocks:
            if block["type"] == "thinking":
                key = block["signature"].removeprefix("rollwire:")
                key = key if key == "reasoning" else "reasoning_content"
                assert message[key] == block["thinking"]


def test_tool_results_come_first_then_the_rest_of_the_message():
    chat = dialect.translate(
        {
            "max_tokens": 5,
            "messages": [
                {"role": "user", "content": "go"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": "a", "name": "f", "input": {}},
                        {"type": "tool_use", "id": "b", "name": "f", "input": {}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "both done"},
                        {"type": "tool_result", "tool_use_id": "a", "content": "1"},
                        {
                            "type": "tool_result",
                            "tool_use_id": "b",
                            "content": "2",
                            "is_error": True,
                        },
                    ],
                },
            ],
        }
    ).chat
    assert [(m["role"], m.get("tool_call_id")) for m in chat["messages"][2:]] == [
        ("tool", "a"),
        ("tool", "b"),
        ("user", None),
    ]
    assert chat["messages"][3]["is_error"] is True and "is_error" not in chat["messages"][2]


@pytest.mark.parametrize(
    "tool_type",
    [
        "bash_20250124",
        "text_editor_20250728",
        "web_search_20250305",
        "web_fetch_20250910",
        "code_execution_20250825",
        "memory_20250818",
    ],
)
def test_anthropic_defined_tools_are_refused_by_type(tool_type: str):
    body = {
        "max_tokens": 5,
        "tools": [{"type": tool_type, "name": "t"}],
        "messages": [{"role": "user", "content": "x"}],
    }
    with pytest.raises(DialectError) as err:
        dialect.translate(body)
    assert tool_type in err.value.message and err.value.param == "tools.0.type"


@pytest.mark.parametrize(
    ("role", "block"),
    [
        ("assistant", {"type": "redacted_thinking", "data": "opaque"}),
        ("assistant", {"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}}),
        (
            "user",
            {
                "type": "document",
                "source": {"type": "text", "media_type": "text/plain", "data": "d"},
            },
        ),
        ("user", {"type": "search_result", "source": "s", "title": "t", "content": []}),
        ("user", {"type": "image", "source": {"type": "file", "file_id": "file_1"}}),
    ],
)
def test_blocks_without_a_chat_equivalent_are_refused(role: str, block: dict[str, Any]):
    messages = [{"role": "user", "content": "x"}, {"role": role, "content": [block]}]
    if role == "assistant":
        messages.append({"role": "user", "content": "y"})
    with pytest.raises(DialectError) as err:
        dialect.translate({"max_tokens": 5, "messages": messages})
    assert err.value.param.startswith("messages.1.content.0")


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        ({"mcp_servers": [{"type": "url", "url": "https://x", "name": "x"}]}, "mcp_servers"),
        (
            {
                "messages": [
                    {"role": "user", "content": "x"},
                    {"role": "assistant", "content": "So"},
                ]
            },
            "messages.1",
        ),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
        ({"tool_choice": {"type": "any"}}, "tool_choice"),
    ],
)
def test_requests_that_cannot_be_translated_faithfully_are_refused(change: dict, param: str):
    body = {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], **change}
    body = {k: v for k, v in body.items() if v is not None}
    with pytest.raises(DialectError) as err:
        dialect.translate(body)
    assert err.value.param == param


def test_output_config_format_becomes_a_json_schema_response_format():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    chat = dialect.translate(
        {
            "max_tokens": 5,
            "messages": [{"role": "user", "content": "x"}],
            "output_config": {"effort": "low", "format": {"type": "json_schema", "schema": schema}},
        }
    ).chat
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": schema},
    }


# --------------------------------------------------------------------------- reply properties

arguments = st.one_of(
    st.builds(
        lambda value, ascii_, seps: json.dumps(value, ensure_ascii=ascii_, separators=seps),
        inputs,
        st.booleans(),
        st.sampled_from([None, (",", ":"), (", ", ": ")]),
    ),
    st.text(max_size=12),  # not JSON, or JSON that is not an object
    st.lists(json_values, max_size=2).map(json.dumps),
)


@st.composite
def chat_replies(draw: st.DrawFn) -> tuple[dict[str, Any], Translated]:
    stops = draw(st.lists(nonempty, max_size=2))
    message: dict[str, Any] = {"role": "assistant", "content": draw(st.none() | texts)}
    key = draw(st.sampled_from([None, "reasoning_content", "reasoning"]))
    if key:
        message[key] = draw(texts)
    calls = [
        {
            "id": draw(st.none() | st.from_regex(r"chatcmpl-tool-[0-9a-f]{8}", fullmatch=True)),
            "type": "function",
            "function": {"name": draw(names), "arguments": draw(arguments)},
        }
        for _ in range(draw(st.integers(0, 3)))
    ]
    if calls:
        message["tool_calls"] = calls
    choice = {
        "index": 0,
        "message": message,
        "finish_reason": draw(
            st.sampled_from(["stop", "length", "tool_calls", "content_filter", None])
        ),
        "stop_reason": draw(st.sampled_from([None, 7, *stops])),
    }
    prompt = draw(st.integers(0, 10**5))
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": draw(st.integers(0, 10**4)),
    }
    if draw(st.booleans()):
        usage["prompt_tokens_details"] = {"cached_tokens": draw(st.integers(0, prompt))}
    reply = {
        "id": draw(st.sampled_from(["chatcmpl-abc", "", None])),
        "model": "smol",
        "choices": [choice],
        "usage": usage,
    }
    body = {"model": MODEL, "max_tokens": 9, "messages": [{"role": "user", "content": "q"}]}
    if stops:
        body["stop_sequences"] = stops
    return reply, dialect.translate(body)


class _Replay:
    """An SDK client whose HTTP transport answers with the SSE bytes it is given."""

    def __init__(self) -> None:
        self.body = b""
        transport = httpx2.MockTransport(
            lambda _req: httpx2.Response(
                200, content=self.body, headers={"content-type": "text/event-stream"}
            )
        )
        self.client = anthropic.Anthropic(
            api_key="k",
            base_url="http://replay.test",
            http_client=httpx2.Client(transport=transport),
            max_retries=0,
        )

    def final_message(self, body: bytes) -> Message:
        self.body = body
        with self.client.messages.stream(
            model=MODEL, max_tokens=9, messages=[{"role": "user", "content": "q"}]
        ) as stream:
            final = stream.get_final_message()
        return Message.model_validate(final.to_dict())


REPLAY = _Replay()


def _events(body: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for frame in body.split(b"\n\n"):
        if frame:
            head, data = frame.split(b"\n")
            assert head.startswith(b"event: ") and data.startswith(b"data: ")
            out.append(
                (head.removeprefix(b"event: ").decode(), orjson.loads(data.removeprefix(b"data: ")))
            )
    return out


@settings(max_examples=100, deadline=None)
@given(chat_replies())
def test_replies_and_their_streams_validate_and_reassemble(case):
    chat_reply, translated = case
    reply = dialect.reply(chat_reply, translated)
    message = Message.model_validate(reply)
    assert message.model == MODEL and message.id.startswith("msg_")
    body = b"".join(dialect.sse(reply, translated))
    events = _events(body)
    for name, data in events:
        assert name == data["type"]
        if name != "ping":
            EVENT_ADAPTER.validate_python(data)
    assert REPLAY.final_message(body) == message


@settings(max_examples=100, deadline=None)
@given(chat_replies())
def test_the_next_request_carries_back_what_was_sampled(case):
    chat_reply, translated = case
    sampled = chat_reply["choices"][0]["message"]
    parsed = Message.model_validate(dialect.reply(chat_reply, translated))
    body = {
        "max_tokens": 9,
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [b.to_dict() for b in parsed.content]},
            {"role": "user", "content": "next"},
        ],
    }
    again = dialect.translate(body).chat["messages"][1]
    assert (again["content"] or "") == (sampled["content"] or "") or (
        not sampled.get("tool_calls") and not sampled["content"] and again["content"] == ""
    )
    for key in ("reasoning_content", "reasoning"):
        assert again.get(key) == (sampled.get(key) or None)
    calls = sampled.get("tool_calls", [])
    assert len(again.get("tool_calls", [])) == len(calls)
    for call, back_call in zip(calls, again.get("tool_calls", []), strict=True):
        if call["id"]:
            assert back_call["id"] == call["id"]
        assert back_call["id"] and back_call["function"]["name"] == call["function"]["name"]
        was, now = call["function"]["arguments"], back_call["function"]["arguments"]
        try:
            value = orjson.loads(was)
        except orjson.JSONDecodeError:
            value = None
        if isinstance(value, dict):  # the proxy restores the exact string by call id
            assert orjson.loads(now) == value
        else:
            assert now == was


@pytest.mark.parametrize(
    ("finish", "stop_reason", "calls", "expected"),
    [
        ("stop", None, False, ("end_turn", None)),
        ("length", None, False, ("max_tokens", None)),
        ("tool_calls", None, True, ("tool_use", None)),
        ("stop", None, True, ("tool_use", None)),
        ("stop", "END", False, ("stop_sequence", "END")),
        ("stop", 2, False, ("end_turn", None)),
        ("content_filter", None, False, ("refusal", None)),
    ],
)
def test_finish_reasons_map_to_stop_reasons(finish, stop_reason, calls, expected):
    message: dict[str, Any] = {"content": "done"}
    if calls:
        message["tool_calls"] = [{"id": "c", "function": {"name": "f", "arguments": "{}"}}]
    translated = dialect.translate(
        {"max_tokens": 5, "stop_sequences": ["END"], "messages": [{"role": "user", "content": "x"}]}
    )
    reply = dialect.reply(
        {"choices": [{"message": message, "finish_reason": finish, "stop_reason": stop_reason}]},
        translated,
    )
    assert (reply["stop_reason"], reply["stop_sequence"]) == expected


def test_tool_call_without_an_id_gets_one():
    translated = dialect.translate(
        {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    )
    call = {"id": None, "function": {"name": "f", "arguments": '{"a": 1}'}}
    reply = dialect.reply({"choices": [{"message": {"tool_calls": [call]}}]}, translated)
    (block,) = reply["content"]
    assert block["id"].startswith("toolu_") and block["input"] == {"a": 1}


# --------------------------------------------------------------------------- aux routes


def test_count_tokens_grows_with_every_field():
    base = {"messages": [{"role": "user", "content": "hi"}]}
    n = dialect.count_tokens(base)["input_tokens"]
    additions = [
        {"system": "a long system prompt " * 10},
        {"tools": TOOLS},
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": [{"type": "thinking", "thinking": "hmm " * 20, "signature": "s"}],
                },
            ]
        },
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t", "content": "out " * 30}
                    ],
                }
            ]
        },
    ]
    for extra in additions:
        assert dialect.count_tokens({**base, **extra})["input_tokens"] > n, extra


def test_count_tokens_counts_an_image_as_an_image_not_its_base64():
    data = base64.b64encode(b"\0" * 300_000).decode()
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}
    counted = dialect.count_tokens({"messages": [{"role": "user", "content": [image]}]})
    assert dialect.IMAGE_TOKENS <= counted["input_tokens"] < 2 * dialect.IMAGE_TOKENS


def test_count_tokens_never_raises_on_a_malformed_body():
    assert (
        dialect.count_tokens({"messages": "nope", "system": 3, "tools": [None]})["input_tokens"]
        >= 1
    )


def test_models_listing_has_anthropics_shape():
    listing = dialect.models(["smol", "big"])
    assert [ModelInfo.model_validate(m).id for m in listing["data"]] == ["smol", "big"]
    assert listing["has_more"] is False
    assert (listing["first_id"], listing["last_id"]) == ("smol", "big")


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (415, "invalid_request_error"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (502, "api_error"),
        (529, "overloaded_error"),
    ],
)
def test_errors_have_anthropics_shape_and_type(status: int, kind: str):
    body = dialect.error(status, "went wrong", "max_tokens")
    assert body == {"type": "error", "error": {"type": kind, "message": "max_tokens: went wrong"}}


def test_session_key_is_x_api_key_then_bearer():
    assert dialect.session_key({"x-api-key": "a", "authorization": "Bearer b"}, {}) == "a"
    assert dialect.session_key({"authorization": "Bearer b"}, {}) == "b"
    assert dialect.session_key({}, {"key": "c"}) is None


def test_a_system_message_inside_messages_stays_in_place():
    """claude-code 2.x sends system reminders as messages of their own."""
    body = {
        "max_tokens": 5,
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "system", "content": "Available agent types: ..."},
            {"role": "user", "content": "go"},
        ],
    }
    chat = dialect.DIALECT.translate(body, None).chat
    assert [m["role"] for m in chat["messages"]] == ["user", "system", "user"]
    assert chat["messages"][1]["content"] == "Available agent types: ..."
