"""The Google Gemini dialect: the official google-genai SDK -> proxy (uvicorn) -> fake vLLM, and
property tests of the pure translation functions."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import orjson
import pytest
from google import genai
from google.genai import errors, types
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollwire.capture.dialects import google as g
from rollwire.capture.dialects.base import DialectError, Translated
from tests.capture.conftest import Proxy

WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city.",
    "parametersJsonSchema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def client(proxy: Proxy, key: str, api_version: str = "v1") -> genai.Client:
    options = types.HttpOptions(base_url=proxy.url, api_version=api_version)
    return genai.Client(api_key=key, http_options=options)


def weather_config(**kw: Any) -> types.GenerateContentConfig:
    return types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[types.FunctionDeclaration(**WEATHER)])],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
        **kw,
    )


def sse_events(raw: str) -> list[dict[str, Any]]:
    events = [e for e in raw.replace("\r\n", "\n").split("\n\n") if e.strip()]
    assert all(e.startswith("data: ") for e in events)
    return [json.loads(e[len("data: ") :]) for e in events]


def merged_parts(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive text parts of the same kind (thought or not) joined: a stream reassembled."""
    out: list[dict[str, Any]] = []
    for part in parts:
        prev = out[-1] if out else None
        if (
            prev is not None
            and "text" in part
            and "text" in prev
            and bool(prev.get("thought")) == bool(part.get("thought"))
        ):
            prev["text"] += part["text"]
        else:
            out.append(dict(part))
    return out


# ---- the SDK end to end ----------------------------------------------------------------------


@pytest.mark.parametrize("api_version", ["v1", "v1beta"])
def test_sdk_generate_content_is_captured(proxy: Proxy, api_version: str):
    sid = proxy.open_session()
    sdk = client(proxy, sid, api_version)
    reply = sdk.models.generate_content(model="gemini-2.5-flash", contents="hello")
    doc = proxy.rollout(sid)
    (turn,) = doc["turns"]
    (sent,) = proxy.upstream.fake.requests
    assert sent["messages"] == [{"role": "user", "content": "hello"}]
    assert reply.text and reply.candidates[0].finish_reason == types.FinishReason.STOP
    assert reply.usage_metadata.candidates_token_count == len(turn["completion_token_ids"])
    assert reply.usage_metadata.prompt_token_count == len(turn["prompt_token_ids"])


def test_sdk_stream_reassembles_to_the_whole_reply(proxy: Proxy):
    sid = proxy.open_session()
    sdk = client(proxy, sid)  # keep the client: it closes its connection pool when collected
    models = sdk.models
    config = types.GenerateContentConfig(seed=7)
    whole = models.generate_content(model="m", contents="stream please", config=config)
    chunks = list(
        models.generate_content_stream(model="m", contents="stream please", config=config)
    )
    assert len(chunks) > 1 and all(c.candidates[0].content.parts for c in chunks)
    assert "".join(c.text for c in chunks) == whole.text
    assert [c.candidates[0].finish_reason for c in chunks][-1] == types.FinishReason.STOP
    assert all(c.candidates[0].finish_reason is None for c in chunks[:-1])
    assert chunks[-1].usage_metadata.total_token_count == whole.usage_metadata.total_token_count
    assert all(body["stream"] is False for body in proxy.upstream.fake.requests)


def _strip_ids(content: types.Content) -> types.Content:
    parts = [
        types.Part(function_call=p.function_call.model_copy(update={"id": None}))
        if p.function_call
        else p
        for p in content.parts
    ]
    return types.Content(role=content.role, parts=parts)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("ids", ["echoed", "calls_only", "none"])
def test_sdk_function_calling_conversation_is_one_trainable_sequence(
    proxy: Proxy, stream: bool, ids: str
):
    """gemini-cli's loop: full history each turn; a streamed reply is kept chunk by chunk (as the
    SDK's chat history does); function responses echo the call id, or omit it (the SDK's own
    function calling), or the history has no ids at all (as from Gemini itself)."""
    proxy.upstream.fake.behavior.tool_call_every_turn = True
    sid = proxy.open_session()
    sdk = client(proxy, sid)  # keep the client: it closes its connection pool when collected
    models = sdk.models
    config = weather_config(system_instruction="You are terse.")
    history: list[types.Content] = []
    calls = 0
    for question in ("weather in Paris?", "and tomorrow?"):
        history.append(types.Content(role="user", parts=[types.Part.from_text(text=question)]))
        while True:
            if stream:
                chunks = list(
                    models.generate_content_stream(model="m", contents=history, config=config)
                )
                contents = [c.candidates[0].content for c in chunks]
            else:
                contents = [
                    models.generate_content(model="m", contents=history, config=config)
                    .candidates[0]
                    .content
                ]
            fcs = [p.function_call for c in contents for p in c.parts if p.function_call]
            history += [_strip_ids(c) if ids == "none" else c for c in contents]
            if not fcs:
                break
            calls += len(fcs)
            assert all(fc.id and fc.name == "get_weather" and fc.args["city"] for fc in fcs)
            responses = [
                types.Part(
                    function_response=types.FunctionResponse(
                        name=fc.name,
                        response={"output": f"sunny in {fc.args['city']}"},
                        id=fc.id if ids == "echoed" else None,
                    )
                )
                for fc in fcs
            ]
            history.append(types.Content(role="user", parts=responses))
    assert calls == 2
    stats = proxy.rollout(sid)["stats"]
    assert stats["turns"] == 4
    assert stats["roots"] == 1 and stats["trainable_sequences"] == 1
    assert stats["retokenized"] == 0
    last = proxy.upstream.fake.requests[-1]["messages"]
    call_ids = [c["id"] for m in last if m["role"] == "assistant" for c in m.get("tool_calls", [])]
    assert [m["tool_call_id"] for m in last if m["role"] == "tool"] == call_ids


def test_sdk_automatic_function_calling_is_one_trainable_sequence(proxy: Proxy):
    proxy.upstream.fake.behavior.tool_call_every_turn = True
    sid = proxy.open_session()
    seen: list[str] = []

    def get_weather(city: str) -> str:
        """Weather for a city."""
        seen.append(city)
        return f"sunny in {city}"

    sdk = client(proxy, sid)
    reply = sdk.models.generate_content(
        model="m",
        contents="weather in Paris?",
        config=types.GenerateContentConfig(tools=[get_weather]),
    )
    assert len(seen) == 1 and reply.text
    stats = proxy.rollout(sid)["stats"]
    assert stats["turns"] == 2 and stats["trainable_sequences"] == 1 and stats["roots"] == 1


def test_sdk_count_tokens_answers_and_records_nothing(proxy: Proxy):
    sid = proxy.open_session()
    sdk = client(proxy, sid)  # keep the client: it closes its connection pool when collected
    models = sdk.models
    short = models.count_tokens(model="m", contents="hello")
    long = models.count_tokens(model="m", contents="hello " * 200)
    assert 0 < short.total_tokens < long.total_tokens
    assert proxy.rollout(sid)["stats"]["turns"] == 0 and proxy.upstream.fake.requests == []


def test_sdk_model_list(proxy: Proxy):
    sid = proxy.open_session()
    sdk = client(proxy, sid, "v1beta")
    (model,) = sdk.models.list()
    assert model.name == "models/smol" and "generateContent" in model.supported_actions


@pytest.mark.parametrize(
    "action",
    [":StreamGenerateContent", ":streamgeneratecontent", ":STREAMGENERATECONTENT"],
)
def test_mixed_case_stream_action_streams(proxy: Proxy, action: str):
    sid = proxy.open_session()
    resp = httpx.post(
        f"{proxy.url}/v1beta/models/gemini-2.5-flash{action}?alt=sse",
        json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
        headers={"x-goog-api-key": sid},
    )
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    events = [types.GenerateContentResponse.model_validate(e) for e in sse_events(resp.text)]
    assert events[-1].candidates[0].finish_reason == types.FinishReason.STOP
    assert proxy.rollout(sid)["stats"]["turns"] == 1


def test_mixed_case_generate_action_answers_json(proxy: Proxy):
    sid = proxy.open_session()
    resp = httpx.post(
        f"{proxy.url}/v1/models/m:GENERATECONTENT",
        json={"contents": [{"parts": [{"text": "hi"}]}]},
        headers={"x-goog-api-key": sid},
    )
    assert resp.status_code == 200
    assert types.GenerateContentResponse.model_validate(resp.json()).text


def test_unknown_key_gets_401_in_googles_shape(proxy: Proxy):
    sdk = client(proxy, "not-a-session")
    with pytest.raises(errors.ClientError) as caught:
        sdk.models.generate_content(model="m", contents="hi")
    assert caught.value.code == 401 and caught.value.status == "UNAUTHENTICATED"
    assert proxy.upstream.fake.requests == []


def test_key_as_query_parameter_is_accepted(proxy: Proxy):
    sid = proxy.open_session()
    resp = httpx.post(
        f"{proxy.url}/v1beta/models/m:generateContent",
        params={"key": sid},
        json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
    )
    assert resp.status_code == 200 and resp.json()["candidates"][0]["content"]["parts"]
    assert proxy.rollout(sid)["stats"]["turns"] == 1


def test_unknown_action_is_404_in_googles_shape(proxy: Proxy):
    sid = proxy.open_session()
    resp = httpx.post(
        f"{proxy.url}/v1beta/models/m:embedContent",
        json={"content": {"parts": [{"text": "hi"}]}},
        headers={"x-goog-api-key": sid},
    )
    assert resp.status_code == 404 and resp.json()["error"]["status"] == "NOT_FOUND"


def test_builtin_google_tool_is_refused_before_forwarding(proxy: Proxy):
    sid = proxy.open_session()
    config = types.GenerateContentConfig(tools=[types.Tool(google_search=types.GoogleSearch())])
    sdk = client(proxy, sid)
    with pytest.raises(errors.ClientError) as caught:
        sdk.models.generate_content(model="m", contents="hi", config=config)
    assert caught.value.code == 400 and caught.value.status == "INVALID_ARGUMENT"
    assert "googleSearch" in caught.value.message
    assert proxy.upstream.fake.requests == [] and proxy.rollout(sid)["stats"]["turns"] == 0


# ---- pure functions: routes, keys, refusals --------------------------------------------------


@pytest.mark.parametrize(
    ("rest", "expected"),
    [
        ("gemini-2.5-flash:generateContent", ("turn", False)),
        ("gemini-2.5-flash:GenerateContent", ("turn", False)),
        ("gemini-2.5-flash:streamGenerateContent", ("turn", True)),
        ("gemini-2.5-flash:StreamGenerateContent", ("turn", True)),
        ("gemini-2.5-flash:countTokens", ("count", False)),
        ("gemini-2.5-flash:COUNTTOKENS", ("count", False)),
        ("gemini-2.5-flash:embedContent", None),
        ("gemini-2.5-flash", None),
        (":generateContent", None),
    ],
)
def test_action_is_read_from_the_path_case_insensitively(rest: str, expected):
    assert g.action({"rest": rest}) == expected


def test_model_list_route_has_no_action_in_its_path():
    assert g.action({}) == ("models", False)


def test_session_key_order():
    both = {"x-goog-api-key": "header", "authorization": "Bearer bearer"}
    assert g.session_key(both, {"key": "query"}) == "header"
    assert g.session_key({"authorization": "Bearer bearer"}, {"key": "query"}) == "query"
    assert g.session_key({"authorization": "Bearer bearer"}, {}) == "bearer"
    assert g.session_key({}, {}) is None


def _user(text: str = "hi") -> dict[str, Any]:
    return {"role": "user", "parts": [{"text": text}]}


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"generationConfig": {"candidateCount": 2}}, "candidateCount"),
        ({"generationConfig": {"responseLogprobs": True}}, "responseLogprobs"),
        ({"generationConfig": {"responseModalities": ["AUDIO"]}}, "responseModalities"),
        ({"generationConfig": {"speechConfig": {"voiceConfig": {}}}}, "speechConfig"),
        ({"generationConfig": {"responseMimeType": "text/x.enum"}}, "responseMimeType"),
        ({"tools": [{"googleSearch": {}}]}, "googleSearch"),
        ({"tools": [{"codeExecution": {}}]}, "codeExecution"),
        ({"tools": [{"url_context": {}}]}, "urlContext"),
        ({"cachedContent": "cachedContents/abc"}, "cachedContent"),
        ({"someNewField": 1}, "someNewField"),
        (
            {"contents": [{"role": "user", "parts": [{"executableCode": {"code": "1"}}]}]},
            "executableCode",
        ),
        (
            {"contents": [{"role": "user", "parts": [{"fileData": {"fileUri": "gs://b/x.pdf"}}]}]},
            "fileData",
        ),
        (
            {
                "contents": [
                    {"role": "user", "parts": [{"inlineData": {"mimeType": "a/b", "data": ""}}]}
                ]
            },
            "a/b",
        ),
        ({"contents": [{"role": "system", "parts": [{"text": "x"}]}]}, "role"),
        (
            {
                "tools": [{"functionDeclarations": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}],
                "toolConfig": {
                    "functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["a", "b"]}
                },
            },
            "allowedFunctionNames",
        ),
    ],
)
def test_untranslatable_requests_are_refused_by_name(body: dict[str, Any], named: str):
    with pytest.raises(DialectError) as caught:
        g.translate({"contents": [_user()], **body}, False)
    assert named in caught.value.message


def test_non_text_system_parts_are_kept():
    image = base64.b64encode(b"\x89PNG").decode()
    body = {
        "contents": [_user()],
        "systemInstruction": {
            "parts": [{"text": "look:"}, {"inlineData": {"mimeType": "image/png", "data": image}}]
        },
    }
    system = g.translate(body, False).chat["messages"][0]
    assert system == {
        "role": "system",
        "content": [
            {"type": "text", "text": "look:"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}},
        ],
    }


def test_google_schema_becomes_json_schema():
    schema = {
        "type": "OBJECT",
        "properties": {
            "b": {"type": "STRING", "nullable": True, "example": "x"},
            "a": {"type": "ARRAY", "items": {"type": "INTEGER"}, "max_items": 3},
        },
        "required": ["a"],
        "property_ordering": ["a", "b"],
    }
    assert g.json_schema(schema) == {
        "type": "object",
        "properties": {
            "a": {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
            "b": {"type": ["string", "null"], "examples": ["x"]},
        },
        "required": ["a"],
    }


def test_function_response_maps_to_its_call_when_the_ids_disagree():
    """gemini-cli invents its own id for a call that had none: the response still answers it."""
    body = {
        "contents": [
            _user(),
            {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {}}}]},
            {
                "role": "user",
                "parts": [{"functionResponse": {"name": "f", "id": "f-123", "response": {}}}],
            },
        ]
    }
    _, assistant, tool = g.translate(body, False).chat["messages"]
    assert assistant["tool_calls"][0]["id"] == tool["tool_call_id"] == "call_1_0"


def test_arguments_that_are_not_an_object_survive_the_round_trip():
    chat_reply = {
        "choices": [
            {
                "message": {
                    "content": None,
                    "tool_calls": [
                        {"id": "c1", "function": {"name": "f", "arguments": "[1, 2]"}},
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ]
    }
    content = g.reply(chat_reply, Translated(chat={}))["candidates"][0]["content"]
    types.GenerateContentResponse.model_validate({"candidates": [{"content": content}]})
    messages = g.translate({"contents": [_user(), content]}, False).chat["messages"]
    assert messages[-1]["tool_calls"][0]["function"]["arguments"] == "[1, 2]"


def test_count_tokens_counts_every_field():
    base = {"contents": [_user("hello there")]}
    plain = g.count_tokens(base)["totalTokens"]
    image = {"inlineData": {"mimeType": "image/png", "data": "AAAA"}}
    more = [
        {**base, "systemInstruction": {"parts": [{"text": "be brief " * 20}]}},
        {"contents": [{"role": "user", "parts": [{"text": "hello there"}, image]}]},
        {**base, "tools": [{"functionDeclarations": [WEATHER]}]},
        {"generateContentRequest": {**base, "systemInstruction": {"parts": [{"text": "x" * 80}]}}},
    ]
    for body in more:
        assert g.count_tokens(body)["totalTokens"] > plain


@pytest.mark.parametrize(
    ("status", "name"),
    [
        (400, "INVALID_ARGUMENT"),
        (401, "UNAUTHENTICATED"),
        (404, "NOT_FOUND"),
        (429, "RESOURCE_EXHAUSTED"),
        (500, "INTERNAL"),
        (503, "UNAVAILABLE"),
    ],
)
def test_error_shape(status: int, name: str):
    body = g.error(status, "why", "contents")
    assert body["error"]["code"] == status and body["error"]["status"] == name
    assert body["error"]["message"] == "why"


# ---- property tests: requests ----------------------------------------------------------------

texts = st.text(max_size=20)
names = st.from_regex(r"[a-z][a-z0-9_]{0,11}", fullmatch=True)
scalars = st.none() | st.booleans() | st.integers(-(10**6), 10**6) | texts
json_values = st.recursive(
    scalars | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
json_objects = st.dictionaries(texts, json_values, max_size=4)


def _spell(key: str, snake: bool) -> str:
    return g._snake(key) if snake else key


@st.composite
def media(draw, snake: bool) -> tuple[dict[str, Any], tuple]:
    data = draw(st.binary(max_size=12))
    mime = draw(st.sampled_from(["image/png", "image/jpeg"]))
    url_safe = draw(st.booleans())
    encoded = (base64.urlsafe_b64encode if url_safe else base64.b64encode)(data).decode()
    if url_safe:
        encoded = encoded.rstrip("=")
    inline = {_spell("mimeType", snake): mime, "data": encoded}
    return {_spell("inlineData", snake): inline}, ("media", mime, data)


@st.composite
def user_items(draw, snake: bool) -> tuple[list[dict[str, Any]], list[tuple]]:
    parts, items = [], []
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            text = draw(texts)
            parts.append({"text": text})
            items.append(("text", text))
        else:
            part, item = draw(media(snake))
            parts.append(part)
            items.append(item)
    return parts, items


@st.composite
def requests(draw) -> tuple[dict[str, Any], dict[str, Any]]:
    """A well-formed generateContent request and what the chat body must carry."""
    snake = draw(st.booleans())
    tool_names = draw(st.lists(names, min_size=0, max_size=3, unique=True))
    body: dict[str, Any] = {}
    expect: dict[str, Any] = {"events": []}
    events = expect["events"]
    if draw(st.booleans()):
        parts, items = draw(user_items(snake))
        body[_spell("systemInstruction", snake)] = {"role": "user", "parts": parts}
        events.append(("system", items))
    contents: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(1, 4))):
        parts, items = draw(user_items(snake))
        contents.append({"role": "user", "parts": parts})
        events.append(("user", items))
        if not draw(st.booleans()):
            continue
        # a model turn, maybe split over several contents (a stream kept chunk by chunk)
        thought, text, calls = "", "", []
        for _ in range(draw(st.integers(1, 3))):
            mparts: list[dict[str, Any]] = []
            for _ in range(draw(st.integers(0, 3))):
                kind = draw(
                    st.sampled_from(["text", "thought", "call"] if tool_names else ["text"])
                )
                if kind == "call":
                    call = {"name": draw(st.sampled_from(tool_names)), "args": draw(json_objects)}
                    if draw(st.booleans()):
                        call["id"] = draw(st.from_regex(r"id-[a-z0-9]{6}", fullmatch=True))
                    mparts.append({_spell("functionCall", snake): call})
                    calls.append(call)
                else:
                    piece = draw(texts)
                    mparts.append(
                        {"text": piece, **({"thought": True} if kind == "thought" else {})}
                    )
                    if kind == "thought":
                        thought += piece
                    else:
                        text += piece
            contents.append({"role": "model", "parts": mparts})
        events.append(("model", thought, text, [(c["name"], c["args"]) for c in calls]))
        if calls:
            responses = []
            for call in calls:
                fr = {"name": call["name"], "response": draw(json_objects)}
                if "id" in call and draw(st.booleans()):
                    fr["id"] = call["id"]
                responses.append({_spell("functionResponse", snake): fr})
                events.append(("tool", call["name"], fr["response"]))
            contents.append({"role": "user", "parts": responses})
    body["contents"] = contents
    if tool_names:
        decls = []
        for name in tool_names:
            schema = {"type": "object", "properties": {"x": {"type": "string"}}}
            decl: dict[str, Any] = {"name": name}
            if draw(st.booleans()):
                decl["description"] = draw(texts)
            if draw(st.booleans()):
                decl[_spell("parametersJsonSchema", snake)] = schema
            else:
                decl["parameters"] = {"type": "OBJECT", "properties": {"x": {"type": "STRING"}}}
            decls.append(decl)
        body["tools"] = [{_spell("functionDeclarations", snake): decls}]
        expect["tools"] = [
            (
                d["name"],
                d.get("description"),
                {"type": "object", "properties": {"x": {"type": "string"}}},
            )
            for d in decls
        ]
        mode = draw(st.sampled_from(["AUTO", "ANY", "NONE", None]))
        if mode is not None:
            fcc: dict[str, Any] = {"mode": mode}
            choice: Any = {"AUTO": "auto", "ANY": "required", "NONE": "none"}[mode]
            if mode == "ANY" and draw(st.booleans()):
                only = draw(st.sampled_from(tool_names))
                fcc[_spell("allowedFunctionNames", snake)] = [only]
                choice = {"type": "function", "function": {"name": only}}
            body[_spell("toolConfig", snake)] = {_spell("functionCallingConfig", snake): fcc}
            expect["tool_choice"] = choice
    sampling = {
        "temperature": ("temperature", st.floats(0, 2)),
        "topP": ("top_p", st.floats(0, 1)),
        "topK": ("top_k", st.integers(1, 100)),
        "maxOutputTokens": ("max_tokens", st.integers(1, 4096)),
        "stopSequences": ("stop", st.lists(st.text(min_size=1, max_size=5), max_size=3)),
        "seed": ("seed", st.integers(0, 2**31)),
        "presencePenalty": ("presence_penalty", st.floats(-2, 2)),
        "frequencyPenalty": ("frequency_penalty", st.floats(-2, 2)),
    }
    config: dict[str, Any] = {}
    expect["sampling"] = {}
    for field, (chat_name, strategy) in sampling.items():
        if draw(st.booleans()):
            value = draw(strategy)
            config[_spell(field, snake)] = value
            expect["sampling"][chat_name] = value
    if draw(st.booleans()):
        config[_spell("candidateCount", snake)] = 1
    if config:
        body[_spell("generationConfig", snake)] = config
    return body, expect


def _chat_items(content: Any) -> list[tuple]:
    if isinstance(content, str):
        return [("text", content)]
    items = []
    for part in content:
        if part["type"] == "text":
            items.append(("text", part["text"]))
        else:
            head, _, data = part["image_url"]["url"].partition(";base64,")
            items.append(("media", head.removeprefix("data:"), base64.b64decode(data)))
    return items


def _chat_events(messages: list[dict[str, Any]]) -> list[tuple]:
    events = []
    for m in messages:
        if m["role"] in ("system", "user"):
            events.append((m["role"], _chat_items(m["content"])))
        elif m["role"] == "assistant":
            calls = [
                (c["function"]["name"], json.loads(c["function"]["arguments"]))
                for c in m.get("tool_calls", [])
            ]
            events.append(("model", m.get("reasoning_content") or "", m["content"] or "", calls))
        else:
            events.append(("tool", m["name"], json.loads(m["content"])))
    return events


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests(), st.booleans())
def test_requests_translate_without_loss(case, stream):
    body, expect = case
    translated = g.translate(body, stream)
    chat = translated.chat
    assert translated.stream is stream
    assert _chat_events(chat["messages"]) == expect["events"]
    tools = [
        (t["function"]["name"], t["function"].get("description"), t["function"]["parameters"])
        for t in chat.get("tools", [])
    ]
    assert tools == expect.get("tools", [])
    assert chat.get("tool_choice") == expect.get("tool_choice")
    for name, value in expect["sampling"].items():
        assert chat[name] == value
    # tool ids: never None, and each tool message answers a call of the assistant turn before it
    open_ids: list[str] = []
    for m in chat["messages"]:
        if m["role"] == "assistant":
            open_ids = [c["id"] for c in m.get("tool_calls", [])]
            assert all(isinstance(i, str) and i for i in open_ids)
        elif m["role"] == "tool":
            assert m["tool_call_id"] == open_ids.pop(0)
    # the same history one turn later gives the same ids (the next prompt renders identically)
    longer = {**body, "contents": [*body["contents"], _user("next")]}
    again = g.translate(longer, stream).chat["messages"]
    assert again[: len(chat["messages"])] == chat["messages"]


# ---- property tests: replies and streams -----------------------------------------------------

finish_reasons = st.sampled_from(["stop", "length", "tool_calls", "content_filter", None])


@st.composite
def chat_replies(draw) -> dict[str, Any]:
    calls = [
        {
            "id": f"chatcmpl-tool-{k}",
            "type": "function",
            "function": {"name": draw(names), "arguments": json.dumps(draw(json_objects))},
        }
        for k in range(draw(st.integers(0, 3)))
    ]
    message: dict[str, Any] = {
        "role": "assistant",
        "content": draw(st.none() | st.text(max_size=120)),
        "reasoning_content": draw(st.none() | st.text(max_size=60)),
    }
    if calls:
        message["tool_calls"] = calls
    prompt, completion = draw(st.integers(0, 5000)), draw(st.integers(0, 500))
    return {
        "id": "chatcmpl-x",
        "model": "smol",
        "choices": [{"index": 0, "message": message, "finish_reason": draw(finish_reasons)}],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


@settings(max_examples=100, deadline=None)
@given(chat_replies())
def test_replies_and_streams_validate_and_reassemble(chat_reply):
    translated = Translated(chat={}, stream=True, context={"include_thoughts": True})
    out = g.reply(chat_reply, translated)
    message = chat_reply["choices"][0]["message"]
    parsed = types.GenerateContentResponse.model_validate(out)
    candidate = parsed.candidates[0]
    parts = candidate.content.parts
    assert "".join(p.text for p in parts if p.text and p.thought) == (
        message["reasoning_content"] or ""
    )
    assert "".join(p.text for p in parts if p.text and not p.thought) == (message["content"] or "")
    calls = [
        (p.function_call.id, p.function_call.name, p.function_call.args)
        for p in parts
        if p.function_call
    ]
    assert calls == [
        (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in message.get("tool_calls", [])
    ]
    expected_finish = {"length": "MAX_TOKENS", "content_filter": "SAFETY"}.get(
        chat_reply["choices"][0]["finish_reason"], "STOP"
    )
    assert candidate.finish_reason == expected_finish
    usage = chat_reply["usage"]
    assert parsed.usage_metadata.prompt_token_count == usage["prompt_tokens"]
    assert parsed.usage_metadata.candidates_token_count == usage["completion_tokens"]
    assert parsed.usage_metadata.total_token_count == usage["total_tokens"]

    events = [orjson.loads(e.removeprefix(b"data: ")) for e in g.sse(out, translated)]
    chunks = [types.GenerateContentResponse.model_validate(e) for e in events]
    assert all(c.candidates[0].content.parts for c in chunks)  # the SDK's chat keeps the turn
    assert [c.candidates[0].finish_reason for c in chunks] == [None] * (len(chunks) - 1) + [
        candidate.finish_reason
    ]
    assert chunks[-1].usage_metadata == parsed.usage_metadata
    streamed = [p for e in events for p in e["candidates"][0]["content"]["parts"]]
    assert merged_parts(streamed) == merged_parts(out["candidates"][0]["content"]["parts"])
