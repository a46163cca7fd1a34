"""The one HTTP client to the inference endpoint (vLLM, SGLang, any OpenAI-spec server)."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import anyio
import httpx
import orjson


class UpstreamError(Exception):
    """The endpoint did not give a usable reply. ``kind`` says how:

    - ``connect``: no reply at all (refused, unreachable, or closed before a status line);
    - ``timeout``: no whole reply within ``timeout_s`` (a hang, a stall, a trickle);
    - ``disconnected``: the connection closed in the middle of the reply's body;
    - ``http``: an error status (``status``; ``body`` is the parsed JSON body, if any;
      ``retry_after`` the ``Retry-After`` header, if any);
    - ``invalid_json``: a success status whose body is not JSON;
    - ``unexpected_stream``: an event stream (``text/event-stream``) where a JSON reply was asked;
    - ``malformed_reply``: JSON that is not a usable reply (raised by the proxy's own checks).
    """

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        status: int | None = None,
        body: Any = None,
        retry_after: str | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status
        self.body = body
        self.retry_after = retry_after


def normalise_base_url(llm_url: str) -> str:
    """``http://host:8000`` and ``http://host:8000/v1`` both mean the OpenAI base ``.../v1``."""
    parts = urlsplit(llm_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(
            f"--llm-url must be an http(s) URL like http://127.0.0.1:8000/v1, got {llm_url!r}"
        )
    url = llm_url.rstrip("/")
    if parts.path in ("", "/"):
        url += "/v1"
    return url


@dataclass(frozen=True)
class _Reply:
    """A whole reply as the exchange read it: status line, headers and body."""

    status: int
    reason: str
    headers: Mapping[str, str]  # case-insensitive (aiohttp's CIMultiDict, httpx.Headers)
    raw: bytes

    @property
    def is_success(self) -> bool:
        return 200 <= self.status < 300


class Upstream:
    """An async client bound to one endpoint; owns its connection pool until ``aclose``.

    Over the network it sends with aiohttp (a third of httpx's CPU per call on the proxy's hot
    path: bench/README.md, issue 20); given an httpx ``transport`` (an in-process ASGI app, a
    test's mock) it sends through that. Both report failures as the same :class:`UpstreamError`
    kinds.
    """

    def __init__(
        self,
        llm_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = normalise_base_url(llm_url)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout_s = timeout_s
        # Load and health, read by rollwire.tools.engines to place and drain rollouts.
        self.in_flight = 0  # exchanges under way
        self.transport_failures_in_a_row = 0  # connect/timeout/disconnected, reset by any reply
        self.last_transport_error: str | None = None
        self.stale_retries = 0  # requests sent again after a reused connection was found closed
        self._connect_s = min(10.0, timeout_s)
        self._httpx: httpx.AsyncClient | None = None
        self._session: aiohttp.ClientSession | None = None  # made on first use, inside a loop
        self._closed = False
        self._proxies: dict[str, str | None] = {}  # per host:port, from the environment
        if transport is not None:
            self._httpx = httpx.AsyncClient(
                headers=self._headers,
                timeout=httpx.Timeout(timeout_s, connect=self._connect_s),
                transport=transport,
            )

    async def aclose(self) -> None:
        """Close the connection pool."""
        self._closed = True
        if self._httpx is not None:
            await self._httpx.aclose()
        if self._session is not None:
            await self._session.close()

    def _proxy_for(self, url: str) -> str | None:
        """``HTTP(S)_PROXY`` unless ``NO_PROXY`` covers the host (as httpx honoured them), read
        once per host: aiohttp's own ``trust_env`` reads the environment on every request."""
        parts = urlsplit(url)
        host = parts.netloc
        if host not in self._proxies:
            bypass = urllib.request.proxy_bypass(parts.hostname or host)
            self._proxies[host] = None if bypass else urllib.request.getproxies().get(parts.scheme)
        return self._proxies[host]

    def _aiohttp(self) -> aiohttp.ClientSession:
        if self._session is None:
            if self._closed:
                raise RuntimeError(f"upstream client for {self.base_url} is closed")
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                connector=aiohttp.TCPConnector(limit=256, ttl_dns_cache=300),
                timeout=aiohttp.ClientTimeout(
                    total=None, sock_connect=self._connect_s, sock_read=self.timeout_s
                ),
                skip_auto_headers=("User-Agent",),
                trace_configs=[_REUSE_TRACE],
            )
        return self._session

    async def request_json(self, method: str, path: str, body: Any = None) -> Any:
        """Send one request; return parsed JSON or raise :class:`UpstreamError`.

        ``timeout_s`` bounds the whole exchange, status line to last byte: the clients' own
        timeouts bound each read, so a reply that trickles a byte at a time would never end
        without it.
        """
        content = orjson.dumps(body) if body is not None else None
        headers = {"Content-Type": "application/json"} if content is not None else None
        url = path if path.startswith(("http://", "https://")) else self.base_url + path
        started: list[int] = []  # the status, once the status line is in
        self.in_flight += 1
        try:
            with anyio.fail_after(self.timeout_s):
                if self._httpx is not None:
                    reply = await self._exchange_httpx(method, url, content, headers, started)
                else:
                    reply = await self._exchange_aiohttp(method, url, content, headers, started)
        except TimeoutError:
            error = self._timed_out(started[0] if started else None, "total deadline")
            self._note_transport_failure(error)
            raise error from None
        except UpstreamError as exc:
            self._note_transport_failure(exc)
            raise
        finally:
            self.in_flight -= 1
        self.transport_failures_in_a_row = 0  # the engine answered (even with an error status)
        return self._parse(reply)

    def _note_transport_failure(self, error: UpstreamError) -> None:
        self.transport_failures_in_a_row += 1
        self.last_transport_error = error.message

    def _timed_out(self, status: int | None, why: str) -> UpstreamError:
        """``why``: the client's read timeout (no byte for ``timeout_s``), or the total deadline."""
        if status is None:
            msg = f"upstream {self.base_url} timed out after {self.timeout_s:g}s with no reply ({why})"
            return UpstreamError("timeout", msg)
        msg = (
            f"upstream {self.base_url} answered {status} but its body was still "
            f"incomplete when it timed out after {self.timeout_s:g}s ({why})"
        )
        return UpstreamError("timeout", msg, status=status)

    def _no_answer(self, exc: BaseException) -> UpstreamError:
        msg = (
            f"upstream {self.base_url} closed the connection without answering: "
            f"{type(exc).__name__}: {exc}"
        )
        return UpstreamError("connect", msg)

    def _cut_off(self, status: int, exc: BaseException) -> UpstreamError:
        msg = (
            f"upstream {self.base_url} closed the connection in the middle of its "
            f"{status} reply: {type(exc).__name__}: {exc}"
        )
        return UpstreamError("disconnected", msg, status=status)

    async def _exchange_aiohttp(
        self,
        method: str,
        url: str,
        content: bytes | None,
        headers: dict[str, str] | None,
        started: list[int],
    ) -> _Reply:
        for attempt in (1, 2):
            connection: dict[str, bool] = {}  # {"reused": True} once aiohttp reuses one
            try:
                resp = await self._aiohttp().request(
                    method,
                    url,
                    data=content,
                    headers=headers,
                    allow_redirects=False,
                    proxy=self._proxy_for(url),
                    trace_request_ctx=connection,
                )
            except TimeoutError as exc:  # aiohttp's connect and read timeouts are TimeoutErrors
                raise self._timed_out(None, type(exc).__name__) from exc
            except aiohttp.ClientConnectorError as exc:
                msg = f"cannot reach upstream {self.base_url}: {type(exc).__name__}: {exc}"
                raise UpstreamError("connect", msg) from exc
            except (aiohttp.ClientError, OSError) as exc:
                # The keep-alive race: the engine closed an idle pooled connection just as it
                # was reused, so the request never reached it. Sent again once, on another
                # connection; a fresh connection closed without an answer is the engine's own
                # failure and is not sent again.
                if attempt == 1 and connection.get("reused"):
                    self.stale_retries += 1
                    continue
                raise self._no_answer(exc) from exc
            break
        started.append(resp.status)
        try:
            raw = await resp.read()
        except TimeoutError as exc:
            resp.close()
            raise self._timed_out(resp.status, type(exc).__name__) from exc
        except (aiohttp.ClientError, OSError) as exc:
            resp.close()
            raise self._cut_off(resp.status, exc) from exc
        except BaseException:  # cancelled mid-body: the connection cannot be reused
            resp.close()
            raise
        resp.release()
        return _Reply(resp.status, resp.reason or "", resp.headers, raw)

    async def _exchange_httpx(
        self,
        method: str,
        url: str,
        content: bytes | None,
        headers: dict[str, str] | None,
        started: list[int],
    ) -> _Reply:
        assert self._httpx is not None
        request = self._httpx.build_request(method, url, content=content, headers=headers)
        try:
            resp = await self._httpx.send(request, stream=True)
        except httpx.TimeoutException as exc:
            raise self._timed_out(None, type(exc).__name__) from exc
        except httpx.ConnectError as exc:
            msg = f"cannot reach upstream {self.base_url}: {type(exc).__name__}: {exc}"
            raise UpstreamError("connect", msg) from exc
        except httpx.TransportError as exc:
            raise self._no_answer(exc) from exc
        started.append(resp.status_code)
        try:
            raw = await resp.aread()
        except httpx.TimeoutException as exc:
            raise self._timed_out(resp.status_code, type(exc).__name__) from exc
        except httpx.TransportError as exc:
            raise self._cut_off(resp.status_code, exc) from exc
        finally:
            await resp.aclose()
        return _Reply(resp.status_code, resp.reason_phrase, resp.headers, raw)

    def _parse(self, reply: _Reply) -> Any:
        raw = reply.raw
        try:
            parsed = orjson.loads(raw)
        except orjson.JSONDecodeError:
            parsed = _lenient_json(raw)
        if parsed is _NOT_JSON:
            parsed = None
            if reply.is_success:
                if _is_event_stream(reply):
                    raise UpstreamError(
                        "unexpected_stream", _stream_message(reply), status=reply.status
                    ) from None
                snippet = raw[:200].decode("utf-8", "replace")
                msg = f"upstream answered {reply.status} with a body that is not JSON: {snippet!r}"
                raise UpstreamError("invalid_json", msg, status=reply.status) from None
        if not reply.is_success:
            raise UpstreamError(
                "http",
                f"upstream answered {reply.status}: {_error_message(parsed, reply)}",
                status=reply.status,
                body=parsed,
                retry_after=reply.headers.get("retry-after"),
            )
        return parsed

    @property
    def root_url(self) -> str:
        """The server root (vLLM serves ``/tokenize`` there, beside ``/v1``)."""
        return self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url

    async def tokenize(self, body: dict[str, Any]) -> list[int]:
        """``POST /tokenize`` (chat form: messages, tools, add_generation_prompt, ...) -> ids."""
        data = await self.request_json("POST", self.root_url + "/tokenize", body)
        tokens = data.get("tokens") if isinstance(data, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise UpstreamError("invalid_json", "upstream /tokenize answered without 'tokens'")
        return tokens

    async def detokenize(self, model: str, tokens: list[int]) -> str:
        """``POST /detokenize`` -> the text of ``tokens`` (vLLM answers ``prompt``, SGLang
        ``text``)."""
        data = await self.request_json(
            "POST", self.root_url + "/detokenize", {"model": model, "tokens": tokens}
        )
        text = data.get("prompt", data.get("text")) if isinstance(data, dict) else None
        if not isinstance(text, str):
            raise UpstreamError("invalid_json", "upstream /detokenize answered without text")
        return text

    async def model_cards(self) -> list[dict[str, Any]]:
        """The model cards of ``GET /models`` (each has an ``id``)."""
        data = await self.request_json("GET", "/models")
        items = data.get("data") if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise UpstreamError("invalid_json", "GET /models did not return a 'data' list")
        return [m for m in items if isinstance(m, dict) and "id" in m]

    async def served_models(self) -> list[str]:
        """Model ids from ``GET /models``."""
        return [str(m["id"]) for m in await self.model_cards()]


_NOT_JSON = object()


async def _note_reuse(
    session: aiohttp.ClientSession, ctx: Any, params: aiohttp.TraceConnectionReuseconnParams
) -> None:
    if isinstance(ctx.trace_request_ctx, dict):
        ctx.trace_request_ctx["reused"] = True


#: marks a request's ``trace_request_ctx`` when aiohttp sends it on a pooled connection
_REUSE_TRACE = aiohttp.TraceConfig()
_REUSE_TRACE.on_connection_reuseconn.append(_note_reuse)
_REUSE_TRACE.freeze()


def _lenient_json(raw: bytes) -> Any:
    """JSON as Python's ``json`` writes it by default, which orjson refuses: ``NaN`` and
    ``Infinity`` (a Python server's non-finite logprob) and integers beyond 64 bits. The reply
    stays usable (ingest masks a turn whose logprobs are not finite); anything else that orjson
    refuses is not JSON (``_NOT_JSON``)."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return _NOT_JSON


def _error_message(parsed: Any, reply: _Reply) -> str:
    if isinstance(parsed, dict):
        err = parsed.get("error", parsed)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if parsed.get("detail"):
            return str(parsed["detail"])
    text = reply.raw[:2000].decode("utf-8", "replace")
    if "html" in reply.headers.get("content-type", "").lower() or text.lstrip().startswith("<"):
        # A gateway's error page (nginx: "502 Bad Gateway"): its title, else its text.
        title = _HTML_TITLE.search(text)
        text = title.group(1) if title else _HTML_TAG.sub(" ", text)
        text = " ".join(text.split())
    return text[:300] or reply.reason


_HTML_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)
_HTML_TAG = re.compile(r"<[^>]*>")


def _is_event_stream(reply: _Reply) -> bool:
    ctype = reply.headers.get("content-type", "").lower()
    return "text/event-stream" in ctype or reply.raw.lstrip().startswith((b"data:", b"event:"))


def _stream_message(reply: _Reply) -> str:
    """What an event stream that came instead of a JSON reply looked like (stream=false was
    sent: the proxy never asks an engine to stream)."""
    events = [e for e in reply.raw.replace(b"\r\n", b"\n").split(b"\n\n") if e.strip()]
    done = any(e.strip().endswith(b"data: [DONE]") for e in events)
    ending = (
        "it ended with data: [DONE]"
        if done
        else "it was cut before data: [DONE] (truncated stream)"
    )
    return (
        f"upstream answered {reply.status} with an event stream ({len(events)} events) "
        f"where a JSON reply was asked (stream=false); {ending}"
    )
