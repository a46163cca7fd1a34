"""How a token prompt reaches each kind of engine (token-in continuation's engine seam).

A spliced prompt (:mod:`rollwire.capture.splice`) is a list of ids; engines take it in
different places. Each :class:`TokenPath` is data plus pure functions:

- ``vllm_chat``: vLLM chat with ``kv_transfer_params.prompt_token_ids`` (vLLM's pre-tokenized
  chat prompt). The engine still runs its own tool and reasoning parsers. Echo: the top-level
  ``prompt_token_ids``.
- ``sglang_chat``: SGLang chat with ``input_ids`` ("bypasses chat template tokenization;
  messages still used to derive stop tokens and tool_call_constraint"). Echo:
  ``choices[0].prompt_token_ids`` with ``return_prompt_token_ids``.
- ``completions``: ``/v1/completions`` with ``prompt=ids``, for engines whose chat route takes no
  token prompt. Completions do no tool or reasoning parsing, so the proxy parses the text with
  the parsers the engine would use (:data:`TOOL_PARSERS`, :data:`REASONING_PARSERS`) and gives
  the caller a chat reply. A forced ``tool_choice`` or a ``response_format`` needs the engine's
  guided decoding, which only its chat route applies: such calls fall back (rendered on chat).

Certification (:mod:`rollwire.capture.certify`) finds which paths an endpoint honours, in the
order of :data:`PATH_ORDER` (best first); the proxy sends every spliced call by one of them and
checks the echo.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rollwire.capture.dialects import hermes
from rollwire.capture.splice import Fallback

# Sampling fields a chat request shares with completions (copied when present).
_SAMPLING = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "ignore_eos",
    "min_tokens",
    "logit_bias",
    "stop_token_ids",
    "bad_words",
    "allowed_token_ids",
)


# ---- parsers ------------------------------------------------------------------------------------


def _no_tools(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    return text, []


ToolParser = Callable[[str], tuple[str | None, list[dict[str, Any]]]]
ReasoningParser = Callable[[str], tuple[str | None, str]]

TOOL_PARSERS: dict[str, ToolParser] = {
    # vLLM/SGLang ``hermes``: <tool_call>{"name": ..., "arguments": {...}}</tool_call>
    "hermes": hermes.parse_calls_as_vllm,
    "none": _no_tools,
}


def _no_reasoning(text: str) -> tuple[str | None, str]:
    return None, text


_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"


def _think(text: str) -> tuple[str | None, str]:
    """``<think>...</think>`` reasoning (vLLM's deepseek_r1/qwen3 parsers): what precedes the
    close is reasoning (the open tag may be in the prompt); a reply that opened a think block
    and never closed it is all reasoning."""
    if _THINK_CLOSE in text:
        reasoning, _, content = text.partition(_THINK_CLOSE)
        reasoning = (
            reasoning.removeprefix(_THINK_OPEN) if reasoning.startswith(_THINK_OPEN) else reasoning
        )
        return reasoning.strip("\n") or None, content.lstrip("\n")
    if text.startswith(_THINK_OPEN):
        return text.removeprefix(_THINK_OPEN).strip("\n") or None, ""
    return None, text


REASONING_PARSERS: dict[str, ReasoningParser] = {"none": _no_reasoning, "think": _think}


@dataclass(frozen=True)
class Parsers:
    """The engine's parsers, named as vLLM's ``--tool-call-parser`` / ``--reasoning-parser``."""

    tool: str = "hermes"
    reasoning: str = "none"

    def __post_init__(self) -> None:
        if self.tool not in TOOL_PARSERS:
            raise ValueError(f"unknown tool parser {self.tool!r}; known: {sorted(TOOL_PARSERS)}")
        if self.reasoning not in REASONING_PARSERS:
            raise ValueError(
                f"unknown reasoning parser {self.reasoning!r}; known: {sorted(REASONING_PARSERS)}"
            )


# ---- the paths ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenPath:
    """One way to give an engine a token prompt."""

    name: str
    route: str  # under the OpenAI base URL
    # (upstream chat body, ids, max_model_len) -> the body to send
    request: Callable[[dict[str, Any], list[int], int | None], dict[str, Any]]
    # the engine's reply -> the prompt ids it says it used (None: it did not say)
    echoed: Callable[[Any], list[int] | None]
    # a call this path cannot carry -> the fallback reason, else None
    refuses: Callable[[Mapping[str, Any]], str | None]
    # (engine reply, upstream chat body, parsers) -> a chat reply (normalise_reply then reads
    # any engine's chat reply in vLLM's shape)
    to_chat: Callable[[Any, Mapping[str, Any], Parsers], Any]
    # the request needs the context length (max_tokens is not optional on this route)
    needs_context: bool = False


def _never(_body: Mapping[str, Any]) -> str | None:
    return None


def _as_is(reply: Any, _body: Mapping[str, Any], _parsers: Parsers) -> Any:
    return reply


def _ids(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    ):
        return list(value)
    return None


def _first_choice(reply: Any) -> Mapping[str, Any]:
    choices = reply.get("choices") if isinstance(reply, Mapping) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):
        return choices[0]
    return {}


# vLLM chat ------------------------------------------------------------------------------------


def _vllm_request(body: dict[str, Any], ids: list[int], _ctx: int | None) -> dict[str, Any]:
    return {**body, "kv_transfer_params": {"prompt_token_ids": ids}}


def _vllm_echo(reply: Any) -> list[int] | None:
    return _ids(reply.get("prompt_token_ids")) if isinstance(reply, Mapping) else None


# SGLang chat ----------------------------------------------------------------------------------


def _sglang_request(body: dict[str, Any], ids: list[int], _ctx: int | None) -> dict[str, Any]:
    return {**body, "input_ids": ids, "return_prompt_token_ids": True, "return_meta_info": True}


def _sglang_echo(reply: Any) -> list[int] | None:
    return _ids(_first_choice(reply).get("prompt_token_ids"))


def normalise_reply(reply: Any) -> Any:
    """An engine's chat reply in vLLM's shape, which the capture reads. SGLang (0.5.23, fixtures
    tests/fixtures/sglang-cpu) returns the prompt ids on the choice (``prompt_token_ids``, with
    ``return_prompt_token_ids``), the sampled ids as ``choices[0].response_token_ids``, and
    ``logprobs.content`` naming tokens by text; its ``meta_info.output_token_logprobs`` (with
    ``return_meta_info``) pairs each sampled id with its logprob as ``[logprob, id, text]``.
    Those become vLLM's top-level ``prompt_token_ids``, ``choices[0].token_ids`` and
    ``token_id:N`` logprob entries. A vLLM reply is returned unchanged (and not scanned: it has
    no ``meta_info``). The proxy applies this once to every chat reply."""
    choice = _first_choice(reply)
    if not choice or not isinstance(reply, dict):
        return reply
    top: dict[str, Any] = {}
    if reply.get("prompt_token_ids") is None and _ids(choice.get("prompt_token_ids")) is not None:
        top["prompt_token_ids"] = list(choice["prompt_token_ids"])
    updates: dict[str, Any] = {}
    if choice.get("token_ids") is None and _ids(choice.get("response_token_ids")) is not None:
        updates["token_ids"] = list(choice["response_token_ids"])
    meta = choice.get("meta_info")
    if isinstance(meta, Mapping):
        lps = choice.get("logprobs")
        content = lps.get("content") if isinstance(lps, Mapping) else None
        by_id = isinstance(content, list) and all(
            isinstance(e, Mapping) and str(e.get("token", "")).startswith("token_id:")
            for e in content
        )
        rebuilt = None if by_id else _meta_logprobs(meta)
        if rebuilt is not None:
            updates["logprobs"] = {"content": rebuilt}
    if updates:
        top["choices"] = [{**choice, **updates}, *reply["choices"][1:]]
    return {**reply, **top} if top else reply


def _meta_logprobs(meta: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    entries = meta.get("output_token_logprobs")
    if not isinstance(entries, list):
        return None
    tops = meta.get("output_top_logprobs")
    out = []
    for i, entry in enumerate(entries or []):
        if not isinstance(entry, list | tuple) or len(entry) < 2:
            return None
        lp, tid = entry[0], entry[1]
        if not isinstance(tid, int) or isinstance(tid, bool):
            return None
        alts = (
            tops[i]
            if isinstance(tops, list) and i < len(tops) and isinstance(tops[i], list)
            else []
        )
        out.append(
            {
                "token": f"token_id:{tid}",
                "logprob": lp,
                "bytes": None,
                "top_logprobs": [
                    {"token": f"token_id:{a[1]}", "logprob": a[0], "bytes": None}
                    for a in alts
                    if isinstance(a, list | tuple) and len(a) >= 2
                ],
            }
        )
    return out


# completions ----------------------------------------------------------------------------------


def _completions_refuses(body: Mapping[str, Any]) -> str | None:
    choice = body.get("tool_choice")
    if body.get("tools") and (choice == "required" or isinstance(choice, Mapping)):
        return "tool_choice_forced"
    if body.get("response_format") not in (None, {"type": "text"}):
        return "response_format"
    return None


def completion_request(body: Mapping[str, Any], ids: list[int], ctx: int | None) -> dict[str, Any]:
    """The ``/v1/completions`` request for a chat call's spliced prompt."""
    wanted = body.get("max_completion_tokens") or body.get("max_tokens")
    if wanted is None:
        # Completions default to 16 tokens where chat runs to the context: give the room left.
        if ctx is None:
            raise Fallback(
                "max_tokens_unknown",
                "no max_tokens and the endpoint lists no max_model_len (completions default to 16)",
            )
        wanted = ctx - len(ids)
        if wanted < 1:
            raise Fallback("context_full", f"the spliced prompt ({len(ids)}) fills the context")
    top = body.get("top_logprobs")
    out: dict[str, Any] = {
        "model": body.get("model"),
        "prompt": ids,
        "max_tokens": int(wanted),
        "add_special_tokens": False,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        # vLLM's hermes parser turns this off too when tools are offered: the markup must stay
        "skip_special_tokens": not body.get("tools"),
        "logprobs": top if isinstance(top, int) and top >= 0 else 0,
        "n": 1,
        "stream": False,
    }
    for key in _SAMPLING:
        if body.get(key) is not None:
            out[key] = body[key]
    return out


def _completions_echo(reply: Any) -> list[int] | None:
    return _ids(_first_choice(reply).get("prompt_token_ids"))


def _chat_logprobs(lps: Any, k: int) -> dict[str, Any] | None:
    """Completions logprobs (parallel lists; per position a dict of the sampled token, then the
    top k by rank) as chat's ``logprobs.content``, whose ``top_logprobs`` is the first k of that
    dict in order (vLLM 0.32, fixtures 12c/12e: the same sample on both routes)."""
    if not isinstance(lps, Mapping):
        return None
    tokens, values, tops = lps.get("tokens"), lps.get("token_logprobs"), lps.get("top_logprobs")
    if not isinstance(tokens, list) or not isinstance(values, list) or len(tokens) != len(values):
        return None
    content = []
    for i, (token, value) in enumerate(zip(tokens, values, strict=True)):
        top = tops[i] if isinstance(tops, list) and i < len(tops) else None
        alts = list(top.items())[:k] if isinstance(top, Mapping) else []
        content.append(
            {
                "token": token,
                "logprob": value,
                "bytes": None,  # the sampled piece's bytes: completions do not give them
                "top_logprobs": [
                    {"token": t, "logprob": v, "bytes": list(str(t).encode())} for t, v in alts
                ],
            }
        )
    return {"content": content}


CLOSE_TEXT = re.compile(r"(<\|im_end\|>|<\|eot_id\|>|<\|end\|>|</s>)\s*$")


def chat_from_completion(reply: Any, body: Mapping[str, Any], parsers: Parsers) -> Any:
    """A ``/v1/completions`` reply as the chat reply vLLM would have given for the same ids:
    reasoning and tool calls parsed from the text, ``tool_calls`` as the finish reason."""
    if not isinstance(reply, Mapping):
        return reply
    choice = _first_choice(reply)
    if not choice:
        return {**reply, "object": "chat.completion", "choices": []}
    text = str(choice.get("text") or "")
    if body.get(
        "tools"
    ):  # special tokens were kept for the parser: a trailing close is not content
        text = CLOSE_TEXT.sub("", text)
    reasoning, rest = REASONING_PARSERS[parsers.reasoning](text)
    calls: list[dict[str, Any]] = []
    content: str | None = rest
    if body.get("tools") and body.get("tool_choice") != "none":
        content, calls = TOOL_PARSERS[parsers.tool](rest)
    # vLLM 0.32's chat message, key for key (fixtures 02, 05a)
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
    }
    if calls:
        message["tool_calls"] = calls
    message["reasoning"] = reasoning
    finish = choice.get("finish_reason")
    if calls and finish == "stop":
        finish = "tool_calls"
    top = body.get("top_logprobs")
    rid = str(reply.get("id") or "")
    # vLLM 0.32's chat reply, key for key (fixture 02)
    return {
        "id": "chatcmpl-" + rid.removeprefix("cmpl-"),
        "object": "chat.completion",
        "created": reply.get("created"),
        "model": reply.get("model"),
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": _chat_logprobs(
                    choice.get("logprobs"), top if isinstance(top, int) else 0
                ),
                "finish_reason": finish,
                "stop_reason": choice.get("stop_reason"),
                "token_ids": choice.get("token_ids"),
                "routed_experts": None,
            }
        ],
        "service_tier": reply.get("service_tier"),
        "system_fingerprint": reply.get("system_fingerprint"),
        "usage": reply.get("usage"),
        "prompt_logprobs": None,
        "prompt_token_ids": choice.get("prompt_token_ids"),
        "prompt_text": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


PATHS: dict[str, TokenPath] = {
    "vllm_chat": TokenPath(
        "vllm_chat", "/chat/completions", _vllm_request, _vllm_echo, _never, _as_is
    ),
    "sglang_chat": TokenPath(
        "sglang_chat", "/chat/completions", _sglang_request, _sglang_echo, _never, _as_is
    ),
    "completions": TokenPath(
        "completions",
        "/completions",
        completion_request,
        _completions_echo,
        _completions_refuses,
        chat_from_completion,
        needs_context=True,
    ),
}

# Best first: the chat routes keep the engine's own parsers and guided decoding.
PATH_ORDER: tuple[str, ...] = ("vllm_chat", "sglang_chat", "completions")
