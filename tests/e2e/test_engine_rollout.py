"""Whole system on CPU: openai SDK -> capture proxy -> real reference engine -> trainable rollout."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import httpx
import openai
import pytest

from rollwire.capture.certify import validate_llm
from rollwire.capture.parity import rescore
from rollwire.capture.proxy import CaptureProxy, ProxyConfig
from rollwire.capture.upstream import Upstream
from tests.conftest import SERVED
from tests.fakes.serve import serve_in_thread

pytestmark = pytest.mark.slow

ADMIN_KEY = "e2e-admin-key"  # the control plane always takes one
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
QUESTIONS = ["Name a colour of the sea.", "Why is it that colour?", "Say it in five words."]


@pytest.fixture(scope="module")
def certified_proxy(engine_url: str) -> Iterator[str]:
    cert = anyio.run(validate_llm, engine_url)
    assert cert.verdict == "TRAIN", cert.findings
    proxy = CaptureProxy(
        ProxyConfig(
            llm_url=engine_url,
            model=cert.model,
            capture_level=cert.capture_level,
            admin_key=ADMIN_KEY,
        )
    )
    with serve_in_thread(proxy.app) as url:
        yield url


def test_multi_turn_conversation_is_one_trainable_sequence_of_engine_numbers(
    certified_proxy, engine_url
):
    sid = httpx.post(f"{certified_proxy}/sessions", headers=ADMIN).json()["session_id"]
    client = openai.OpenAI(base_url=f"{certified_proxy}/v1", api_key=sid, max_retries=0)
    messages: list[dict] = []
    received: list[str] = []
    for k, question in enumerate(QUESTIONS):
        messages.append({"role": "user", "content": question})
        reply = client.chat.completions.create(
            model="anything", messages=messages, temperature=0.7, seed=11 + k, max_tokens=40
        )
        received.append(reply.choices[0].message.content)
        messages.append({"role": "assistant", "content": received[-1]})
    doc = httpx.get(f"{certified_proxy}/sessions/{sid}/rollout", headers=ADMIN).json()

    assert doc["rollout_type"] == "train" and doc["stats"]["turns"] == 3
    assert doc["stats"]["trainable_sequences"] == 1, doc["findings"]
    (seq,) = doc["sequences"]
    assert seq["role"] == "agent" and seq["trainable"]

    for turn, text, n in zip(doc["turns"], received, range(1, 4), strict=True):
        # the tokens decode to the text the client received
        done = turn["completion_token_ids"]
        decoded = httpx.post(f"{engine_url}/detokenize", json={"tokens": done}).json()["prompt"]
        assert decoded == text
        # the prompt ids are the engine's own tokenisation of the conversation so far
        asked = messages[: 2 * n - 1]
        tokens = httpx.post(
            f"{engine_url}/tokenize", json={"messages": asked, "add_generation_prompt": True}
        ).json()
        assert turn["prompt_token_ids"] == tokens["tokens"]

    async def rescored() -> list[float]:
        upstream = Upstream(engine_url)
        try:
            out: list[float] = []
            for span in seq["turn_spans"]:
                ids = seq["input_ids"][: span["end"]]
                out += await rescore(upstream, SERVED, ids, span["start"], 0.7)
            return out
        finally:
            await upstream.aclose()

    captured = [lp for lp, m in zip(seq["logprobs"], seq["loss_mask"], strict=True) if m]
    again = anyio.run(rescored)
    assert len(again) == len(captured)
    assert max(abs(a - b) for a, b in zip(captured, again, strict=True)) <= 1e-4
