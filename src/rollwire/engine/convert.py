"""``rollwire convert``: a GGUF chat model (default: the embedded SmolLM2) as a Hugging Face folder.

What a fine-tune starts from and what ``rollwire engine --model DIR`` (or vLLM) serves: float32
safetensors dequantised by transformers' GGUF loader, ``config.json`` without the GGUF
``quantization_config`` (vLLM refuses it), the tokenizer with
:data:`~rollwire.engine.template.HERMES_CHATML` as its chat template (the reference engine's
prompts, tool manifest and calls included, with ``{% generation %}`` marks for
``assistant_only_loss``), and a ``generation_config.json`` whose EOS ids are the turn ends the
engine stops on. Needs the ``train`` extra (torch, transformers, gguf, accelerate).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

from rollwire.engine.hf import TRAIN_EXTRA_HINT, import_torch
from rollwire.engine.model import default_model_path
from rollwire.engine.template import HERMES_CHATML

_END_CANDIDATES = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>")


class ConvertError(ValueError):
    """A conversion that cannot run (bad input path, occupied output folder)."""


@dataclass
class ConvertReport:
    """What a conversion wrote."""

    gguf: Path
    out: Path
    files: dict[str, int] = field(default_factory=dict)  # name -> bytes
    parameters: int = 0
    vocab_size: int = 0
    eos_token_ids: list[int] = field(default_factory=list)
    architecture: str = ""

    def describe(self) -> str:
        """A few lines for a person."""
        lines = [
            f"converted {self.gguf} -> {self.out}",
            f"  {self.architecture}, {self.parameters:,} parameters (float32), "
            f"vocabulary {self.vocab_size}, eos ids {self.eos_token_ids}",
            "  chat template: rollwire's HERMES_CHATML (the reference engine's prompts, "
            "tool calls included; {% generation %} marks for assistant_only_loss)",
        ]
        lines += [f"  {name:<28} {size / 1e6:9.1f} MB" for name, size in sorted(self.files.items())]
        lines.append(f"  serve it: rollwire engine --model {self.out}")
        return "\n".join(lines)


def check_paths(out: Path | str, gguf: Path | str | None, *, force: bool) -> tuple[Path, Path]:
    """``(gguf, out)`` resolved, or a ConvertError naming the bad path (before anything loads)."""
    source = Path(gguf).expanduser() if gguf is not None else default_model_path()
    if not source.is_file():
        raise ConvertError(f"{source}: no such GGUF file")
    if source.suffix.lower() != ".gguf":
        raise ConvertError(f"{source} is not a .gguf file")
    target = Path(out).expanduser()
    if target.exists() and not target.is_dir():
        raise ConvertError(f"{target} exists and is not a folder")
    if target.is_dir() and any(target.iterdir()) and not force:
        raise ConvertError(f"{target} is not empty: choose an empty folder or pass --force")
    return source, target


def convert_gguf(
    out: Path | str, gguf: Path | str | None = None, *, force: bool = False
) -> ConvertReport:
    """Write the GGUF model at ``gguf`` (default: the embedded SmolLM2) as a Hugging Face folder."""
    source, target = check_paths(out, gguf, force=force)
    torch, transformers = import_torch()
    try:
        import accelerate  # noqa: F401  (transformers' GGUF loader needs both)
        import gguf as _gguf  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"reading a GGUF needs gguf and accelerate ({exc}): {TRAIN_EXTRA_HINT}"
        ) from exc

    where, name = str(source.parent), source.name
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(where, gguf_file=name)
        loaded = transformers.AutoModelForCausalLM.from_pretrained(
            where, gguf_file=name, dtype=torch.float32
        )
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ConvertError(f"{source}: transformers cannot read it: {exc}") from exc

    # save_pretrained refuses a GGUF-loaded model: the same weights in a fresh model, no
    # quantization_config (vLLM: "Unknown quantization method: gguf").
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.eval()

    ends: list[int] = []
    primary = config.eos_token_id
    for value in [*(primary if isinstance(primary, list) else [primary])]:
        if isinstance(value, int) and value not in ends:
            ends.append(value)
    for candidate in _END_CANDIDATES:
        ids = tokenizer(candidate, add_special_tokens=False)["input_ids"]
        if len(ids) == 1 and ids[0] not in ends:
            ends.append(ids[0])
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=ends,
        pad_token_id=getattr(config, "pad_token_id", None),
    )

    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)
    tokenizer.chat_template = HERMES_CHATML
    tokenizer.save_pretrained(target)
    return ConvertReport(
        gguf=source,
        out=target,
        files={p.name: p.stat().st_size for p in sorted(target.iterdir()) if p.is_file()},
        parameters=sum(p.numel() for p in model.parameters()),
        vocab_size=int(config.vocab_size),
        eos_token_ids=ends,
        architecture=type(model).__name__,
    )
