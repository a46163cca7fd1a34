"""Hermes-style tool calls written in text, for models and templates with no native tool calls.

The manifest is described in the system message; the model answers a call as
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; history renders a call the same way,
so a conversation keeps its exact token prefix when the model wrote canonical JSON. Used by the
reference engine (SmolLM2's template has no tool section) and by the tool loop's text format.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any


class ToolFormatError(ValueError):
    """A message the text tool format cannot carry; ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def text_of(content: Any, where: str) -> str:
    """Message content as plain text; non-text parts are refused (this engine reads text only)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ToolFormatError(
                    f"{where}.content[{i}] is {kind!r}: the reference engine reads text only",
                    param=where,
                )
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise ToolFormatError(f"{where}.content must be a string or a list of text parts", param=where)


def call_text(name: str, arguments: Any) -> str:
    """How one call is written by the model and rendered in history."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def template_arguments(value: Any) -> Any:
    """Tool-call arguments as a chat template should get them to write what :func:`call_text`
    writes: the parsed value of a JSON string (an object, as templates expect), or, for text
    that is not JSON, its ``json.dumps`` string (a template writes strings verbatim)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            pass
    return json.dumps(value) if isinstance(value, str) else value


def manifest_prompt(tools: list[dict[str, Any]]) -> str:
    """The system-prompt section that offers the tools."""
    specs = "\n".join(json.dumps(t.get("function", t)) for t in tools)
    return (
        "You may call one or more functions to assist with the user query. "
        "Function signatures are within <tools></tools> XML tags:\n<tools>\n"
        f"{specs}\n</tools>\n"
        "For each function call, return a JSON object with the function name and arguments "
        'within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, '
        '"arguments": <args-json-object>}\n</tool_call>'
    )


def prepare_messages(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """Messages as the template expects them: text content, calls written out, tools offered."""
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        role = message.get("role")
        if not isinstance(role, str):
            raise ToolFormatError(f"{where} has no string 'role'", param=where)
        text = text_of(message.get("content"), where)
        calls = message.get("tool_calls") or []
        if role == "assistant" and calls:
            written = [
                call_text(
                    (c.get("function") or {}).get("name", ""),
                    (c.get("function") or {}).get("arguments"),
                )
                for c in calls
            ]
            text = "\n".join([text, *written]) if text else "\n".join(written)
        out.append({"role": role, "content": text})
    if tools:
        section = manifest_prompt(tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{section}"}
        else:
            out.insert(0, {"role": "system", "content": section})
    return out


def _call(name: str, arguments: str) -> dict[str, Any]:
    """One OpenAI-shaped tool call, with a vLLM-style id."""
    return {
        "id": f"chatcmpl-tool-{secrets.token_hex(8)}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


# vLLM's Hermes2ProToolParser pattern: the last call may be unclosed.
_VLLM_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


def parse_calls_as_vllm(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """vLLM's ``hermes`` parser as its ``extract_tool_calls`` reads a finished reply (used where
    rollwire parses for an engine: the completions token-in path). Stricter than
    :func:`parse_calls`: every ``<tool_call>`` body must be JSON with a ``name``, or nothing is
    a call and the whole text is content; arguments are re-serialised
    (``json.dumps(..., ensure_ascii=False)``); content is the text before the first tag, or None."""
    if "<tool_call>" not in text:
        return text, []
    try:
        found = [json.loads(a or b) for a, b in _VLLM_CALL.findall(text)]
        calls = [
            _call(str(obj["name"]), json.dumps(obj["arguments"], ensure_ascii=False))
            for obj in found
        ]
    except (ValueError, KeyError, TypeError):
        return text, []
    content = text[: text.find("<tool_call>")]
    return content or None, calls


def parse_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Split generated text into content and OpenAI-shaped tool calls (invalid JSON stays text)."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    last = 0
    for match in _CALL.finditer(text):
        try:
            obj = json.loads(match.group(1))
        except ValueError:
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            continue
        kept.append(text[last : match.start()])
        last = match.end()
        args = obj.get("arguments", {})
        calls.append(_call(obj["name"], args if isinstance(args, str) else json.dumps(args)))
    if not calls:
        return text, []
    kept.append(text[last:])
    return "".join(kept).strip(), calls
