"""The Google Gemini API dialect (``generateContent``): what the ``google-genai`` SDK and
gemini-cli speak.

The action is in the path (``/v1beta/models/{model}:generateContent``,
``:streamGenerateContent?alt=sse``, ``:countTokens``), matched case-insensitively; streaming is
signalled there, never in the body. The key comes as ``x-goog-api-key`` (the SDK), ``?key=``, or
``Authorization: Bearer``.

Request -> chat-completions:

- ``systemInstruction`` -> one system message (text parts; images and other media kept as content
  parts, never dropped).
- ``contents``: ``user`` parts -> a user message (one text part: a string; otherwise content
  parts: ``inlineData`` image/audio/video -> ``image_url``/``input_audio``/``video_url`` with a
  base64 data URL, ``fileData`` with an http(s) image -> ``image_url``); ``functionResponse`` ->
  ``tool`` messages (content: the response object as JSON). Consecutive ``model`` contents are
  one assistant message (the SDK's chat history keeps each streamed chunk as its own content):
  text parts concatenated -> ``content``, ``thought`` parts -> ``reasoning_content``,
  ``functionCall`` -> ``tool_calls`` (arguments: ``json.dumps(args)``; the proxy puts back the
  exact string the engine sampled).
- Tool call ids: a call's own ``id`` (this dialect returns the engine's id, so the SDK echoes it),
  else ``call_<content index>_<call index>`` (stable while the history only grows). A
  ``functionResponse`` maps to its call by ``id``, else to the earliest unanswered call of the same
  name: a response always carries its call's id, so the next prompt renders identically.
- ``tools[].functionDeclarations`` -> chat tools (``parametersJsonSchema`` as is; the OpenAPI
  ``parameters`` schema converted to JSON Schema). Google's built-in tools are refused.
- ``toolConfig.functionCallingConfig``: ``AUTO``/``VALIDATED`` -> ``auto``, ``NONE`` -> ``none``,
  ``ANY`` -> ``required`` (one allowed name -> that function).
- ``generationConfig``: ``temperature``, ``topP``, ``topK``, ``maxOutputTokens`` ->
  ``max_tokens``, ``stopSequences`` -> ``stop``, ``seed``, ``presencePenalty``,
  ``frequencyPenalty``, ``responseMimeType``/``responseSchema``/``responseJsonSchema`` ->
  ``response_format``; ``thinkingConfig.includeThoughts=false`` hides thought parts in the reply,
  ``thinkingBudget=0`` -> ``chat_template_kwargs.enable_thinking=false``. ``candidateCount>1``,
  ``responseLogprobs``, non-text modalities and every field not listed are refused.

Field names are accepted in camelCase (the wire form) and snake_case (what the SDK leaves inside
nested objects such as ``thinkingConfig`` or a function declaration).
"""

from __future__ import annotations

import json
import re
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

NAME = "google"

#: Marks a tool call whose sampled arguments are not a JSON object (Google's ``args`` must be
#: one): ``{RAW_ARGUMENTS_KEY: "<the sampled string>"}``, turned back into that string on the
#: next request so the prompt renders the same.
RAW_ARGUMENTS_KEY = "rollwire_raw_arguments"

#: Tokens counted for one image or other media part (Gemini's figure for one image).
MEDIA_TOKENS = 258

SAMPLING_FIELDS = (
    "temperature",
    "topP",
    "topK",
    "maxOutputTokens",
    "stopSequences",
    "candidateCount",
    "seed",
    "presencePenalty",
    "frequencyPenalty",
    "responseLogprobs",
    "logprobs",
    "responseMimeType",
    "responseSchema",
    "responseJsonSchema",
    "responseModalities",
    "thinkingConfig",
)

_ACTIONS = {
    "generatecontent": ("turn", False),
    "streamgeneratecontent": ("turn", True),
    "counttokens": ("count", False),
}

# Request fields accepted without effect on the prompt: safety filters and labels have no meaning
# for an open model behind vLLM, and the model is chosen by the proxy.
_IGNORED_TOP = ("safetySettings", "labels", "model", "serviceTier", "store")
_KNOWN_TOP = (
    "contents",
    "systemInstruction",
    "tools",
    "toolConfig",
    "generationConfig",
    *_IGNORED_TOP,
)
# Part fields that are metadata, not content: accepted, not rendered.
_PART_METADATA = ("thoughtSignature", "partMetadata", "mediaResolution")

_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    415: "INVALID_ARGUMENT",
    422: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}

_FINISH = {
    "stop": "STOP",
    "tool_calls": "STOP",
    "function_call": "STOP",
    "length": "MAX_TOKENS",
    "content_filter": "SAFETY",
}


# ---- field access ----------------------------------------------------------------------------


def _snake(name: str) -> str:
    return re.sub(r"([A-Z])", r"_\1", name).lower()


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(word[:1].upper() + word[1:] for word in rest)


def _get(obj: Mapping[str, Any], name: str) -> Any:
    """``obj[name]`` under its camelCase or snake_case spelling (None when absent or null)."""
    value = obj.get(name)
    if value is None:
        value = obj.get(_snake(name))
    return value


def _has(obj: Mapping[str, Any], name: str) -> bool:
    return _get(obj, name) is not None


def _unknown(obj: Mapping[str, Any], known: tuple[str, ...]) -> list[str]:
    """Keys of ``obj`` (with a non-null value) that are not in ``known`` under either spelling."""
    return [k for k, v in obj.items() if v is not None and _camel(k) not in known]


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise DialectError(f"'{where}' must be an object, got {type(value).__name__}", param=where)
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise DialectError(f"'{where}' must be a list, got {type(value).__name__}", param=where)
    return value


# ---- routes and keys -------------------------------------------------------------------------


def action(path_params: Mapping[str, str]) -> tuple[str, bool] | None:
    """``(kind, stream)`` for ``<model>:<action>`` (case-insensitive); the model list when the
    route has no ``rest``; None for any other action."""
    rest = path_params.get("rest")
    if rest is None:
        return ("models", False)
    model, sep, verb = rest.rpartition(":")
    if not sep or not model.strip("/"):
        return None
    return _ACTIONS.get(verb.lower())


def session_key(headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
    """``x-goog-api-key``, else ``?key=``, else ``Authorization: Bearer``."""
    key = (headers.get("x-goog-api-key") or "").strip()
    if key:
        return key
    key = (query.get("key") or "").strip()
    return key or bearer(headers)


# ---- request: parts --------------------------------------------------------------------------


def _standard_b64(data: Any, where: str) -> str:
    """Base64 as a data URL wants it: the SDK sends URL-safe base64, maybe unpadded."""
    if not isinstance(data, str):
        raise DialectError(f"'{where}.data' must be a base64 string", param=where)
    text = data.strip().replace("-", "+").replace("_", "/")
    return text + "=" * (-len(text) % 4)


def _media_part(part: Mapping[str, Any], where: str) -> dict[str, Any]:
    """An ``inlineData``/``fileData`` part as a chat content part."""
    inline = _get(part, "inlineData")
    if inline is not None:
        inline = _object(inline, f"{where}.inlineData")
        mime = str(_get(inline, "mimeType") or "").lower()
        data = _standard_b64(_get(inline, "data"), f"{where}.inlineData")
        if mime.startswith("image/"):
            return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{data}"}}
        if mime.startswith("video/"):
            return {"type": "video_url", "video_url": {"url": f"data:{mime};base64,{data}"}}
        audio = {"audio/wav": "wav", "audio/x-wav": "wav", "audio/mpeg": "mp3", "audio/mp3": "mp3"}
        if mime in audio:
            return {"type": "input_audio", "input_audio": {"data": data, "format": audio[mime]}}
        raise DialectError(
            f"{where}.inlineData has mimeType {mime!r}: the chat engine takes images, video, "
            "and wav/mp3 audio only",
            param=f"{where}.inlineData.mimeType",
        )
    file = _object(_get(part, "fileData"), f"{where}.fileData")
    mime = str(_get(file, "mimeType") or "").lower()
    uri = str(_get(file, "fileUri") or "")
    if mime.startswith("image/") and uri.startswith(("http://", "https://")):
        return {"type": "image_url", "image_url": {"url": uri}}
    raise DialectError(
        f"{where}.fileData ({mime or 'no mimeType'}, {uri!r}) cannot be fetched by the proxy: "
        "send the bytes as inlineData (only http(s) image URLs are passed through)",
        param=f"{where}.fileData",
    )


_PART_KINDS = (
    "text",
    "inlineData",
    "fileData",
    "functionCall",
    "functionResponse",
    "executableCode",
    "codeExecutionResult",
    "toolCall",
    "toolResponse",
)


def _part_kind(part: Any, where: str) -> str:
    part = _object(part, where)
    unknown = _unknown(part, (*_PART_KINDS, "thought", "videoMetadata", *_PART_METADATA))
    if unknown:
        raise DialectError(f"{where} has unsupported field(s) {unknown}", param=where)
    kinds = [k for k in _PART_KINDS if _has(part, k)]
    if len(kinds) != 1:
        raise DialectError(
            f"{where} must have exactly one of text, inlineData, fileData, functionCall, "
            f"functionResponse; it has {kinds or 'none'}",
            param=where,
        )
    kind = kinds[0]
    if kind in ("executableCode", "codeExecutionResult", "toolCall", "toolResponse"):
        raise DialectError(
            f"{where} is a {kind} part: Google's server-side tools have no chat-completions "
            "equivalent",
            param=where,
        )
    if _get(part, "thought") and kind != "text":
        raise DialectError(f"{where}: only a text part can be a thought", param=where)
    if kind == "text" and not isinstance(_get(part, "text"), str):
        raise DialectError(f"{where}.text must be a string", param=f"{where}.text")
    return kind


def _content_parts(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Chat content: one text part as a string, anything else as a list of content parts."""
    if len(parts) == 1 and parts[0]["type"] == "text":
        return parts[0]["text"]
    return parts


def _system_message(value: Any) -> dict[str, Any] | None:
    if isinstance(value, str):
        return {"role": "system", "content": value}
    value = _object(value, "systemInstruction")
    parts = _list(_get(value, "parts") or [], "systemInstruction.parts")
    out: list[dict[str, Any]] = []
    for j, part in enumerate(parts):
        where = f"systemInstruction.parts[{j}]"
        kind = _part_kind(part, where)
        if kind == "text":
            out.append({"type": "text", "text": _get(part, "text")})
        elif kind in ("inlineData", "fileData"):
            out.append(_media_part(part, where))
        else:
            raise DialectError(f"{where} is a {kind} part: not allowed in systemInstruction")
    if not out:
        return None
    return {"role": "system", "content": _content_parts(out)}


def _arguments(args: Any, where: str) -> str:
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise DialectError(f"'{where}.args' must be an object", param=f"{where}.args")
    if set(args) == {RAW_ARGUMENTS_KEY} and isinstance(args[RAW_ARGUMENTS_KEY], str):
        return args[RAW_ARGUMENTS_KEY]
    return json.dumps(args, ensure_ascii=False)


def _tool_response_text(response: Any, where: str) -> str:
    if response is None:
        response = {}
    if not isinstance(response, dict):
        raise DialectError(f"'{where}.response' must be an object", param=f"{where}.response")
    return json.dumps(response, ensure_ascii=False)


class _History:
    """Builds the chat messages of ``contents``, keeping tool-call ids consistent."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        # [id, name, answered] of the calls of the latest model turn, in order
        self.pending: list[list[Any]] = []
        self._model_group: int | None = None  # index of the assistant message being extended
        self._model_start = 0  # content index where that assistant message began
        self._model_calls = 0

    def model(self, i: int, parts: list[Any]) -> None:
        where = f"contents[{i}]"
        if self._model_group is None:
            self.pending = []
            self.messages.append({"role": "assistant", "content": None})
            self._model_group = len(self.messages) - 1
            self._model_start = i
            self._model_calls = 0
        msg = self.messages[self._model_group]
        for j, part in enumerate(parts):
            pw = f"{where}.parts[{j}]"
            kind = _part_kind(part, pw)
            if kind == "text":
                key = "reasoning_content" if _get(part, "thought") else "content"
                msg[key] = (msg.get(key) or "") + _get(part, "text")
            elif kind == "functionCall":
                call = _object(_get(part, "functionCall"), f"{pw}.functionCall")
                name = _get(call, "name")
                if not isinstance(name, str) or not name:
                    raise DialectError(
                        f"{pw}.functionCall needs a name", param=f"{pw}.functionCall"
                    )
                call_id = _get(call, "id")
                if not isinstance(call_id, str) or not call_id:
                    call_id = f"call_{self._model_start}_{self._model_calls}"
                self._model_calls += 1
                msg.setdefault("tool_calls", []).append(
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": name,
                            "arguments": _arguments(_get(call, "args"), f"{pw}.functionCall"),
                        },
                    }
                )
                self.pending.append([call_id, name, False])
            else:
                raise DialectError(
                    f"{pw} is a {kind} part: a model turn carries text, thoughts and function "
                    "calls only",
                    param=pw,
                )
        if msg["content"] is None and not msg.get("tool_calls"):
            msg["content"] = ""

    def user(self, i: int, parts: list[Any]) -> None:
        self._model_group = None
        where = f"contents[{i}]"
        if not parts:
            raise DialectError(f"{where} has no parts", param=f"{where}.parts")
        run: list[dict[str, Any]] = []

        def flush() -> None:
            if run:
                self.messages.append({"role": "user", "content": _content_parts(list(run))})
                run.clear()

        for j, part in enumerate(parts):
            pw = f"{where}.parts[{j}]"
            kind = _part_kind(part, pw)
            if _get(part, "thought"):
                raise DialectError(f"{pw}: thought parts belong to model turns", param=pw)
            if kind == "text":
                run.append({"type": "text", "text": _get(part, "text")})
            elif kind in ("inlineData", "fileData"):
                run.append(_media_part(part, pw))
            elif kind == "functionResponse":
                flush()
                self._tool_message(i, j, _object(_get(part, "functionResponse"), pw))
            else:
                raise DialectError(
                    f"{pw} is a {kind} part: a user turn carries text, media and function "
                    "responses only",
                    param=pw,
                )
        flush()

    def _tool_message(self, i: int, j: int, fr: dict[str, Any]) -> None:
        where = f"contents[{i}].parts[{j}].functionResponse"
        name = _get(fr, "name")
        if not isinstance(name, str) or not name:
            raise DialectError(f"{where} needs a name", param=where)
        if _get(fr, "parts"):
            raise DialectError(
                f"{where}.parts (media in a function response) has no chat-completions "
                "equivalent: return it in the response object or a user part",
                param=f"{where}.parts",
            )
        wanted = _get(fr, "id")
        open_calls = [call for call in self.pending if not call[2]]
        call = next((c for c in open_calls if c[0] == wanted), None)
        if call is None:
            call = next((c for c in open_calls if c[1] == name), None)
        if call is not None:
            call[2] = True
            match = call[0]
        else:
            match = wanted if isinstance(wanted, str) and wanted else f"call_{i}_{j}_response"
        self.messages.append(
            {
                "role": "tool",
                "tool_call_id": match,
                "name": name,
                "content": _tool_response_text(_get(fr, "response"), where),
            }
        )


def _messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    contents = _get(body, "contents")
    if isinstance(contents, dict):  # a single Content
        contents = [contents]
    if contents is None:
        raise DialectError("missing required field 'contents'", param="contents")
    contents = _list(contents, "contents")
    if not contents:
        raise DialectError("'contents' must not be empty", param="contents")
    history = _History()
    system = _get(body, "systemInstruction")
    if system is not None:
        message = _system_message(system)
        if message is not None:
            history.messages.append(message)
    for i, content in enumerate(contents):
        content = _object(content, f"contents[{i}]")
        unknown = _unknown(content, ("role", "parts"))
        if unknown:
            raise DialectError(f"contents[{i}] has unsupported field(s) {unknown}")
        role = _get(content, "role") or "user"
        parts = _list(_get(content, "parts") or [], f"contents[{i}].parts")
        if role == "model":
            history.model(i, parts)
        elif role in ("user", "function", "tool"):
            history.user(i, parts)
        else:
            raise DialectError(
                f"contents[{i}].role is {role!r}; expected 'user' or 'model'",
                param=f"contents[{i}].role",
            )
    return history.messages


# ---- request: tools, tool config, generation config -----------------------------------------

_SCHEMA_RENAMES = {
    "anyOf": "anyOf",
    "maxItems": "maxItems",
    "minItems": "minItems",
    "maxLength": "maxLength",
    "minLength": "minLength",
    "maxProperties": "maxProperties",
    "minProperties": "minProperties",
    "additionalProperties": "additionalProperties",
    "defs": "$defs",
    "ref": "$ref",
}


def json_schema(schema: Any) -> Any:
    """Google's OpenAPI-subset ``Schema`` (``type: "OBJECT"``, ``nullable``, ``propertyOrdering``,
    snake_case keys from the SDK) as JSON Schema."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    order = _get(schema, "propertyOrdering")
    if isinstance(order, list):  # only names can order properties (a dict is not even hashable)
        order = [k for k in order if isinstance(k, str)]
    nullable = bool(_get(schema, "nullable"))
    for key, value in schema.items():
        name = _camel(key) if not key.startswith("$") else key
        if value is None or name in ("propertyOrdering", "nullable"):
            continue
        if name == "type":
            kind = str(value).lower()
            if kind != "type_unspecified":
                out["type"] = kind
        elif name == "properties" and isinstance(value, dict):
            props = {k: json_schema(v) for k, v in value.items()}
            if isinstance(order, list):
                ranked = [k for k in order if k in props] + [k for k in props if k not in order]
                props = {k: props[k] for k in ranked}
            out["properties"] = props
        elif name in ("items", "additionalProperties"):
            out[_SCHEMA_RENAMES.get(name, name)] = json_schema(value)
        elif name == "anyOf" and isinstance(value, list):
            out["anyOf"] = [json_schema(v) for v in value]
        elif name == "defs" and isinstance(value, dict):
            out["$defs"] = {k: json_schema(v) for k, v in value.items()}
        elif name == "example":
            out["examples"] = [value]
        else:
            out[_SCHEMA_RENAMES.get(name, name)] = value
    if nullable:
        if isinstance(out.get("type"), str):
            out["type"] = [out["type"], "null"]
        else:
            out = {"anyOf": [out, {"type": "null"}]}
    return out


_GOOGLE_TOOLS = (
    "googleSearch",
    "googleSearchRetrieval",
    "codeExecution",
    "urlContext",
    "googleMaps",
    "fileSearch",
    "computerUse",
    "mcpServers",
    "retrieval",
    "enterpriseWebSearch",
)


def _tools(value: Any) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = []
    for i, tool in enumerate(_list(value, "tools")):
        tool = _object(tool, f"tools[{i}]")
        others = _unknown(tool, ("functionDeclarations",))
        if others:
            kinds = [_camel(k) for k in others]
            builtin = [k for k in kinds if k in _GOOGLE_TOOLS]
            why = (
                "Google's server-side tools have no equivalent behind a chat-completions engine"
                if builtin
                else "unknown tool kind"
            )
            raise DialectError(f"tools[{i}] declares {kinds}: {why}", param=f"tools[{i}]")
        for j, decl in enumerate(_list(_get(tool, "functionDeclarations") or [], "tools")):
            where = f"tools[{i}].functionDeclarations[{j}]"
            decl = _object(decl, where)
            unknown = _unknown(
                decl,
                (
                    "name",
                    "description",
                    "parameters",
                    "parametersJsonSchema",
                    "response",
                    "responseJsonSchema",
                    "behavior",
                ),
            )
            if unknown:
                raise DialectError(f"{where} has unsupported field(s) {unknown}", param=where)
            name = _get(decl, "name")
            if not isinstance(name, str) or not name:
                raise DialectError(f"{where} needs a name", param=f"{where}.name")
            if _has(decl, "parametersJsonSchema"):
                params = _get(decl, "parametersJsonSchema")
            elif _has(decl, "parameters"):
                params = json_schema(_get(decl, "parameters"))
            else:
                params = {"type": "object", "properties": {}}
            fn: dict[str, Any] = {"name": name}
            if _get(decl, "description") is not None:
                fn["description"] = _get(decl, "description")
            fn["parameters"] = params
            tools.append({"type": "function", "function": fn})
    return tools


def _tool_choice(config: Any, names: list[str]) -> Any:
    config = _object(config, "toolConfig")
    unknown = _unknown(config, ("functionCallingConfig",))
    if unknown:
        raise DialectError(f"toolConfig has unsupported field(s) {unknown}", param="toolConfig")
    fcc = _get(config, "functionCallingConfig")
    if fcc is None:
        return None
    where = "toolConfig.functionCallingConfig"
    fcc = _object(fcc, where)
    unknown = _unknown(fcc, ("mode", "allowedFunctionNames"))
    if unknown:
        raise DialectError(f"{where} has unsupported field(s) {unknown}", param=where)
    mode = str(_get(fcc, "mode") or "MODE_UNSPECIFIED").upper()
    allowed = _get(fcc, "allowedFunctionNames")
    if allowed is not None:
        allowed = _list(allowed, f"{where}.allowedFunctionNames")
        if mode != "ANY":
            raise DialectError(
                f"{where}.allowedFunctionNames needs mode ANY (got {mode})",
                param=f"{where}.allowedFunctionNames",
            )
        missing = [n for n in allowed if n not in names]
        if missing:
            raise DialectError(
                f"{where}.allowedFunctionNames names undeclared function(s) {missing}",
                param=f"{where}.allowedFunctionNames",
            )
    if mode in ("MODE_UNSPECIFIED", "AUTO", "VALIDATED"):
        return "auto" if names else None
    if mode == "NONE":
        return "none"
    if mode == "ANY":
        if not names:
            raise DialectError(f"{where}.mode ANY needs function declarations", param=where)
        chosen = list(dict.fromkeys(allowed or []))
        if len(chosen) == 1:
            return {"type": "function", "function": {"name": chosen[0]}}
        if not chosen or set(chosen) == set(names):
            return "required"
        raise DialectError(
            f"{where}.allowedFunctionNames {chosen} is a subset of the declared functions: "
            "chat-completions can force one function or any, not a subset",
            param=f"{where}.allowedFunctionNames",
        )
    raise DialectError(f"{where}.mode {mode!r} is not AUTO, ANY, NONE or VALIDATED", param=where)


def _integer(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise DialectError(f"'{where}' must be an integer, got {value!r}", param=where)
    return int(value)


def _generation(config: Any, chat: dict[str, Any], context: dict[str, Any]) -> None:
    config = _object(config, "generationConfig")
    unknown = _unknown(config, SAMPLING_FIELDS)
    if unknown:
        raise DialectError(
            f"generationConfig has unsupported field(s) {unknown}: no chat-completions equivalent",
            param=f"generationConfig.{unknown[0]}",
        )
    where = "generationConfig."
    for google, name in (
        ("temperature", "temperature"),
        ("topP", "top_p"),
        ("presencePenalty", "presence_penalty"),
        ("frequencyPenalty", "frequency_penalty"),
    ):
        if _has(config, google):
            chat[name] = _get(config, google)
    for google, name in (("topK", "top_k"), ("maxOutputTokens", "max_tokens"), ("seed", "seed")):
        if _has(config, google):
            chat[name] = _integer(_get(config, google), where + google)
    if _has(config, "stopSequences"):
        chat["stop"] = list(_list(_get(config, "stopSequences"), where + "stopSequences"))
    if _has(config, "candidateCount"):
        count = _integer(_get(config, "candidateCount"), where + "candidateCount")
        if count != 1:
            raise DialectError(
                f"candidateCount={count}: the proxy captures one sample per call",
                param=where + "candidateCount",
            )
    if _get(config, "responseLogprobs") or _get(config, "logprobs"):
        raise DialectError(
            "responseLogprobs/logprobs are not returned in the Google dialect (the proxy "
            "records the engine's logprobs itself)",
            param=where + "responseLogprobs",
        )
    modalities = _get(config, "responseModalities")
    if modalities is not None:
        modalities = _list(modalities, where + "responseModalities")
    if modalities is not None and {str(m).upper() for m in modalities} - {"TEXT"}:
        raise DialectError(
            f"responseModalities {modalities}: the engine answers text only",
            param=where + "responseModalities",
        )
    mime = str(_get(config, "responseMimeType") or "text/plain").lower()
    schema = _get(config, "responseJsonSchema")
    if schema is None and _has(config, "responseSchema"):
        schema = json_schema(_get(config, "responseSchema"))
    if mime == "application/json":
        if schema is None:
            chat["response_format"] = {"type": "json_object"}
        else:
            chat["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "response", "schema": schema},
            }
    elif mime != "text/plain" or schema is not None:
        raise DialectError(
            f"responseMimeType {mime!r} with "
            f"{'a' if schema is not None else 'no'} schema: only text/plain, or application/json "
            "with or without a schema, can be served",
            param=where + "responseMimeType",
        )
    thinking = _get(config, "thinkingConfig")
    if thinking is not None:
        thinking = _object(thinking, where + "thinkingConfig")
        unknown = _unknown(thinking, ("includeThoughts", "thinkingBudget", "thinkingLevel"))
        if unknown:
            raise DialectError(
                f"thinkingConfig has unsupported field(s) {unknown}",
                param=where + "thinkingConfig",
            )
        if _get(thinking, "includeThoughts") is False:
            context["include_thoughts"] = False
        if _get(thinking, "thinkingBudget") == 0:
            chat["chat_template_kwargs"] = {"enable_thinking": False}


def translate(body: dict[str, Any], stream_hint: bool | None) -> Translated:
    """A ``GenerateContentRequest`` as a chat-completions body."""
    unknown = _unknown(body, _KNOWN_TOP)
    if _has(body, "cachedContent"):
        raise DialectError(
            "cachedContent cannot be resolved by the proxy: send the full contents",
            param="cachedContent",
        )
    if unknown:
        raise DialectError(f"unsupported request field(s) {unknown}", param=unknown[0])
    chat: dict[str, Any] = {"messages": _messages(body)}
    context: dict[str, Any] = {"include_thoughts": True}
    tools = _tools(_get(body, "tools") or [])
    if tools:
        chat["tools"] = tools
    names = [t["function"]["name"] for t in tools]
    if _has(body, "toolConfig"):
        choice = _tool_choice(_get(body, "toolConfig"), names)
        if choice is not None:
            chat["tool_choice"] = choice
    if _has(body, "generationConfig"):
        _generation(_get(body, "generationConfig"), chat, context)
    return Translated(chat=chat, stream=bool(stream_hint), context=context)


# ---- reply -----------------------------------------------------------------------------------


def _call_args(arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    if not isinstance(arguments, str) or not arguments.strip():
        return {}
    try:
        parsed = json.loads(arguments)
    except ValueError:
        parsed = None
    return parsed if isinstance(parsed, dict) else {RAW_ARGUMENTS_KEY: arguments}


def _usage(usage: Any) -> dict[str, int]:
    usage = usage if isinstance(usage, dict) else {}
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    details = usage.get("completion_tokens_details") or {}
    thoughts = int(details.get("reasoning_tokens") or 0) if isinstance(details, dict) else 0
    out = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": completion - thoughts,
        "totalTokenCount": int(usage.get("total_tokens") or prompt + completion),
    }
    if thoughts:
        out["thoughtsTokenCount"] = thoughts
    return out


def reply(chat_reply: dict[str, Any], translated: Translated) -> dict[str, Any]:
    """A chat-completions reply as a ``GenerateContentResponse``."""
    choices = chat_reply.get("choices") or [{}]
    choice = choices[0] or {}
    message = choice.get("message") or {}
    parts: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning and translated.context.get("include_thoughts", True):
        parts.append({"text": reasoning, "thought": True})
    content = message.get("content")
    if isinstance(content, list):  # content parts: keep their text
        content = "".join(p.get("text") or "" for p in content if isinstance(p, dict))
    if content:
        parts.append({"text": content})
    for i, call in enumerate(message.get("tool_calls") or []):
        fn = call.get("function") or {}
        part_call: dict[str, Any] = {
            "name": fn.get("name") or "",
            "args": _call_args(fn.get("arguments")),
        }
        part_call["id"] = call.get("id") or f"call_{i}"
        parts.append({"functionCall": part_call})
    if not parts:
        parts.append({"text": ""})
    finish = _FINISH.get(choice.get("finish_reason") or "stop", "OTHER")
    return {
        "candidates": [
            {
                "content": {"role": "model", "parts": parts},
                "finishReason": finish,
                "index": 0,
            }
        ],
        "usageMetadata": _usage(chat_reply.get("usage")),
        "modelVersion": chat_reply.get("model") or "rollwire",
        "responseId": chat_reply.get("id") or "rollwire",
    }


def _text_chunks(text: str, words: int = 8) -> list[str]:
    pieces = re.findall(r"\S+\s*|\s+", text)
    return ["".join(pieces[k : k + words]) for k in range(0, len(pieces), words)] or [text]


def sse(dialect_reply: dict[str, Any], translated: Translated) -> Iterator[bytes]:
    """The reply as ``alt=sse`` events: one part per chunk (text in pieces), every chunk with
    content (the SDK's chat history drops a turn with an empty chunk), the last one with the
    finish reason and usage. The chunks' parts concatenate to the whole reply's parts."""
    candidate = dialect_reply["candidates"][0]
    pieces: list[dict[str, Any]] = []
    for part in candidate["content"]["parts"]:
        if part.get("text"):
            for chunk in _text_chunks(part["text"]):
                pieces.append({**part, "text": chunk})
        else:
            pieces.append(part)
    base = {k: dialect_reply[k] for k in ("modelVersion", "responseId") if k in dialect_reply}
    for k, part in enumerate(pieces):
        out: dict[str, Any] = {"content": {"role": "model", "parts": [part]}, "index": 0}
        event: dict[str, Any] = {"candidates": [out], **base}
        if k == len(pieces) - 1:
            out["finishReason"] = candidate.get("finishReason", "STOP")
            event["usageMetadata"] = dialect_reply.get("usageMetadata")
        yield b"data: " + orjson.dumps(event) + b"\r\n\r\n"


# ---- count, models, errors -------------------------------------------------------------------


def _count(value: Any) -> int:
    if isinstance(value, dict):
        media = 0
        rest = value
        for key in ("inlineData", "inline_data", "fileData", "file_data"):
            if key in value:
                media += MEDIA_TOKENS
                rest = {k: v for k, v in rest.items() if k != key}
        return media + sum(estimate_tokens(k) + _count(v) for k, v in rest.items())
    if isinstance(value, list):
        return sum(_count(v) for v in value)
    return estimate_tokens(value)


def count_tokens(body: dict[str, Any]) -> dict[str, Any]:
    """``{"totalTokens": N}``, estimated from every field of the request (contents and all their
    parts, systemInstruction, tools, and a nested generateContentRequest); media parts count as
    one image each. Never recorded as a turn."""
    counted = {k: v for k, v in body.items() if k != "model"}
    nested = _get(counted, "generateContentRequest")
    if isinstance(nested, dict):
        counted.pop("generateContentRequest", None)
        counted.pop("generate_content_request", None)
        counted["_request"] = {k: v for k, v in nested.items() if k != "model"}
    return {"totalTokens": _count(counted)}


def models(served: list[str]) -> dict[str, Any]:
    """Google's model list: ``{"models": [{"name": "models/<id>", ...}]}``."""
    return {
        "models": [
            {
                "name": f"models/{model}",
                "baseModelId": model,
                "version": "rollwire",
                "displayName": model,
                "description": "served through the rollwire capture proxy",
                "supportedGenerationMethods": [
                    "generateContent",
                    "streamGenerateContent",
                    "countTokens",
                ],
            }
            for model in served
        ]
    }


def error(status: int, message: str, param: str | None) -> dict[str, Any]:
    """Google's error body: ``{"error": {"code", "message", "status"}}`` (a field violation in
    ``details`` when a field is named)."""
    default = "INVALID_ARGUMENT" if status < 500 else "INTERNAL"
    body: dict[str, Any] = {
        "code": status,
        "message": message,
        "status": _STATUS.get(status, default),
    }
    if param:
        body["details"] = [
            {
                "@type": "type.googleapis.com/google.rpc.BadRequest",
                "fieldViolations": [{"field": param, "description": message}],
            }
        ]
    return {"error": body}


DIALECT = Dialect(
    name=NAME,
    routes=(
        RouteSpec("POST", "/v1beta/models/{rest:path}", "turn"),
        RouteSpec("POST", "/v1/models/{rest:path}", "turn"),
        RouteSpec("GET", "/v1beta/models", "models"),
    ),
    session_key=session_key,
    translate=translate,
    reply=reply,
    sse=sse,
    count_tokens=count_tokens,
    models=models,
    error=error,
    action=action,
    sampling_fields=SAMPLING_FIELDS,
)
