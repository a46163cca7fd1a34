"""Token-in by each engine path, through the proxy with the official openai SDK against the fake
vLLM: an engine whose chat ignores the token prompt splices over /v1/completions with tool calls
parsed by the proxy; an SGLang-shaped engine splices with ``input_ids``."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from rollwire.capture.certify import validate_llm
from rollwire.capture.proxy import CaptureProxy, ProxyConfig, certified_config
from rollwire.capture.rollout import CaptureLevel
from rollwire.capture.upstream import Upstream
from tests.capture.conftest import ADMIN, ADMIN_KEY
from tests.capture.test_token_in import TOOLS, carried_ok, converse
from tests.fakes.serve import serve_in_thread
from tests.fakes.vllm import FakeVLLM


@pytest.fixture
def fake() -> Iterator[tuple[FakeVLLM, str]]:
    vllm = FakeVLLM()
    with serve_in_thread(vllm.app) as url:
        yield vllm, url


def served(url: str, path: str, **settings: object):
    config = ProxyConfig(
        llm_url=url + "/v1",
        capture_level=CaptureLevel.TOKENS,
        token_in="auto",
        token_in_path=path,
        admin_key=ADMIN_KEY,
        **settings,
    )
    return serve_in_thread(CaptureProxy(config).app)


def client_of(root: str) -> tuple[str, openai.OpenAI]:
    """A new capture session on the proxy at ``root`` and an openai client bound to it."""
    sid = httpx.post(f"{root}/sessions", headers=ADMIN).json()["session_id"]
    return sid, openai.OpenAI(base_url=f"{root}/v1", api_key=sid, max_retries=0)


def completions_engine(vllm: FakeVLLM) -> None:
    """A vLLM whose chat ignores kv_transfer_params, with a template that offers the tools in
    the prompt and drops tool calls from history, sampling splits re-tokenising would not give."""
    vllm.behavior.update(
        ignore_token_prompt=True,
        tools_in_prompt=True,
        tool_call_every_turn=True,
        drop_tool_calls_in_history=True,
        noncanonical_split=True,
    )


@pytest.mark.parametrize("stream", [False, True])
def test_completions_path_keeps_a_tool_conversation_one_sequence(fake, stream):
    vllm, url = fake
    completions_engine(vllm)
    with served(url, "completions") as root:
        doc = converse(root, turns=4, stream=stream, tools=True)
    stats = doc["stats"]
    assert stats["roots"] == 1 and stats["retokenized"] == 0
    assert stats["trainable_sequences"] == 1
    assert stats["token_in"] == {"rendered": 1, "spliced": 3}
    assert {t["token_in_path"] for t in doc["turns"][1:]} == {"completions"}
    assert carried_ok(doc)
    assert vllm.stats["completions"] == 3


def test_completions_path_is_what_fragments_without_token_in(fake):
    vllm, url = fake
    completions_engine(vllm)
    config = ProxyConfig(
        llm_url=url + "/v1", capture_level=CaptureLevel.TOKENS, token_in="off", admin_key=ADMIN_KEY
    )
    with serve_in_thread(CaptureProxy(config).app) as root:
        doc = converse(root, turns=4, tools=True)
    assert doc["stats"]["roots"] > 1


def test_completions_path_gives_the_client_the_tool_calls_chat_would(fake):
    vllm, url = fake
    completions_engine(vllm)
    with served(url, "completions") as root:
        sid, client = client_of(root)
        messages: list = [{"role": "user", "content": "Look up a word."}]
        first = client.chat.completions.create(
            model="any", messages=messages, tools=TOOLS, max_tokens=40, seed=1
        )
        call = first.choices[0].message.tool_calls[0]
        messages += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "a guess"},
            {"role": "user", "content": "And another."},
        ]
        second = client.chat.completions.create(
            model="any", messages=messages, tools=TOOLS, max_tokens=40, seed=2
        )
        doc = httpx.get(f"{root}/sessions/{sid}/rollout", headers=ADMIN).json()
    assert doc["turns"][1]["token_in_mode"] == "spliced"
    choice = second.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls[0].function.name == "lookup"
    assert choice.message.content is None


def test_completions_path_falls_back_for_a_forced_tool_choice(fake):
    vllm, url = fake
    completions_engine(vllm)
    with served(url, "completions") as root:
        sid, client = client_of(root)
        messages: list = [{"role": "user", "content": "Hello there."}]
        first = client.chat.completions.create(
            model="any", messages=messages, tools=TOOLS, tool_choice="none", max_tokens=8
        )
        messages += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": "Now look it up."},
        ]
        client.chat.completions.create(
            model="any", messages=messages, tools=TOOLS, tool_choice="required", max_tokens=40
        )
        doc = httpx.get(f"{root}/sessions/{sid}/rollout", headers=ADMIN).json()
    turn = doc["turns"][1]
    assert turn["token_in_mode"] == "fallback:tool_choice_forced"
    assert "token_in_fallback" in [f["code"] for f in turn["findings"]]
    assert vllm.stats["completions"] == 0


def test_completions_path_asks_for_the_room_left_when_the_caller_sets_no_max_tokens(fake):
    vllm, url = fake
    completions_engine(vllm)
    with served(url, "completions") as root:
        sid, client = client_of(root)
        messages: list = [{"role": "user", "content": "Hello there."}]
        first = client.chat.completions.create(model="any", messages=messages)
        messages += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": "More."},
        ]
        client.chat.completions.create(model="any", messages=messages)
        doc = httpx.get(f"{root}/sessions/{sid}/rollout", headers=ADMIN).json()
    sent = next(r["body"] for r in vllm.request_log if r["path"] == "/v1/completions")
    assert sent["max_tokens"] == vllm.max_model_len - len(sent["prompt"])
    assert doc["turns"][1]["token_in_mode"] == "spliced"


def test_sglang_chat_path_keeps_a_tool_conversation_one_sequence(fake):
    vllm, url = fake
    vllm.behavior.update(
        engine="sglang",
        tool_call_every_turn=True,
        drop_tool_calls_in_history=True,
        noncanonical_split=True,
    )
    with served(url, "sglang_chat") as root:
        doc = converse(root, turns=4, tools=True)
    stats = doc["stats"]
    assert stats["roots"] == 1 and stats["trainable_sequences"] == 1
    assert stats["token_in"] == {"rendered": 1, "spliced": 3}
    assert {t["token_in_path"] for t in doc["turns"][1:]} == {"sglang_chat"}
    assert carried_ok(doc)


@pytest.mark.anyio
async def test_certification_lists_chat_and_completions_on_vllm(fake):
    _, url = fake
    cert = await validate_llm(url + "/v1", probe_tools=False)
    assert cert.token_in_paths == ["vllm_chat", "completions"]


@pytest.mark.anyio
async def test_certification_finds_completions_when_chat_ignores_the_token_prompt(fake):
    vllm, url = fake
    vllm.behavior.update(ignore_token_prompt=True)
    cert = await validate_llm(url + "/v1", probe_tools=False)
    assert cert.token_in_paths == ["completions"]
    assert certified_config(url, cert).token_in_path == "completions"


@pytest.mark.anyio
async def test_certification_finds_sglang_input_ids(fake):
    vllm, url = fake
    vllm.behavior.update(engine="sglang")
    cert = await validate_llm(url + "/v1", probe_tools=False)
    # its completions name tokens by text (SGLang 0.5.23): only input_ids carries them by id
    assert cert.token_in_paths == ["sglang_chat"]
    assert cert.capture_level is CaptureLevel.TOKENS


@pytest.mark.anyio
async def test_certification_names_why_no_path_works(fake):
    vllm, url = fake
    vllm.behavior.update(ignore_token_prompt=True, reject_param="prompt")
    cert = await validate_llm(url + "/v1", probe_tools=False)
    assert not cert.token_in and cert.token_in_paths == []
    for name in ("vllm_chat", "sglang_chat", "completions"):
        assert name in cert.token_in_reason


@pytest.mark.anyio
async def test_a_path_the_engine_does_not_honour_is_refused(fake):
    vllm, url = fake
    vllm.behavior.update(ignore_token_prompt=True)
    cert = await validate_llm(url + "/v1", probe_tools=False)
    with pytest.raises(ValueError, match=r"token_in_path='vllm_chat'.*completions"):
        certified_config(url, cert, token_in_path="vllm_chat")


@pytest.mark.anyio
async def test_certification_finds_the_tool_parser_that_reads_the_engine_calls(fake):
    vllm, url = fake
    vllm.behavior.update(ignore_token_prompt=True)
    cert = await validate_llm(url + "/v1", probe_tools=False)
    assert cert.tool_parser == "hermes"
    assert "tool_parser" in [f.code for f in cert.findings]
    assert certified_config(url, cert).tool_parser == "hermes"


@pytest.mark.anyio
async def test_completions_path_is_withdrawn_when_no_parser_reads_the_engine_calls(
    fake, monkeypatch
):
    vllm, url = fake
    vllm.behavior.update(ignore_token_prompt=True)
    # the engine writes its calls in a format none of our parsers knows
    monkeypatch.setattr(
        "tests.fakes.vllm.tool_call_text", lambda name, arguments: f"[[call {name} {arguments}]]"
    )
    cert = await validate_llm(url + "/v1", probe_tools=False)
    assert "completions" not in cert.token_in_paths and not cert.token_in
    assert "tool_parser_unknown" in [f.code for f in cert.findings]


def two_turns(root: str, *, first_max_tokens: int = 24) -> dict:
    sid, client = client_of(root)
    messages: list = [{"role": "user", "content": "Hello there."}]
    first = client.chat.completions.create(
        model="any", messages=messages, max_tokens=first_max_tokens
    )
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "user", "content": "More."},
    ]
    client.chat.completions.create(model="any", messages=messages, max_tokens=24)
    return httpx.get(f"{root}/sessions/{sid}/rollout", headers=ADMIN).json()


def test_no_known_turn_close_falls_back(fake):
    # nothing certified the close token and the session's only call was cut by length
    _, url = fake
    with served(url, "vllm_chat") as root:
        doc = two_turns(root, first_max_tokens=3)
    assert doc["turns"][0]["finish_reason"] == "length"
    turn = doc["turns"][1]
    assert turn["token_in_mode"] == "fallback:no_turn_close"
    assert "token_in_fallback" in [f["code"] for f in turn["findings"]]


class _FailingTokenize(httpx.AsyncBaseTransport):
    """The engine, except that its /tokenize answers 500."""

    def __init__(self, app) -> None:
        self.inner = httpx.ASGITransport(app=app)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/tokenize"):
            return httpx.Response(500, json={"error": {"message": "tokenizer crashed"}})
        return await self.inner.handle_async_request(request)


def test_a_failing_tokenize_falls_back_and_the_call_still_answers(fake):
    vllm, _ = fake
    config = ProxyConfig(
        llm_url="http://engine/v1",
        capture_level=CaptureLevel.TOKENS,
        token_in="auto",
        close_token_id=2,
        admin_key=ADMIN_KEY,
    )
    upstream = Upstream("http://engine/v1", transport=_FailingTokenize(vllm.app))
    with serve_in_thread(CaptureProxy(config, upstream=upstream).app) as root:
        doc = two_turns(root)
    turn = doc["turns"][1]
    assert turn["token_in_mode"] == "fallback:tokenize_failed"
    finding = next(f for f in turn["findings"] if f["code"] == "token_in_fallback")
    assert "tokenizer crashed" in finding["message"]
