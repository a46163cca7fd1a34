"""Shared fixtures for the env adapter tests: fake upstreams, in-process capture proxies, checks."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from rollwire.capture.export import Role, RolloutDocument
from rollwire.capture.proxy import CaptureProxy, ProxyConfig
from rollwire.capture.rollout import CaptureLevel
from rollwire.capture.upstream import Upstream
from tests.fakes.serve import serve_in_thread
from tests.fakes.vllm import DEFAULT_MODEL, IM_END_ID, IM_START_ID, NEWLINE_ID, TOKENIZER, FakeVLLM


@pytest.fixture(scope="session")
def tool_fake_url() -> Iterator[str]:
    """A fake vLLM that calls the first tool whenever the last message is a user message."""
    with serve_in_thread(FakeVLLM(tool_call_every_turn=True).app) as url:
        yield url


@pytest.fixture(scope="session")
def text_fake_url() -> Iterator[str]:
    """A fake vLLM that only ever answers in text (never calls a tool)."""
    with serve_in_thread(FakeVLLM().app) as url:
        yield url


async def _proxy(url: str, model: str = DEFAULT_MODEL) -> AsyncIterator[CaptureProxy]:
    upstream = Upstream(url)
    try:
        config = ProxyConfig(llm_url=url, model=model, capture_level=CaptureLevel.TOKENS)
        yield CaptureProxy(config, upstream=upstream)
    finally:
        await upstream.aclose()


@pytest.fixture
async def tool_proxy(tool_fake_url: str) -> AsyncIterator[CaptureProxy]:
    """An in-process capture proxy in front of the tool-calling fake."""
    async for proxy in _proxy(tool_fake_url):
        yield proxy


@pytest.fixture
async def text_proxy(text_fake_url: str) -> AsyncIterator[CaptureProxy]:
    """An in-process capture proxy in front of the text-only fake."""
    async for proxy in _proxy(text_fake_url):
        yield proxy


@pytest.fixture
async def engine_proxy(engine_url: str) -> AsyncIterator[CaptureProxy]:
    """An in-process capture proxy in front of the real CPU reference engine."""
    from tests.conftest import SERVED

    async for proxy in _proxy(engine_url, model=SERVED):
        yield proxy


def chatml_segments(ids: list[int]) -> list[tuple[str, int, int]]:
    """(role, start, end) of each ``<|im_start|>role\\n ... <|im_end|>`` block in fake ids."""
    out: list[tuple[str, int, int]] = []
    i = 0
    while i < len(ids):
        if ids[i] != IM_START_ID:
            i += 1
            continue
        nl = ids.index(NEWLINE_ID, i + 1)
        role = TOKENIZER.decode(ids[i + 1 : nl])
        end = ids.index(IM_END_ID, nl) + 1 if IM_END_ID in ids[nl:] else len(ids)
        out.append((role, i, end))
        i = end
    return out


def check_trainable(document: RolloutDocument | None, *, tool_outputs_expected: bool) -> None:
    """The document has a trainable agent sequence whose loss mask is 1 only on sampled spans,
    and 0 on every tool-output block (parsed from the fake's ChatML ids)."""
    assert document is not None
    sequences = [s for s in document.sequences if s.role is Role.AGENT and s.trainable]
    assert sequences, [f.message for f in document.findings]
    tool_blocks = 0
    for seq in sequences:
        assert len(seq.loss_mask) == len(seq.input_ids) == len(seq.logprobs)
        sampled = set()
        for span in seq.turn_spans:
            sampled.update(range(span.start, span.end))
        ones = {i for i, m in enumerate(seq.loss_mask) if m}
        assert ones and ones <= sampled, "loss_mask is 1 outside the sampled turn spans"
        for role, start, end in chatml_segments(seq.input_ids):
            if role == "tool":
                tool_blocks += 1
                assert not any(seq.loss_mask[start:end]), "a tool result is trainable"
            if role in ("system", "user"):
                assert not any(seq.loss_mask[start:end]), f"a {role} message is trainable"
    if tool_outputs_expected:
        assert tool_blocks > 0, "no tool result reached a prompt"


def check_ones_in_spans(document: RolloutDocument | None) -> None:
    """Engine-agnostic: some agent sequence is trainable and its 1s lie inside sampled spans."""
    assert document is not None
    sequences = [s for s in document.sequences if s.role is Role.AGENT and s.trainable]
    assert sequences, [f.message for f in document.findings]
    for seq in sequences:
        sampled = {i for span in seq.turn_spans for i in range(span.start, span.end)}
        ones = {i for i, m in enumerate(seq.loss_mask) if m}
        assert ones and ones <= sampled


def many_calls_app(n: int, arguments: Callable[[int], dict[str, Any]]) -> Starlette:
    """A tiny OpenAI-shaped model: ``n`` calls of the first tool per user turn, else text."""

    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        last = body["messages"][-1]
        message: dict[str, Any] = {"role": "assistant", "content": "done"}
        if last.get("role") == "user" and body.get("tools"):
            name = body["tools"][0]["function"]["name"]
            message = {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": f"call-{i}",
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(arguments(i))},
                    }
                    for i in range(n)
                ],
            }
        return JSONResponse({"choices": [{"index": 0, "message": message}]})

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def asgi_upstream(app: Starlette) -> Upstream:
    """An Upstream client that talks to an ASGI app in-process."""
    return Upstream("http://fake-model/v1", transport=httpx.ASGITransport(app=app))


def check_every_call_answered(messages: list[dict[str, Any]], executed: int, n: int) -> None:
    """The ``n`` calls of the first assistant turn each got a tool message; ``executed`` ran."""
    first = next(i for i, m in enumerate(messages) if m.get("tool_calls"))
    ids = [c["id"] for c in messages[first]["tool_calls"]]
    assert len(ids) == n
    replies = messages[first + 1 : first + 1 + n]
    assert [r["role"] for r in replies] == ["tool"] * n
    assert [r["tool_call_id"] for r in replies] == ids
    skipped = [r for r in replies if "max_tool_calls_per_turn reached" in r["content"]]
    assert len(skipped) == n - executed


@pytest.fixture
def harness_checks() -> Any:
    """The shared check helpers, as one namespace (tests import nothing from conftest)."""

    class Checks:
        trainable = staticmethod(check_trainable)
        ones_in_spans = staticmethod(check_ones_in_spans)
        many_calls_app = staticmethod(many_calls_app)
        asgi_upstream = staticmethod(asgi_upstream)
        every_call_answered = staticmethod(check_every_call_answered)

    return Checks
