"""The OpenAI chat-completions dialect: what goes upstream, and how the reply goes back.

Pure functions over JSON-shaped dicts. Upstream always gets ``stream=false`` and ``n=1`` and, at
the tokens tier, the fields that make the engine return its own ids and processed logprobs, with
every knob that reshapes the sampling distribution set to its no-op value (the trainer recomputes
logprobs over the full vocabulary, so a truncated distribution would make them disagree).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from rollwire.capture.findings import Finding, info, warn
from rollwire.capture.rollout import CaptureLevel

NAME = "chat"

# Knobs that reshape the distribution, and the value under which each is a no-op (vLLM's names).
NO_OP_SAMPLING: dict[str, Any] = {
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}
_DROPPED_AT_TOKENS = ("logit_bias",)
RECORDED_PARAMS = (
    "temperature",
    *NO_OP_SAMPLING,
    "logit_bias",
    "seed",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "stop",
)


class RequestError(ValueError):
    """A caller's request that cannot be served; ``param`` names the offending field."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status


@dataclass
class Prepared:
    """A caller's request made ready for the engine, with what changed and why."""

    upstream: dict[str, Any]
    stream: bool
    include_usage: bool
    wants_logprobs: bool
    wants_token_ids: bool
    requested: dict[str, Any] = field(default_factory=dict)
    applied: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)


def validate_request(body: Any) -> dict[str, Any]:
    """The request as a dict, or a RequestError naming the field that is wrong."""
    if not isinstance(body, dict):
        raise RequestError(f"request body must be a JSON object, got {type(body).__name__}")
    messages = body.get("messages")
    if messages is None:
        raise RequestError("missing required field 'messages'", param="messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(
            "'messages' must be a non-empty list of message objects", param="messages"
        )
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(
                f"messages[{i}] must be an object with a string 'role'", param=f"messages[{i}]"
            )
    stream = body.get("stream", False)
    if not isinstance(stream, bool | None):
        raise RequestError(f"'stream' must be a boolean, got {stream!r}", param="stream")
    n = body.get("n", 1)
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise RequestError(f"'n' must be a positive integer, got {n!r}", param="n")
    return body


def prepare(
    body: dict[str, Any],
    *,
    model: str,
    capture_level: CaptureLevel,
    drop_params: tuple[str, ...] = (),
) -> Prepared:
    """Build the upstream request for a validated caller request."""
    up = dict(body)
    findings: list[Finding] = []
    requested = {k: body[k] for k in RECORDED_PARAMS if k in body}
    stream = bool(body.get("stream"))
    options = body.get("stream_options")
    include_usage = bool(isinstance(options, dict) and options.get("include_usage"))
    wants_logprobs = bool(body.get("logprobs"))
    wants_ids = bool(body.get("return_token_ids"))

    requested_model = body.get("model")
    up["model"] = model
    if requested_model not in (None, model):
        requested["model"] = requested_model
    up["stream"] = False
    up.pop("stream_options", None)
    n = body.get("n")
    if n not in (None, 1):
        msg = f"n={n} was requested; the proxy captures one sample per call, so n=1 was applied"
        findings.append(warn("n_forced", msg))
    up["n"] = 1
    if isinstance(body.get("tools"), list) and not body["tools"]:
        # vLLM answers 400 to `tools: []`, which silently truncates an agent's trajectory.
        up.pop("tools")
        up.pop("tool_choice", None)
        findings.append(
            info("empty_tools_dropped", "an empty 'tools' list was dropped before forwarding")
        )

    if capture_level is CaptureLevel.TOKENS:
        up["return_token_ids"] = True
        # SGLang's names for the prompt ids and the sampled ids' logprobs (vLLM ignores them);
        # rollwire.capture.token_paths.normalise_reply reads them back in vLLM's shape.
        up["return_prompt_token_ids"] = True
        up["return_meta_info"] = True
        up["logprobs"] = True
        if not isinstance(up.get("top_logprobs"), int) or not wants_logprobs:
            up["top_logprobs"] = 0
        for knob, no_op in NO_OP_SAMPLING.items():
            if knob in body and body[knob] is not None and body[knob] != no_op:
                msg = (
                    f"{knob}={body[knob]!r} was requested; {no_op!r} was applied, because a "
                    "reshaped distribution makes the captured logprobs disagree with the trainer's"
                )
                findings.append(warn("sampling_param_forced", msg))
            up[knob] = no_op
        for knob in _DROPPED_AT_TOKENS:
            if up.pop(knob, None):
                findings.append(warn("sampling_param_dropped", f"{knob} was requested and dropped"))
    for param in drop_params:  # the endpoint rejected these at certification
        if up.pop(param, None) is not None:
            findings.append(
                info("param_fix_applied", f"{param!r} dropped: the endpoint rejects it")
            )
    applied = {k: up[k] for k in RECORDED_PARAMS if k in up}
    return Prepared(
        upstream=up,
        stream=stream,
        include_usage=include_usage,
        wants_logprobs=wants_logprobs,
        wants_token_ids=wants_ids,
        requested=requested,
        applied=applied,
        findings=findings,
    )


def caller_reply(reply: dict[str, Any], prepared: Prepared) -> dict[str, Any]:
    """The engine's reply as the caller asked for it: fields it did not ask for are nulled."""
    out = dict(reply)
    if not prepared.wants_token_ids and "prompt_token_ids" in out:
        out["prompt_token_ids"] = None
    choices = []
    for choice in reply.get("choices") or []:
        c = dict(choice)
        if not prepared.wants_logprobs:
            c["logprobs"] = None
        if not prepared.wants_token_ids and "token_ids" in c:
            c["token_ids"] = None
        choices.append(c)
    out["choices"] = choices
    return out


#: Tokens a chat template may add per message (role markers, separators) and once per prompt.
_TEMPLATE_TOKENS_PER_MESSAGE = 8
_TEMPLATE_TOKENS_PER_PROMPT = 64


def prompt_upper_bound(body: Mapping[str, Any]) -> int:
    """A bound no rendered prompt of ``body`` exceeds, with no tokenizer: every token of a
    byte-level (or byte-fallback) tokenizer covers at least one byte, so the UTF-8 size of the
    messages, tools and template kwargs as JSON (which only adds bytes), plus the template's
    own tokens, is at least the prompt's length in tokens."""
    parts = {k: body.get(k) for k in ("messages", "tools", "chat_template_kwargs")}
    size = len(orjson.dumps(parts))
    n_messages = len(body.get("messages") or ())
    return size + _TEMPLATE_TOKENS_PER_MESSAGE * n_messages + _TEMPLATE_TOKENS_PER_PROMPT


def error_body(
    message: str, *, type_: str, param: str | None = None, code: int | str | None = None
) -> dict[str, Any]:
    """An error in the OpenAI shape: ``{"error": {message, type, param, code}}``."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def sse_replay(reply: dict[str, Any], prepared: Prepared) -> Iterator[bytes]:
    """Replay a finished reply as a well-formed chat-completions SSE stream."""
    base = {
        "id": reply.get("id") or "chatcmpl-rollwire",
        "object": "chat.completion.chunk",
        "created": reply.get("created") or 0,
        "model": reply.get("model"),
    }
    if reply.get("system_fingerprint"):
        base["system_fingerprint"] = reply["system_fingerprint"]
    choice = (reply.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    first = {
        **base,
        "choices": [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ],
    }
    if prepared.wants_token_ids:
        first["prompt_token_ids"] = reply.get("prompt_token_ids")
    yield _sse(first)
    for key in ("reasoning_content", "reasoning"):
        if message.get(key):
            delta = {key: message[key]}
            yield _sse(
                {
                    **base,
                    "choices": [
                        {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
                    ],
                }
            )
    content = message.get("content")
    if content:
        c: dict[str, Any] = {
            "index": 0,
            "delta": {"content": content},
            "logprobs": None,
            "finish_reason": None,
        }
        if prepared.wants_logprobs:
            c["logprobs"] = choice.get("logprobs")
        if prepared.wants_token_ids:
            c["token_ids"] = choice.get("token_ids")
        yield _sse({**base, "choices": [c]})
    calls = message.get("tool_calls") or []
    if calls:
        deltas = [
            {
                "index": i,
                "id": call.get("id"),
                "type": call.get("type", "function"),
                "function": {
                    "name": (call.get("function") or {}).get("name"),
                    "arguments": (call.get("function") or {}).get("arguments", ""),
                },
            }
            for i, call in enumerate(calls)
        ]
        yield _sse(
            {
                **base,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"tool_calls": deltas},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
            }
        )
    last = {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": choice.get("finish_reason") or "stop",
    }
    yield _sse({**base, "choices": [last]})
    if prepared.include_usage:
        yield _sse({**base, "choices": [], "usage": reply.get("usage")})
    yield b"data: [DONE]\n\n"
