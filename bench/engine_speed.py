"""Reference-engine speed: generated tokens/s for a 100-token completion, over HTTP and in-process.

Baseline in the same run: llama.cpp's bare decode loop (eval one token, read the logits, argmax)
with none of rollwire's work (full-vocabulary log_softmax, seeded sampling, top logprobs,
response shaping). Target: >= 40 generated tokens/s over HTTP on this 2-core machine.

    uv run python bench/engine_speed.py [--tokens 100] [--repeats 5]
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

from rollwire.engine.model import ReferenceModel
from rollwire.engine.server import create_engine_app

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for tests.fakes
from tests.fakes.serve import serve_in_thread

PROMPT = [{"role": "user", "content": "Tell me a long story about the sea."}]


def bare_decode(model: ReferenceModel, prompt: list[int], n: int) -> float:
    """Tokens/s of llama.cpp's decode loop alone (the floor rollwire's engine builds on)."""
    llm = model._llm
    llm.reset()
    llm.eval(prompt)
    start = time.perf_counter()
    for _ in range(n):
        logits = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(model.n_vocab,))
        llm.eval([int(np.argmax(logits))])
    return n / (time.perf_counter() - start)


def engine_generate(model: ReferenceModel, prompt: list[int], n: int, top: int) -> float:
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
    args = parser.parse_args()
    model = ReferenceModel(n_ctx=4096)
    prompt = model.tokenize(model.render(PROMPT))
    n = args.tokens
    rows: dict[str, list[float]] = {
        "bare llama.cpp decode": [],
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
            rows["bare llama.cpp decode"].append(bare_decode(model, prompt, n))
            rows["engine, in-process"].append(engine_generate(model, prompt, n, 1))
            start = time.perf_counter()
            reply = client.post(f"{url}/v1/chat/completions", json=body).json()
            elapsed = time.perf_counter() - start
            assert len(reply["choices"][0]["token_ids"]) == n
            rows["engine over HTTP"].append(n / elapsed)
    floor = statistics.median(rows["bare llama.cpp decode"])
    print(
        f"\n{n}-token completion, {args.repeats} repeats, load average {os.getloadavg()[0]:.2f}\n"
    )
    print("| path | median tok/s | min | max | vs bare decode |")
    print("|---|---:|---:|---:|---:|")
    for name, values in rows.items():
        med = statistics.median(values)
        print(f"| {name} | {med:.1f} | {min(values):.1f} | {max(values):.1f} | {med / floor:.2f} |")
    out = Path(__file__).parent / "results" / "engine_speed.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"tokens": n, "repeats": args.repeats, "tok_per_s": rows}, indent=2))


if __name__ == "__main__":
    main()
