"""The capture proxy: an OpenAI-spec front door that records every model call of a session.

Data plane: ``/v1/chat/completions`` and ``/v1/models``; the caller's API key is its capture
session id, and an unknown key is refused before anything is forwarded (no open relay).
Control plane: ``/sessions`` (open, list, read, export, close), always behind an admin key:
``ProxyConfig.admin_key``, or one generated when none is given (``CaptureProxy.admin_key``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import secrets
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

import anyio
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from rollwire.capture.certify import Certification
from rollwire.capture.dialects import chat, load_dialects
from rollwire.capture.dialects.base import Dialect, DialectError
from rollwire.capture.findings import Finding, info, warn
from rollwire.capture.ingest import ingest_chat_reply
from rollwire.capture.rollout import CaptureLevel
from rollwire.capture.session import CaptureSession, SessionStore
from rollwire.capture.splice import (
    CallMemory,
    Fallback,
    ReasoningPolicy,
    header_key,
    plan_call,
    splice,
)
from rollwire.capture.splice import Mode as TokenInMode
from rollwire.capture.token_paths import PATHS, Parsers, TokenPath, normalise_reply
from rollwire.capture.upstream import Upstream, UpstreamError

log = logging.getLogger("rollwire.proxy")

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
AUX_HEADER = "x-rollwire-role"


@dataclass(frozen=True)
class ProxyConfig:
    """How the proxy reaches its engine and whom it serves."""

    llm_url: str
    model: str | None = None
    api_key: str | None = None
    admin_key: str | None = None
    # Decided by certification, never by a flag; unknown means the weakest tier.
    capture_level: CaptureLevel = CaptureLevel.TEXT
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    timeout_s: float = 600.0
    # Parameters the endpoint rejected at certification: dropped from every request.
    param_fixes: tuple[str, ...] = ()
    # Token-in continuation (rollwire.capture.splice): off, auto (splice when the engine takes
    # a token prompt, which certification found) or required (refuse to start otherwise).
    token_in: TokenInMode = "off"
    # Keep the model's own reasoning tokens when a harness strips them from history (keep), or
    # start a new chain there (fork).
    reasoning_policy: ReasoningPolicy = "keep"
    # The model's turn-close token, when certification saw one (else learnt from the first
    # call of a session that ends by itself).
    close_token_id: int | None = None
    # How a token prompt reaches the engine (rollwire.capture.token_paths.PATHS): the best path
    # certification found; None with token_in on means vllm_chat.
    token_in_path: str | None = None
    # The engine's tool and reasoning parsers, for the completions path (which parses in the
    # proxy); named as vLLM's --tool-call-parser / --reasoning-parser.
    tool_parser: str = "hermes"
    reasoning_parser: str = "none"


def certified_config(llm_url: str, cert: Certification, **settings: Any) -> ProxyConfig:
    """The configuration a certification earned: its resolved model, tier and parameter fixes,
    and token-in continuation when the engine takes a token prompt at the tokens tier."""
    token_in = settings.pop("token_in", "auto")
    path = settings.pop("token_in_path", None)
    tool_parser = settings.pop("tool_parser", None) or cert.tool_parser or "hermes"
    if token_in == "required" and not cert.token_in:
        raise ValueError(
            f"token_in=required, but {llm_url} does not take a token prompt ({cert.token_in_reason})"
        )
    if path is not None and path not in cert.token_in_paths:
        raise ValueError(
            f"token_in_path={path!r}, but {llm_url} takes a token prompt only by "
            f"{cert.token_in_paths or 'no path'} ({cert.token_in_reason or 'certified'})"
        )
    if not cert.token_in or cert.capture_level is not CaptureLevel.TOKENS:
        token_in = "off"
    return ProxyConfig(
        llm_url=llm_url,
        model=cert.model,
        capture_level=cert.capture_level,
        param_fixes=tuple(f.param for f in cert.param_fixes),
        token_in=token_in,
        close_token_id=cert.close_token_id,
        token_in_path=path or (cert.token_in_paths[0] if cert.token_in_paths else None),
        tool_parser=tool_parser,
        **settings,
    )


@dataclass(frozen=True)
class _TokenSend:
    """A spliced call on its way: the path, the prompt ids and the request body."""

    path: TokenPath
    ids: list[int]
    body: dict[str, Any]


def json_response(data: Any, status: int = 200) -> Response:
    """A JSON response serialised with orjson (pydantic models via model_dump)."""
    if hasattr(data, "model_dump"):
        data = data.model_dump(mode="json")
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def _error(
    status: int, message: str, *, type_: str, param: str | None = None, code: Any = None
) -> Response:
    return json_response(chat.error_body(message, type_=type_, param=param, code=code), status)


def _bearer(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    key = request.headers.get("x-api-key") or request.headers.get("api-key")
    return key.strip() if key else None


_KEY_HEADERS = (b"x-api-key", b"api-key", b"x-goog-api-key")


def _presented_keys(scope: Mapping[str, Any]) -> list[str]:
    """Every API key a request presents, in any dialect's place (header, bearer, ``?key=``)."""
    keys = []
    for name, value in scope.get("headers") or ():
        name = name.lower()
        text = value.decode("latin-1").strip()
        if name == b"authorization":
            scheme, _, token = text.partition(" ")
            keys.append(token.strip() if scheme.lower() == "bearer" else text)
        elif name in _KEY_HEADERS:
            keys.append(text)
    for name, value in parse_qsl(scope.get("query_string", b"").decode("latin-1")):
        if name == "key":
            keys.append(value.strip())
    return keys


class _SessionPin:
    """ASGI middleware: pass a request only when every key it presents is the session's."""

    def __init__(self, app: Any, session_id: str) -> None:
        self.app = app
        self._key = session_id.encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            keys = _presented_keys(scope)
            if not keys or not all(secrets.compare_digest(k.encode(), self._key) for k in keys):
                response = _error(
                    403,
                    "this endpoint serves one capture session: use its key",
                    type_="permission_error",
                    code="session_pinned",
                )
                await response(scope, receive, send)
                return
        elif scope["type"] == "websocket":  # nothing here speaks it: refused at once
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 1008})
            return
        await self.app(scope, receive, send)


class _TooLarge(Exception):
    pass


@dataclass
class _Failure:
    """A call that ends in an error, before it is shaped for the caller's dialect."""

    status: int
    message: str
    type_: str
    param: str | None = None
    code: Any = None
    passthrough: dict[str, Any] | None = None  # the engine's own OpenAI-shaped error

    def chat_response(self) -> Response:
        if self.passthrough is not None:
            return json_response({"error": self.passthrough}, self.status)
        return _error(self.status, self.message, type_=self.type_, param=self.param, code=self.code)


def _remember_tool_arguments(session: CaptureSession, reply: dict[str, Any]) -> None:
    for choice in reply.get("choices") or []:
        for call in (choice.get("message") or {}).get("tool_calls") or []:
            fn = call.get("function") or {}
            if isinstance(call.get("id"), str) and isinstance(fn.get("arguments"), str):
                session.tool_arguments[call["id"]] = fn["arguments"]


def _same_json(a: str, b: str) -> bool:
    try:
        return orjson.loads(a) == orjson.loads(b)
    except orjson.JSONDecodeError:
        return a == b


def _restore_tool_arguments(session: CaptureSession, body: dict[str, Any]) -> None:
    """Put back the exact arguments string the engine sampled for each earlier tool call that a
    dialect carried as an object and re-serialised (same JSON value, maybe other spacing): the
    next prompt must extend the earlier turn's tokens."""
    for message in body.get("messages") or []:
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        for call in message.get("tool_calls") or []:
            fn = call.get("function") if isinstance(call, dict) else None
            sampled = session.tool_arguments.get(call.get("id")) if fn else None
            if sampled is not None and isinstance(fn.get("arguments"), str):
                if fn["arguments"] != sampled and _same_json(fn["arguments"], sampled):
                    fn["arguments"] = sampled


def _remember_call(session: CaptureSession, body: dict[str, Any], turn: Any) -> None:
    """Keep what a later call needs to splice onto this one."""
    if turn.prompt_ids is None or turn.sampled_ids is None or turn.reply is None:
        return
    sampled = [int(t) for t in turn.sampled_ids]
    close_id = sampled[-1] if sampled and turn.finish_reason in ("stop", "tool_calls") else None
    if close_id is not None and session.close_id is None:
        session.close_id = close_id
    session.calls.append(
        CallMemory(
            node_id=turn.node_id,
            messages=list(body["messages"]),
            reply=dict(turn.reply),
            header=header_key(body),
            prompt_ids=[int(t) for t in turn.prompt_ids],
            sampled_ids=sampled,
            finish_reason=turn.finish_reason,
            close_id=close_id,
        )
    )


def _is_aux(request: Request) -> bool:
    return request.headers.get(AUX_HEADER, "").lower() in ("auxiliary", "aux")


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise _TooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


class CaptureProxy:
    """The proxy's state and handlers; ``app`` is the Starlette application."""

    def __init__(
        self,
        config: ProxyConfig,
        *,
        sessions: SessionStore | None = None,
        upstream: Upstream | None = None,
    ) -> None:
        self.config = config
        # The control plane's key: the configured one, or a fresh one (never an open plane).
        self.admin_key: str = config.admin_key or secrets.token_urlsafe(32)
        self.sessions = sessions or SessionStore(config.capture_level)
        self._upstream = upstream
        self._owns_upstream = upstream is None
        self._model: str | None = None
        self._max_model_len: int | None = None
        self.parsers = Parsers(config.tool_parser, config.reasoning_parser)
        name = config.token_in_path or "vllm_chat"
        if name not in PATHS:
            raise ValueError(f"unknown token_in_path {name!r}; known: {sorted(PATHS)}")
        self.token_path: TokenPath | None = PATHS[name] if config.token_in != "off" else None
        self.instance_id = secrets.token_hex(8)
        # The data plane: what an agent calls. A sandbox reaches these routes only, and only
        # with its own session's key (session_app).
        self.data_routes = [
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            *self._dialect_routes(),
        ]
        self.app = Starlette(
            routes=[
                Route("/health", self.health, methods=["GET"]),
                *self.data_routes,
                Route("/sessions", self.open_session, methods=["POST"]),
                Route("/sessions", self.list_sessions, methods=["GET"]),
                Route("/sessions/{session_id}", self.get_session, methods=["GET"]),
                Route("/sessions/{session_id}", self.close_session, methods=["DELETE"]),
                Route("/sessions/{session_id}/rollout", self.get_rollout, methods=["GET"]),
            ],
            lifespan=self._lifespan,
        )
        self.app.state.proxy = self

    def session_app(self, session_id: str) -> Any:
        """An ASGI app that serves one capture session's data plane and nothing else.

        The dialect routes and ``/v1/models`` only (no ``/health``, no control plane), and only
        to a caller whose every presented key is ``session_id``: another session's key, or none,
        is refused with 403 before any handler runs. What a sandbox's agent is given to reach
        (:mod:`rollwire.harnesses.harbor.gate`). It has no lifespan: the proxy's own app must be
        running (its upstream open) while this one serves.
        """
        return _SessionPin(Starlette(routes=list(self.data_routes)), session_id)

    def _dialect_routes(self) -> list[Route]:
        routes = []
        for dialect in load_dialects():
            for spec in dialect.routes:
                routes.append(
                    Route(
                        spec.path,
                        functools.partial(self.dialect_call, dialect, spec.kind),
                        methods=[spec.method],
                    )
                )
        return routes

    @contextlib.asynccontextmanager
    async def _lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        if self._upstream is None:
            self._upstream = Upstream(
                self.config.llm_url, api_key=self.config.api_key, timeout_s=self.config.timeout_s
            )
        try:
            yield
        finally:
            if self._owns_upstream and self._upstream is not None:
                await self._upstream.aclose()
                self._upstream = None

    @property
    def upstream(self) -> Upstream:
        """The upstream client (exists while the app is running)."""
        if self._upstream is None:
            raise RuntimeError("the proxy app is not running (its lifespan has not started)")
        return self._upstream

    async def max_model_len(self) -> int | None:
        """The served model's context length, from the ``GET /models`` card that
        :meth:`resolve_model` read (vLLM and SGLang list it); None when it does not say."""
        await self.resolve_model()
        return self._max_model_len

    async def resolve_model(self) -> str:
        """The served model name to substitute into every request (cached once known)."""
        if self._model is not None:
            return self._model
        wanted = self.config.model
        try:
            cards = await self.upstream.model_cards()
        except UpstreamError:
            if wanted:  # some OpenAI-spec endpoints have no /models: trust the operator
                self._model = wanted
                return wanted
            raise
        served = [str(c["id"]) for c in cards]
        if wanted:
            if wanted not in served:
                raise chat.RequestError(
                    f"model {wanted!r} is not served by {self.upstream.base_url}; it serves {served}",
                    param="model",
                    status=502,
                )
            self._model = wanted
        elif len(served) == 1:
            self._model = served[0]
        else:
            raise chat.RequestError(
                f"{self.upstream.base_url} serves {len(served)} models {served}: start the proxy with --model",
                param="model",
                status=502,
            )
        for card in cards:
            value = card.get("max_model_len")
            if card["id"] == self._model and isinstance(value, int) and value > 0:
                self._max_model_len = value
        return self._model

    # ---- data plane -------------------------------------------------------------------------

    def _session_or_401(self, request: Request) -> CaptureSession | Response:
        session = self.sessions.get(_bearer(request))
        if session is None:
            return _error(
                401,
                "unknown or missing capture session key: pass the session id from POST /sessions as the API key",
                type_="authentication_error",
                code="invalid_api_key",
            )
        return session

    async def models(self, request: Request) -> Response:
        """``GET /v1/models``: the one model this proxy serves (in Google's or Anthropic's shape
        when the caller speaks that dialect: the route is shared)."""
        headers = request.headers
        speaker = (
            "google"
            if "x-goog-api-key" in headers or "key" in request.query_params
            else "anthropic"
            if "anthropic-version" in headers
            else None
        )
        dialect = next((d for d in load_dialects() if d.name == speaker), None)
        if dialect is not None:
            return await self.dialect_call(dialect, "models", request)
        session = self._session_or_401(request)
        if isinstance(session, Response):
            return session
        try:
            model = await self.resolve_model()
        except chat.RequestError as exc:
            return _error(exc.status, exc.message, type_="upstream_error", param=exc.param)
        except UpstreamError as exc:
            return _error(502, exc.message, type_="upstream_error")
        return json_response(
            {
                "object": "list",
                "data": [{"id": model, "object": "model", "created": 0, "owned_by": "rollwire"}],
            }
        )

    async def chat_completions(self, request: Request) -> Response:
        """``POST /v1/chat/completions``: forward, capture, replay."""
        session = self._session_or_401(request)
        if isinstance(session, Response):
            return session
        body = await self._json_body(request)
        if isinstance(body, _Failure):
            return body.chat_response()
        try:
            body = chat.validate_request(body)
        except chat.RequestError as exc:
            return _error(exc.status, exc.message, type_="invalid_request_error", param=exc.param)
        outcome = await self._capture_turn(session, body, _is_aux(request))
        if isinstance(outcome, _Failure):
            return outcome.chat_response()
        out, prepared = outcome
        if prepared.stream:
            return StreamingResponse(chat.sse_replay(out, prepared), media_type="text/event-stream")
        return json_response(out)

    async def _json_body(self, request: Request) -> Any:
        """The request's JSON body, or a failure (415, 413, 400)."""
        ctype = request.headers.get("content-type", "")
        if ctype and "json" not in ctype.lower():
            return _Failure(
                415,
                f"content-type must be application/json, got {ctype!r}",
                "invalid_request_error",
            )
        try:
            raw = await _read_body(request, self.config.max_body_bytes)
        except _TooLarge:
            limit = self.config.max_body_bytes
            return _Failure(
                413, f"request body is larger than {limit} bytes", "invalid_request_error"
            )
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return _Failure(400, f"request body is not valid JSON: {exc}", "invalid_request_error")

    async def _capture_turn(
        self,
        session: CaptureSession,
        body: dict[str, Any],
        auxiliary: bool,
        *,
        dialect: str = chat.NAME,
        notes: list[str] | None = None,
    ) -> tuple[dict[str, Any], chat.Prepared] | _Failure:
        """One model call of a session, whatever the caller's dialect: forward the validated
        chat body, record the turn, and return the caller-facing chat reply."""
        node_id = session.begin_call()
        if node_id is None:
            msg = f"session {session.session_id} reached max_model_calls={session.max_model_calls}"
            session.record(warn("max_model_calls", msg), error=True)
            return _Failure(429, msg, "rate_limit_error", code="max_model_calls")
        try:
            model = await self.resolve_model()
        except chat.RequestError as exc:
            session.record(warn("model_unresolved", exc.message), error=True)
            return _Failure(exc.status, exc.message, "upstream_error", param=exc.param)
        except UpstreamError as exc:
            return self._upstream_failed(session, node_id, exc)
        prepared = chat.prepare(
            body,
            model=model,
            capture_level=session.capture_level,
            drop_params=self.config.param_fixes,
        )
        fitted = await self._fit_max_tokens(prepared, model, node_id)
        if fitted is not None:
            prepared.findings.append(fitted)
        token_in, send = await self._token_in(session, body, prepared, model)
        try:
            if send is None:
                reply = await self.upstream.request_json(
                    "POST", "/chat/completions", prepared.upstream
                )
                echoed = None
            else:
                raw = await self.upstream.request_json("POST", send.path.route, send.body)
                echoed = send.path.echoed(raw)
                reply = send.path.to_chat(raw, prepared.upstream, self.parsers)
        except UpstreamError as exc:
            return self._upstream_failed(session, node_id, exc)
        reply = normalise_reply(reply)
        if send is not None and echoed != send.ids:
            # The engine rendered the messages itself: the turn is what it saw, not a splice.
            token_in = {"token_in_mode": "fallback:engine_ignored_token_in"}
            prepared.findings.append(
                warn(
                    "token_in_ignored",
                    f"the engine did not use the token prompt it was sent on {send.path.name} "
                    "(the prompt ids it echoed differ): this call was rendered",
                    node_id,
                )
            )
        elif token_in is not None and token_in["token_in_mode"].startswith("fallback:"):
            prepared.findings.append(info("token_in_fallback", token_in.pop("detail"), node_id))
        for note in notes or []:
            prepared.findings.append(info("dialect_note", f"{dialect}: {note}", node_id))
        ingested = ingest_chat_reply(
            node_id,
            reply,
            capture_level=session.capture_level,
            request_messages=body["messages"],
            requested_params=prepared.requested,
            applied_params=prepared.applied,
            auxiliary=auxiliary,
            request_findings=prepared.findings,
            token_in=token_in,
            dialect=dialect,
        )
        if ingested.turn is None:
            for finding in ingested.findings:
                session.record(finding.model_copy(update={"node_id": node_id}), error=True)
            msg = "; ".join(f.message for f in ingested.findings) or "unusable upstream reply"
            return _Failure(502, msg, "upstream_error")
        session.graph.add(ingested.turn)
        _remember_tool_arguments(session, reply)
        if self.config.token_in != "off":
            _remember_call(session, body, ingested.turn)
        return chat.caller_reply(reply, prepared), prepared

    async def _fit_max_tokens(
        self, prepared: chat.Prepared, model: str, node_id: str
    ) -> Finding | None:
        """Clamp an output cap that cannot fit the context to the room the prompt leaves.

        Agents ask for what their own vendor's models allow (claude-code: 32k-64k tokens); an
        engine with a smaller context answers 400 and the agent stops. When the cap and an upper
        bound of the prompt's length could overflow the served model's ``max_model_len``, the
        prompt is measured (``/tokenize``) and the cap lowered to what is left, with a note on
        the turn. Unknowable (no context length, no ``/tokenize``) or no room at all: the call
        goes as asked, and the engine's error reaches the caller."""
        up = prepared.upstream
        key = "max_completion_tokens" if "max_completion_tokens" in up else "max_tokens"
        wanted = up.get(key)
        if not isinstance(wanted, int) or isinstance(wanted, bool) or wanted < 1:
            return None
        ctx = await self.max_model_len()
        if ctx is None or wanted + chat.prompt_upper_bound(up) <= ctx:
            return None
        measure = {k: up[k] for k in ("messages", "tools", "chat_template_kwargs") if up.get(k)}
        try:
            n_prompt = len(
                await self.upstream.tokenize(
                    {"model": model, **measure, "add_generation_prompt": True}
                )
            )
        except UpstreamError:
            return None
        room = ctx - n_prompt
        if wanted <= room or room < 1:
            return None
        up[key] = room
        prepared.applied[key] = room
        return info(
            "max_tokens_clamped",
            f"{key}={wanted} cannot fit: the served model's context is {ctx} tokens and the "
            f"prompt takes {n_prompt}; sent {key}={room}",
            node_id,
        )

    async def _token_in(
        self,
        session: CaptureSession,
        body: dict[str, Any],
        prepared: chat.Prepared,
        model: str,
    ) -> tuple[dict[str, Any] | None, _TokenSend | None]:
        """Splice the call onto its parent when it continues one, and build the request that
        gives the engine the token prompt by the certified path (``token_paths``). Returns the
        turn's token-in record and what to send (None: render as usual)."""
        path = self.token_path
        if path is None or session.capture_level is not CaptureLevel.TOKENS:
            return None, None
        try:
            parent = plan_call(body, session.calls, reasoning=self.config.reasoning_policy)
            if parent is None:
                return {"token_in_mode": "rendered"}, None
            refused = path.refuses(prepared.upstream)
            if refused is not None:
                raise Fallback(refused, f"the {path.name} path cannot carry this call")
            close_id = parent.memory.close_id or session.close_id or self.config.close_token_id
            if close_id is None:
                raise Fallback("no_turn_close", "no call of this session ended by itself yet")
            common = {
                "model": model,
                "tools": body.get("tools") or None,
                "chat_template_kwargs": body.get("chat_template_kwargs"),
            }
            common = {k: v for k, v in common.items() if v is not None}
            messages = body["messages"]
            full, history = await self._tokenize_both(
                {**common, "messages": messages, "add_generation_prompt": True},
                {
                    **common,
                    "messages": messages[: parent.index + 1],
                    "add_generation_prompt": False,
                },
            )
            out = splice(parent.memory, full, history, close_id=close_id)
            ctx = await self.max_model_len() if path.needs_context else None
            send = _TokenSend(
                path, out.prompt_ids, path.request(prepared.upstream, out.prompt_ids, ctx)
            )
        except Fallback as fb:
            return {"token_in_mode": f"fallback:{fb.reason}", "detail": str(fb)}, None
        except UpstreamError as exc:
            detail = f"tokenize_failed: {exc.message}"
            return {"token_in_mode": "fallback:tokenize_failed", "detail": detail}, None
        return {
            "token_in_mode": "spliced",
            "token_in_path": path.name,
            "parent_call_id": parent.memory.node_id,
            "carried_len": out.carried_len,
            "synthesized": out.synthesized,
            "drift": out.drift,
        }, send

    async def _tokenize_both(
        self, full: dict[str, Any], history: dict[str, Any]
    ) -> tuple[list[int], list[int]]:
        """The two renders a splice needs, requested concurrently (they are independent)."""
        out: dict[str, list[int]] = {}
        failed: list[UpstreamError] = []

        async def one(key: str, body: dict[str, Any]) -> None:
            try:
                out[key] = await self.upstream.tokenize(body)
            except UpstreamError as exc:
                failed.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, "full", full)
            tg.start_soon(one, "history", history)
        if failed:
            raise failed[0]
        return out["full"], out["history"]

    async def dialect_call(self, dialect: Dialect, kind: str, request: Request) -> Response:
        """A route of another wire dialect: the same capture path, the caller's own shapes."""

        def fail(status: int, message: str, param: str | None = None) -> Response:
            return json_response(dialect.error(status, message, param), status)

        stream_hint: bool | None = None
        if dialect.action is not None:
            found = dialect.action(request.path_params)
            if found is None:
                return fail(404, f"no such route: {request.method} {request.url.path}")
            kind, stream_hint = found
        headers = {k.lower(): v for k, v in request.headers.items()}
        session = self.sessions.get(dialect.session_key(headers, dict(request.query_params)))
        if session is None:
            return fail(401, f"unknown or missing capture session key ({dialect.name} dialect)")
        if kind == "models":
            try:
                return json_response(dialect.models([await self.resolve_model()]))
            except (chat.RequestError, UpstreamError) as exc:
                return fail(502, getattr(exc, "message", str(exc)))
        body = await self._json_body(request)
        if isinstance(body, _Failure):
            return fail(body.status, body.message)
        if not isinstance(body, dict):
            return fail(400, f"request body must be a JSON object, got {type(body).__name__}")
        if kind == "count":  # answered, never recorded as a turn
            return json_response(dialect.count_tokens(body))
        try:
            translated = dialect.translate(body, stream_hint)
            _restore_tool_arguments(session, translated.chat)
            chat_body = chat.validate_request({**translated.chat, "stream": False})
        except DialectError as exc:
            return fail(exc.status, exc.message, exc.param)
        except chat.RequestError as exc:
            return fail(exc.status, exc.message, exc.param)
        notes = translated.context.get("notes")
        outcome = await self._capture_turn(
            session,
            chat_body,
            _is_aux(request),
            dialect=dialect.name,
            notes=[str(n) for n in notes] if isinstance(notes, list) else None,
        )
        if isinstance(outcome, _Failure):
            return fail(outcome.status, outcome.message, outcome.param)
        out, _ = outcome
        reply = dialect.reply(out, translated)
        if translated.stream:
            return StreamingResponse(dialect.sse(reply, translated), media_type="text/event-stream")
        return json_response(reply)

    def _upstream_failed(
        self, session: CaptureSession, node_id: str, exc: UpstreamError
    ) -> _Failure:
        session.record(warn(f"upstream_{exc.kind}", exc.message, node_id), error=True)
        log.warning("session %s call %s: %s", session.session_id, node_id, exc.message)
        if exc.kind == "http" and exc.status is not None:
            err = exc.body.get("error") if isinstance(exc.body, dict) else None
            if isinstance(err, dict) and "message" in err:
                return _Failure(exc.status, str(err["message"]), "upstream_error", passthrough=err)
            return _Failure(exc.status, exc.message, "upstream_error", code=exc.status)
        status = 504 if exc.kind == "timeout" else 502
        return _Failure(status, exc.message, "upstream_error", code=exc.kind)

    # ---- control plane ----------------------------------------------------------------------

    def _admin_or_401(self, request: Request) -> Response | None:
        given = _bearer(request) or ""
        if secrets.compare_digest(given.encode(), self.admin_key.encode()):
            return None
        return _error(
            401,
            "control routes need 'Authorization: Bearer <admin key>'",
            type_="authentication_error",
        )

    def _lookup(self, request: Request) -> CaptureSession | Response:
        denied = self._admin_or_401(request)
        if denied is not None:
            return denied
        session_id = request.path_params["session_id"]
        session = self.sessions.get(session_id)
        if session is None:
            return _error(
                404, f"no live session {session_id!r}", type_="not_found_error", param="session_id"
            )
        return session

    async def health(self, _request: Request) -> Response:
        """Liveness, plus an instance id so a launcher can verify it owns the port it bound."""
        return json_response(
            {
                "status": "ok",
                "instance_id": self.instance_id,
                "capture_level": self.config.capture_level.value,
                "sessions": len(self.sessions.all()),
            }
        )

    async def open_session(self, request: Request) -> Response:
        """``POST /sessions`` (optional body: metadata, max_model_calls) -> session id."""
        denied = self._admin_or_401(request)
        if denied is not None:
            return denied
        try:
            raw = await _read_body(request, 1024 * 1024)
        except _TooLarge:
            return _error(413, "session body is larger than 1 MiB", type_="invalid_request_error")
        options: Any = {}
        if raw.strip():
            try:
                options = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                return _error(400, f"body is not valid JSON: {exc}", type_="invalid_request_error")
        if not isinstance(options, dict):
            return _error(400, "body must be a JSON object", type_="invalid_request_error")
        unknown = sorted(set(options) - {"metadata", "max_model_calls"})
        if unknown:
            return _error(
                400,
                f"unknown field(s) {unknown}; accepted: metadata, max_model_calls",
                type_="invalid_request_error",
                param=unknown[0],
            )
        metadata = options.get("metadata") or {}
        if not isinstance(metadata, dict):
            return _error(
                400, "'metadata' must be an object", type_="invalid_request_error", param="metadata"
            )
        cap = options.get("max_model_calls")
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            return _error(
                400,
                f"'max_model_calls' must be a positive integer, got {cap!r}",
                type_="invalid_request_error",
                param="max_model_calls",
            )
        session = self.sessions.open(metadata=metadata, max_model_calls=cap)
        return json_response(
            {
                "session_id": session.session_id,
                "capture_level": session.capture_level.value,
                "created_at": session.created_at,
            }
        )

    async def list_sessions(self, request: Request) -> Response:
        """``GET /sessions``: live sessions with turn and root counts."""
        denied = self._admin_or_401(request)
        if denied is not None:
            return denied
        return json_response({"sessions": [s.summary() for s in self.sessions.all()]})

    async def get_session(self, request: Request) -> Response:
        """``GET /sessions/{id}``: one session's summary and its session-level findings."""
        session = self._lookup(request)
        if isinstance(session, Response):
            return session
        data = session.summary()
        data["findings"] = [f.model_dump(mode="json") for f in session.findings]
        return json_response(data)

    async def get_rollout(self, request: Request) -> Response:
        """``GET /sessions/{id}/rollout``: the versioned rollout document."""
        session = self._lookup(request)
        if isinstance(session, Response):
            return session
        # An 800-turn export takes seconds: keep the event loop (every other session) serving.
        body = await anyio.to_thread.run_sync(
            lambda: orjson.dumps(session.document().model_dump(mode="json"))
        )
        return Response(body, media_type="application/json")

    async def close_session(self, request: Request) -> Response:
        """``DELETE /sessions/{id}``: forget the session (its key stops working at once)."""
        session = self._lookup(request)
        if isinstance(session, Response):
            return session
        self.sessions.close(session.session_id)
        return json_response({"session_id": session.session_id, "deleted": True})


def create_proxy_app(config: ProxyConfig, **kwargs: Any) -> Starlette:
    """The proxy as an ASGI app; the :class:`CaptureProxy` is at ``app.state.proxy``."""
    return CaptureProxy(config, **kwargs).app
