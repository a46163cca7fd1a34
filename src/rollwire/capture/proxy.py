"""The capture proxy: an OpenAI-spec front door that records every model call of a session.

Data plane: ``/v1/chat/completions`` and ``/v1/models``; the caller's API key is its capture
session id, and an unknown key is refused before anything is forwarded (no open relay).
Control plane: ``/sessions`` (open, list, read, export, close), always behind an admin key:
``ProxyConfig.admin_key``, or one generated when none is given (``CaptureProxy.admin_key``).
"""

from __future__ import annotations

import contextlib
import email.utils
import functools
import logging
import re
import secrets
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import parse_qsl

import anyio
import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from rollwire.capture.certify import Certification
from rollwire.capture.dialects import chat, load_dialects
from rollwire.capture.dialects.base import Dialect, DialectError
from rollwire.capture.findings import Finding, info, warn
from rollwire.capture.ingest import ingest_chat_reply
from rollwire.capture.rollout import CaptureLevel, Turn
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
# The deepest JSON nesting a request body may have. orjson reads 1024 levels but writes only 254,
# and a request is written again (to the engine, into session listings and rollout documents)
# inside a few levels of its own: deeper bodies are refused at the door, with room to spare.
MAX_JSON_DEPTH = 128
AUX_HEADER = "x-rollwire-role"

BadDataPolicy = Literal["error", "mask"]
BAD_DATA_POLICIES: tuple[BadDataPolicy, ...] = ("error", "mask")


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
    # A reply whose capture data is wrong (ids and logprobs that disagree, no ids, a logprob
    # that is not a log-probability, another model's sample) on a tokens-tier session: refuse
    # it with a 502 in the caller's dialect, nothing recorded as a turn (error), or pass it on
    # and record the turn masked, never a loss target (mask). See BAD_DATA.
    on_bad_data: BadDataPolicy = "error"
    # The engine reports the version of the weights it serves (GET /weight_info), as
    # certification found: read around every call. Else the version a trainer announced.
    weight_info: bool = False


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
        weight_info=cert.weight_info,
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


def _nests_too_deep(value: Any) -> bool:
    """Whether a parsed JSON value nests more than MAX_JSON_DEPTH levels. orjson itself tells
    (at C speed, no Python walk over a large body): wrapped in as many more levels as it can
    write beyond MAX_JSON_DEPTH, the value must still serialise."""
    for _ in range(254 - MAX_JSON_DEPTH):
        value = [value]
    try:
        orjson.dumps(value)
    except orjson.JSONEncodeError:
        return True
    return False


def _deep_field(value: Any) -> str:
    """The field under which a too-deep value nests too deep (its first three steps), for the
    error message; walked only once the value is known to be too deep."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if len(path) >= MAX_JSON_DEPTH:
            break
        if isinstance(item, dict):
            stack.extend((v, (*path, k)) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, (*path, i)) for i, v in enumerate(item))
    else:
        return "body"
    text = "".join(
        f"[{s}]" if isinstance(s, int) else f".{s}" if s.isidentifier() else f"[{s!r}]"
        for s in path[:3]
    )
    return text.lstrip(".")


@dataclass
class _Failure:
    """A call that ends in an error, before it is shaped for the caller's dialect."""

    status: int
    message: str
    type_: str
    param: str | None = None
    code: Any = None
    passthrough: dict[str, Any] | None = None  # the engine's own OpenAI-shaped error
    headers: dict[str, str] | None = None  # e.g. the engine's Retry-After, passed on

    def chat_response(self) -> Response:
        if self.passthrough is not None:
            response = json_response({"error": self.passthrough}, self.status)
        else:
            response = _error(
                self.status, self.message, type_=self.type_, param=self.param, code=self.code
            )
        response.headers.update(self.headers or {})
        return response


def _valid_retry_after(value: str | None) -> bool:
    """A ``Retry-After`` worth passing on: delay-seconds or an HTTP date (RFC 9110 10.2.3)."""
    if not value or len(value) > 64:
        return False
    value = value.strip()
    if value.isdigit():
        return True
    with contextlib.suppress(TypeError, ValueError, IndexError):
        return email.utils.parsedate_to_datetime(value) is not None
    return False


def _malformed_reply(reply: Any) -> str | None:
    """What makes a parsed 200 unusable as a chat completion (None when nothing does): the types
    ingest and every dialect's reply rely on. A reply that is not an object or has no choices is
    left to ingest (which says so); a message that is not an object, content that is not text,
    a tool call that is not an object with a function name and a string of arguments is refused
    here, before it can become a turn or crash a dialect's rendering."""
    choices = reply.get("choices") if isinstance(reply, dict) else None
    if not isinstance(choices, list):
        return None
    for i, choice in enumerate(choices):
        where = f"choices[{i}]"
        if not isinstance(choice, dict):
            return f"{where} is {_type_name(choice)}, not an object"
        message = choice.get("message")
        if message is None:
            continue
        if not isinstance(message, dict):
            return f"{where}.message is {_type_name(message)}, not an object"
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            return f"{where}.message.content is {_type_name(content)}, not text"
        for key in ("reasoning_content", "reasoning", "refusal"):
            value = message.get(key)
            if value is not None and not isinstance(value, str):
                return f"{where}.message.{key} is {_type_name(value)}, not text"
        calls = message.get("tool_calls")
        if calls is None:
            continue
        if not isinstance(calls, list):
            return f"{where}.message.tool_calls is {_type_name(calls)}, not a list"
        for j, call in enumerate(calls):
            at = f"{where}.message.tool_calls[{j}]"
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict):
                return f"{at} has no function object"
            if not isinstance(fn.get("name"), str) or not fn["name"]:
                return f"{at}.function.name is {_type_name(fn.get('name'))}, not a name"
            if not isinstance(fn.get("arguments", ""), str):
                return f"{at}.function.arguments is {_type_name(fn['arguments'])}, not a string"
    return None


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


# "gpt-4o" answers as "gpt-4o-2024-08-06", "claude-sonnet-4" as "claude-sonnet-4-20250514".
_DATE_SUFFIX = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8}|\d{4})")


def _check_reply_model(turn: Turn, model: str, reply: dict[str, Any]) -> None:
    """A reply that names another model than the one the call was sent to (a router or load
    balancer that sent it elsewhere, a stale policy version) was sampled by another policy: its
    logprobs are not the served model's. The turn keeps its ids as context and is masked (never
    a loss target), with a WARN naming both models (at the tokens tier the call is then refused,
    unless ``on_bad_data="mask"``). A dated alias of the same name matches."""
    answered = reply.get("model")
    if not isinstance(answered, str) or answered == model:
        return
    suffix = answered.removeprefix(model)
    if suffix != answered and _DATE_SUFFIX.fullmatch(suffix):
        return
    turn.sampled_logprobs = None
    turn.certain = None
    turn.findings.append(
        warn(
            "model_mismatch",
            f"the call was sent to model {model!r} but the reply names {answered!r}: another "
            "policy's sample; turn masked (ids kept as context)",
            turn.node_id,
        )
    )


# Findings that say a turn's sampled ids may not be what the engine sampled (or not by this
# model): a later call is not spliced onto such a turn (token-in renders it instead).
_SUSPECT_IDS = frozenset({"logprob_length_mismatch", "logprob_id_mismatch", "model_mismatch"})


def _ids_suspect(turn: Turn) -> bool:
    return any(f.code in _SUSPECT_IDS for f in turn.findings)


#: Findings that say an engine's reply is unusable for training at the tokens tier: its ids and
#: logprobs disagree or are missing, a logprob is not a log-probability, or another model
#: sampled it. ``ProxyConfig.on_bad_data`` says whether such a reply is refused (a 502) or
#: passed on with its turn masked.
BAD_DATA = frozenset(
    {
        "missing_token_ids",
        "missing_logprobs",
        "logprobs_malformed",
        "logprob_length_mismatch",
        "null_logprob_entry",
        "logprob_tokens_not_ids",
        "logprob_id_unparsable",
        "logprob_id_mismatch",
        "logprob_invalid",
        "model_mismatch",
    }
)
# What ingest says it did about a bad reply ("turn masked", ...): not what happens when the
# reply is refused instead.
_MASKED_CLAUSE = re.compile(
    r"[:;] (turn masked|turn's logprobs dropped|this turn cannot be trained)[^:;]*$"
)


def _bad_data_failure(session: CaptureSession, turn: Turn) -> _Failure | None:
    """The refusal of a tokens-tier reply whose capture data is wrong (None when it is not):
    recorded on the session as an error, one finding per fault, and shaped for the caller as
    a 502 naming them."""
    bad = [f for f in turn.findings if f.code in BAD_DATA]
    if not bad:
        return None
    faults = "; ".join(f"{f.code}: {_MASKED_CLAUSE.sub('', f.message)}" for f in bad)
    message = f"upstream reply unusable for training: {faults}"
    for i, finding in enumerate(bad):
        detail = _MASKED_CLAUSE.sub("", finding.message)
        session.record(
            warn(finding.code, f"{detail}; refused with a 502, no turn recorded", turn.node_id),
            error=i == 0,
        )
    log.warning(
        "session %s call %s: %s (refused; --on-bad-data mask passes such replies on, masked)",
        session.session_id,
        turn.node_id,
        message,
    )
    return _Failure(502, message, "upstream_error", code=bad[0].code)


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


def _speaker(request: Request) -> str | None:
    """The dialect a request speaks when its route does not say (a shared or unknown route):
    Google's and Anthropic's path prefixes, else their key headers; None for OpenAI's."""
    path, headers = request.scope["path"], request.headers
    path = path.removeprefix(request.scope.get("root_path", ""))  # mounted: e.g. /capture
    if path.startswith(("/v1beta/", "/v1/models/")):
        return "google"
    if path.startswith("/v1/messages"):
        return "anthropic"
    if "x-goog-api-key" in headers or "key" in request.query_params:
        return "google"
    if "anthropic-version" in headers:
        return "anthropic"
    return None


def _route_error(request: Request, exc: HTTPException) -> Response:
    """A routing refusal (no such route: 404; a route without this method: 405) as a JSON error
    in the caller's dialect, instead of Starlette's plain text an SDK cannot read."""
    status, path = exc.status_code, request.url.path
    if status == 404:
        message = f"no such route: {request.method} {path}"
    elif status == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        message = f"method {request.method} is not allowed on {path} (allowed: {allowed})"
    else:
        message = str(exc.detail)
    dialect = next((d for d in load_dialects() if d.name == _speaker(request)), None)
    if dialect is not None:
        response = json_response(dialect.error(status, message, None), status)
    else:
        type_ = "not_found_error" if status == 404 else "invalid_request_error"
        response = _error(status, message, type_=type_)
    response.headers.update(exc.headers or {})
    return response


_ROUTE_ERRORS = {HTTPException: _route_error}


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
        if config.on_bad_data not in BAD_DATA_POLICIES:
            raise ValueError(
                f"unknown on_bad_data {config.on_bad_data!r}; known: {', '.join(BAD_DATA_POLICIES)}"
            )
        if name not in PATHS:
            raise ValueError(f"unknown token_in_path {name!r}; known: {sorted(PATHS)}")
        self.token_path: TokenPath | None = PATHS[name] if config.token_in != "off" else None
        self.instance_id = secrets.token_hex(8)
        # The weight version a trainer announced (POST /weight_version): what calls record
        # when the engine does not report its own.
        self.announced_version: str | None = None
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
                Route("/weight_version", self.weight_version_route, methods=["GET", "POST"]),
            ],
            exception_handlers=_ROUTE_ERRORS,
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
        app = Starlette(routes=list(self.data_routes), exception_handlers=_ROUTE_ERRORS)
        return _SessionPin(app, session_id)

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
        dialect = next((d for d in load_dialects() if d.name == _speaker(request)), None)
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
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return _Failure(400, f"request body is not valid JSON: {exc}", "invalid_request_error")
        if _nests_too_deep(body):
            where = _deep_field(body)
            return _Failure(
                400,
                f"request body nests JSON deeper than {MAX_JSON_DEPTH} levels (under {where})",
                "invalid_request_error",
                param=where,
            )
        return body

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
        before = await self.read_weight_version()
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
        after = await self.read_weight_version()
        reply = normalise_reply(reply)
        malformed = _malformed_reply(reply)
        if malformed is not None:
            msg = f"upstream answered 200 with a malformed chat completion: {malformed}"
            return self._upstream_failed(session, node_id, UpstreamError("malformed_reply", msg))
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
        _check_reply_model(ingested.turn, model, reply)
        if self.config.on_bad_data == "error" and session.capture_level is CaptureLevel.TOKENS:
            refused = _bad_data_failure(session, ingested.turn)
            if refused is not None:
                return refused
        _stamp_weight_version(ingested.turn, before, after)
        session.graph.add(ingested.turn)
        _remember_tool_arguments(session, reply)
        if self.config.token_in != "off" and not _ids_suspect(ingested.turn):
            _remember_call(session, body, ingested.turn)
        return chat.caller_reply(reply, prepared), prepared

    async def read_weight_version(self) -> tuple[str | None, str | None]:
        """The version of the weights the engine serves now, and why it is unknown if it is:
        the engine's own (``GET /weight_info``) when certification found it reports one, else
        the one a trainer announced."""
        if not self.config.weight_info:
            return self.announced_version, None
        try:
            data = await self.upstream.request_json("GET", self.upstream.root_url + "/weight_info")
        except UpstreamError as exc:
            return None, f"GET /weight_info failed: {exc.message}"
        version = data.get("weight_version") if isinstance(data, dict) else None
        if not isinstance(version, str):
            return None, f"GET /weight_info answered without a weight_version: {data!r:.200}"
        return version, None

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
            return fail(body.status, body.message, body.param)
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
            response = fail(outcome.status, outcome.message, outcome.param)
            response.headers.update(outcome.headers or {})
            return response
        out, _ = outcome
        reply = dialect.reply(out, translated)
        if translated.stream:
            return StreamingResponse(dialect.sse(reply, translated), media_type="text/event-stream")
        return json_response(reply)

    def _upstream_failed(
        self, session: CaptureSession, node_id: str, exc: UpstreamError
    ) -> _Failure:
        """Record a failed upstream call on the session and shape it for the caller.

        An engine's error status reaches the caller as that status, so the agent's own retry
        policy sees what it would see from the engine (a 429 is retried, a 400 is not), with a
        message that names the upstream as its source (never mistaken for a fault of rollwire's
        own), the engine's own OpenAI error object on the chat route, and its ``Retry-After``
        passed on as is: the proxy never waits on the caller's behalf. Any other failure is a
        502 (no usable reply), or a 504 when the engine did not answer within ``timeout_s``.
        """
        session.record(warn(f"upstream_{exc.kind}", exc.message, node_id), error=True)
        log.warning("session %s call %s: %s", session.session_id, node_id, exc.message)
        if exc.kind == "http" and exc.status is not None:
            headers = (
                {"retry-after": exc.retry_after} if _valid_retry_after(exc.retry_after) else None
            )
            err = exc.body.get("error") if isinstance(exc.body, dict) else None
            if isinstance(err, dict) and "message" in err:
                message = f"upstream answered {exc.status}: {err['message']}"
                return _Failure(
                    exc.status,
                    message,
                    "upstream_error",
                    param=err.get("param") if isinstance(err.get("param"), str) else None,
                    passthrough={**err, "message": message},
                    headers=headers,
                )
            return _Failure(
                exc.status, exc.message, "upstream_error", code=exc.status, headers=headers
            )
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
        if _nests_too_deep(metadata):
            return _error(
                400,
                f"'metadata' nests JSON deeper than {MAX_JSON_DEPTH} levels",
                type_="invalid_request_error",
                param="metadata",
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

    async def weight_version_route(self, request: Request) -> Response:
        """``POST /weight_version`` ``{"weight_version": "..."}``: the trainer announces the
        version of the weights the engine now serves (what calls record when the engine does
        not report its own); ``GET`` reads it back. Both need the admin key."""
        denied = self._admin_or_401(request)
        if denied is not None:
            return denied
        if request.method == "POST":
            try:
                body = orjson.loads(await _read_body(request, 64 * 1024) or b"null")
            except (_TooLarge, orjson.JSONDecodeError) as exc:
                return _error(
                    400, f"body is not a small JSON object: {exc}", type_="invalid_request_error"
                )
            version = body.get("weight_version") if isinstance(body, dict) else None
            if not isinstance(version, str) or not version or set(body) != {"weight_version"}:
                return _error(
                    400,
                    'send {"weight_version": "<non-empty string>"} and nothing else',
                    type_="invalid_request_error",
                    param="weight_version",
                )
            self.announced_version = version
        return json_response(
            {
                "weight_version": self.announced_version,
                "engine_reports_version": self.config.weight_info,
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


def _stamp_weight_version(
    turn: Turn, before: tuple[str | None, str | None], after: tuple[str | None, str | None]
) -> None:
    """Record the weight version that sampled a turn from the reads before and after its call.
    A version that changed during the call masks the turn (its tokens may come from two
    policies); a read that failed leaves it unknown. Both say so in a finding."""
    (v0, err0), (v1, err1) = before, after
    if err0 or err1:
        turn.findings.append(
            warn("weight_version_unread", f"weight version unknown: {err0 or err1}", turn.node_id)
        )
        return
    if v0 != v1:
        turn.sampled_logprobs = None
        turn.findings.append(
            warn(
                "weight_version_changed",
                f"the engine's weights changed from {v0!r} to {v1!r} during this call: its "
                "tokens may come from two policies, so it is masked (kept as context)",
                turn.node_id,
            )
        )
        return
    turn.weight_version = v0


def create_proxy_app(config: ProxyConfig, **kwargs: Any) -> Starlette:
    """The proxy as an ASGI app; the :class:`CaptureProxy` is at ``app.state.proxy``."""
    return CaptureProxy(config, **kwargs).app
