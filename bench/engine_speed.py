"""Reference-engine speed: generated tokens/s for a 100-token completion, over HTTP and in-process.

Baseline in the same run, on the same model object (so the same llama.cpp context and thread
count): the backend's bare completion, i.e. the prompt evaluated in one batch, then per token the
logits read, argmax, one token evaluated; none of rollwire's work (full-vocabulary log_softmax,
seeded sampling, top logprobs, chat template, response shaping, HTTP). The engine's rows include
the prompt's evaluation too, so the ratio compares like with like. The same bare call also times
its decode loop alone (``bare decode only``), for reference: the engine cannot beat that row,
because a completion evaluates its prompt first.

The paths run interleaved, their order rotating every repeat, after one untimed warm-up round;
ratios are the median of per-repeat ratios (each engine run against the bare run next to it) and
the ratio of the medians. Each timed run records the CPU that *other* processes used meanwhile
(``/proc/stat`` minus this process), since on a shared machine that, not rollwire, sets the spread.
Target: >= 0.9 of bare over HTTP. ``--model DIR`` measures a Hugging Face folder on torch instead.

``--against-lib DIR`` compares builds instead: the installed llama.cpp (portable,
``GGML_NATIVE=OFF``: pyproject.toml) against another build of the same version whose libraries
are in DIR (e.g. a ``GGML_NATIVE=ON`` build, loaded through llama-cpp-python's
``LLAMA_CPP_LIB_PATH``). Each round starts one fresh process per build, in rotating order, and
each process times the bare completion and the engine in-process once after a warm-up; the
ratio is other build / portable, paired per round. What each library reports it was built with
(``llama_print_system_info``) is printed beside it.

    uv run python bench/engine_speed.py [--tokens 100] [--repeats 7] [--threads N] [--model PATH]
    uv run python bench/engine_speed.py --against-lib DIR [--repeats 7] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np

from rollwire.engine.model import EngineModel, load_model
from rollwire.engine.server import create_engine_app

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for tests.fakes
from tests.fakes.serve import serve_in_thread

PROMPT = [{"role": "user", "content": "Tell me a long story about the sea."}]
BARE = "bare completion (prefill + decode)"
DECODE = "bare decode only (no prefill)"
IN_PROCESS = "engine, in-process"
HTTP = "engine over HTTP"
TICK = os.sysconf("SC_CLK_TCK")


def _busy_ticks() -> tuple[int, int]:
    """(CPU ticks every process spent busy, ticks this process spent), from /proc."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        values = [int(v) for v in fields]
        busy = sum(values) - values[3] - values[4]  # all but idle and iowait
        own = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        return busy, int(own[11]) + int(own[12])  # utime + stime, all threads
    except (OSError, IndexError, ValueError):
        return 0, 0


def timed(fn: Callable[[], float | None]) -> tuple[float, float | None, float]:
    """(seconds, fn's own result, cores other processes used meanwhile)."""
    busy0, own0 = _busy_ticks()
    start = time.perf_counter()
    extra = fn()
    elapsed = time.perf_counter() - start
    busy1, own1 = _busy_ticks()
    foreign = max(0, (busy1 - busy0) - (own1 - own0)) / TICK / elapsed
    return elapsed, extra, foreign


def bare_completion(model: EngineModel, prompt: list[int], n: int) -> float:
    """The backend alone: prefill, then ``n`` greedy tokens (the last one is not evaluated, as
    the engine does not evaluate it either). Returns the seconds spent after the prefill."""
    model._start(prompt)
    start = time.perf_counter()
    for i in range(n):
        token = int(np.argmax(model._logits()))
        if i + 1 < n:
            model._advance(token)
    return time.perf_counter() - start


def engine_generate(model: EngineModel, prompt: list[int], n: int, top: int) -> None:
    gen = model.generate(
        prompt, max_tokens=n, temperature=1.0, seed=1, top_logprobs=top, ignore_eos=True
    )
    assert len(gen.steps) == n


def one_build(args: argparse.Namespace) -> None:
    """One process of ``--against-lib``: warm up, then time the bare completion and the engine
    in-process once each; print the tok/s and the library's own report as one JSON line."""
    import llama_cpp

    model = load_model(None, n_ctx=4096, n_threads=args.threads)
    prompt = model.tokenize(model.render(PROMPT))
    n = args.tokens
    bare_completion(model, prompt, n)
    engine_generate(model, prompt, n, 1)
    bare_s, _, bare_busy = timed(lambda: bare_completion(model, prompt, n))
    engine_s, _, engine_busy = timed(lambda: engine_generate(model, prompt, n, 1))
    record = {
        "system_info": llama_cpp.llama_print_system_info().decode().strip(),
        "lib_path": os.environ.get("LLAMA_CPP_LIB_PATH") or str(Path(llama_cpp.__file__).parent),
        BARE: n / bare_s,
        IN_PROCESS: n / engine_s,
        "foreign_cores": max(bare_busy, engine_busy),
    }
    print(json.dumps(record), flush=True)


def against_lib(args: argparse.Namespace) -> None:
    """``--against-lib DIR``: the installed (portable) build against the build in DIR."""
    import subprocess

    other = str(Path(args.against_lib).resolve())
    builds = {"portable (installed)": None, f"other ({other})": other}
    rows: dict[str, list[dict[str, object]]] = {name: [] for name in builds}
    names = list(builds)
    for r in range(args.repeats):
        for name in names[r % 2 :] + names[: r % 2]:
            env = {k: v for k, v in os.environ.items() if k != "LLAMA_CPP_LIB_PATH"}
            if builds[name] is not None:
                env["LLAMA_CPP_LIB_PATH"] = builds[name]  # type: ignore[assignment]
            cmd = [sys.executable, __file__, "--one-build", "--tokens", str(args.tokens)]
            if args.threads:
                cmd += ["--threads", str(args.threads)]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                raise SystemExit(f"{name}: exit {done.returncode}\n{done.stderr[-2000:]}")
            rows[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    portable, native = names
    print(
        f"\n{args.tokens}-token completion, {args.repeats} rounds (a fresh process per build "
        "per round, order rotating), load average "
        f"{os.getloadavg()[0]:.2f} at the end\n"
    )
    for name in names:
        print(f"- {name}: {rows[name][0]['system_info']}")
    print(
        "\n| path | portable tok/s (median) | other tok/s (median) | other / portable "
        "(median of paired rounds) | other processes' CPU (cores, max) |"
    )
    print("|---|---:|---:|---:|---:|")
    record: dict[str, object] = {"tokens": args.tokens, "repeats": args.repeats, "rows": rows}
    for path in (BARE, IN_PROCESS):
        p = [float(x[path]) for x in rows[portable]]  # type: ignore[arg-type]
        o = [float(x[path]) for x in rows[native]]  # type: ignore[arg-type]
        paired = statistics.median(b / a for a, b in zip(p, o, strict=True))
        busy = max(float(x["foreign_cores"]) for x in rows[portable] + rows[native])  # type: ignore[arg-type]
        record[f"ratio {path}"] = paired
        print(
            f"| {path} | {statistics.median(p):.1f} | {statistics.median(o):.1f} "
            f"| {paired:.3f} | {busy:.2f} |"
        )
    out = Path(__file__).parent / "results" / "engine_builds.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(record, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, help="backend threads (default: all CPUs)")
    parser.add_argument("--model", help="a .gguf or a Hugging Face folder (default: embedded)")
    parser.add_argument(
        "--against-lib", metavar="DIR", help="compare the installed build with the one in DIR"
    )
    parser.add_argument("--one-build", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_build:
        return one_build(args)
    if args.against_lib:
        return against_lib(args)
    model = load_model(args.model, n_ctx=4096, n_threads=args.threads)
    threads = getattr(getattr(model, "_llm", None), "n_threads", None) or args.threads
    prompt = model.tokenize(model.render(PROMPT))
    n = args.tokens
    body = {
        "messages": PROMPT,
        "max_tokens": n,
        "ignore_eos": True,
        "seed": 1,
        "logprobs": True,
        "top_logprobs": 1,
        "return_token_ids": True,
    }
    rows: dict[str, list[float]] = {BARE: [], DECODE: [], IN_PROCESS: [], HTTP: []}
    foreign: dict[str, list[float]] = {name: [] for name in rows}
    prefill_ms: list[float] = []
    load_start = os.getloadavg()
    with (
        serve_in_thread(create_engine_app(model, served_name="bench")) as url,
        httpx.Client(timeout=300) as client,
    ):

        def http() -> None:
            reply = client.post(f"{url}/v1/chat/completions", json=body).json()
            assert len(reply["choices"][0]["token_ids"]) == n

        runs: dict[str, Callable[[], float | None]] = {
            BARE: lambda: bare_completion(model, prompt, n),
            IN_PROCESS: lambda: engine_generate(model, prompt, n, 1),
            HTTP: http,
        }
        names = list(runs)
        for fn in runs.values():  # warm-up: first allocations, connection, graph reservation
            fn()
        for r in range(args.repeats):
            for name in names[r % 3 :] + names[: r % 3]:  # rotated: no path always goes first
                elapsed, decode_s, busy = timed(runs[name])
                rows[name].append(n / elapsed)
                foreign[name].append(busy)
                if name == BARE:
                    assert decode_s is not None
                    rows[DECODE].append(n / decode_s)
                    foreign[DECODE].append(busy)
                    prefill_ms.append((elapsed - decode_s) * 1e3)
    load_end = os.getloadavg()
    floor = statistics.median(rows[BARE])
    decode_floor = statistics.median(rows[DECODE])
    print(
        f"\n{model.backend} ({model.path.name}), {threads} threads: {n}-token completion after a "
        f"{len(prompt)}-token prompt, {args.repeats} repeats (interleaved, rotated), load average "
        f"{load_start[0]:.2f} at start, {load_end[0]:.2f} at end\n"
    )
    print(
        "| path | median tok/s | min | max | vs bare completion: median of paired ratios "
        "| ratio of medians | vs bare decode only | other processes' CPU (cores, median) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    ratios: dict[str, dict[str, float]] = {}
    for name, values in rows.items():
        med = statistics.median(values)
        paired = statistics.median(v / b for v, b in zip(values, rows[BARE], strict=True))
        ratios[name] = {
            "paired_vs_bare_completion": paired,
            "medians_vs_bare_completion": med / floor,
            "medians_vs_bare_decode_only": med / decode_floor,
        }
        print(
            f"| {name} | {med:.1f} | {min(values):.1f} | {max(values):.1f} | {paired:.3f} "
            f"| {med / floor:.3f} | {med / decode_floor:.3f} "
            f"| {statistics.median(foreign[name]):.2f} |"
        )
    engine_s = [n / v for v in rows[IN_PROCESS]]
    bare_s = [n / v for v in rows[BARE]]
    per_token_us = statistics.median(
        (e - b) / n * 1e6 for e, b in zip(engine_s, bare_s, strict=True)
    )
    http_ms = statistics.median(
        (n / h - n / e) * 1e3 for h, e in zip(rows[HTTP], rows[IN_PROCESS], strict=True)
    )
    print(
        f"\nprefill (bare, {len(prompt)} tokens): median {statistics.median(prefill_ms):.0f} ms; "
        f"engine in-process minus bare: {per_token_us:.0f} us per token (median of pairs); "
        f"HTTP minus in-process: {http_ms:.1f} ms per request"
    )
    filename = "engine_speed.json" if model.backend == "llama.cpp" else "engine_speed_hf.json"
    out = Path(__file__).parent / "results" / filename
    out.parent.mkdir(exist_ok=True)
    record = {
        "backend": model.backend,
        "threads": threads,
        "tokens": n,
        "prompt_tokens": len(prompt),
        "repeats": args.repeats,
        "load_average_start": load_start,
        "load_average_end": load_end,
        "tok_per_s": rows,
        "foreign_load_cores": foreign,
        "prefill_ms": prefill_ms,
        "ratios": ratios,
        "engine_minus_bare_us_per_token": per_token_us,
        "http_minus_in_process_ms": http_ms,
    }
    out.write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
