"""Fuzzing the capture proxy over real HTTP: its data plane in all four wire dialects and its
control plane (issue 17).

Hypothesis generates requests (plausible but odd ones, and garbage: wrong types, missing and
unknown fields, huge and negative numbers, unicode, deeply nested JSON, non-JSON bodies, wrong
content types, unknown or spent session keys, bad paths and methods, oversized bodies) and sends
each one over a socket to a uvicorn-served proxy in front of the uvicorn-served fake vLLM; one
proxy serves the whole module. Every answer must hold:

* no 5xx that rollwire makes: a 5xx is allowed only when it is an upstream failure passed on,
  i.e. the fake itself answered 5xx to that very call (counted by a middleware around the fake)
  or the connection to it failed (the fake answers garbage as vLLM does, with a 400, so neither
  happens in a normal run: the count is printed);
* no unhandled exception or error record in the proxy's log (an error-level handler on the root
  and uvicorn loggers, attributed to the proxy's server thread);
* every 4xx is the dialect's own error shape, with a message; a body one mutation away from a
  generated one is refused naming a field (of the mutated path or of the body) or, for a value
  only the engine can judge, by the engine's own error;
* every 2xx is the dialect's reply shape (JSON, or a well-formed SSE stream);
* after the run the proxy still answers a normal request of the dialect.

``ROLLWIRE_FUZZ_EXAMPLES`` scales the run (default 1,200 examples per dialect and 1,000 for the
control plane: 5,800 requests, a few minutes, hence ``slow``). Generation is derandomized, so
every run replays the same inputs. The bugs the fuzzer found are pinned at the end of this file
by fast regression tests of their own.
"""

from __future__ import annotations

import base64
import copy
import json
import logging
import os
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollwire.capture.dialects import anthropic, google, responses
from rollwire.capture.dialects.base import DialectError
from rollwire.capture.proxy import MAX_JSON_DEPTH, CaptureProxy
from tests.capture.conftest import Proxy, start_proxy
from tests.fakes.serve import serve_in_thread
from tests.fakes.vllm import FakeVLLM

EXAMPLES = int(os.environ.get("ROLLWIRE_FUZZ_EXAMPLES", "1200"))
CONTROL_EXAMPLES = max(1, EXAMPLES * 5 // 6)
#: The proxy's body limit in this module: small, so oversized bodies are cheap to send.
MAX_BODY = 64 * 1024
#: Calls one session serves before the fuzzer closes it and opens the next.
SESSION_CALLS = 100

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)


# ------------------------------------------------------------------------------ the target


class _ErrorRecords(logging.Handler):
    """Every error-level log record, with the thread that wrote it."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class _Count5xx:
    """ASGI middleware around the fake: counts the 5xx answers it sends."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.count = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def counted(message: Any) -> None:
            if message["type"] == "http.response.start" and message["status"] >= 500:
                self.count += 1
            await send(message)

        await self.app(scope, receive, counted)


@dataclass
class Target:
    """The running proxy, its upstream, and what the fuzzer saw."""

    url: str
    proxy: CaptureProxy
    fake: FakeVLLM
    upstream_5xx: _Count5xx
    http: httpx.Client
    errors: _ErrorRecords
    proxy_thread: str
    sent: Counter[str] = field(default_factory=Counter)
    statuses: Counter[tuple[str, int]] = field(default_factory=Counter)
    passed_through_5xx: int = 0
    _sid: str | None = None
    _uses: int = 0
    spent_sid: str = ""
    closed_sid: str = ""
    busy_sid: str = ""  # a session with turns, for the control plane to read

    @property
    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.proxy.admin_key}"}

    def open_session(self, **options: Any) -> str:
        resp = self.http.post("/sessions", json=options or None, headers=self.admin)
        assert resp.status_code == 200, resp.text
        return resp.json()["session_id"]

    def close_session(self, sid: str) -> None:
        self.http.delete(f"/sessions/{sid}", headers=self.admin)

    def session(self) -> str:
        """A live session, closed and replaced every SESSION_CALLS uses (as a trainer would)."""
        if self._sid is None or self._uses >= SESSION_CALLS:
            if self._sid is not None:
                self.close_session(self._sid)
            self._sid, self._uses = self.open_session(), 0
        self._uses += 1
        return self._sid

    def proxy_errors(self, since: int = 0) -> list[str]:
        """The error records the proxy's server thread wrote (from record ``since`` on)."""
        text = logging.Formatter("%(name)s: %(message)s").format
        return [text(r) for r in self.errors.records[since:] if r.threadName == self.proxy_thread]


@pytest.fixture(scope="module")
def target() -> Iterator[Target]:
    fake = FakeVLLM()
    counted = _Count5xx(fake.app)
    with serve_in_thread(counted) as upstream_url:
        proxy, server = start_proxy(f"{upstream_url}/v1", max_body_bytes=MAX_BODY)
        with server as url, httpx.Client(base_url=url, timeout=60.0) as http:
            # uvicorn configures its loggers when a server is made: attach afterwards.
            errors = _ErrorRecords()
            loggers = [logging.getLogger(), logging.getLogger("uvicorn")]
            for logger in loggers:
                logger.addHandler(errors)
            port = url.rsplit(":", 1)[1]
            t = Target(url, proxy, fake, counted, http, errors, f"uvicorn-{port}")
            t.closed_sid = t.open_session()
            t.close_session(t.closed_sid)
            t.spent_sid = t.open_session(max_model_calls=1)
            first = http.post(
                "/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "hi"}]},
                headers={"Authorization": f"Bearer {t.spent_sid}"},
            )
            assert first.status_code == 200, first.text
            t.busy_sid = t.open_session(metadata={"task": "busy"})
            for text in ("one", "two", "three"):
                turn = http.post(
                    "/v1/chat/completions",
                    json={"messages": [{"role": "user", "content": text}]},
                    headers={"Authorization": f"Bearer {t.busy_sid}"},
                )
                assert turn.status_code == 200, turn.text
            try:
                yield t
            finally:
                for logger in loggers:
                    logger.removeHandler(errors)
                crashes = Counter(
                    f"{r.getMessage()} {r.exc_info[1]!r}" if r.exc_info else r.getMessage()
                    for r in errors.records
                    if r.threadName != t.proxy_thread
                )
                if crashes:
                    print(f"\nthe fake upstream crashed (passed through as 5xx): {dict(crashes)}")
                print(
                    f"\nfuzz: {sum(t.sent.values())} requests {dict(t.sent)}, "
                    f"{t.passed_through_5xx} upstream 5xx passed through; "
                    f"statuses {sorted(t.statuses.items())}"
                )


# ------------------------------------------------------------------------------ JSON garbage

_DEEP = re.compile(r'"\\u0000deep:(list|dict):(\d+)\\u0000"')


def deep(kind: str, depth: int) -> str:
    """A placeholder for ``depth`` nested lists or objects, expanded when the body is written
    (the stdlib encoder cannot write a thousand levels itself)."""
    return f"\x00deep:{kind}:{depth}\x00"


def _expand(match: re.Match[str]) -> str:
    kind, depth = match.group(1), int(match.group(2))
    if kind == "list":
        return "[" * depth + "1" + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


def dumps(value: Any) -> bytes:
    """JSON bytes of a generated value: unicode escaped, deep placeholders expanded."""
    return _DEEP.sub(_expand, json.dumps(value)).encode()


texts = st.text(max_size=24)
odd_texts = st.one_of(
    texts,
    st.text(st.characters(codec="utf-8"), max_size=24),
    st.sampled_from(["", " ", "\x00", "\u202e", "🦜" * 5, "<|im_end|>", "\r\n", "null", "{}"]),
)
odd_numbers = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, -1, 1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0.5, -0.0, 1e308, -1e308, 5e-324, 1e-7]),
)
scalars = st.one_of(st.none(), st.booleans(), odd_numbers, odd_texts)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(odd_texts, inner, max_size=4),
    max_leaves=10,
)
deep_values = st.builds(deep, st.sampled_from(["list", "dict"]), st.integers(2, 1100))
garbage = st.one_of(json_values, deep_values, st.builds(lambda n: "x" * n, st.integers(0, 5000)))


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _paths(item, (*prefix, i))


def _at(value: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        value = value[step]
    return value


@dataclass
class Mutated:
    body: Any
    paths: list[tuple[Any, ...]]  # where the mutations struck


@st.composite
def mutated(draw: st.DrawFn, valid: st.SearchStrategy[dict[str, Any]]) -> Mutated:
    """A valid body of the dialect, then up to three mutations: a value replaced by garbage, a
    field deleted, an unknown field or element inserted, or the whole body replaced."""
    body: Any = copy.deepcopy(draw(valid))
    struck: list[tuple[Any, ...]] = []
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 1, 2, 3]))):
        path = draw(st.sampled_from(list(_paths(body))))
        op = draw(st.sampled_from(["replace", "replace", "delete", "insert"]))
        if not path:
            if op == "replace":
                body = draw(garbage)
                struck.append(path)
            continue
        parent = _at(body, path[:-1])
        if op == "replace":
            parent[path[-1]] = draw(garbage)
        elif op == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            key = draw(odd_texts)
            parent[key] = draw(garbage)
            path = (*path[:-1], key)
        else:
            parent.insert(path[-1], draw(garbage))
        struck.append(path)
    return Mutated(body, struck)


# ------------------------------------------------------------------------------ dialects

names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True)
temperatures = st.floats(0, 2)
probabilities = st.floats(0, 1)
small_caps = st.integers(1, 48)
schemas = st.fixed_dictionaries(
    {
        "type": st.just("object"),
        "properties": st.dictionaries(
            names,
            st.fixed_dictionaries(
                {"type": st.sampled_from(["string", "integer", "number", "boolean"])}
            ),
            max_size=3,
        ),
    }
)
arguments = st.dictionaries(
    names, st.one_of(texts, st.integers(-99, 99), st.booleans()), max_size=3
)
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 16).decode()


def _fd(required: dict[str, Any], **optional: Any) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(required, optional=optional)


# chat-completions
_chat_parts = st.lists(
    _fd({"type": st.just("text"), "text": texts})
    | st.just({"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}),
    min_size=1,
    max_size=3,
)
_chat_call = _fd(
    {
        "id": names,
        "type": st.just("function"),
        "function": _fd({"name": names, "arguments": arguments.map(json.dumps)}),
    }
)
_chat_messages = st.one_of(
    _fd({"role": st.just("user"), "content": texts | _chat_parts}, name=names),
    _fd({"role": st.sampled_from(["system", "developer"]), "content": texts}),
    _fd(
        {"role": st.just("assistant"), "content": st.none() | texts},
        tool_calls=st.lists(_chat_call, min_size=1, max_size=2),
        reasoning_content=texts,
    ),
    _fd({"role": st.just("tool"), "tool_call_id": names, "content": texts}),
)
_chat_tools = st.lists(
    _fd(
        {"type": st.just("function"), "function": _fd({"name": names}, parameters=schemas)},
    ),
    min_size=1,
    max_size=3,
)
chat_bodies = _fd(
    {"messages": st.lists(_chat_messages, min_size=1, max_size=5)},
    model=texts,
    temperature=temperatures,
    top_p=probabilities,
    top_k=st.integers(-1, 50),
    min_p=probabilities,
    max_tokens=small_caps,
    max_completion_tokens=small_caps,
    seed=st.integers(0, 2**31),
    stop=texts | st.lists(texts, max_size=2),
    n=st.sampled_from([1, 2]),
    stream=st.booleans(),
    stream_options=_fd({"include_usage": st.booleans()}),
    logprobs=st.booleans(),
    top_logprobs=st.integers(0, 5),
    logit_bias=st.dictionaries(st.integers(0, 999).map(str), st.integers(-100, 100), max_size=2),
    tools=_chat_tools,
    tool_choice=st.sampled_from(["auto", "none"]),
    parallel_tool_calls=st.booleans(),
    response_format=st.sampled_from([{"type": "text"}, {"type": "json_object"}]),
    chat_template_kwargs=_fd({}, enable_thinking=st.booleans()),
    return_token_ids=st.booleans(),
    presence_penalty=st.floats(-2, 2),
    frequency_penalty=st.floats(-2, 2),
    repetition_penalty=st.floats(0.5, 2),
    ignore_eos=st.booleans(),
    user=texts,
)

# OpenAI Responses
_input_text = _fd({"type": st.just("input_text"), "text": texts})
_input_parts = st.lists(
    _input_text
    | st.just({"type": "input_image", "image_url": f"data:image/png;base64,{PNG}"})
    | st.just({"type": "input_file", "file_data": PNG, "filename": "a.png"}),
    min_size=1,
    max_size=2,
)
_items = st.one_of(
    _fd(
        {
            "type": st.just("message"),
            "role": st.sampled_from(["user", "system", "developer"]),
            "content": texts | _input_parts,
        }
    ),
    _fd(
        {
            "role": st.just("assistant"),
            "content": st.lists(
                _fd({"type": st.just("output_text"), "text": texts})
                | _fd({"type": st.just("refusal"), "refusal": texts}),
                min_size=1,
                max_size=2,
            ),
        },
        id=names,
        status=st.just("completed"),
    ),
    _fd(
        {
            "type": st.just("function_call"),
            "call_id": names,
            "name": names,
            "arguments": arguments.map(json.dumps) | arguments,
        }
    ),
    _fd({"type": st.just("function_call_output"), "call_id": names, "output": texts}),
    _fd(
        {"type": st.just("reasoning"), "summary": st.just([])},
        content=st.lists(
            _fd({"type": st.just("reasoning_text"), "text": texts}), min_size=1, max_size=1
        ),
        encrypted_content=texts,
    ),
)
_function_tool = _fd(
    {"type": st.just("function"), "name": names},
    description=texts,
    parameters=schemas,
    strict=st.booleans(),
)
responses_bodies = _fd(
    {"input": texts | st.lists(_items, min_size=1, max_size=5)},
    model=texts,
    instructions=texts
    | st.lists(_fd({"role": st.just("developer"), "content": texts}), max_size=1),
    max_output_tokens=small_caps,
    temperature=temperatures,
    top_p=probabilities,
    top_k=st.integers(-1, 50),
    seed=st.integers(0, 2**31),
    stop=st.lists(texts, max_size=2),
    stream=st.booleans(),
    stream_options=_fd({}, include_obfuscation=st.booleans()),
    store=st.just(False),
    background=st.just(False),
    previous_response_id=st.none(),
    tools=st.lists(
        _function_tool
        | st.just({"type": "web_search"})
        | _fd({"type": st.just("namespace"), "tools": st.lists(_function_tool, max_size=2)}),
        min_size=1,
        max_size=3,
    ),
    tool_choice=st.sampled_from(["auto", "none"])
    | _fd(
        {
            "type": st.just("allowed_tools"),
            "mode": st.just("auto"),
            "tools": st.lists(_fd({"type": st.just("function"), "name": names}), max_size=2),
        }
    ),
    text=_fd(
        {
            "format": st.sampled_from([{"type": "text"}, {"type": "json_object"}])
            | _fd({"type": st.just("json_schema"), "name": names, "schema": schemas})
        },
        verbosity=st.sampled_from(["low", "medium"]),
    ),
    metadata=st.dictionaries(names, texts, max_size=2),
    include=st.lists(
        st.sampled_from(["reasoning.encrypted_content", "message.output_text.logprobs"]),
        max_size=2,
    ),
    parallel_tool_calls=st.booleans(),
    top_logprobs=st.integers(0, 5),
    reasoning=_fd({"effort": st.sampled_from(["low", "medium", "high"])}),
    truncation=st.just("disabled"),
    prompt_cache_key=texts,
    safety_identifier=texts,
    service_tier=st.just("auto"),
    max_tool_calls=st.integers(1, 10),
    user=texts,
)

# Anthropic Messages
_text_block = _fd(
    {"type": st.just("text"), "text": texts}, cache_control=st.just({"type": "ephemeral"})
)
_image_block = st.sampled_from(
    [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
    ]
)
_tool_result = _fd(
    {"type": st.just("tool_result"), "tool_use_id": names},
    content=texts | st.lists(_text_block, max_size=2),
    is_error=st.booleans(),
)
_user = _fd(
    {
        "role": st.just("user"),
        "content": texts
        | st.lists(_text_block | _image_block | _tool_result, min_size=1, max_size=3),
    }
)
_assistant = _fd(
    {
        "role": st.just("assistant"),
        "content": texts
        | st.lists(
            _text_block
            | _fd({"type": st.just("tool_use"), "id": names, "name": names, "input": arguments})
            | _fd(
                {
                    "type": st.just("thinking"),
                    "thinking": texts,
                    "signature": texts | st.just("rollwire:reasoning"),
                }
            ),
            min_size=1,
            max_size=3,
        ),
    }
)
_anthropic_messages = st.lists(
    st.tuples(_user, _assistant) | st.tuples(_fd({"role": st.just("system"), "content": texts})),
    max_size=2,
).flatmap(lambda pairs: _user.map(lambda last: [m for pair in pairs for m in pair] + [last]))
anthropic_bodies = _fd(
    {"max_tokens": small_caps, "messages": _anthropic_messages},
    model=texts,
    system=texts | st.lists(_text_block, min_size=1, max_size=2),
    tools=st.lists(
        _fd(
            {"name": names, "input_schema": schemas},
            description=texts,
            strict=st.booleans(),
            allowed_callers=st.just(["direct"]),
            defer_loading=st.just(False),
        ),
        min_size=1,
        max_size=3,
    ),
    tool_choice=_fd(
        {"type": st.sampled_from(["auto", "none", "any"])},
        disable_parallel_tool_use=st.booleans(),
    ),
    temperature=temperatures,
    top_p=probabilities,
    top_k=st.integers(1, 100),
    stop_sequences=st.lists(texts, max_size=2),
    stream=st.booleans(),
    metadata=_fd({}, user_id=texts),
    thinking=_fd({"type": st.just("enabled"), "budget_tokens": st.integers(1024, 4096)}),
    output_config=_fd(
        {}, effort=st.just("low"), format=_fd({"type": st.just("json_schema"), "schema": schemas})
    ),
    service_tier=st.just("auto"),
    container=st.none(),
    mcp_servers=st.just([]),
    context_management=st.just({}),
)

# Google generateContent
_g_text = _fd({"text": texts}, thoughtSignature=texts)
_g_user = _fd(
    {
        "role": st.sampled_from(["user", "function"]),
        "parts": st.lists(
            _g_text
            | st.just({"inlineData": {"mimeType": "image/png", "data": PNG}})
            | st.just({"fileData": {"mimeType": "image/png", "fileUri": "https://x.test/a.png"}})
            | _fd({"functionResponse": _fd({"name": names}, id=names, response=arguments)}),
            min_size=1,
            max_size=3,
        ),
    }
)
_g_model = _fd(
    {
        "role": st.just("model"),
        "parts": st.lists(
            _fd({"text": texts}, thought=st.booleans())
            | _fd({"functionCall": _fd({"name": names}, args=arguments, id=names)}),
            min_size=1,
            max_size=3,
        ),
    }
)
_g_contents = st.lists(st.tuples(_g_user, _g_model), max_size=2).flatmap(
    lambda pairs: _g_user.map(lambda last: [c for pair in pairs for c in pair] + [last])
)
_g_schema = st.just(
    {
        "type": "OBJECT",
        "properties": {"q": {"type": "STRING", "nullable": True}, "n": {"type": "INTEGER"}},
        "propertyOrdering": ["q", "n"],
    }
)
google_bodies = _fd(
    {"contents": _g_contents},
    systemInstruction=texts | _fd({"parts": st.lists(_g_text, min_size=1, max_size=2)}),
    tools=st.lists(
        _fd(
            {
                "functionDeclarations": st.lists(
                    _fd(
                        {"name": names},
                        description=texts,
                        parameters=_g_schema,
                        parametersJsonSchema=schemas,
                    ),
                    min_size=1,
                    max_size=2,
                )
            }
        ),
        min_size=1,
        max_size=2,
    ),
    toolConfig=_fd(
        {
            "functionCallingConfig": _fd(
                {"mode": st.sampled_from(["AUTO", "NONE", "ANY", "auto", "VALIDATED"])},
                allowedFunctionNames=st.lists(names, max_size=2),
            )
        }
    ),
    generationConfig=_fd(
        {},
        temperature=temperatures,
        topP=probabilities,
        topK=st.integers(1, 64),
        maxOutputTokens=small_caps,
        stopSequences=st.lists(texts, max_size=2),
        seed=st.integers(0, 2**31),
        candidateCount=st.just(1),
        presencePenalty=st.floats(-2, 2),
        frequencyPenalty=st.floats(-2, 2),
        responseLogprobs=st.just(False),
        responseModalities=st.just(["TEXT"]),
        responseMimeType=st.sampled_from(["text/plain", "application/json"]),
        responseSchema=_g_schema,
        responseJsonSchema=schemas,
        thinkingConfig=_fd(
            {},
            includeThoughts=st.booleans(),
            thinkingBudget=st.sampled_from([0, -1, 1024]),
            thinkingLevel=st.sampled_from(["low", "high"]),
        ),
    ),
    safetySettings=st.just([{"category": "HARM_CATEGORY_HATE_SPEECH", "threshold": "BLOCK_NONE"}]),
    labels=st.dictionaries(names, texts, max_size=2),
    serviceTier=st.just("standard"),
    store=st.booleans(),
)


# ------------------------------------------------------------------------------ calls


@dataclass
class Call:
    """One generated request and what its answer must look like."""

    shape: str  # whose error shape a 4xx must have: chat, anthropic, google
    reply: str  # what a 2xx must be: chat, responses, anthropic, google, *_count, *_models, ...
    method: str
    path: str
    headers: dict[str, Any]
    content: Any = None
    params: dict[str, str] | None = None
    struck: list[tuple[Any, ...]] | None = None  # the mutations of a once-valid body
    fields: frozenset[str] = frozenset()  # the body's field names, at any depth


@dataclass(frozen=True)
class Wire:
    """How a dialect reaches the proxy."""

    name: str
    shape: str
    routes: tuple[tuple[str, str], ...]  # (path, reply kind) of its POST routes
    key: Any  # sid -> headers, params

    def auth(self, sid: str) -> tuple[dict[str, Any], dict[str, str] | None]:
        return self.key(sid)


def _bearer(sid: str) -> tuple[dict[str, Any], None]:
    return {"Authorization": f"Bearer {sid}"}, None


WIRES = {
    "chat": Wire("chat", "chat", (("/v1/chat/completions", "chat"),), _bearer),
    "responses": Wire(
        "responses",
        "chat",
        (("/v1/responses", "responses"), ("/v1/responses/input_tokens", "responses_count")),
        _bearer,
    ),
    "anthropic": Wire(
        "anthropic",
        "anthropic",
        (("/v1/messages", "anthropic"), ("/v1/messages/count_tokens", "anthropic_count")),
        lambda sid: ({"x-api-key": sid, "anthropic-version": "2023-06-01"}, None),
    ),
    "google": Wire(
        "google",
        "google",
        (
            ("/v1beta/models/gemini-x:generateContent", "google"),
            ("/v1beta/models/gemini-x:streamGenerateContent", "google"),
            ("/v1/models/models/gemini-x:GENERATECONTENT", "google"),
            ("/v1beta/models/gemini-x:countTokens", "google_count"),
        ),
        lambda sid: ({"x-goog-api-key": sid}, None),
    ),
}
BODIES = {
    "chat": chat_bodies,
    "responses": responses_bodies,
    "anthropic": anthropic_bodies,
    "google": google_bodies,
}

# Paths a lost client may try: each must be a JSON 404/405 in the shape its prefix implies.
_stray_paths = st.one_of(
    st.sampled_from(
        [
            "/",
            "/v1",
            "/v1/",
            "/v1/completions",
            "/v1/chat/completions/x",
            "/v1/embeddings",
            "/v1/messages/batches",
            "/v1beta/models/gemini-x",
            "/v1beta/models/:generateContent",
            "/v1beta/models/gemini-x:embedContent",
            "/v1beta/models/a/b/c:predict",
            "/v1/models/gemini-x:frobnicate",
            "/v1beta/tunedModels/x:generateContent",
            "/v2/chat/completions",
            "/sessions/x/y/z",
            "/health/x",
            "/%00",
            "/v1/%E2%80%AE",
            "/..%2F..%2Fetc%2Fpasswd",
        ]
    ),
    st.text(st.characters(codec="utf-8"), max_size=20).map(lambda s: "/v1/" + quote(s, safe="/")),
)
_content_types = st.sampled_from(
    [
        None,
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/json; charset=latin-1",
        "APPLICATION/JSON",
        "application/jsonl",
        "application/octet-stream",
        "*/*",
        "",
    ]
)
_raw_bodies = st.one_of(
    st.binary(max_size=64),
    st.sampled_from(
        [
            b"",
            b"   ",
            b"null",
            b"[]",
            b"{}",
            b'"x"',
            b"0",
            b"NaN",
            b"Infinity",
            b"1e400",
            b"\xef\xbb\xbf{}",
            b'{"a": 1,}',
            b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
            b'{"a": 1, "a": 2}',
            "{}".encode("utf-16"),
            b"\xff\xfe\x00",
        ]
    ),
    st.integers(1, 1100).map(lambda n: b"[" * n + b"]" * n),
    st.integers(1, 1100).map(lambda n: b'{"messages": ' + b"[" * n + b"]" * n + b"}"),
)


def _chunks(data: bytes) -> Iterator[bytes]:
    for i in range(0, len(data), 16 * 1024):
        yield data[i : i + 16 * 1024]


@st.composite
def dialect_calls(draw: st.DrawFn, wire: Wire, target: Target) -> Call:
    """A request to one dialect: mostly a (mutated) body on its own route, else transport
    garbage: a raw body, a wrong content type, a bad key, method or path, an oversized body."""
    path, reply = draw(st.sampled_from(wire.routes))
    mode = draw(st.sampled_from(["body"] * 12 + ["raw", "ctype", "key", "method", "path", "big"]))
    headers, params = wire.auth(target.session())
    if wire.name == "google":
        params = {}
        if draw(st.booleans()):  # the key as ?key= (gemini-cli), not x-goog-api-key
            params["key"] = headers.pop("x-goog-api-key")
        if "stream" in path.lower() and draw(st.booleans()):
            params["alt"] = "sse"
    m = draw(mutated(BODIES[wire.name]))
    call = Call(
        wire.shape,
        reply,
        "POST",
        path,
        {**headers, "Content-Type": "application/json"},
        dumps(m.body),
        params,
        m.paths,
        _fields(m.body),
    )
    if mode == "raw":
        call.content, call.struck = draw(_raw_bodies), None
    elif mode == "ctype":
        ctype = draw(_content_types)
        call.headers.pop("Content-Type")
        if ctype is not None:
            call.headers["Content-Type"] = ctype
        call.struck = None
    elif mode == "key":
        key = draw(
            st.sampled_from(
                ["unknown", "closed", "spent", "empty", "none", "long", "bytes", "mixed"]
            )
        )
        ctype = {"Content-Type": "application/json"}
        if key == "none":
            call.headers = ctype
        elif key == "bytes":
            call.headers = {**ctype, **{k: "é✓".encode() for k in wire.auth("x")[0]}}
        elif key == "mixed":  # a live key in another dialect's place
            other = draw(st.sampled_from([w for w in WIRES.values() if w.key is not wire.key]))
            call.headers = {**ctype, **other.auth(target.session())[0]}
        else:
            sid = {
                "unknown": "rw-" + draw(names),
                "closed": target.closed_sid,
                "spent": target.spent_sid,
                "empty": " ",
                "long": "rw-" + "x" * 20_000,
            }[key]
            call.headers = {**ctype, **{k: v.strip() for k, v in wire.auth(sid)[0].items()}}
        call.struck = None
    elif mode == "method":
        call.method = draw(st.sampled_from(["GET", "PUT", "PATCH", "DELETE", "OPTIONS"]))
        call.struck = None
    elif mode == "path":
        call.path = draw(_stray_paths)
        call.shape = _shape_of_path(call.path, wire)
        call.reply = "any"
        call.struck = None
    elif mode == "big":
        size = draw(st.integers(MAX_BODY + 1, 4 * MAX_BODY))
        blob = b'{"pad": "' + b"a" * size + b'"}'
        call.content = _chunks(blob) if draw(st.booleans()) else blob
        call.struck = None
    return call


def _shape_of_path(path: str, wire: Wire) -> str:
    """The error shape a stray path must answer in: Google's under its prefixes, Anthropic's
    under /v1/messages, else the shape of the dialect whose key headers the call carries."""
    if path.startswith(("/v1beta/", "/v1/models/")):
        return "google"
    if path.startswith("/v1/messages"):
        return "anthropic"
    return wire.shape


# ------------------------------------------------------------------------------ checks


def _message(shape: str, status: int, body: Any) -> str:
    """The error's text, after checking it is the shape's error object."""
    assert isinstance(body, dict), body
    if shape == "anthropic":
        assert body.get("type") == "error", body
        err = body["error"]
        assert isinstance(err.get("type"), str) and err["type"], body
        assert isinstance(err.get("message"), str) and err["message"], body
        return err["message"]
    err = body.get("error")
    assert isinstance(err, dict), body
    assert isinstance(err.get("message"), str) and err["message"], body
    if shape == "google":
        assert err.get("code") == status and isinstance(err.get("status"), str), body
        text = err["message"]
        for detail in err.get("details") or []:
            for violation in detail.get("fieldViolations") or []:
                text += f" {violation.get('field')}"
        return text
    assert isinstance(err.get("type"), str) and "param" in err and "code" in err, body
    return f"{err['message']} {err.get('param') or ''}"


def _sse(raw: str) -> list[tuple[str | None, Any]]:
    events = []
    for block in raw.replace("\r\n", "\n").split("\n\n"):
        if not block.strip():
            continue
        name, data = None, None
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                data = line[len("data: ") :]
        assert data is not None, raw
        events.append((name, data if data == "[DONE]" else json.loads(data)))
    return events


def _check_success(reply: str, resp: httpx.Response) -> None:
    if resp.headers.get("content-type", "").startswith("text/event-stream"):
        events = _sse(resp.text)
        assert events, resp.text
        if reply == "chat":
            assert events[-1] == (None, "[DONE]")
            assert all(e["object"] == "chat.completion.chunk" for _, e in events[:-1])
        elif reply == "responses":
            assert events[-1][0] == "response.completed"
            assert all(name == e["type"] for name, e in events)
        elif reply == "anthropic":
            assert events[0][0] == "message_start"
            assert events[-1][0] == "message_stop"
        elif reply == "google":
            assert all(e["candidates"] for _, e in events)
        else:
            raise AssertionError(f"{reply} answered a stream")
        return
    body = resp.json()
    if reply == "chat":
        assert body["object"] == "chat.completion" and body["choices"], body
    elif reply == "responses":
        assert body["object"] == "response" and body["output"], body
    elif reply == "anthropic":
        assert body["type"] == "message" and body["content"], body
    elif reply == "google":
        assert body["candidates"][0]["content"]["parts"], body
    elif reply == "responses_count":
        assert isinstance(body["input_tokens"], int), body
    elif reply == "anthropic_count":
        assert isinstance(body["input_tokens"], int) and body["input_tokens"] >= 1, body
    elif reply == "google_count":
        assert isinstance(body["totalTokens"], int), body
    else:
        raise AssertionError(f"{reply}: unexpected 2xx {body!r}")


def _fields(value: Any) -> frozenset[str]:
    """Every field name of a body, at any depth (the ones a refusal may name)."""
    out: set[str] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            out.update(k for k in item if len(k.strip()) >= 5)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return frozenset(out)


def _names(path: tuple[Any, ...]) -> set[str]:
    """The field names on a mutated path, each as written, snake_case and camelCase."""
    out = set()
    for step in path:
        if isinstance(step, str):
            out |= {repr(step), step, re.sub(r"([A-Z])", r"_\1", step).lower()}
            head, *rest = step.split("_")
            out.add(head + "".join(w[:1].upper() + w[1:] for w in rest))
    return {n for n in out if n.strip()}


def send(target: Target, call: Call, label: str) -> httpx.Response:
    """Send one call and check its answer (a 2xx's body is the caller's to check)."""
    before = target.upstream_5xx.count
    resp = target.http.request(
        call.method, call.path, headers=call.headers, content=call.content, params=call.params
    )
    target.sent[label] += 1
    target.statuses[(label, resp.status_code)] += 1
    status = resp.status_code
    where = f"{call.method} {call.path} -> {status}: {resp.text[:600]}"
    if status >= 500:
        # Only an upstream failure may be a 5xx: the fake answered 5xx to this very call, or
        # the connection to it failed (a keep-alive connection it closed after an error).
        text = _message(call.shape, status, resp.json())
        transport = status == 502 and "connection" in text
        assert target.upstream_5xx.count > before or transport, f"rollwire answered 5xx: {where}"
        assert "upstream" in text, where
        target.passed_through_5xx += 1
    elif status >= 400:
        assert resp.headers.get("content-type", "").startswith("application/json"), where
        text = _message(call.shape, status, resp.json()).lower()
        if (
            call.struck
            and len(call.struck) == 1
            and call.struck[0]
            and status == 400
            and "not valid json" not in text
        ):
            # One mutation of a generated body (left JSON): the refusal names a field on the
            # mutated path or one of the body's (a generated combination can be refused too),
            # or is the engine's judgement of a value (its context limits).
            named = {n.lower() for n in _names(call.struck[0]) | call.fields}
            engine = ("upstream", "input_tokens", "max_tokens", "context length")
            assert any(n in text for n in named) or any(e in text for e in engine), (
                f"the error names none of {sorted(named)}: {where}"
            )
    elif status >= 300:  # Starlette's trailing-slash redirect (/sessions/ -> /sessions)
        assert status in (307, 308) and resp.headers.get("location"), where
    else:
        assert status == 200, where
    return resp


def normal_call(target: Target, name: str) -> httpx.Response:
    """A plain, valid call of a dialect."""
    headers, params = WIRES[name].auth(target.session())
    body = {
        "chat": {"messages": [{"role": "user", "content": "hello"}]},
        "responses": {"input": "hello"},
        "anthropic": {"max_tokens": 16, "messages": [{"role": "user", "content": "hello"}]},
        "google": {"contents": [{"role": "user", "parts": [{"text": "hello"}]}]},
    }[name]
    path = WIRES[name].routes[0][0]
    return target.http.post(path, headers=headers, params=params, json=body)


def _no_proxy_errors(target: Target, since: int) -> None:
    errors = target.proxy_errors(since)
    assert errors == [], "\n".join(errors[:5])


# ------------------------------------------------------------------------------ the fuzz tests


@pytest.mark.slow
@pytest.mark.parametrize("dialect", ["chat", "responses", "anthropic", "google"])
def test_fuzzed_dialect_requests_get_no_5xx_and_dialect_shaped_errors(target: Target, dialect):
    wire = WIRES[dialect]
    before, logged = sum(target.sent.values()), len(target.errors.records)

    @FUZZ
    @given(st.data())
    def run(data: st.DataObject) -> None:
        call = data.draw(dialect_calls(wire, target))
        resp = send(target, call, dialect)
        if resp.status_code == 200 and call.reply != "any":
            _check_success(call.reply, resp)

    run()
    _no_proxy_errors(target, logged)
    assert sum(target.sent.values()) - before >= EXAMPLES
    resp = normal_call(target, dialect)
    assert resp.status_code == 200, resp.text
    _check_success(wire.routes[0][1], resp)


# ---- the control plane


_ids = st.one_of(
    st.sampled_from(
        ["live", "live", "busy", "busy", "closed", "rw-", "rw-" + "x" * 5000, "..", "%2F", "%00"]
    ),
    names,
    st.text(st.characters(codec="utf-8"), min_size=1, max_size=20).map(lambda s: quote(s, safe="")),
)
_auth = st.sampled_from(
    ["admin", "admin", "admin", "x-api-key", "none", "wrong", "session", "basic", "lower", "bytes"]
)
_options = _fd(
    {},
    metadata=st.dictionaries(names, json_values, max_size=3),
    max_model_calls=st.integers(1, 1000),
)


@st.composite
def control_calls(draw: st.DrawFn, target: Target) -> tuple[Call, str | None]:
    """A control-plane request: method x route x session id x auth x body."""
    route = draw(st.sampled_from(["list", "open", "open", "one", "rollout", "delete", "other"]))
    ident = draw(_ids)
    sid = None
    if ident == "live":
        sid = target.open_session()
        ident = sid
    elif ident in ("closed", "busy"):
        ident = target.closed_sid if ident == "closed" else target.busy_sid
    method, path, reply = {
        "list": ("GET", "/sessions", "list"),
        "open": ("POST", "/sessions", "open"),
        "one": ("GET", f"/sessions/{ident}", "one"),
        "rollout": ("GET", f"/sessions/{ident}/rollout", "rollout"),
        "delete": ("DELETE", f"/sessions/{ident}", "delete"),
        "other": (
            draw(st.sampled_from(["PUT", "PATCH", "POST", "OPTIONS"])),
            draw(st.sampled_from(["/sessions/x", f"/sessions/{ident}", "/sessions/x/rollout"])),
            "any",
        ),
    }[route]
    auth = draw(_auth)
    headers: dict[str, Any] = {
        "admin": target.admin,
        "x-api-key": {"x-api-key": target.proxy.admin_key},
        "none": {},
        "wrong": {"Authorization": "Bearer " + draw(names)},
        "session": {"Authorization": f"Bearer {target.session()}"},
        "basic": {"Authorization": f"Basic {target.proxy.admin_key}"},
        "lower": {"Authorization": f"bearer {target.proxy.admin_key}"},
        "bytes": {"Authorization": "Bearer é✓".encode()},
    }[auth]
    content: Any = None
    struck = None
    if route == "open" or draw(st.integers(0, 9)) == 0:
        kind = draw(st.sampled_from(["none", "valid", "valid", "mutated", "raw", "deep", "big"]))
        headers = {**headers, "Content-Type": draw(_content_types) or "application/json"}
        if kind == "valid":
            content = dumps(draw(_options))
        elif kind == "mutated":
            m = draw(mutated(_options))
            content, struck = dumps(m.body), m.paths
        elif kind == "raw":
            content = draw(_raw_bodies)
        elif kind == "deep":
            content = dumps({"metadata": {"m": draw(deep_values)}})
        elif kind == "big":
            content = b'{"metadata": {"pad": "' + b"a" * (1024 * 1024) + b'"}}'
    return Call("chat", reply, method, path, headers, content, struck=struck), sid


def _check_control(target: Target, call: Call, resp: httpx.Response) -> None:
    if resp.status_code != 200 or call.reply == "any":
        return
    body = resp.json()
    if call.reply == "open":
        target.close_session(body["session_id"])  # keep the store small
    elif call.reply == "list":
        assert isinstance(body["sessions"], list)
    elif call.reply == "one":
        assert body["session_id"] and isinstance(body["findings"], list)
    elif call.reply == "rollout":
        assert body["version"].startswith("rollwire.rollout/")
    elif call.reply == "delete":
        assert body["deleted"] is True


@pytest.mark.slow
def test_fuzzed_control_plane_requests_get_no_5xx_and_openai_shaped_errors(target: Target):
    before, logged = sum(target.sent.values()), len(target.errors.records)

    @settings(FUZZ, max_examples=CONTROL_EXAMPLES)
    @given(st.data())
    def run(data: st.DataObject) -> None:
        call, sid = data.draw(control_calls(target))
        try:
            resp = send(target, call, "control")
            _check_control(target, call, resp)
        finally:
            if sid is not None:
                target.close_session(sid)

    run()
    _no_proxy_errors(target, logged)
    assert sum(target.sent.values()) - before >= CONTROL_EXAMPLES
    sid = target.open_session(metadata={"after": "fuzz"})
    assert target.http.get(f"/sessions/{sid}", headers=target.admin).status_code == 200
    target.close_session(sid)
    resp = normal_call(target, "chat")
    assert resp.status_code == 200, resp.text


# ------------------------------------------------------------------------------ regressions
# Each bug the fuzzer found, pinned by a fast test of its own (these run without -m slow).


def _nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = [value]
    return value


def test_body_nested_deeper_than_the_limit_is_a_400_naming_its_field_not_a_500(proxy: Proxy):
    sid = proxy.open_session()
    body = {"messages": [{"role": "user", "content": _nested(MAX_JSON_DEPTH + 72)}]}
    resp = httpx.post(
        f"{proxy.url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {sid}"}
    )
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == "messages[0].content" and str(MAX_JSON_DEPTH) in err["message"]
    assert proxy.upstream.fake.requests == []
    assert proxy.client(sid).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "still there?"}]
    )


def test_body_nested_within_the_limit_is_served(proxy: Proxy):
    sid = proxy.open_session()
    schema: Any = {"type": "string"}
    for _ in range(MAX_JSON_DEPTH - 8):  # the body's own levels above it included
        schema = {"type": "array", "items": schema}
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": [tool]}
    resp = httpx.post(
        f"{proxy.url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {sid}"}
    )
    assert resp.status_code == 200, resp.text
    assert proxy.rollout(sid)["stats"]["turns"] == 1


_DEEP_SCHEMA = {"type": "object", "properties": {"a": _nested(300)}}
_USER = [{"role": "user", "content": "x"}]


@pytest.mark.parametrize(
    ("path", "shape", "body"),
    [
        # each of these was a 500: written back (echoed, forwarded) past orjson's 254 levels,
        # or counted past Python's recursion limit
        ("/v1/responses", "chat", {"input": "x", "metadata": {"m": _nested(300)}}),
        (
            "/v1/messages",
            "anthropic",
            {
                "max_tokens": 5,
                "messages": _USER,
                "tools": [{"name": "f", "input_schema": _DEEP_SCHEMA}],
            },
        ),
        ("/v1/messages/count_tokens", "anthropic", {"messages": _nested(1000)}),
        (
            "/v1beta/models/g:generateContent",
            "google",
            {
                "contents": [{"parts": [{"text": "x"}]}],
                "generationConfig": {
                    "responseMimeType": "application/json",
                    "responseJsonSchema": _DEEP_SCHEMA,
                },
            },
        ),
        ("/v1beta/models/g:countTokens", "google", {"contents": _nested(1000)}),
    ],
)
def test_too_deep_dialect_body_is_refused_in_the_dialects_shape(proxy: Proxy, path, shape, body):
    sid = proxy.open_session()
    auth = {
        "chat": {"Authorization": f"Bearer {sid}"},
        "anthropic": {"x-api-key": sid, "anthropic-version": "2023-06-01"},
        "google": {"x-goog-api-key": sid},
    }[shape]
    resp = httpx.post(f"{proxy.url}{path}", json=body, headers=auth)
    assert resp.status_code == 400, resp.text
    assert "nests JSON deeper" in _message(shape, 400, resp.json())
    assert proxy.upstream.fake.requests == []


def test_too_deep_session_metadata_is_refused_and_the_listing_still_serves(proxy: Proxy):
    resp = httpx.post(
        f"{proxy.url}/sessions", json={"metadata": {"m": _nested(300)}}, headers=proxy.admin
    )
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "metadata"
    assert httpx.get(f"{proxy.url}/sessions", headers=proxy.admin).status_code == 200


@pytest.mark.parametrize(
    ("method", "path", "headers", "status", "shape"),
    [
        ("POST", "/v1/nope", {}, 404, "chat"),
        ("GET", "/v1/chat/completions", {}, 405, "chat"),
        ("GET", "/v1/responses", {}, 405, "chat"),
        ("PUT", "/sessions", {}, 405, "chat"),
        ("POST", "/v1/messages/nope", {}, 404, "anthropic"),
        ("GET", "/v1/messages", {"anthropic-version": "2023-06-01"}, 405, "anthropic"),
        ("POST", "/v2/messages", {"anthropic-version": "2023-06-01"}, 404, "anthropic"),
        ("GET", "/v1beta/models/g:generateContent", {}, 405, "google"),
        ("POST", "/v1beta/tunedModels/x:generateContent", {}, 404, "google"),
        ("POST", "/nope", {"x-goog-api-key": "k"}, 404, "google"),
    ],
)
def test_unknown_route_or_method_is_a_json_error_in_the_callers_dialect(
    proxy: Proxy, method, path, headers, status, shape
):
    resp = httpx.request(method, f"{proxy.url}{path}", headers=headers)
    assert resp.status_code == status
    message = _message(shape, status, resp.json())
    assert path in message and method in message
    if status == 405:
        assert resp.headers["allow"]


def test_session_app_answers_an_unknown_route_with_a_json_404(proxy: Proxy):
    sid = proxy.open_session()
    with serve_in_thread(proxy.proxy.session_app(sid)) as url:
        resp = httpx.post(f"{url}/v1/nope", headers={"Authorization": f"Bearer {sid}"})
    assert resp.status_code == 404 and "/v1/nope" in _message("chat", 404, resp.json())


def test_responses_tool_whose_type_is_an_object_is_refused_not_a_crash(proxy: Proxy):
    with pytest.raises(DialectError) as err:
        responses.translate({"input": "x", "tools": [{"type": {"a": 1}, "name": "f"}]})
    assert err.value.param == "tools"
    sid = proxy.open_session()
    resp = httpx.post(
        f"{proxy.url}/v1/responses",
        json={"input": "x", "tools": [{"type": {"a": 1}, "name": "f"}]},
        headers={"Authorization": f"Bearer {sid}"},
    )
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "tools"


def test_anthropic_unknown_field_error_quotes_an_odd_field_name():
    body = {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "": 1}
    with pytest.raises(DialectError) as err:
        anthropic.translate(body)
    assert err.value.param == "" and "field '' is not supported" in err.value.message


def test_anthropic_allowed_callers_that_is_not_a_list_is_refused_not_a_crash():
    tool = {"name": "f", "input_schema": {"type": "object"}, "allowed_callers": 5}
    with pytest.raises(DialectError) as err:
        anthropic.translate(
            {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tools": [tool]}
        )
    assert err.value.param == "tools.0.allowed_callers"


def test_google_response_modalities_that_is_not_a_list_is_refused_not_a_crash():
    body = {"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"responseModalities": 5}}
    with pytest.raises(DialectError) as err:
        google.translate(body, False)
    assert err.value.param == "generationConfig.responseModalities"


def test_google_property_ordering_with_non_names_is_ignored_not_a_crash():
    schema = {"type": "OBJECT", "properties": {"a": {}, "b": {}}, "propertyOrdering": [{}, "b"]}
    assert list(google.json_schema(schema)["properties"]) == ["b", "a"]
