"""A fault-injecting upstream: the fake vLLM (:mod:`tests.fakes.vllm`) behind a switch that breaks
its chat replies in the ways real endpoints and the gateways in front of them break.

``FaultyVLLM().app`` is an ASGI app. Every route is the fake vLLM's, except that while
``fault`` is set, each ``POST /v1/chat/completions`` is answered with that fault (the rest,
``/v1/models``, ``/tokenize``, ..., stay healthy, so a proxy can resolve its model and measure
prompts). The faults, in :data:`FAULTS`:

* ``http_500``: vLLM's own 500 body (``InternalServerError``, the message of a dead engine core).
* ``http_502``: an nginx ``502 Bad Gateway`` HTML page, as a reverse proxy in front of a crashed
  engine answers.
* ``http_429_retry_after`` / ``http_429``: a rate limiter's 429 in vLLM's error shape, with
  ``Retry-After: 7`` (:data:`RETRY_AFTER`) and without.
* ``hang``: the request is read and never answered (no status line) until the client goes away.
* ``stall_mid_body``: a 200 status line and the first part of the body, then nothing.
* ``trickle``: a 200 status line, then one byte of JSON-legal whitespace every 0.25 s forever: a
  per-read timeout never fires on it.
* ``closed_mid_body``: a 200 with ``content-length`` of the whole reply, half of the body, then
  the connection is closed.
* ``malformed_json``: a complete HTTP 200 whose body is the reply cut at two thirds (not JSON).
* ``truncated_sse``: an event stream (as vLLM streams, fixture 06) that stops after a few token
  chunks: no finishing chunk, no usage chunk, no ``data: [DONE]``.
* ``malformed_reply``: well-formed JSON that is not a usable chat completion: the real reply
  whose message holds a tool call that is ``null``.
* ``ids_shorter_than_logprobs``: the real reply with its last two ``choices[0].token_ids``
  dropped (the logprob entries keep all positions).
* ``logprobs_for_other_ids``: the real reply whose middle logprob entry names another token than
  the sampled one (``token_id:N`` for an N that is not ``token_ids[i]``): equal length, misaligned.
* ``missing_prompt_ids``: the real reply without its ``prompt_token_ids`` key.
* ``nan_logprob``: the real reply with one logprob written as a bare ``NaN`` (what Python's
  ``json.dumps`` writes for a non-finite float: not strict JSON).
* ``other_model``: the real reply from another model (``model`` is :data:`OTHER_MODEL`).

``served`` counts the faults served, by name.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from typing import Any

import anyio

from tests.fakes.vllm import VOCAB_SIZE, FakeVLLM

RETRY_AFTER = "7"
OTHER_MODEL = "Qwen/Qwen3-8B"
TRICKLE_INTERVAL_S = 0.25

NGINX_502 = (
    b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    b"<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx/1.24.0</center>\r\n"
    b"</body>\r\n</html>\r\n"
)
ENGINE_DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."

#: HTTP-level faults: the reply is an error or never a whole reply.
TRANSPORT_FAULTS = (
    "http_500",
    "http_502",
    "http_429_retry_after",
    "http_429",
    "hang",
    "stall_mid_body",
    "trickle",
    "closed_mid_body",
    "malformed_json",
    "truncated_sse",
    "malformed_reply",
)
#: Data-level faults: a well-formed 200 whose capture data is wrong.
DATA_FAULTS = (
    "ids_shorter_than_logprobs",
    "logprobs_for_other_ids",
    "missing_prompt_ids",
    "nan_logprob",
    "other_model",
)
FAULTS = TRANSPORT_FAULTS + DATA_FAULTS

_Message = dict[str, Any]


def _vllm_error(status: int, type_: str, message: str) -> bytes:
    err = {"message": message, "type": type_, "param": None, "code": status}
    return json.dumps({"error": err}).encode()


class FaultyVLLM:
    """The fake vLLM with a fault switch: ``fault`` (one of :data:`FAULTS`, or None for none)."""

    def __init__(self, fake: FakeVLLM | None = None) -> None:
        self.fake = fake or FakeVLLM()
        self.fault: str | None = None
        self.served: Counter[str] = Counter()

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            await self._dispatch(scope, receive, send)

        self.app = app  # a plain coroutine function: servers take it for ASGI 3

    def set(self, fault: str | None) -> None:
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
        self.fault = fault

    async def _dispatch(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        fault = self.fault
        if (
            fault is None
            or scope["type"] != "http"
            or scope["method"] != "POST"
            or scope["path"] != "/v1/chat/completions"
        ):
            await self.fake.app(scope, receive, send)
            return
        body = await _read_body(receive)
        self.served[fault] += 1
        await getattr(self, "_" + fault)(scope, body, receive, send)

    # ---- helpers -------------------------------------------------------------------------------

    async def _inner(self, scope: dict[str, Any], body: bytes) -> tuple[int, bytes]:
        """The fake vLLM's own answer to ``body``: (status, body bytes)."""
        sent = False
        status = 0
        chunks: list[bytes] = []

        async def replay() -> _Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await anyio.sleep_forever()
            raise AssertionError("unreachable")

        async def capture(message: _Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.fake.app(scope, replay, capture)
        return status, b"".join(chunks)

    async def _reply(self, scope: dict[str, Any], body: bytes) -> dict[str, Any]:
        status, raw = await self._inner(scope, body)
        assert status == 200, f"the fake vLLM answered {status}: {raw[:300]!r}"
        return json.loads(raw)

    @staticmethod
    async def _send(
        send: Any,
        status: int,
        body: bytes,
        content_type: str = "application/json",
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        head = [
            (b"content-type", content_type.encode()),
            (b"content-length", str(len(body)).encode()),
            *(headers or []),
        ]
        await send({"type": "http.response.start", "status": status, "headers": head})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    @staticmethod
    async def _until_disconnect(receive: Any) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    async def _mutated(self, scope: dict[str, Any], body: bytes, send: Any, mutate: Any) -> None:
        reply = await self._reply(scope, body)
        mutate(reply)
        await self._send(send, 200, json.dumps(reply).encode())

    # ---- the faults ----------------------------------------------------------------------------

    async def _http_500(self, scope: Any, body: bytes, receive: Any, send: Any) -> None:
        await self._send(send, 500, _vllm_error(500, "InternalServerError", ENGINE_DEAD))

    async def _http_502(self, scope: Any, body: bytes, receive: Any, send: Any) -> None:
        await self._send(send, 502, NGINX_502, "text/html")

    async def _http_429_retry_after(self, scope: Any, body: bytes, receive: Any, send: Any) -> None:
        msg = f"Too many requests: rate limit reached, retry after {RETRY_AFTER} seconds."
        await self._send(
            send,
            429,
            _vllm_error(429, "RateLimitError", msg),
            headers=[(b"retry-after", RETRY_AFTER.encode())],
        )

    async def _http_429(self, scope: Any, body: bytes, receive: Any, send: Any) -> None:
        msg = "Too many requests: rate limit reached."
        await self._send(send, 429, _vllm_error(429, "RateLimitError", msg))

    async def _hang(self, scope: Any, body: bytes, receive: Any, send: Any) -> None:
        await self._until_disconnect(receive)

    async def _stall_mid_body(self, scope: Any, body: bytes, receive: Any, send: Any) -> None:
        raw = json.dumps(await self._reply(scope, body)).encode()
        head = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": head})
        await send({"type": "http.response.body", "body": raw[: len(raw) // 2], "more_body": True})
        await self._until_disconnect(receive)

    async def _trickle(self, scope: Any, body: bytes, receive: Any, send: Any) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        async with anyio.create_task_group() as tg:

            async def drip() -> None:
                while True:
                    await send({"type": "http.response.body", "body": b" ", "more_body": True})
                    await anyio.sleep(TRICKLE_INTERVAL_S)

            tg.start_soon(drip)
            await self._until_disconnect(receive)
            tg.cancel_scope.cancel()

    async def _closed_mid_body(self, scope: Any, body: bytes, receive: Any, send: Any) -> None:
        raw = json.dumps(await self._reply(scope, body)).encode()
        head = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": head})
        await send({"type": "http.response.body", "body": raw[: len(raw) // 2], "more_body": True})
        # Returning with the body incomplete: uvicorn closes the connection.

    async def _malformed_json(self, scope: Any, body: bytes, receive: Any, send: Any) -> None:
        raw = json.dumps(await self._reply(scope, body)).encode()
        await self._send(send, 200, raw[: 2 * len(raw) // 3])

    async def _truncated_sse(self, scope: Any, body: bytes, receive: Any, send: Any) -> None:
        request = json.loads(body)
        request.update(stream=True, stream_options={"include_usage": True})
        status, raw = await self._inner(scope, json.dumps(request).encode())
        assert status == 200
        events = [e for e in raw.decode().split("\n\n") if e.strip()]
        # the role chunk and three token chunks; never the finishing chunk, usage or [DONE]
        kept = "".join(e + "\n\n" for e in events[:4])
        assert "[DONE]" not in kept and '"finish_reason":"' not in kept.replace(" ", "")
        await self._send(send, 200, kept.encode(), "text/event-stream")

    async def _malformed_reply(self, scope: Any, body: bytes, receive: Any, send: Any) -> None:
        def break_it(reply: dict[str, Any]) -> None:
            reply["choices"][0]["message"]["tool_calls"] = [None]

        await self._mutated(scope, body, send, break_it)

    async def _ids_shorter_than_logprobs(
        self, scope: Any, body: bytes, receive: Any, send: Any
    ) -> None:
        def cut(reply: dict[str, Any]) -> None:
            choice = reply["choices"][0]
            assert len(choice["token_ids"]) > 2
            choice["token_ids"] = choice["token_ids"][:-2]

        await self._mutated(scope, body, send, cut)

    async def _logprobs_for_other_ids(
        self, scope: Any, body: bytes, receive: Any, send: Any
    ) -> None:
        def misalign(reply: dict[str, Any]) -> None:
            choice = reply["choices"][0]
            ids = choice["token_ids"]
            content = choice["logprobs"]["content"]
            i = len(ids) // 2
            entry = copy.deepcopy(content[i])
            entry["token"] = f"token_id:{(ids[i] + 1) % VOCAB_SIZE}"
            content[i] = entry

        await self._mutated(scope, body, send, misalign)

    async def _missing_prompt_ids(self, scope: Any, body: bytes, receive: Any, send: Any) -> None:
        await self._mutated(scope, body, send, lambda reply: reply.pop("prompt_token_ids"))

    async def _nan_logprob(self, scope: Any, body: bytes, receive: Any, send: Any) -> None:
        reply = await self._reply(scope, body)
        content = reply["choices"][0]["logprobs"]["content"]
        content[len(content) // 2]["logprob"] = float("nan")
        await self._send(send, 200, json.dumps(reply).encode())  # allow_nan: writes NaN

    async def _other_model(self, scope: Any, body: bytes, receive: Any, send: Any) -> None:
        await self._mutated(scope, body, send, lambda reply: reply.update(model=OTHER_MODEL))


async def _read_body(receive: Any) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(chunks)
