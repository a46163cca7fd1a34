"""What a wire dialect is: a small table of data plus pure translation functions.

The capture proxy speaks chat-completions to the engine. A dialect module (``responses``,
``anthropic``, ``google``) lets a caller speak its own API instead: the proxy reads the
session key the dialect's way, translates the request to a chat-completions body, sends it
through the same capture path as any chat call (the turn is recorded like any other), and
replays the reply in the caller's dialect, as SSE when the caller streams.

Each dialect module defines ``DIALECT = Dialect(...)``; :data:`rollwire.capture.dialects.
DIALECTS` lists them. Adding a dialect is one module and one line there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any


class DialectError(ValueError):
    """A request the dialect cannot translate; ``param`` names the field when there is one."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status


@dataclass
class Translated:
    """A dialect request as a chat-completions request, and what the reply needs.

    ``chat`` is a chat-completions body (``messages``, ``tools``, ``tool_choice``,
    ``max_tokens``, ``temperature``, ...; never ``stream``: the proxy always asks the engine for
    a whole reply and the dialect replays it). ``stream`` says whether the caller streams.
    ``context`` is whatever :attr:`Dialect.reply` and :attr:`Dialect.sse` need from the request
    (the model name the caller asked for, declared tools, a tool-name mapping, ...).
    """

    chat: dict[str, Any]
    stream: bool = False
    context: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RouteSpec:
    """One HTTP route of a dialect: ``kind`` is ``turn`` (a model call, recorded), ``count``
    (token counting, answered, never recorded) or ``models`` (model listing)."""

    method: str
    path: str  # a Starlette path; Google's ``{model}:{action}`` uses one ``{rest:path}``
    kind: str


@dataclass(frozen=True)
class Dialect:
    """A wire dialect.

    - ``routes``: where it is served.
    - ``session_key(headers, query)``: the caller's key, read the dialect's way (headers are
      lower-cased).
    - ``action(path_params)``: for routes that carry the action in the path (Google's
      ``models/{model}:streamGenerateContent``): ``(kind, stream)`` or None when the path is
      not one of its actions. Matching is case-insensitive.
    - ``translate(body, stream_hint)``: the request as chat-completions (raises DialectError).
      ``stream_hint`` is the stream flag from the path (Google), else None.
    - ``reply(chat_reply, translated)``: a whole chat-completions reply (``choices[0].message``
      with ``content``, ``tool_calls``, ``reasoning_content``; ``finish_reason``; ``usage``) as
      the dialect's reply object.
    - ``sse(dialect_reply, translated)``: that reply as the dialect's SSE event stream (bytes).
    - ``count_tokens(body)``: the dialect's token-count reply, estimated from every field the
      dialect uses.
    - ``models(served)``: the dialect's model listing.
    - ``error(status, message, param)``: the dialect's error body.
    - ``sampling_fields``: the request fields that are sampling parameters (documentation and
      tests: each must be translated or refused, never dropped silently).
    """

    name: str
    routes: tuple[RouteSpec, ...]
    session_key: Callable[[Mapping[str, str], Mapping[str, str]], str | None]
    translate: Callable[[dict[str, Any], bool | None], Translated]
    reply: Callable[[dict[str, Any], Translated], dict[str, Any]]
    sse: Callable[[dict[str, Any], Translated], Iterator[bytes]]
    count_tokens: Callable[[dict[str, Any]], dict[str, Any]]
    models: Callable[[list[str]], dict[str, Any]]
    error: Callable[[int, str, str | None], dict[str, Any]]
    action: Callable[[Mapping[str, str]], tuple[str, bool] | None] | None = None
    sampling_fields: tuple[str, ...] = ()


def bearer(headers: Mapping[str, str]) -> str | None:
    """The token of ``Authorization: Bearer <token>``, if any."""
    auth = headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def estimate_tokens(value: Any) -> int:
    """A rough token count of any JSON value (about 4 characters per token, at least 1 per
    string): enough for an agent to decide when to compact, never used for training data."""
    if value is None:
        return 0
    if isinstance(value, str):
        return max(1, (len(value) + 3) // 4) if value else 0
    if isinstance(value, bool | int | float):
        return 1
    if isinstance(value, Mapping):
        return sum(estimate_tokens(k) + estimate_tokens(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return sum(estimate_tokens(v) for v in value)
    return estimate_tokens(str(value))
