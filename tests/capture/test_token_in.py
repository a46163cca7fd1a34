"""Token-in continuation through the proxy, driven by the official openai SDK against the fake
vLLM: sampled splits and re-rendered tool calls fragment a conversation with token-in off and
keep it one sequence with it on."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from rollwire.capture.certify import validate_llm
from rollwire.capture.proxy import CaptureProxy, ProxyConfig
from rollwire.capture.rollout import CaptureLevel
from tests.capture.conftest import ADMIN, ADMIN_KEY
from tests.fakes.serve import serve_in_thread
from tests.fakes.vllm import FakeVLLM

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up.",
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
        },
    }
]


@pytest.fixture
def fake() -> Iterator[tuple[FakeVLLM, str]]:
    vllm = FakeVLLM()
    with serve_in_thread(vllm.app) as url:
        yield vllm, url


def proxy_for(url: str, token_in: str) -> tuple[CaptureProxy, object]:
    config = ProxyConfig(
        llm_url=url + "/v1",
        capture_level=CaptureLevel.TOKENS,
        token_in=token_in,
        admin_key=ADMIN_KEY,
    )
    proxy = CaptureProxy(config)
    return proxy, serve_in_thread(proxy.app)


def converse(root: str, *, turns: int = 3, stream: bool = False, tools: bool = False) -> dict:
    """A multi-turn conversation through the proxy; the rollout document at the end."""
    sid = httpx.post(f"{root}/sessions", headers=ADMIN).json()["session_id"]
    client = openai.OpenAI(base_url=f"{root}/v1", api_key=sid, max_retries=0)
    messages: list = [{"role": "user", "content": "Tell me about hypotheses and theories."}]
    for turn in range(turns):
        kwargs = {"tools": TOOLS} if tools else {}
        if stream:
            text, calls = "", {}
            for chunk in client.chat.completions.create(
                model="any", messages=messages, max_tokens=24, stream=True, seed=turn, **kwargs
            ):
                delta = chunk.choices[0].delta if chunk.choices else None
                if delta and delta.content:
                    text += delta.content
                for tc in (delta.tool_calls or []) if delta else []:
                    slot = calls.setdefault(tc.index, {"id": tc.id, "name": "", "arguments": ""})
                    slot["name"] += tc.function.name or ""
                    slot["arguments"] += tc.function.arguments or ""
            message = {"role": "assistant", "content": text}
            if calls:
                message["tool_calls"] = [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["name"], "arguments": c["arguments"]},
                    }
                    for c in calls.values()
                ]
        else:
            reply = client.chat.completions.create(
                model="any", messages=messages, max_tokens=24, seed=turn, **kwargs
            )
            message = reply.choices[0].message.model_dump(exclude_none=True)
        messages.append(message)
        for call in message.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "a guess"})
        if not message.get("tool_calls"):
            messages.append({"role": "user", "content": f"Go on ({turn})."})
    return httpx.get(f"{root}/sessions/{sid}/rollout", headers=ADMIN).json()


def carried_ok(doc: dict) -> bool:
    by_id = {t["node_id"]: t for t in doc["turns"]}
    for turn in doc["turns"]:
        if turn["token_in_mode"] == "spliced":
            parent = by_id[turn["parent_call_id"]]
            carried = parent["prompt_token_ids"] + parent["completion_token_ids"]
            if turn["prompt_token_ids"][: len(carried)] != carried:
                return False
    return True


@pytest.mark.parametrize("stream", [False, True])
def test_noncanonical_splits_fragment_without_token_in_and_not_with_it(fake, stream):
    vllm, url = fake
    vllm.behavior.update(noncanonical_split=True)
    _, off_server = proxy_for(url, "off")
    with off_server as root:
        off = converse(root, stream=stream)
    assert off["stats"]["retokenized"] >= 1 and off["stats"]["roots"] > 1
    _, on_server = proxy_for(url, "auto")
    with on_server as root:
        on = converse(root, stream=stream)
    stats = on["stats"]
    assert stats["roots"] == 1 and stats["retokenized"] == 0 and stats["trainable_sequences"] == 1
    assert stats["token_in"] == {"rendered": 1, "spliced": 2}
    assert carried_ok(on)
    seq = next(s for s in on["sequences"] if s["trainable"])
    assert len(seq["input_ids"]) == len(seq["loss_mask"]) == len(seq["logprobs"])
    # every sampled token of every turn is a loss target, at its own logprob
    for turn in on["turns"]:
        span = next(sp for sp in seq["turn_spans"] if sp["node_id"] == turn["node_id"])
        assert seq["input_ids"][span["start"] : span["end"]] == turn["completion_token_ids"]
        assert seq["logprobs"][span["start"] : span["end"]] == turn["logprobs"]


def test_tool_calls_the_template_drops_from_history_stay_one_sequence(fake):
    vllm, url = fake
    vllm.behavior.update(tool_call_every_turn=True, drop_tool_calls_in_history=True)
    _, off_server = proxy_for(url, "off")
    with off_server as root:
        off = converse(root, tools=True)
    assert off["stats"]["roots"] > 1
    _, on_server = proxy_for(url, "auto")
    with on_server as root:
        on = converse(root, tools=True)
    assert on["stats"]["roots"] == 1 and on["stats"]["trainable_sequences"] == 1
    assert on["stats"]["token_in"].get("spliced", 0) == 2 and carried_ok(on)
    assert any(t["drift"] for t in on["turns"] if t["token_in_mode"] == "spliced")


def test_an_edited_history_falls_back_with_a_named_reason(fake):
    _, url = fake
    _, server = proxy_for(url, "auto")
    with server as root:
        sid = httpx.post(f"{root}/sessions", headers=ADMIN).json()["session_id"]
        client = openai.OpenAI(base_url=f"{root}/v1", api_key=sid, max_retries=0)
        first = [{"role": "user", "content": "Hello there."}]
        client.chat.completions.create(model="any", messages=first, max_tokens=8)
        edited = [
            *first,
            {"role": "assistant", "content": "Compacted."},
            {"role": "user", "content": "?"},
        ]
        client.chat.completions.create(model="any", messages=edited, max_tokens=8)
        doc = httpx.get(f"{root}/sessions/{sid}/rollout", headers=ADMIN).json()
    modes = [t["token_in_mode"] for t in doc["turns"]]
    assert modes == ["rendered", "fallback:edited_history"]
    codes = [f["code"] for f in doc["turns"][1]["findings"]]
    assert "token_in_fallback" in codes


def test_an_engine_that_ignores_the_token_prompt_is_detected(fake):
    vllm, url = fake
    vllm.behavior.update(noncanonical_split=True)
    _, server = proxy_for(url, "auto")
    with server as root:
        sid = httpx.post(f"{root}/sessions", headers=ADMIN).json()["session_id"]
        client = openai.OpenAI(base_url=f"{root}/v1", api_key=sid, max_retries=0)
        messages = [{"role": "user", "content": "Tell me about hypotheses and theories."}]
        reply = client.chat.completions.create(model="any", messages=messages, max_tokens=24)
        messages += [
            reply.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": "More."},
        ]
        vllm.behavior.update(ignore_token_prompt=True)
        client.chat.completions.create(model="any", messages=messages, max_tokens=24)
        doc = httpx.get(f"{root}/sessions/{sid}/rollout", headers=ADMIN).json()
    assert doc["turns"][1]["token_in_mode"] == "fallback:engine_ignored_token_in"
    assert "token_in_ignored" in [f["code"] for f in doc["turns"][1]["findings"]]


@pytest.mark.anyio
async def test_certification_reports_whether_the_engine_takes_a_token_prompt(fake):
    vllm, url = fake
    cert = await validate_llm(url + "/v1", probe_tools=False)
    assert cert.token_in and cert.token_in_reason is None
    # chat ignores kv_transfer_params and completions refuse a prompt: no path left
    vllm.behavior.update(ignore_token_prompt=True, reject_param="prompt")
    cert = await validate_llm(url + "/v1", probe_tools=False)
    assert not cert.token_in and "ignored" in cert.token_in_reason
    assert "token_in" in [f.code for f in cert.findings]
