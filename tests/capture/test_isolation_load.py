"""Isolation under load: 64 concurrent capture sessions through the four official SDKs.

Sixteen sessions each of openai chat (half of them streamed), openai Responses, anthropic and
google-genai, all at once through one capture proxy (uvicorn) on the fake vLLM (uvicorn), the
fake slowed a little so that calls of different sessions are in flight together. Every session
is a distinct three-turn conversation: each of its user messages carries the session's nonce,
and each turn's request carries the previous assistant reply. Each session's key (Bearer,
x-api-key or x-goog-api-key, as each SDK sends it) must route every call to that session and
no other: its recorded turns hold its own nonce and no other session's, they link into one
graph (each turn the child of the one before, its prompt extending the parent's prompt and
reply token for token) and make one trainable sequence, and the counts add up exactly.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Awaitable, Callable
from itertools import pairwise
from typing import Any

import anthropic
import anyio
from google import genai
from google.genai import types

from tests.capture.conftest import Proxy
from tests.fakes.vllm import TOKENIZER

DIALECTS = ("chat", "responses", "anthropic", "google")
SESSIONS = 64
TURNS = 3
MAX_TOKENS = 24
WALL_LIMIT_S = 60.0
NONCE_RE = re.compile(r"nonce[0-9a-f]{16}")

Converse = Callable[[Proxy, str, str], Awaitable[None]]


def question(nonce: str, turn: int) -> str:
    return f"Question {turn} of conversation {nonce}: tell me more about {nonce}."


async def chat(proxy: Proxy, sid: str, nonce: str, *, stream: bool) -> None:
    async with proxy.async_client(sid) as client:
        messages: list[dict[str, Any]] = []
        for turn in range(TURNS):
            messages.append({"role": "user", "content": question(nonce, turn)})
            if stream:
                chunks = await client.chat.completions.create(
                    model="m", messages=messages, max_tokens=MAX_TOKENS, stream=True
                )
                text = "".join(
                    [c.choices[0].delta.content or "" async for c in chunks if c.choices]
                )
            else:
                reply = await client.chat.completions.create(
                    model="m", messages=messages, max_tokens=MAX_TOKENS
                )
                text = reply.choices[0].message.content or ""
            messages.append({"role": "assistant", "content": text})


async def responses(proxy: Proxy, sid: str, nonce: str) -> None:
    async with proxy.async_client(sid) as client:
        items: list[dict[str, Any]] = []
        for turn in range(TURNS):
            items.append({"role": "user", "content": question(nonce, turn)})
            reply = await client.responses.create(
                model="gpt-x", input=items, max_output_tokens=MAX_TOKENS
            )
            items += [o.model_dump(exclude_none=True) for o in reply.output]


async def claude(proxy: Proxy, sid: str, nonce: str) -> None:
    async with anthropic.AsyncAnthropic(base_url=proxy.url, api_key=sid, max_retries=0) as client:
        history: list[dict[str, Any]] = []
        for turn in range(TURNS):
            history.append({"role": "user", "content": question(nonce, turn)})
            msg = await client.messages.create(
                model="claude-x", max_tokens=MAX_TOKENS, messages=history
            )
            history.append({"role": "assistant", "content": [b.to_dict() for b in msg.content]})


async def gemini(proxy: Proxy, sid: str, nonce: str) -> None:
    client = genai.Client(api_key=sid, http_options=types.HttpOptions(base_url=proxy.url))
    history: list[types.Content] = []
    config = types.GenerateContentConfig(max_output_tokens=MAX_TOKENS)
    for turn in range(TURNS):
        history.append(types.Content(role="user", parts=[types.Part(text=question(nonce, turn))]))
        reply = await client.aio.models.generate_content(
            model="gemini-x", contents=history, config=config
        )
        assert reply.candidates and reply.candidates[0].content is not None
        history.append(reply.candidates[0].content)


def conversation(dialect: str, index: int) -> Converse:
    if dialect == "chat":
        stream = index % 2 == 1

        async def run(proxy: Proxy, sid: str, nonce: str) -> None:
            await chat(proxy, sid, nonce, stream=stream)

        return run
    return {"responses": responses, "anthropic": claude, "google": gemini}[dialect]


def nonces_in(ids: list[int]) -> set[str]:
    return set(NONCE_RE.findall(TOKENIZER.decode(ids)))


def test_64_concurrent_sdk_sessions_record_only_their_own_turns(proxy: Proxy) -> None:
    fake = proxy.upstream.fake
    fake.behavior.update(delay_s=0.02)  # calls of many sessions are in flight together
    plan = [
        (DIALECTS[i % len(DIALECTS)], i, f"nonce{uuid.uuid4().hex[:16]}") for i in range(SESSIONS)
    ]
    assert len({nonce for *_, nonce in plan}) == SESSIONS
    sids = [proxy.open_session(metadata={"dialect": d, "nonce": n}) for d, _, n in plan]
    assert len(set(sids)) == SESSIONS

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            for (dialect, index, nonce), sid in zip(plan, sids, strict=True):
                tg.start_soon(conversation(dialect, index), proxy, sid, nonce)

    start = time.perf_counter()
    anyio.run(main)
    wall = time.perf_counter() - start

    cross_talk: list[tuple[str, str, set[str]]] = []
    recorded = 0
    for (dialect, _, nonce), sid in zip(plan, sids, strict=True):
        doc = proxy.rollout(sid)
        turns = doc["turns"]
        recorded += len(turns)
        assert len(turns) == TURNS, (dialect, sid, len(turns))
        assert [t["dialect"] for t in turns] == [dialect] * TURNS
        for turn in turns:
            seen = nonces_in(turn["prompt_token_ids"] + turn["completion_token_ids"])
            if seen != {nonce}:
                cross_talk.append((sid, turn["node_id"], seen))
        # One graph: each turn the child of the one before, extending it token for token.
        assert turns[0]["parent_id"] is None
        for parent, child in pairwise(turns):
            assert child["parent_id"] == parent["node_id"], (dialect, sid)
            prefix = parent["prompt_token_ids"] + parent["completion_token_ids"]
            assert child["prompt_token_ids"][: len(prefix)] == prefix, (dialect, sid)
        stats = doc["stats"]
        assert stats["turns"] == TURNS and stats["roots"] == 1 and stats["retokenized"] == 0
        assert stats["sequences"] == 1 and stats["trainable_sequences"] == 1, (dialect, stats)
        (sequence,) = doc["sequences"]
        last = turns[-1]
        assert sequence["input_ids"] == last["prompt_token_ids"] + last["completion_token_ids"]
        assert [s["node_id"] for s in sequence["turn_spans"]] == [t["node_id"] for t in turns]

    assert cross_talk == [], f"{len(cross_talk)} turns hold another session's nonce"
    assert recorded == SESSIONS * TURNS
    # Upstream saw exactly those calls, each naming one conversation only.
    assert len(fake.requests) == SESSIONS * TURNS
    per_nonce: dict[str, int] = {}
    for body in fake.requests:
        (only,) = set(NONCE_RE.findall(str(body.get("messages"))))
        per_nonce[only] = per_nonce.get(only, 0) + 1
    assert per_nonce == {nonce: TURNS for *_, nonce in plan}
    assert wall < WALL_LIMIT_S, f"{SESSIONS} sessions took {wall:.1f} s"
