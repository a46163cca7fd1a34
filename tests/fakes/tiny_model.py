"""A random 1-layer Llama whose vocabulary covers the fake vLLM's token ids (< 49152): a real
torch model for training-path tests that must not wait on a real one."""

from __future__ import annotations

from pathlib import Path


def tiny_model(path: Path) -> Path:
    """Write the model and a word-level tokenizer (``t<id>`` words, ChatML specials) to ``path``."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(49152)} | {"<|im_start|>": 1, "<|im_end|>": 2}
    del vocab["t1"], vocab["t2"]
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|im_end|>", unk_token="t0"
    ).save_pretrained(path)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49152, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024,
        bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(path)
    return path
