"""A Hugging Face folder on torch (a checkpoint fine-tuned with transformers or TRL) as an engine.

The primitives :class:`~rollwire.engine.model.EngineModel` samples and scores over, and nothing
else: float32 weights on the CPU, a KV cache kept across steps (the prompt prefilled in one
forward pass, then one token per pass), the last position's logits in float32 (then
``log_softmax`` in float64, as the llama.cpp path does). :meth:`~EngineModel.score` repeats the
same pattern (``ids[:start]`` in one pass, then token by token), so re-scoring a capture gives
back the sampled logprobs.

The prompt is the folder's own chat template through ``apply_chat_template``: with ``tools=``
when the template renders tools itself (``rollwire convert`` writes
:data:`~rollwire.engine.template.HERMES_CHATML`, which renders exactly what the llama.cpp engine
renders), else over :func:`~rollwire.capture.dialects.hermes.prepare_messages` as the llama.cpp
path does. Needs the ``train`` extra (torch, transformers).
"""

from __future__ import annotations

import hashlib
import inspect
import re
import threading
from pathlib import Path
from typing import Any

import numpy as np

from rollwire.capture.dialects.hermes import prepare_messages
from rollwire.checkpoints import TensorSpec
from rollwire.engine.model import EngineError, EngineModel, usable_cpus
from rollwire.engine.template import hf_messages
from rollwire.extras import install_hint

TRAIN_EXTRA_HINT = install_hint("train")
_END_CANDIDATES = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>")
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_SAFETENSORS_DTYPES = {
    "torch.float64": "F64", "torch.float32": "F32", "torch.float16": "F16",
    "torch.bfloat16": "BF16", "torch.int64": "I64", "torch.int32": "I32", "torch.int16": "I16",
    "torch.int8": "I8", "torch.uint8": "U8", "torch.bool": "BOOL",
}  # fmt: skip


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte as the printable character that stands for it."""
    kept = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(kept)
    extra = 0
    for b in range(256):
        if b not in kept:
            kept.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(kept, map(chr, chars), strict=True))


def import_torch() -> tuple[Any, Any]:
    """``(torch, transformers)``, or an ImportError saying which extra to install."""
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise ImportError(
            f"torch and transformers are missing ({exc}): {TRAIN_EXTRA_HINT}"
        ) from exc
    return torch, transformers


class HFModel(EngineModel):
    """One Hugging Face causal LM in float32 on the CPU, with one KV cache; calls are serialised.

    ``n_ctx`` is capped at the config's ``max_position_embeddings``; ``n_threads`` sets torch's
    (process-wide) thread count, every CPU this process may use by default."""

    backend = "transformers"
    supports_weight_updates = True

    def __init__(
        self, path: Path | str, *, n_ctx: int = 8192, n_threads: int | None = None
    ) -> None:
        torch, transformers = import_torch()
        self._torch = torch
        self.path = Path(path)
        if not (self.path / "config.json").is_file():
            raise FileNotFoundError(
                f"{self.path}: not a Hugging Face model folder (no config.json)"
            )
        torch.set_num_threads(n_threads or usable_cpus())
        try:
            self._tok = transformers.AutoTokenizer.from_pretrained(self.path)
            self._model = transformers.AutoModelForCausalLM.from_pretrained(
                self.path, dtype=torch.float32
            )
        except (OSError, ValueError, KeyError) as exc:
            raise EngineError(f"{self.path}: cannot load the model: {exc}") from exc
        self._model.eval()
        config = self._model.config.get_text_config()
        self.n_vocab = int(self._model.get_output_embeddings().weight.shape[0])
        positions = getattr(config, "max_position_embeddings", None)
        self.n_ctx = min(n_ctx, positions) if positions else n_ctx
        template = self._tok.chat_template
        if not isinstance(template, str) or not template:
            raise EngineError(f"{self.path} has no chat template (tokenizer_config or .jinja)")
        # A template that reads `tools` writes the manifest itself; else rollwire writes it.
        self._renders_tools = re.search(r"\btools\b", template) is not None
        self._pieces, self._special = self._piece_table()
        self.eos_ids = set()
        for source in (config, getattr(self._model, "generation_config", None)):
            value = getattr(source, "eos_token_id", None)
            self.eos_ids.update([value] if isinstance(value, int) else value or [])
        primary = getattr(config, "eos_token_id", None)
        if isinstance(primary, list):
            primary = primary[0] if primary else None
        if primary is None:
            primary = self._tok.eos_token_id
        if primary is None:
            raise EngineError(f"{self.path} names no eos_token_id in its config or tokenizer")
        self.eos_id = int(primary)
        self.eos_ids.add(self.eos_id)
        for candidate in _END_CANDIDATES:
            ids = self.tokenize(candidate)
            if len(ids) == 1 and ids[0] in self._special:
                self.eos_ids.add(ids[0])
        self._cache: Any = None
        # transformers 5.x renamed the forward's `past_key_values` to `cache`
        forward = inspect.signature(self._model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in forward else "past_key_values"
        self._last: np.ndarray | None = None
        self._lock = threading.Lock()
        # What a checkpoint of this model holds, by name: the parameters (a tied weight once,
        # as save_pretrained writes it) and the persistent buffers.
        saved = set(self._model.state_dict())
        self._weights: dict[str, Any] = {
            **dict(self._model.named_parameters()),
            **{n: b for n, b in self._model.named_buffers() if n in saved},
        }

    # ---- text <-> ids -------------------------------------------------------------------------

    def _piece_table(self) -> tuple[list[bytes], set[int]]:
        """Every id's raw bytes, and the ids of special tokens (dropped by ``detokenize``)."""
        tok = self._tok
        added = {i: t for i, t in tok.added_tokens_decoder.items() if i < self.n_vocab}
        special = {i for i, t in added.items() if t.special}
        decoder = getattr(getattr(tok, "backend_tokenizer", None), "decoder", None)
        byte_level = "ByteLevel" in repr(decoder)
        inverse = {c: b for b, c in bytes_to_unicode().items()}
        strings = tok.convert_ids_to_tokens(list(range(min(len(tok), self.n_vocab))))
        pieces = [b""] * self.n_vocab  # rows past the tokenizer (embedding padding) decode to ""
        for i, s in enumerate(strings):
            if s is None:
                continue
            if i in added:
                pieces[i] = added[i].content.encode("utf-8")
            elif byte_level and all(c in inverse for c in s):
                pieces[i] = bytes(inverse[c] for c in s)
            elif (m := _BYTE_FALLBACK.fullmatch(s)) is not None:
                pieces[i] = bytes([int(m.group(1), 16)])
            else:  # SentencePiece-style: "▁" is a space
                pieces[i] = s.replace("\u2581", " ").encode("utf-8")
        return pieces, special

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
    ) -> str:
        """The folder's chat template: with ``tools=`` when it renders tools itself, else over
        ``prepare_messages`` (the manifest and calls written into the messages)."""
        from jinja2 import TemplateError

        try:
            if self._renders_tools:
                return self._tok.apply_chat_template(
                    hf_messages(messages),
                    tools=tools or None,
                    add_generation_prompt=add_generation_prompt,
                    tokenize=False,
                )
            return self._tok.apply_chat_template(
                prepare_messages(messages, tools),
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
            )
        except TemplateError as exc:
            raise EngineError(
                f"the chat template refused the messages: {exc}", "messages"
            ) from None

    def tokenize(self, text: str) -> list[int]:
        """Ids for text with special tokens parsed, nothing added (the template writes those)."""
        return list(self._tok(text, add_special_tokens=False)["input_ids"])

    def detokenize(self, ids: list[int], *, special: bool = False) -> str:
        """Text for ids (their bytes joined, then decoded); special tokens are dropped unless
        asked for."""
        pieces = self._pieces
        raw = b"".join(
            pieces[i] for i in ids if 0 <= i < len(pieces) and (special or i not in self._special)
        )
        return raw.decode("utf-8", errors="replace")

    def piece_bytes(self, token_id: int) -> bytes:
        """The raw bytes of one token (a special token: its text in UTF-8)."""
        return self._pieces[token_id] if 0 <= token_id < len(self._pieces) else b""

    # ---- weights ------------------------------------------------------------------------------

    def weight_specs(self) -> dict[str, TensorSpec]:
        """Every served tensor by its checkpoint name, with its safetensors dtype and shape."""
        return {
            name: TensorSpec(_SAFETENSORS_DTYPES.get(str(t.dtype), str(t.dtype)), tuple(t.shape))
            for name, t in self._weights.items()
        }

    def read_tensors(self, source: Path | bytes) -> dict[str, Any]:
        """The tensors of one safetensors file (a path, or its bytes), on the CPU; a float
        tensor holding NaN or inf is refused (it would serve a broken policy)."""
        from safetensors.torch import load, load_file

        tensors = load_file(str(source)) if isinstance(source, Path) else load(source)
        for name, t in tensors.items():
            if t.is_floating_point() and not bool(self._torch.isfinite(t).all()):
                raise EngineError(f"tensor {name!r} holds NaN or inf values", "update_info")
        return tensors

    def swap_weights(self, tensors: dict[str, Any]) -> None:
        """Copy checked tensors into the served ones, in place (cast to the served dtype)."""
        with self._torch.no_grad():
            for name, value in tensors.items():
                self._weights[name].copy_(value)
        self._cache = None  # a cache computed by the old weights is never continued

    def weight_checksums(self) -> dict[str, str]:
        """SHA-256 of each served tensor's bytes (as vLLM's /weight_checker computes them)."""
        torch = self._torch
        out = {}
        for name, t in self._weights.items():
            raw = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
            out[name] = hashlib.sha256(memoryview(raw)).hexdigest()
        return out

    def randomize_weights(self) -> None:
        """Overwrite every served tensor with uniform random values (vLLM's reset)."""
        torch = self._torch
        with torch.no_grad():
            for t in self._weights.values():
                t.copy_(torch.rand_like(t, dtype=torch.float32).to(t.dtype))
        self._cache = None

    # ---- compute ------------------------------------------------------------------------------

    def _forward(self, ids: list[int]) -> None:
        torch = self._torch
        with torch.inference_mode():
            out = self._model(
                input_ids=torch.tensor([ids], dtype=torch.long),
                use_cache=True,
                logits_to_keep=1,
                **{self._cache_kwarg: self._cache},  # the cache object grows in place
            )
        self._last = out.logits[0, -1].to(torch.float32).numpy()

    def _start(self, prompt_ids: list[int]) -> None:
        from transformers import DynamicCache

        self._cache = DynamicCache(config=self._model.config)  # empty every time
        self._forward(prompt_ids)

    def _logits(self) -> np.ndarray:
        assert self._last is not None, "_start first"
        return self._last

    def _advance(self, token: int) -> None:
        self._forward([token])
