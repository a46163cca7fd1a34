"""The one HTTP client to the inference endpoint (vLLM, SGLang, any OpenAI-spec server)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson


class UpstreamError(Exception):
    """The endpoint did not give a usable reply. ``kind``: http, timeout, connect, invalid_json."""

    def __init__(
        self, kind: str, message: str, *, status: int | None = None, body: Any = None
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status
        self.body = body


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


class Upstream:
    """An async client bound to one endpoint; owns its connection pool until ``aclose``."""

    def __init__(
        self,
        llm_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = normalise_base_url(llm_url)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout_s = timeout_s
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=min(10.0, timeout_s)),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=128),
            transport=transport,
        )

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._client.aclose()

    async def request_json(self, method: str, path: str, body: Any = None) -> Any:
        """Send one request; return parsed JSON or raise :class:`UpstreamError`."""
        content = orjson.dumps(body) if body is not None else None
        headers = {"Content-Type": "application/json"} if content is not None else None
        try:
            resp = await self._client.request(method, path, content=content, headers=headers)
        except httpx.TimeoutException as exc:
            msg = f"upstream {self.base_url} timed out after {self.timeout_s:g}s ({type(exc).__name__})"
            raise UpstreamError("timeout", msg) from exc
        except httpx.TransportError as exc:
            msg = f"cannot reach upstream {self.base_url}: {type(exc).__name__}: {exc}"
            raise UpstreamError("connect", msg) from exc
        try:
            parsed = orjson.loads(resp.content)
        except orjson.JSONDecodeError:
            parsed = None
            if resp.is_success:
                snippet = resp.content[:200].decode("utf-8", "replace")
                msg = f"upstream answered {resp.status_code} with a body that is not JSON: {snippet!r}"
                raise UpstreamError("invalid_json", msg, status=resp.status_code) from None
        if not resp.is_success:
            raise UpstreamError(
                "http",
                f"upstream answered {resp.status_code}: {_error_message(parsed, resp)}",
                status=resp.status_code,
                body=parsed,
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


def _error_message(parsed: Any, resp: httpx.Response) -> str:
    if isinstance(parsed, dict):
        err = parsed.get("error", parsed)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if parsed.get("detail"):
            return str(parsed["detail"])
    return resp.content[:300].decode("utf-8", "replace") or resp.reason_phrase
