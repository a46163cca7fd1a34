"""The Anthropic Messages dialect: ``POST /v1/messages`` and ``/v1/messages/count_tokens``.

A caller that speaks Anthropic's API (claude-code with ``ANTHROPIC_BASE_URL`` and
``ANTHROPIC_API_KEY``, the ``anthropic`` SDK) is translated to chat-completions, captured like any
chat call, and answered with an Anthropic ``Message`` (or its SSE event stream). Pure functions.

Request (Anthropic -> chat-completions)

=====================================  =========================================================
``system`` string / blocks             a first ``system`` message; a string stays a string,
                                       blocks become content parts (text, and image parts if
                                       any: nothing is merged away); empty -> no message
``messages[].content`` string          the same string
user ``text`` / ``image`` blocks       ``text`` / ``image_url`` parts of one user message
                                       (base64 -> ``data:`` URL, url -> url)
user ``tool_result``                   a ``tool`` message (``tool_call_id``; content string or
                                       text/image parts; ``is_error: true`` kept on the
                                       message), all of a message's results first, in order,
                                       then the rest of that message as a user message
assistant ``text``                     ``content`` (one block -> its string; several -> parts)
assistant ``tool_use``                 ``tool_calls[]`` ``{id, function: {name, arguments:
                                       json.dumps(input, ensure_ascii=False)}}`` (the proxy then
                                       restores the exact sampled string by id); an input that
                                       is ``{"_rollwire_raw_arguments": text}`` gives back ``text``
assistant ``thinking``                 ``reasoning_content`` (or ``reasoning`` when the block's
                                       signature says the engine used that key); several are
                                       joined with a blank line
``tools`` (custom)                     ``{"type": "function", "function": {name, description,
                                       parameters: input_schema, strict}}``
``tool_choice`` auto / any / tool /    ``"auto"`` / ``"required"`` / ``{"type": "function",
none                                   "function": {"name"}}`` / ``"none"``;
                                       ``disable_parallel_tool_use`` -> ``parallel_tool_calls``
``max_tokens`` (required)              ``max_tokens``
``temperature``, ``top_p``, ``top_k``  the same names (the proxy records and, at the tokens
                                       tier, neutralises the distribution knobs)
``stop_sequences``                     ``stop``
``output_config.format`` json_schema   ``response_format`` ``json_schema`` (``effort`` ignored)
``stream``                             how the reply is sent back (upstream never streams)
``metadata``, ``thinking``,            accepted; they do not change what an open model is
``service_tier``, ``cache_control``,   asked (no chat-completions equivalent)
``context_management``, ...
=====================================  =========================================================

Refused with a DialectError that names the field: Anthropic-defined and server tools (``bash_*``,
``text_editor_*``, ``web_search_*``, ``code_execution_*``, ``memory_*``, ...: their schemas and
prompts are Anthropic's, so they cannot be declared faithfully to another model; declare them as
custom tools), ``redacted_thinking`` (encrypted: no text another model could read), documents,
search results, Files-API sources, server tool blocks, ``mcp_servers``, ``container``, deferred
tools and tool ``input_examples``, an assistant prefill (a last message from the assistant),
``max_tokens`` < 1, and any top-level field this table does not know.

Not kept: the order of blocks inside one assistant message (chat carries reasoning, then text,
then tool calls: the order this dialect's own replies have) and ``cache_control`` / citation
markers. Consecutive messages of one role stay separate messages (Anthropic would merge them).

Reply (chat-completions -> ``Message``): ``reasoning_content``/``reasoning`` -> a ``thinking``
block (signature ``rollwire:<key>``), text -> a ``text`` block, each tool call -> a ``tool_use``
block with the engine's call id and the arguments parsed as a JSON object. Arguments that are not a
JSON object (invalid JSON, a list, empty) are kept verbatim as
``{"_rollwire_raw_arguments": text}``, and the next request turns that back into exactly the
sampled text, so the token prefix holds.
``finish_reason`` tool_calls (or any tool call) / length / stop / content_filter -> ``tool_use`` /
``max_tokens`` / ``end_turn`` (``stop_sequence`` when the engine's ``stop_reason`` is one of the
requested ``stop_sequences``) / ``refusal``.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator, Mapping
from typing import Any

import orjson

from rollwire.capture.dialects.base import (
    Dialect,
    DialectError,
    RouteSpec,
    Translated,
    bearer,
    estimate_tokens,
)

NAME = "anthropic"

#: A tool_use ``input`` that carries arguments the engine sampled that are not a JSON object.
RAW_ARGUMENTS_KEY = "_rollwire_raw_arguments"
#: Thinking-block signatures this dialect writes: ``rollwire:<chat reasoning key>``.
SIGNATURE_PREFIX = "rollwire:"
#: Rough cost of one image in count_tokens (its base64 text is not what the model reads).
IMAGE_TOKENS = 1600

SAMPLING_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "stop_sequences")
_TRANSLATED_FIELDS = frozenset(
    {
        "model",
        "messages",
        "system",
        "tools",
        "tool_choice",
        "stream",
        "output_config",
        "output_format",
        *SAMPLING_FIELDS,
    }
)
# Accepted and not forwarded: routing, billing, caching and server-side features with no
# chat-completions equivalent that do not change what the model is asked.
_ACCEPTED_FIELDS = frozenset(
    {
        "metadata",
        "thinking",
        "service_tier",
        "cache_control",
        "context_management",
        "diagnostics",
        "inference_geo",
        "speed",
        "user_profile_id",
        "workspace_id",
        "betas",
    }
)
# Accepted only when empty: each one asks for something only Anthropic's servers do.
_EMPTY_ONLY_FIELDS = {
    "container": "a code-execution container runs on Anthropic's servers",
    "mcp_servers": "the MCP connector runs tools on Anthropic's servers; give the tools to the "
    "client instead",
}
_REASONING_KEYS = ("reasoning_content", "reasoning")
_CHUNK = 32  # characters per SSE delta

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


# --------------------------------------------------------------------------- session key


def session_key(headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
    """``x-api-key`` (what ``ANTHROPIC_API_KEY`` sends), else ``Authorization: Bearer``."""
    key = (headers.get("x-api-key") or "").strip()
    return key or bearer(headers)


# --------------------------------------------------------------------------- request


def _fail(where: str, message: str) -> DialectError:
    return DialectError(f"{where}: {message}", param=where)


def _block_type(block: Any, where: str) -> str:
    if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
        raise _fail(where, "a content block must be an object with a string 'type'")
    return block["type"]


def _string(block: Mapping[str, Any], key: str, where: str, *, nonempty: bool = False) -> str:
    value = block.get(key)
    if not isinstance(value, str) or (nonempty and not value):
        kind = "a non-empty string" if nonempty else "a string"
        raise _fail(f"{where}.{key}", f"must be {kind}, got {value!r}")
    return value


def _unsupported(kind: str, where: str) -> DialectError:
    reasons = {
        "redacted_thinking": "it is encrypted, so no text of it can be shown to another model",
        "document": "documents (PDF, text, content sources) have no chat-completions part; send "
        "their text as a text block",
        "search_result": "search results have no chat-completions part; send them as text",
        "server_tool_use": "server tools run on Anthropic's servers",
        "container_upload": "containers run on Anthropic's servers",
        "tool_reference": "tool search runs on Anthropic's servers",
    }
    if kind.endswith("_tool_result"):
        reason = "server tool results come from Anthropic's servers"
    else:
        reason = reasons.get(kind, "it has no chat-completions equivalent")
    return _fail(where, f"content block type {kind!r} is not supported here: {reason}")


def _image_part(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    source = block.get("source")
    if not isinstance(source, Mapping):
        raise _fail(f"{where}.source", "an image needs a 'source' object")
    kind = source.get("type")
    if kind == "base64":
        media = _string(source, "media_type", f"{where}.source", nonempty=True)
        data = _string(source, "data", f"{where}.source")
        return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{data}"}}
    if kind == "url":
        url = _string(source, "url", f"{where}.source", nonempty=True)
        return {"type": "image_url", "image_url": {"url": url}}
    raise _fail(
        f"{where}.source",
        f"image source type {kind!r} cannot reach a chat-completions engine; send base64 or url",
    )


def _part(block: Any, where: str) -> dict[str, Any]:
    """A text or image block as a chat content part."""
    kind = _block_type(block, where)
    if kind == "text":
        return {"type": "text", "text": _string(block, "text", where)}
    if kind == "image":
        return _image_part(block, where)
    raise _unsupported(kind, where)


def _parts(content: Any, where: str) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _fail(where, "must be a string or a list of content blocks")
    return [_part(block, f"{where}.{i}") for i, block in enumerate(content)]


def _tool_result(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    content = block.get("content")
    message: dict[str, Any] = {
        "role": "tool",
        "tool_call_id": _string(block, "tool_use_id", where, nonempty=True),
        "content": "" if content is None else _parts(content, f"{where}.content"),
    }
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise _fail(f"{where}.is_error", f"must be a boolean, got {is_error!r}")
    if is_error:
        message["is_error"] = True
    return message


def _user(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    if not isinstance(content, list):
        raise _fail(where, "must be a string or a list of content blocks")
    results: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for i, block in enumerate(content):
        at = f"{where}.{i}"
        if _block_type(block, at) == "tool_result":
            results.append(_tool_result(block, at))
        else:
            parts.append(_part(block, at))
    if parts or not results:
        results.append({"role": "user", "content": parts})
    return results


def _arguments(value: Any) -> str:
    """A tool_use input as the chat ``arguments`` string."""
    if (
        isinstance(value, Mapping)
        and len(value) == 1
        and isinstance(value.get(RAW_ARGUMENTS_KEY), str)
    ):
        return value[RAW_ARGUMENTS_KEY]
    return json.dumps(value, ensure_ascii=False)


def _tool_call(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    if "input" not in block:
        raise _fail(f"{where}.input", "a tool_use block needs its 'input'")
    return {
        "id": _string(block, "id", where, nonempty=True),
        "type": "function",
        "function": {
            "name": _string(block, "name", where, nonempty=True),
            "arguments": _arguments(block["input"]),
        },
    }


def _assistant(content: Any, where: str) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    if not isinstance(content, list):
        raise _fail(where, "must be a string or a list of content blocks")
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    thinking: list[str] = []
    reasoning_key = _REASONING_KEYS[0]
    for i, block in enumerate(content):
        at = f"{where}.{i}"
        kind = _block_type(block, at)
        if kind == "text":
            texts.append(_string(block, "text", at))
        elif kind == "tool_use":
            calls.append(_tool_call(block, at))
        elif kind == "thinking":
            thinking.append(_string(block, "thinking", at))
            signature = block.get("signature")
            if isinstance(signature, str) and signature.startswith(SIGNATURE_PREFIX):
                key = signature.removeprefix(SIGNATURE_PREFIX)
                if key in _REASONING_KEYS:
                    reasoning_key = key
        else:
            raise _unsupported(kind, at)
    message: dict[str, Any] = {"role": "assistant"}
    if len(texts) == 1:
        message["content"] = texts[0]
    elif texts:
        message["content"] = [{"type": "text", "text": t} for t in texts]
    else:
        message["content"] = None if calls else ""
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message[reasoning_key] = "\n\n".join(thinking)
    return message


def _system(system: Any) -> dict[str, Any] | None:
    if system is None or system == "" or system == []:
        return None
    return {"role": "system", "content": _parts(system, "system")}


def _tool(tool: Any, where: str) -> dict[str, Any]:
    if not isinstance(tool, Mapping):
        raise _fail(where, "a tool must be an object")
    kind = tool.get("type")
    if kind not in (None, "custom"):
        raise _fail(
            f"{where}.type",
            f"tool type {kind!r} is an Anthropic-defined tool whose schema and prompt are "
            "Anthropic's own, so it cannot be declared faithfully to another model; declare it "
            "as a custom tool {name, description, input_schema}",
        )
    schema = tool.get("input_schema")
    if not isinstance(schema, Mapping):
        raise _fail(f"{where}.input_schema", "a tool needs an 'input_schema' object")
    function: dict[str, Any] = {"name": _string(tool, "name", where, nonempty=True)}
    description = tool.get("description")
    if description is not None:
        function["description"] = _string(tool, "description", where)
    function["parameters"] = schema
    strict = tool.get("strict")
    if strict is not None:
        if not isinstance(strict, bool):
            raise _fail(f"{where}.strict", f"must be a boolean, got {strict!r}")
        function["strict"] = strict
    if tool.get("defer_loading"):
        raise _fail(f"{where}.defer_loading", "deferred tools need Anthropic's tool search")
    if tool.get("input_examples"):
        raise _fail(
            f"{where}.input_examples",
            "tool input examples have no chat-completions equivalent; put them in the description",
        )
    callers = tool.get("allowed_callers")
    if callers is not None and (
        not isinstance(callers, list) or any(c != "direct" for c in callers)
    ):
        raise _fail(
            f"{where}.allowed_callers",
            f"must be a list of 'direct' (the only caller outside Anthropic), got {callers!r}",
        )
    return {"type": "function", "function": function}


def _tool_choice(choice: Any, tools: list[dict[str, Any]], chat: dict[str, Any]) -> None:
    if choice is None:
        return
    if not isinstance(choice, Mapping):
        raise _fail("tool_choice", "must be an object with a 'type'")
    kind = choice.get("type")
    if kind == "auto":
        value: Any = "auto"
    elif kind == "any":
        value = "required"
    elif kind == "none":
        value = "none"
    elif kind == "tool":
        name = _string(choice, "name", "tool_choice", nonempty=True)
        value = {"type": "function", "function": {"name": name}}
    else:
        raise _fail("tool_choice.type", f"must be auto, any, tool or none, got {kind!r}")
    if not tools:
        if kind in ("any", "tool"):
            raise _fail("tool_choice", f"tool_choice {kind!r} needs 'tools'")
        return  # auto / none with no tools: nothing to choose from
    chat["tool_choice"] = value
    parallel = choice.get("disable_parallel_tool_use")
    if parallel is not None and kind != "none":
        if not isinstance(parallel, bool):
            raise _fail("tool_choice.disable_parallel_tool_use", "must be a boolean")
        chat["parallel_tool_calls"] = not parallel


def _number(body: Mapping[str, Any], key: str) -> Any:
    value = body.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise _fail(key, f"must be a number, got {value!r}")
    return value


def _response_format(body: Mapping[str, Any]) -> dict[str, Any] | None:
    config = body.get("output_config")
    if config is not None and not isinstance(config, Mapping):
        raise _fail("output_config", "must be an object")
    fmt = (config or {}).get("format")
    where = "output_config.format"
    if fmt is None:
        fmt, where = body.get("output_format"), "output_format"
    if fmt is None:
        return None
    if not isinstance(fmt, Mapping) or fmt.get("type") != "json_schema":
        raise _fail(where, "only {'type': 'json_schema', 'schema': {...}} is supported")
    schema = fmt.get("schema")
    if not isinstance(schema, Mapping):
        raise _fail(f"{where}.schema", "must be a JSON schema object")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}


def translate(body: dict[str, Any], stream_hint: bool | None = None) -> Translated:
    """An Anthropic Messages request as a chat-completions request (see the module table)."""
    unknown = sorted(set(body) - _TRANSLATED_FIELDS - _ACCEPTED_FIELDS - set(_EMPTY_ONLY_FIELDS))
    if unknown:
        # The name quoted: an unknown field's name can be anything (empty, spaces, unicode).
        raise DialectError(
            f"field {unknown[0]!r} is not supported by the capture proxy's Anthropic dialect "
            "(neither translated nor known to be safe to ignore)",
            param=unknown[0],
        )
    for key, reason in _EMPTY_ONLY_FIELDS.items():
        if body.get(key):
            raise _fail(key, f"not supported: {reason}")

    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        raise _fail("max_tokens", "field required")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise _fail("max_tokens", f"must be an integer >= 1, got {max_tokens!r}")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _fail("model", f"must be a string, got {model!r}")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _fail("stream", f"must be a boolean, got {stream!r}")

    messages: list[dict[str, Any]] = []
    system = _system(body.get("system"))
    if system is not None:
        messages.append(system)
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise _fail("messages", "must be a non-empty list of messages")
    for i, message in enumerate(raw):
        where = f"messages.{i}"
        if not isinstance(message, Mapping):
            raise _fail(where, "a message must be an object")
        role = message.get("role")
        if "content" not in message:
            raise _fail(f"{where}.content", "field required")
        if role == "user":
            messages += _user(message["content"], f"{where}.content")
        elif role == "assistant":
            if i == len(raw) - 1:
                raise _fail(
                    where,
                    "a last message from the assistant (a prefill) is not supported: the "
                    "reply would not continue it",
                )
            messages.append(_assistant(message["content"], f"{where}.content"))
        elif role == "system":
            # claude-code 2.x sends system reminders as messages of their own: a system
            # message in place, as the chat template renders it.
            message_system = _system(message["content"])
            if message_system is not None:
                messages.append(message_system)
        else:
            raise _fail(f"{where}.role", f"must be 'user', 'assistant' or 'system', got {role!r}")

    chat: dict[str, Any] = {"messages": messages, "max_tokens": max_tokens}
    if model is not None:
        chat["model"] = model
    raw_tools = body.get("tools")
    if raw_tools is not None and not isinstance(raw_tools, list):
        raise _fail("tools", "must be a list of tools")
    tools = [_tool(t, f"tools.{i}") for i, t in enumerate(raw_tools or [])]
    if tools:
        chat["tools"] = tools
    _tool_choice(body.get("tool_choice"), tools, chat)
    for key in ("temperature", "top_p", "top_k"):
        value = _number(body, key)
        if value is not None:
            chat[key] = value
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise _fail("stop_sequences", "must be a list of strings")
        if stops:
            chat["stop"] = list(stops)
    response_format = _response_format(body)
    if response_format is not None:
        chat["response_format"] = response_format
    context = {
        "model": model,
        "stop_sequences": list(stops or []),
        "ignored": sorted(k for k in body if k in _ACCEPTED_FIELDS),
    }
    return Translated(chat=chat, stream=bool(stream), context=context)


# --------------------------------------------------------------------------- reply


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text") or "")
            for p in content
            if isinstance(p, Mapping) and p.get("type", "text") == "text"
        )
    return ""


def tool_input(arguments: Any) -> dict[str, Any]:
    """The chat ``arguments`` the engine sampled as a tool_use ``input`` object: parsed when it
    is a JSON object, else kept verbatim under :data:`RAW_ARGUMENTS_KEY`."""
    if isinstance(arguments, dict):
        return arguments
    if isinstance(arguments, str):
        try:
            parsed = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict):
            return parsed
        return {RAW_ARGUMENTS_KEY: arguments}
    return {RAW_ARGUMENTS_KEY: "" if arguments is None else json.dumps(arguments)}


def _tool_use(call: Any) -> dict[str, Any]:
    call = call if isinstance(call, Mapping) else {}
    fn = call.get("function") if isinstance(call.get("function"), Mapping) else {}
    call_id = call.get("id")
    if not isinstance(call_id, str) or not call_id:
        call_id = f"toolu_{secrets.token_hex(12)}"
    name = fn.get("name")
    return {
        "type": "tool_use",
        "id": call_id,
        "name": name if isinstance(name, str) else "",
        "input": tool_input(fn.get("arguments")),
    }


def _stop(choice: Mapping[str, Any], has_calls: bool, stops: list[str]) -> tuple[str, str | None]:
    finish = choice.get("finish_reason")
    if has_calls or finish == "tool_calls":
        return "tool_use", None
    if finish == "length":
        return "max_tokens", None
    if finish == "content_filter":
        return "refusal", None
    matched = choice.get("stop_reason")
    if isinstance(matched, str) and matched in stops:
        return "stop_sequence", matched
    return "end_turn", None


def _usage(usage: Any) -> dict[str, int]:
    usage = usage if isinstance(usage, Mapping) else {}

    def count(value: Any) -> int:
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    details = usage.get("prompt_tokens_details")
    cached = count(details.get("cached_tokens")) if isinstance(details, Mapping) else 0
    prompt = count(usage.get("prompt_tokens"))
    return {
        "input_tokens": max(prompt - cached, 0),
        "output_tokens": count(usage.get("completion_tokens")),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": min(cached, prompt),
    }


def reply(chat_reply: dict[str, Any], translated: Translated) -> dict[str, Any]:
    """A whole chat-completions reply as an Anthropic ``Message``."""
    choices = chat_reply.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else {}
    choice = choice if isinstance(choice, Mapping) else {}
    message = choice.get("message") if isinstance(choice.get("message"), Mapping) else {}
    content: list[dict[str, Any]] = []
    for key in _REASONING_KEYS:
        reasoning = message.get(key)
        if isinstance(reasoning, str) and reasoning:
            signature = SIGNATURE_PREFIX + key
            content.append({"type": "thinking", "thinking": reasoning, "signature": signature})
            break
    text = _text(message.get("content"))
    refusal = message.get("refusal")
    if isinstance(refusal, str) and refusal and not text:
        text = refusal
    if text:
        content.append({"type": "text", "text": text})
    calls = message.get("tool_calls")
    calls = calls if isinstance(calls, list) else []
    content += [_tool_use(call) for call in calls]
    if not content:
        content.append({"type": "text", "text": ""})
    stop_reason, stop_sequence = _stop(
        choice, bool(calls), translated.context.get("stop_sequences") or []
    )
    if isinstance(refusal, str) and refusal and not calls:
        stop_reason, stop_sequence = "refusal", None
    chat_id = chat_reply.get("id")
    msg_id = (
        "msg_" + chat_id.removeprefix("chatcmpl-")
        if isinstance(chat_id, str) and chat_id
        else f"msg_{secrets.token_hex(12)}"
    )
    model = translated.context.get("model") or chat_reply.get("model") or "unknown"
    return {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": _usage(chat_reply.get("usage")),
    }


# --------------------------------------------------------------------------- SSE


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _chunks(text: str) -> list[str]:
    return [text[i : i + _CHUNK] for i in range(0, len(text), _CHUNK)]


def _block_events(index: int, block: dict[str, Any]) -> Iterator[bytes]:
    kind = block["type"]
    deltas: list[dict[str, Any]]
    if kind == "text":
        start: dict[str, Any] = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": c} for c in _chunks(block["text"])]
    elif kind == "thinking":
        start = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [{"type": "thinking_delta", "thinking": c} for c in _chunks(block["thinking"])]
        deltas.append({"type": "signature_delta", "signature": block["signature"]})
    elif kind == "tool_use":
        start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        arguments = orjson.dumps(block["input"]).decode()
        deltas = [{"type": "input_json_delta", "partial_json": c} for c in _chunks(arguments)]
    else:  # pragma: no cover - reply() writes only the three kinds above
        start, deltas = block, []
    yield _event(
        "content_block_start",
        {"type": "content_block_start", "index": index, "content_block": start},
    )
    for delta in deltas:
        yield _event(
            "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        )
    yield _event("content_block_stop", {"type": "content_block_stop", "index": index})


def sse(message: dict[str, Any], translated: Translated) -> Iterator[bytes]:
    """A ``Message`` as Anthropic's SSE stream: message_start, ping, per block
    content_block_start / deltas / content_block_stop, message_delta, message_stop."""
    usage = message["usage"]
    start = {
        **message,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": 0},
    }
    yield _event("message_start", {"type": "message_start", "message": start})
    yield _event("ping", {"type": "ping"})
    for index, block in enumerate(message["content"]):
        yield from _block_events(index, block)
    yield _event(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {
                "stop_reason": message["stop_reason"],
                "stop_sequence": message["stop_sequence"],
            },
            "usage": usage,
        },
    )
    yield _event("message_stop", {"type": "message_stop"})


# --------------------------------------------------------------------------- aux routes


def _estimate(value: Any) -> int:
    """Tokens of a JSON value, an image counted as :data:`IMAGE_TOKENS` (the model does not
    read its base64 text) and everything else as written."""
    if isinstance(value, Mapping):
        if value.get("type") == "image" and isinstance(value.get("source"), Mapping):
            source = {k: v for k, v in value["source"].items() if k != "data"}
            rest = {k: v for k, v in value.items() if k != "source"}
            return IMAGE_TOKENS + estimate_tokens(source) + _estimate(rest)
        return sum(estimate_tokens(k) + _estimate(v) for k, v in value.items())
    if isinstance(value, list):
        return sum(_estimate(v) for v in value)
    return estimate_tokens(value)


def count_tokens(body: dict[str, Any]) -> dict[str, Any]:
    """``{"input_tokens": N}`` estimated from system, messages (every block kind), tools and
    tool_choice. Never raises: a malformed body still gets a count."""
    fields = ("system", "messages", "tools", "tool_choice")
    total = sum(_estimate(body.get(k)) for k in fields)
    return {"input_tokens": max(total, 1)}


def models(served: list[str]) -> dict[str, Any]:
    """Anthropic's model list shape."""
    data = [
        {
            "type": "model",
            "id": name,
            "display_name": name,
            "created_at": "1970-01-01T00:00:00Z",
            "lifecycle": "active",
        }
        for name in served
    ]
    return {
        "data": data,
        "has_more": False,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }


def error(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """Anthropic's error body; the type follows the status."""
    kind = _ERROR_TYPES.get(status) or (
        "invalid_request_error" if 400 <= status < 500 else "api_error"
    )
    if param and param not in message:
        message = f"{param}: {message}"
    return {"type": "error", "error": {"type": kind, "message": message}}


DIALECT = Dialect(
    name=NAME,
    routes=(
        RouteSpec("POST", "/v1/messages", "turn"),
        RouteSpec("POST", "/v1/messages/count_tokens", "count"),
    ),
    session_key=session_key,
    translate=translate,
    reply=reply,
    sse=sse,
    count_tokens=count_tokens,
    models=models,
    error=error,
    sampling_fields=SAMPLING_FIELDS,
)
