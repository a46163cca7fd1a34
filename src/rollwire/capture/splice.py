"""Token-in continuation: send the engine the model's own earlier tokens, tokenise only what is new.

Linking turns by exact token prefix is correct, but on real engines conversations fragment: the
sampler picks token splits that re-tokenising the same text does not give, and chat templates
re-render (or drop) earlier tool calls. The cure is to build call k+1's prompt as
``P_k + S_k' + X``:

- ``P_k``, ``S_k``: call k's prompt and sampled ids, exactly as the engine saw and produced them;
  ``S_k'`` ends at the model's turn-close token (synthesised, and then listed, when call k did
  not end with it: cut by the length cap, or stopped on a stop string or another end token);
- ``X``: the engine's own rendering of what is new (tool results, a user message, the
  generation prompt), cut from a full render at the N-th turn-close token, where N is the
  number of closes in the render of the history up to call k's reply. Counting closes, not
  positions, makes re-rendered tool calls and reasoning before the cut irrelevant.

Everything here is pure: :func:`plan_call` decides (parent or fallback with a reason);
:func:`splice` builds the prompt from two token lists the caller got from the engine's
``/tokenize``. The proxy does the I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

Mode = Literal["off", "auto", "required"]
ReasoningPolicy = Literal["keep", "fork"]

# Keys of a message that carry no content the model sees (wire-only), ignored when matching.
_WIRE_ONLY = frozenset({"refusal", "annotations", "audio", "function_call", "name", "index"})


_TEXT_KEYS = frozenset({"content", "tool_calls", "reasoning_content", "reasoning"})


class Fallback(Exception):
    """This call cannot be spliced; ``reason`` names why (recorded as ``fallback:<reason>``)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


def _json_value(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def _content(value: Any) -> Any:
    """``""`` and None are the same; a list of text parts is its text."""
    if value is None or value == "":
        return None
    if isinstance(value, list) and all(
        isinstance(p, Mapping) and p.get("type") == "text" for p in value
    ):
        return "".join(str(p.get("text", "")) for p in value) or None
    return value


def normalise_message(message: Mapping[str, Any], *, with_reasoning: bool) -> Any:
    """A message as the model sees it: wire-only keys dropped, tool arguments as JSON values,
    ``""`` as None; ``reasoning_content`` only when ``with_reasoning``."""
    out: dict[str, Any] = {"role": message.get("role")}
    content = _content(message.get("content"))
    if content is not None:
        out["content"] = content
    calls = message.get("tool_calls") or []
    if calls:
        out["tool_calls"] = [
            {
                "id": c.get("id"),
                "name": (c.get("function") or {}).get("name"),
                "arguments": _json_value((c.get("function") or {}).get("arguments")),
            }
            for c in calls
            if isinstance(c, Mapping)
        ]
    if message.get("tool_call_id") is not None:
        out["tool_call_id"] = message.get("tool_call_id")
    # vLLM 0.32 names the parsed reasoning ``reasoning``; older vLLM and SGLang
    # ``reasoning_content``: one thing, compared under one key.
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if with_reasoning and reasoning:
        out["reasoning_content"] = reasoning
    for key, value in message.items():
        if key in out or key in _WIRE_ONLY or key in _TEXT_KEYS:
            continue
        if value is not None:
            out[key] = value
    return out


def header_key(body: Mapping[str, Any]) -> bytes:
    """What, besides the messages, changes the rendered prompt: tools, chat template kwargs."""
    return orjson.dumps(
        {"tools": body.get("tools") or None, "kwargs": body.get("chat_template_kwargs") or None},
        option=orjson.OPT_SORT_KEYS,
    )


def _has_media(messages: Sequence[Mapping[str, Any]]) -> bool:
    for m in messages:
        content = m.get("content")
        if isinstance(content, list) and any(
            isinstance(p, Mapping) and p.get("type") not in ("text", None) for p in content
        ):
            return True
    return False


@dataclass
class CallMemory:
    """What a later call needs from an earlier one of the same session."""

    node_id: str
    messages: list[dict[str, Any]]  # the request's messages
    reply: dict[str, Any]  # the assistant message the engine returned
    header: bytes  # header_key of the request
    prompt_ids: list[int]
    sampled_ids: list[int]
    finish_reason: str | None
    close_id: int | None  # the turn-close token this call ended with, if it ended by itself
    # history_key per reasoning mode, made once: a session's later calls compare against it.
    _keys: dict[bool, bytes] = field(default_factory=dict, repr=False, compare=False)

    def history_key(self, with_reasoning: bool) -> bytes:
        """The key of this call's history (its messages and its reply), see prefix_keys."""
        key = self._keys.get(with_reasoning)
        if key is None:
            history = [*self.messages, self.reply]
            key = prefix_keys(history, with_reasoning=with_reasoning)[-1]
            self._keys[with_reasoning] = key
        return key


def prefix_keys(messages: Sequence[Mapping[str, Any]], *, with_reasoning: bool) -> list[bytes]:
    """``keys[i]`` identifies ``messages[: i + 1]`` as the model sees them (normalised): equal
    keys, equal histories. One pass, so matching a request against every earlier call of a
    session costs one key comparison per call instead of re-normalising each history."""
    digest = hashlib.sha256()
    keys = []
    for message in messages:
        digest.update(
            orjson.dumps(
                normalise_message(message, with_reasoning=with_reasoning),
                option=orjson.OPT_SORT_KEYS,
            )
        )
        digest.update(b"\n")
        keys.append(digest.copy().digest())
    return keys


@dataclass
class Parent:
    """The earlier call a new call continues: its reply is ``messages[index]``."""

    memory: CallMemory
    index: int


def plan_call(
    body: Mapping[str, Any],
    memories: Sequence[CallMemory],
    *,
    reasoning: ReasoningPolicy = "keep",
) -> Parent | None:
    """The parent to splice onto, None for a first call (nothing to carry), or
    :class:`Fallback` (raised) naming why a continuation cannot be spliced."""
    messages = body.get("messages") or []
    assistants = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if not assistants:
        return None  # a fresh conversation: rendered as usual
    n = body.get("n")
    if isinstance(n, int) and n > 1:
        raise Fallback("n_gt_1", f"n={n}: several samples cannot share one continuation")
    if body.get("stop"):
        raise Fallback("stop_strings", "stop strings cut mid-token")
    if _has_media(messages):
        raise Fallback("multimodal", "non-text content is always rendered")
    if not memories:
        raise Fallback(
            "assistant_not_sampled",
            "the history holds assistant messages no call of this session sampled "
            "(a resumed or few-shot conversation)",
        )
    header = header_key(body)
    with_reasoning = reasoning == "fork"
    wanted = prefix_keys(messages, with_reasoning=with_reasoning)
    plain = prefix_keys(messages, with_reasoning=False) if with_reasoning else wanted
    best: Parent | None = None
    near: str | None = None
    for memory in memories:
        size = len(memory.messages) + 1
        if size >= len(messages):
            continue
        if memory.history_key(with_reasoning) != wanted[size - 1]:
            if with_reasoning and memory.history_key(False) == plain[size - 1]:
                near = near or "reasoning_stripped"
            continue
        tail = [m.get("role") for m in messages[size:]]
        if "assistant" in tail or "system" in tail or tail.count("user") > 1:
            near = near or "assistant_not_sampled"
            continue
        if "user" in tail and tail[-1] != "user":
            near = near or "assistant_not_sampled"
            continue
        if memory.header != header:
            near = near or "tools_changed"
            continue
        if best is None or size > best.index + 1:
            best = Parent(memory, size - 1)
    if best is not None:
        return best
    raise Fallback(near or "edited_history", "no earlier call of this session is its history")


@dataclass
class Splice:
    """A spliced prompt and what it carries."""

    prompt_ids: list[int]
    carried_len: int  # prompt_ids[:carried_len] == parent prompt + sampled (+ synthesised)
    synthesized: list[int] = field(default_factory=list)  # positions in prompt_ids
    drift: int = 0  # positions where the canonical render of the history differs


def splice(
    parent: CallMemory,
    full: Sequence[int],
    history: Sequence[int],
    *,
    close_id: int,
) -> Splice:
    """Build ``P + S' + X`` from the engine's renders of the whole request (``full``, with the
    generation prompt) and of the history up to the parent's reply (``history``, without).

    Raises :class:`Fallback` when the renders do not line up with what was sampled.
    """
    prompt, sampled = list(parent.prompt_ids), list(parent.sampled_ids)
    # The history ends at its last close: an engine that always appends the generation prompt
    # to a render (SGLang's /tokenize has no add_generation_prompt) gives the same cut.
    last = max((i for i, t in enumerate(history) if t == close_id), default=-1)
    history = list(history[: last + 1])
    synthesized: list[int] = []
    if not sampled or sampled[-1] != close_id:
        # Cut by the length cap, or ended on a stop string or another end token: the template
        # closes the turn, so the close is synthesised (a prompt position of the child, masked).
        synthesized = [len(prompt) + len(sampled)]
        sampled = [*sampled, close_id]
    carried = prompt + sampled
    n = history.count(close_id)
    if carried.count(close_id) != n:
        raise Fallback(
            "close_count_mismatch",
            f"{carried.count(close_id)} closes carried, {n} in the history's render "
            "(literal special-token text, or a template that drops turns)",
        )
    if list(full[: len(history)]) != list(history):
        raise Fallback("history_not_prefix", "the full render does not extend the history's")
    cut = _nth(full, close_id, n)
    if cut is None:
        raise Fallback("close_count_mismatch", "the full render has fewer closes")
    canonical = list(full[: cut + 1])
    drift = sum(a != b for a, b in zip(canonical, carried, strict=False)) + abs(
        len(canonical) - len(carried)
    )
    return Splice(
        prompt_ids=carried + list(full[cut + 1 :]),
        carried_len=len(carried),
        synthesized=synthesized,
        drift=drift,
    )


def _nth(ids: Sequence[int], token: int, n: int) -> int | None:
    if n <= 0:
        return -1
    seen = 0
    for i, t in enumerate(ids):
        if t == token:
            seen += 1
            if seen == n:
                return i
    return None
