"""Reference-engine speed: generated tokens/s for a 100-token completion, over HTTP and in-process.

Baseline in the same run: the backend's bare decode loop (advance one token, read the logits,
argmax) with none of rollwire's work (full-vocabulary log_softmax, seeded sampling, top logprobs,
response shaping). Target: >= 40 generated tokens/s over HTTP on this 2-core machine (llama.cpp).
``--model DIR`` measures a Hugging Face folder on torch instead (``rollwire engine --model``).

    uv run python bench/engine_speed.py [--tokens 100] [--repeats 5] [--model PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import httpx
import numpy as np

from rollwire.engine.model import EngineModel, load_model
from rollwire.engine.server import create_engine_app

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for tests.fakes
from tests.fakes.serve import serve_in_thread

PROMPT = [{"role": "user", "content": "Tell me a long story about the sea."}]


def bare_decode(model: EngineModel, prompt: list[int], n: int) -> float:
    """Tokens/s of the backend's decode loop alone (the floor rollwire's engine builds on)."""
    model._start(prompt)
    start = time.perf_counter()
    for _ in range(n):
        model._advance(int(np.argmax(model._logits())))
    return n / (time.perf_counter() - start)


def engine_generate(model: EngineModel, prompt: list[int], n: int, top: int) -> float:
    start = time.perf_counter()
    gen = model.generate(
        prompt, max_tokens=n, temperature=1.0, seed=1, top_logprobs=top, ignore_eos=True
    )
    assert len(gen.steps) == n
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--model", help="a .gguf or a Hugging Face folder (default: embedded)")
    args = parser.parse_args()
    model = load_model(args.model, n_ctx=4096)
    prompt = model.tokenize(model.render(PROMPT))
    n = args.tokens
    bare = f"bare {model.backend} decode"
    rows: dict[str, list[float]] = {
        bare: [],
        "engine, in-process": [],
        "engine over HTTP": [],
    }
    body = {
        "messages": PROMPT,
        "max_tokens": n,
        "ignore_eos": True,
        "seed": 1,
        "logprobs": True,
        "top_logprobs": 1,
        "return_token_ids": True,
    }
    with (
        serve_in_thread(create_engine_app(model, served_name="bench")) as url,
        httpx.Client(timeout=120) as client,
    ):
        for _ in range(args.repeats):  # interleaved so machine noise hits every row alike
            rows[bare].append(bare_decode(model, prompt, n))
            rows["engine, in-process"].append(engine_generate(model, prompt, n, 1))
            start = time.perf_counter()
            reply = client.post(f"{url}/v1/chat/completions", json=body).json()
            elapsed = time.perf_counter() - start
            assert len(reply["choices"][0]["token_ids"]) == n
            rows["engine over HTTP"].append(n / elapsed)
    floor = statistics.median(rows[bare])
    print(
        f"\n{model.backend} ({model.path.name}): {n}-token completion, {args.repeats} repeats, "
        f"load average {os.getloadavg()[0]:.2f}\n"
    )
    print("| path | median tok/s | min | max | vs bare decode |")
    print("|---|---:|---:|---:|---:|")
    for name, values in rows.items():
        med = statistics.median(values)
        print(f"| {name} | {med:.1f} | {min(values):.1f} | {max(values):.1f} | {med / floor:.2f} |")
    filename = "engine_speed.json" if model.backend == "llama.cpp" else "engine_speed_hf.json"
    out = Path(__file__).parent / "results" / filename
    out.parent.mkdir(exist_ok=True)
    record = {"backend": model.backend, "tokens": n, "repeats": args.repeats, "tok_per_s": rows}
    out.write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
