"""The OpenAI Responses dialect (``POST /v1/responses``): what codex speaks.

A Responses request is translated to one chat-completions request; the chat reply comes back
as a ``response`` object, or as the Responses SSE event stream when the caller streams. The
proxy is stateless: every request must carry the whole conversation in ``input`` (codex does,
with ``store: false``), so ``previous_response_id``, ``conversation``, stored prompts and item
references are refused.

Translation table (request → chat):

- ``instructions`` (a string, or a list of input items) → the first message(s), as ``system``.
- ``input`` (a string → one user message, or a list of items):

  - ``message`` (role user / system / developer / assistant; ``type`` may be absent): role
    ``developer`` → ``system``. Parts ``input_text`` / ``output_text`` → text, ``refusal`` →
    text, ``input_image`` (``image_url``) → ``image_url``, ``input_file`` (``file_data``) →
    ``file``; a content of one text part becomes a plain string, anything else stays a list of
    parts (non-text parts are never dropped, in any role).
  - ``function_call`` {call_id, name, arguments, namespace?} → a ``tool_calls`` entry of an assistant
    message. Consecutive calls share one assistant message, which is also the message of an
    immediately preceding assistant text message or reasoning item: one reply, one message,
    so the chat template renders the same tokens the engine sampled.
  - ``function_call_output`` {call_id, output} → a ``tool`` message (``output`` a string, or
    parts as above).
  - ``reasoning`` → the next assistant message's ``reasoning_content``, taken from its
    ``reasoning_text`` content or from an ``encrypted_content`` this proxy wrote (codex sends
    reasoning back without its text but with ``encrypted_content`` when it asked for it via
    ``include``). A reasoning item with neither (a summary only, another provider's
    ciphertext) is dropped, and the reason is kept in ``context["notes"]``.
  - any other item type (built-in tool calls, ``item_reference``, ...) → refused.

- ``tools``: ``function`` tools → chat function tools; a ``namespace`` of function tools
  (codex's multi-agent tools, each MCP server's tools) → its function tools under their own
  names (a reply's call to one names its ``namespace``: codex routes by it); ``web_search`` →
  dropped with a note (the engine cannot search; codex declares it by default). Every other
  tool type (``local_shell``, ``shell``, ``custom``, ``mcp``, ...) is refused: the engine
  cannot run a hosted tool, and a shell call replayed as a function call (or the reverse)
  changes the tokens of the next turn. A reply's tool call is always a ``function_call`` item,
  whatever its name: no shell call is ever invented.
- ``tool_choice``: ``auto`` / ``none`` / ``required`` as is, ``{type: function, name}`` →
  ``{type: function, function: {name}}``, ``allowed_tools`` → chat's ``allowed_tools``;
  hosted-tool choices are refused.
- ``max_output_tokens`` → ``max_tokens``; ``temperature``, ``top_p``, ``parallel_tool_calls``
  as is; the engine's sampling extras (``seed``, ``stop``, ``top_k``, ``min_p``, penalties) as
  is; ``top_logprobs`` or ``include: ["message.output_text.logprobs"]`` → ``logprobs`` (and
  ``top_logprobs``), returned in ``output_text.logprobs``.
- ``text.format``: ``json_schema`` / ``json_object`` → ``response_format``; ``text`` → nothing.
- ``stream`` → the caller streams (the engine never does).
- ``store``, ``metadata``, ``user``, ``reasoning``, ``include``, ``truncation``,
  ``prompt_cache_key``, ``service_tier``, ``safety_identifier``, ``stream_options``,
  ``text.verbosity``, ``max_tool_calls``: accepted, not sent to the engine, echoed in the reply
  where the ``response`` object has the field.
- ``previous_response_id``, ``conversation``, ``prompt``, ``background: true`` → refused.

Reply: ``status`` is ``completed``, or ``incomplete`` with ``incomplete_details.reason``
``max_output_tokens`` (finish ``length``) or ``content_filter``. Output items, in order: a
``reasoning`` item (when the engine returned reasoning), a ``message`` (when there is text, or
when there is nothing else, so every reply leaves a turn in the caller's history), one
``function_call`` per tool call (``call_id`` is the engine's tool call id). The SSE stream always
ends with ``response.completed`` (an incomplete response too, with its status): codex treats
``response.incomplete`` as a stream error and retries, which would sample the turn again.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import time
import uuid
from collections import Counter
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

NAME = "responses"

#: Written into a reasoning item's ``encrypted_content`` so its text comes back with the item.
REASONING_TOKEN_PREFIX = "rollwire.reasoning.v1:"
_LOGPROBS_INCLUDE = "message.output_text.logprobs"
_REASONING_INCLUDE = "reasoning.encrypted_content"

#: Sampling fields of a Responses request (and the engine extras a caller may add), each carried
#: to the chat request (where the chat path forces its no-op value and records it).
SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "max_output_tokens",
    "top_logprobs",
    "seed",
    "stop",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)
_CARRIED_AS_IS = (
    "temperature",
    "top_p",
    "seed",
    "stop",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)
#: Every request field this dialect knows (translated, refused, or accepted and echoed); any other
#: field is ignored and listed in ``context["unknown_fields"]``.
KNOWN_FIELDS = (
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "stream",
    "text",
    "store",
    "metadata",
    "user",
    "reasoning",
    "include",
    "truncation",
    "prompt_cache_key",
    "prompt_cache_retention",
    "service_tier",
    "safety_identifier",
    "stream_options",
    "max_tool_calls",
    "background",
    "previous_response_id",
    "conversation",
    "prompt",
    *SAMPLING_FIELDS,
)
_STATELESS = (
    "the rollwire capture proxy is stateless: send the whole conversation in 'input' "
    "(with store=false) instead"
)


# ---------------------------------------------------------------------------------- request


def _is_str(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


def _text_part(text: Any, where: str) -> dict[str, Any]:
    if not isinstance(text, str):
        raise DialectError(f"{where}.text must be a string", param=where)
    return {"type": "text", "text": text}


def _chat_part(part: Any, where: str) -> dict[str, Any]:
    """One Responses content part as a chat-completions content part (never dropped)."""
    if isinstance(part, str):
        return {"type": "text", "text": part}
    if not isinstance(part, Mapping):
        raise DialectError(f"{where} must be a content part object", param=where)
    kind = part.get("type")
    if kind in ("input_text", "output_text", "text"):
        return _text_part(part.get("text"), where)
    if kind == "refusal":
        return _text_part(part.get("refusal"), where)
    if kind == "input_image":
        url = part.get("image_url")
        if not _is_str(url):
            raise DialectError(
                f"{where}: an input_image needs 'image_url' (a URL or a data: URL); "
                "'file_id' refers to OpenAI's file store, which this proxy does not have",
                param=where,
            )
        image: dict[str, Any] = {"url": url}
        if isinstance(part.get("detail"), str):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    if kind == "input_file":
        data = part.get("file_data")
        if not _is_str(data):
            raise DialectError(
                f"{where}: an input_file needs 'file_data'; 'file_id' and 'file_url' need a "
                "file store or a download, which this proxy does not do",
                param=where,
            )
        file: dict[str, Any] = {"file_data": data}
        if isinstance(part.get("filename"), str):
            file["filename"] = part["filename"]
        return {"type": "file", "file": file}
    raise DialectError(f"{where}: content part type {kind!r} is not supported", param=where)


def _chat_content(content: Any, where: str) -> str | list[dict[str, Any]]:
    """Message content: one text part becomes a string; anything else stays a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise DialectError(f"{where} must be a string or a list of content parts", param=where)
    parts = [_chat_part(p, f"{where}[{i}]") for i, p in enumerate(content)]
    if not parts:
        return ""
    if len(parts) == 1 and parts[0]["type"] == "text":
        return parts[0]["text"]
    return parts


def reasoning_token(text: str) -> str:
    """The ``encrypted_content`` this proxy writes: the reasoning text, recoverable."""
    return REASONING_TOKEN_PREFIX + base64.urlsafe_b64encode(text.encode()).decode()


def _reasoning_from_token(token: Any) -> str | None:
    if not isinstance(token, str) or not token.startswith(REASONING_TOKEN_PREFIX):
        return None
    try:
        return base64.urlsafe_b64decode(token[len(REASONING_TOKEN_PREFIX) :]).decode()
    except (binascii.Error, ValueError):
        return None


def _reasoning_text(item: Mapping[str, Any]) -> str | None:
    content = item.get("content")
    if isinstance(content, list):
        texts = [
            p["text"]
            for p in content
            if isinstance(p, Mapping)
            and p.get("type") == "reasoning_text"
            and isinstance(p.get("text"), str)
        ]
        if texts:
            return "".join(texts)
    return _reasoning_from_token(item.get("encrypted_content"))


def _arguments(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):  # re-serialised; the proxy restores the sampled string
        return orjson.dumps(value).decode()
    raise DialectError(f"{where}.arguments must be a JSON string", param=f"{where}.arguments")


class _Messages:
    """Builds the chat messages from Responses items, merging one reply's items into one
    assistant message."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.notes: list[str] = []
        # The assistant message that the next assistant-side item of the same reply joins.
        self._open: dict[str, Any] | None = None
        self._pending_reasoning: tuple[str, str] | None = None  # (text, where)

    def _close(self) -> None:
        self._open = None
        if self._pending_reasoning is not None:
            _, where = self._pending_reasoning
            self.notes.append(
                f"{where}: a reasoning item not followed by an assistant message or call was "
                "dropped (chat carries reasoning only on an assistant message)"
            )
            self._pending_reasoning = None

    def _assistant(self, *, new: bool) -> dict[str, Any]:
        """The open assistant message, or a new one (carrying a pending reasoning item)."""
        if self._open is None or new:
            message: dict[str, Any] = {"role": "assistant", "content": None}
            if self._pending_reasoning is not None:
                message["reasoning_content"] = self._pending_reasoning[0]
                self._pending_reasoning = None
            self.messages.append(message)
            self._open = message
        return self._open

    def add(self, item: Any, where: str) -> None:
        if isinstance(item, str):  # a bare string in a list: user text
            item = {"type": "message", "role": "user", "content": item}
        if not isinstance(item, Mapping):
            raise DialectError(f"{where} must be an input item object", param=where)
        kind = item.get("type")
        if kind is None and "role" in item:
            kind = "message"
        if kind == "message":
            self._message(item, where)
        elif kind == "function_call":
            self._function_call(item, where)
        elif kind == "function_call_output":
            self._close()
            call_id = item.get("call_id")
            if not _is_str(call_id):
                raise DialectError(
                    f"{where}.call_id is required: a tool result must name its call",
                    param=f"{where}.call_id",
                )
            content = _chat_content(item.get("output"), f"{where}.output")
            self.messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
        elif kind == "reasoning":
            self._close()
            text = _reasoning_text(item)
            if text is None:
                self.notes.append(
                    f"{where}: a reasoning item without reasoning_text content or this proxy's "
                    "encrypted_content was dropped (its text is not known)"
                )
            else:
                self._pending_reasoning = (text, where)
        elif kind == "item_reference":
            raise DialectError(
                f"{where}: item_reference needs stored items; {_STATELESS}", param=where
            )
        else:
            raise DialectError(
                f"{where}: input item type {kind!r} is not supported by the rollwire proxy "
                "(it translates messages, function_call, function_call_output and reasoning)",
                param=where,
            )

    def _message(self, item: Mapping[str, Any], where: str) -> None:
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise DialectError(f"{where}.role {role!r} is not supported", param=f"{where}.role")
        content = _chat_content(item.get("content"), f"{where}.content")
        if role == "assistant":  # starts a reply (a reply's text precedes its calls)
            self._assistant(new=True)["content"] = content
            return
        self._close()
        self.messages.append(
            {"role": "system" if role == "developer" else role, "content": content}
        )

    def _function_call(self, item: Mapping[str, Any], where: str) -> None:
        call_id, name = item.get("call_id"), item.get("name")
        if not _is_str(call_id):
            raise DialectError(f"{where}.call_id is required", param=f"{where}.call_id")
        if not _is_str(name):
            raise DialectError(f"{where}.name is required", param=f"{where}.name")
        namespace = item.get("namespace")
        if namespace is not None and not _is_str(namespace):
            raise DialectError(f"{where}.namespace must be a string", param=f"{where}.namespace")
        # A namespaced call (codex's MCP tools) names its tool as the engine saw it declared:
        # the function tools of a namespace are declared under their own names (_flatten).
        call = {
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": _arguments(item.get("arguments"), where)},
        }
        message = self._assistant(new=False)
        message.setdefault("tool_calls", []).append(call)

    def finish(self) -> None:
        self._close()


# Hosted tools the engine cannot run and that carry no schema the model would see rendered:
# dropped from the request, with a note (codex declares web_search by default).
_DROPPED_HOSTED_TOOLS = frozenset({"web_search", "web_search_preview"})


def _flatten(tools: list[Any]) -> tuple[list[Any], dict[str, str]]:
    """A ``namespace`` tool groups function tools (codex's multi-agent tools, and each MCP
    server's tools): its function tools are declared as they are, under their own names. Also
    returns each such tool's namespace, by name: a reply's call to it names its namespace, or
    the caller cannot route it. Two tools of one name (in two namespaces, or one in a
    namespace and one outside) are refused: the engine would see one name for both."""
    out: list[Any] = []
    namespaces: dict[str, str] = {}
    for tool in tools:
        if isinstance(tool, Mapping) and tool.get("type") == "namespace":
            inner = tool.get("tools")
            if not isinstance(inner, list) or not all(
                isinstance(t, Mapping) and t.get("type") == "function" for t in inner
            ):
                out.append(tool)  # refused below, by type
                continue
            out.extend(inner)
            if _is_str(tool.get("name")):
                for t in inner:
                    if _is_str(t.get("name")):
                        namespaces[t["name"]] = tool["name"]
        else:
            out.append(tool)
    names = Counter(t["name"] for t in out if isinstance(t, Mapping) and _is_str(t.get("name")))
    twice = sorted(n for n, k in names.items() if k > 1)
    if twice:
        raise DialectError(
            f"tools: {', '.join(map(repr, twice))} declared twice (namespaced tools are "
            "declared to the engine under their own names, so each name must be unique)",
            param="tools",
        )
    return out, namespaces


def _chat_tools(
    tools: Any, notes: list[str] | None = None, namespaces: dict[str, str] | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(chat tools, the tools as the response echoes them). Namespaces are flattened to their
    function tools (each one's namespace put in ``namespaces``); ``web_search`` is dropped
    with a note; other tool types are refused."""
    if tools is None:
        return [], []
    if not isinstance(tools, list):
        raise DialectError("'tools' must be a list", param="tools")
    unsupported = []
    chat_tools, echo = [], []
    flat, found = _flatten(tools)
    if namespaces is not None:
        namespaces.update(found)
    for i, tool in enumerate(flat):
        kind = tool.get("type") if isinstance(tool, Mapping) else None
        if isinstance(kind, str) and kind in _DROPPED_HOSTED_TOOLS:  # a dict is unhashable
            if notes is not None:
                notes.append(f"hosted tool {kind!r} dropped: the engine cannot run it")
            continue
        if kind != "function":
            unsupported.append(str(kind))
            continue
        name = tool.get("name")
        if not _is_str(name):
            raise DialectError(f"tools[{i}].name is required", param=f"tools[{i}].name")
        fn: dict[str, Any] = {"name": name}
        for key in ("description", "parameters", "strict"):
            if tool.get(key) is not None:
                fn[key] = tool[key]
        chat_tools.append({"type": "function", "function": fn})
        echo.append(
            {
                "type": "function",
                "name": name,
                "description": tool.get("description"),
                "parameters": tool.get("parameters"),
                "strict": tool.get("strict"),
            }
        )
    if unsupported:
        raise DialectError(
            f"tool type(s) {', '.join(sorted(set(unsupported)))} are not supported by the "
            "rollwire proxy: only 'function' tools are (the engine cannot run hosted tools, and "
            "a shell or custom tool call cannot be replayed as the tokens the engine sampled)",
            param="tools",
        )
    return chat_tools, echo


def _chat_tool_choice(choice: Any) -> Any:
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, Mapping):
        kind = choice.get("type")
        if kind == "function" and _is_str(choice.get("name")):
            return {"type": "function", "function": {"name": choice["name"]}}
        if kind == "allowed_tools" and isinstance(choice.get("tools"), list):
            allowed = []
            for tool in choice["tools"]:
                if not isinstance(tool, Mapping) or tool.get("type") != "function":
                    raise DialectError(
                        "tool_choice.tools: only function tools can be allowed",
                        param="tool_choice",
                    )
                allowed.append({"type": "function", "function": {"name": tool.get("name")}})
            return {
                "type": "allowed_tools",
                "allowed_tools": {"mode": choice.get("mode", "auto"), "tools": allowed},
            }
        raise DialectError(
            f"tool_choice of type {kind!r} is not supported: only function tools are",
            param="tool_choice",
        )
    raise DialectError(f"tool_choice {choice!r} is not supported", param="tool_choice")


def _response_format(text: Any) -> dict[str, Any] | None:
    if text is None:
        return None
    if not isinstance(text, Mapping):
        raise DialectError("'text' must be an object", param="text")
    fmt = text.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, Mapping) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = {
            k: fmt[k] for k in ("name", "schema", "description", "strict") if fmt.get(k) is not None
        }
        return {"type": "json_schema", "json_schema": schema}
    raise DialectError(f"text.format type {kind!r} is not supported", param="text.format")


def translate(body: dict[str, Any], stream_hint: bool | None = None) -> Translated:
    """A Responses request as a chat-completions request (see the module's table)."""
    for field, why in (
        ("previous_response_id", _STATELESS),
        ("conversation", _STATELESS),
        ("prompt", "stored prompt templates live at OpenAI; send the prompt in 'input'"),
    ):
        if body.get(field) is not None:
            raise DialectError(f"'{field}' is not supported: {why}", param=field)
    if body.get("background"):
        raise DialectError(
            "'background' responses are not supported: the proxy answers each call while "
            "the caller waits",
            param="background",
        )

    built = _Messages()
    instructions = body.get("instructions")
    if isinstance(instructions, str):
        if instructions:
            built.messages.append({"role": "system", "content": instructions})
    elif isinstance(instructions, list):
        for i, item in enumerate(instructions):
            if isinstance(item, Mapping) and item.get("role") in (None, "developer", "system"):
                item = {**item, "role": "system"}
            built.add(item, f"instructions[{i}]")
        built.finish()
    elif instructions is not None:
        raise DialectError("'instructions' must be a string", param="instructions")

    items = body.get("input")
    if isinstance(items, str):
        built.messages.append({"role": "user", "content": items})
    elif isinstance(items, list):
        for i, item in enumerate(items):
            built.add(item, f"input[{i}]")
        built.finish()
    elif items is not None:
        raise DialectError("'input' must be a string or a list of items", param="input")
    if not built.messages:
        raise DialectError("'input' is required (the conversation to answer)", param="input")

    chat: dict[str, Any] = {"messages": built.messages}
    if isinstance(body.get("model"), str):
        chat["model"] = body["model"]
    namespaces: dict[str, str] = {}
    tools, tools_echo = _chat_tools(body.get("tools"), built.notes, namespaces)
    choice = _chat_tool_choice(body.get("tool_choice"))
    if tools:
        chat["tools"] = tools
        if choice is not None:
            chat["tool_choice"] = choice
    elif choice not in (None, "auto", "none"):
        raise DialectError("'tool_choice' names a tool but 'tools' is empty", param="tool_choice")
    if body.get("parallel_tool_calls") is not None:
        chat["parallel_tool_calls"] = body["parallel_tool_calls"]
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    for key in _CARRIED_AS_IS:
        if body.get(key) is not None:
            chat[key] = body[key]
    include = body.get("include") if isinstance(body.get("include"), list) else []
    logprobs = body.get("top_logprobs") is not None or _LOGPROBS_INCLUDE in include
    if logprobs:
        chat["logprobs"] = True
        chat["top_logprobs"] = body.get("top_logprobs") or 0
    response_format = _response_format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format

    text = body.get("text") if isinstance(body.get("text"), Mapping) else None
    echo = {
        "instructions": instructions,
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") if isinstance(body.get("metadata"), Mapping) else None,
        "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
        "previous_response_id": None,
        "reasoning": body.get("reasoning") if isinstance(body.get("reasoning"), Mapping) else None,
        "temperature": body.get("temperature"),
        "text": dict(text) if text and text.get("format") else {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice") if body.get("tool_choice") is not None else "auto",
        "tools": tools_echo,
        "top_logprobs": body.get("top_logprobs"),
        "top_p": body.get("top_p"),
        "truncation": body.get("truncation") or "disabled",
        "user": body.get("user"),
        "store": body.get("store") if isinstance(body.get("store"), bool) else None,
    }
    unknown = sorted(k for k in body if k not in KNOWN_FIELDS)
    context = {
        "model": body.get("model") if isinstance(body.get("model"), str) else None,
        "echo": echo,
        "logprobs": logprobs,
        "encrypt_reasoning": _REASONING_INCLUDE in include,
        "notes": built.notes,
        "unknown_fields": unknown,
        "namespaces": namespaces,
    }
    return Translated(chat=chat, stream=bool(body.get("stream")), context=context)


# ------------------------------------------------------------------------------------ reply


def _output_logprobs(choice: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    content = (choice.get("logprobs") or {}).get("content")
    if not isinstance(content, list):
        return None

    def entry(e: Any) -> dict[str, Any] | None:
        if not isinstance(e, Mapping) or not isinstance(e.get("token"), str):
            return None
        lp = e.get("logprob")
        if isinstance(lp, bool) or not isinstance(lp, int | float) or not math.isfinite(lp):
            return None
        raw = e.get("bytes")
        return {
            "token": e["token"],
            "bytes": list(raw) if isinstance(raw, list) else list(e["token"].encode()),
            "logprob": float(lp),
        }

    out = []
    for e in content:
        top = entry(e)
        if top is None:
            return None
        alts = [entry(a) for a in (e.get("top_logprobs") or [])]
        top["top_logprobs"] = [a for a in alts if a is not None]
        out.append(top)
    return out


def _usage(usage: Any) -> dict[str, Any] | None:
    if not isinstance(usage, Mapping):
        return None
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": int(cached), "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": int(reasoning)},
        "total_tokens": int(usage.get("total_tokens") or prompt + completion),
    }


# The request fields a ``response`` object echoes, as the API defaults them.
_ECHO_DEFAULTS: dict[str, Any] = {
    "instructions": None,
    "max_output_tokens": None,
    "metadata": None,
    "parallel_tool_calls": True,
    "previous_response_id": None,
    "reasoning": None,
    "temperature": None,
    "text": {"format": {"type": "text"}},
    "tool_choice": "auto",
    "tools": [],
    "top_logprobs": None,
    "top_p": None,
    "truncation": "disabled",
    "user": None,
}


def _base_id(chat_id: Any) -> str:
    if isinstance(chat_id, str) and chat_id:
        return re.sub(r"[^A-Za-z0-9_]", "", chat_id.removeprefix("chatcmpl-")) or uuid.uuid4().hex
    return uuid.uuid4().hex


def reply(chat_reply: dict[str, Any], translated: Translated) -> dict[str, Any]:
    """A whole chat-completions reply as a Responses ``response`` object."""
    ctx = translated.context
    choice = (chat_reply.get("choices") or [{}])[0] or {}
    message = choice.get("message") or {}
    finish = choice.get("finish_reason")
    incomplete = None
    if finish == "length":
        incomplete = {"reason": "max_output_tokens"}
    elif finish == "content_filter":
        incomplete = {"reason": "content_filter"}
    item_status = "incomplete" if incomplete else "completed"
    base = _base_id(chat_reply.get("id"))

    output: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        output.append(
            {
                "id": f"rs_{base}",
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": reasoning}],
                "encrypted_content": (
                    reasoning_token(reasoning) if ctx.get("encrypt_reasoning") else None
                ),
                "status": item_status,
            }
        )
    text = message.get("content")
    calls = message.get("tool_calls") or []
    refusal = message.get("refusal")
    if (isinstance(text, str) and text) or refusal or not calls:
        parts: list[dict[str, Any]] = []
        if (isinstance(text, str) and text) or not refusal:
            part: dict[str, Any] = {
                "type": "output_text",
                "text": text if isinstance(text, str) else "",
                "annotations": [],
            }
            if ctx.get("logprobs"):
                part["logprobs"] = _output_logprobs(choice) or []
            parts.append(part)
        if isinstance(refusal, str) and refusal:
            parts.append({"type": "refusal", "refusal": refusal})
        output.append(
            {
                "id": f"msg_{base}",
                "type": "message",
                "role": "assistant",
                "status": item_status,
                "content": parts,
            }
        )
    namespaces = ctx.get("namespaces") or {}
    for i, call in enumerate(calls):
        fn = (call or {}).get("function") or {}
        call_id = call.get("id") if isinstance(call, Mapping) else None
        name = fn.get("name") if isinstance(fn.get("name"), str) else ""
        item = {
            "id": f"fc_{base}_{i}",
            "type": "function_call",
            "call_id": call_id if _is_str(call_id) else f"call_{base}_{i}",
            "name": name,
            "arguments": fn.get("arguments") if isinstance(fn.get("arguments"), str) else "",
            "status": "completed",
        }
        if name in namespaces:  # the caller routes a namespaced tool's call by its namespace
            item["namespace"] = namespaces[name]
        output.append(item)
    created = chat_reply.get("created")
    model = ctx.get("model") or chat_reply.get("model") or ""
    return {
        "id": f"resp_{base}",
        "object": "response",
        "created_at": created if isinstance(created, int | float) else int(time.time()),
        "status": "incomplete" if incomplete else "completed",
        "error": None,
        "incomplete_details": incomplete,
        "model": model,
        "output": output,
        "usage": _usage(chat_reply.get("usage")),
        **_ECHO_DEFAULTS,
        **ctx.get("echo", {}),
    }


# -------------------------------------------------------------------------------------- SSE

_CHUNK = re.compile(r"\s*\S+\s*|\s+")


def _pieces(text: str) -> list[str]:
    """Text cut into word-sized deltas (they join back to the text)."""
    return _CHUNK.findall(text) or [text]


def sse(response: dict[str, Any], translated: Translated) -> Iterator[bytes]:
    """A ``response`` object replayed as the Responses SSE event stream, ending with
    ``response.completed``."""
    seq = 0

    def event(kind: str, **fields: Any) -> bytes:
        nonlocal seq
        data = {"type": kind, "sequence_number": seq, **fields}
        seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

    started = {**response, "status": "in_progress", "output": [], "usage": None}
    started["incomplete_details"] = None
    yield event("response.created", response=started)
    yield event("response.in_progress", response=started)
    for index, item in enumerate(response.get("output") or []):
        kind, item_id = item.get("type"), item.get("id")
        where = {"item_id": item_id, "output_index": index}
        if kind == "message":
            yield event(
                "response.output_item.added",
                output_index=index,
                item={**item, "status": "in_progress", "content": []},
            )
            for c, part in enumerate(item.get("content") or []):
                if part.get("type") == "output_text":
                    empty = {"type": "output_text", "text": "", "annotations": []}
                    yield event("response.content_part.added", **where, content_index=c, part=empty)
                    for delta in _pieces(part["text"]) if part["text"] else []:
                        yield event(
                            "response.output_text.delta",
                            **where,
                            content_index=c,
                            delta=delta,
                            logprobs=[],
                        )
                    yield event(
                        "response.output_text.done",
                        **where,
                        content_index=c,
                        text=part["text"],
                        logprobs=part.get("logprobs") or [],
                    )
                else:  # refusal
                    empty = {"type": "refusal", "refusal": ""}
                    yield event("response.content_part.added", **where, content_index=c, part=empty)
                    yield event(
                        "response.refusal.delta", **where, content_index=c, delta=part["refusal"]
                    )
                    yield event(
                        "response.refusal.done", **where, content_index=c, refusal=part["refusal"]
                    )
                yield event("response.content_part.done", **where, content_index=c, part=part)
        elif kind == "function_call":
            yield event(
                "response.output_item.added",
                output_index=index,
                item={**item, "arguments": "", "status": "in_progress"},
            )
            for delta in _pieces(item["arguments"]) if item["arguments"] else []:
                yield event("response.function_call_arguments.delta", **where, delta=delta)
            yield event(
                "response.function_call_arguments.done",
                **where,
                name=item["name"],
                arguments=item["arguments"],
            )
        elif kind == "reasoning":
            yield event(
                "response.output_item.added",
                output_index=index,
                item={**item, "content": [], "encrypted_content": None, "status": "in_progress"},
            )
            for c, part in enumerate(item.get("content") or []):
                empty = {"type": "reasoning_text", "text": ""}
                yield event("response.content_part.added", **where, content_index=c, part=empty)
                for delta in _pieces(part["text"]):
                    yield event(
                        "response.reasoning_text.delta", **where, content_index=c, delta=delta
                    )
                yield event(
                    "response.reasoning_text.done", **where, content_index=c, text=part["text"]
                )
                yield event("response.content_part.done", **where, content_index=c, part=part)
        yield event("response.output_item.done", output_index=index, item=item)
    yield event("response.completed", response=response)


# ------------------------------------------------------------------------- the other routes


def count_tokens(body: dict[str, Any]) -> dict[str, Any]:
    """``POST /v1/responses/input_tokens``: an estimate from every field the request uses."""
    used = ("instructions", "input", "tools", "tool_choice", "text", "reasoning")
    return {
        "object": "response.input_tokens",
        "input_tokens": sum(estimate_tokens(body.get(k)) for k in used),
    }


def models(served: list[str]) -> dict[str, Any]:
    """The OpenAI model listing (the proxy's own ``GET /v1/models`` already serves it)."""
    return {
        "object": "list",
        "data": [
            {"id": m, "object": "model", "created": 0, "owned_by": "rollwire"} for m in served
        ],
    }


_ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}


def error(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """The OpenAI error shape: ``{"error": {message, type, param, code}}``."""
    kind = _ERROR_TYPES.get(status) or (
        "server_error" if status >= 500 else "invalid_request_error"
    )
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


def session_key(headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
    """The capture session key: ``Authorization: Bearer <key>`` (what OPENAI_API_KEY sends)."""
    return bearer(headers)


DIALECT = Dialect(
    name=NAME,
    routes=(
        RouteSpec("POST", "/v1/responses", "turn"),
        RouteSpec("POST", "/v1/responses/input_tokens", "count"),
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
