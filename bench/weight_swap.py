"""Weight swap time: the trainer's weights into ``rollwire engine --model DIR`` through vLLM's
RL routes (``rollwire.trl.WeightSync``), for the 135M model on these cores.

A ``rollwire engine`` process serves the converted SmolLM2-135M folder (float32, 538 MB of
safetensors); this process holds the same model in transformers, as a trainer does, and pushes
it ``--repeats`` times by each transfer: ``disk`` (a checkpoint folder the engine reads) and
``http`` (the shards in the requests). Reported per transfer, median over the repeats: the
trainer's ``save_pretrained``, the time rollouts wait (pause to resume), and the whole push.
The baseline, in the same run: reading the same checkpoint into memory with safetensors (the
least any transfer does), and one 64-token greedy chat call on the engine (what a rollout's
model call costs).

    uv run python bench/weight_swap.py            # ~3 min
    uv run python bench/weight_swap.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from measure import ROOT, free_port, git_state, machine, write_json

KEY = "bench-key"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "weight_swap.json"))
    return p.parse_args()


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the engine exited ({proc.returncode})")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError("the engine did not start")


def main() -> int:
    args = parse_args()
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from rollwire.trl import WeightSync

    work = Path(tempfile.mkdtemp(prefix="weight-swap-"))
    folder, roots = work / "model", work / "ckpts"
    roots.mkdir()
    subprocess.run(
        [sys.executable, "-m", "rollwire", "convert", "--out", str(folder)],
        check=True, capture_output=True,
    )  # fmt: skip
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "rollwire", "engine", "--model", str(folder), "--port", str(port),
            "--admin-key", KEY, "--weights-root", str(roots)]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(url, proc)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        body = {"messages": [{"role": "user", "content": "Count to twenty."}], "max_tokens": 64,
                "temperature": 0, "ignore_eos": True}  # fmt: skip
        results: dict[str, Any] = {
            "model": "SmolLM2-135M-Instruct (float32)",
            "repeats": args.repeats,
        }
        reads, calls = [], []
        for _ in range(args.repeats):
            started = time.perf_counter()
            tensors = load_file(str(folder / "model.safetensors"))
            # safetensors maps the file: copy every tensor, so every byte is read into memory
            copies = {name: t.clone() for name, t in tensors.items()}
            del copies, tensors
            reads.append(time.perf_counter() - started)
            started = time.perf_counter()
            httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300).raise_for_status()
            calls.append(time.perf_counter() - started)
        results["baseline"] = {
            "read_checkpoint_s": round(statistics.median(reads), 3),
            "chat_call_64_tokens_s": round(statistics.median(calls), 3),
        }
        for transfer in ("disk", "http"):
            sync = WeightSync(
                url, transfer=transfer, admin_key=KEY, checkpoint_dir=roots / transfer
            )
            reports = [sync.push(model, f"{transfer}-{i}") for i in range(args.repeats)]
            sync.close()
            med = {k: round(statistics.median(getattr(r, k) for r in reports), 3)
                   for k in ("save_s", "paused_s", "total_s")}  # fmt: skip
            med["bytes"] = reports[0].bytes
            med["paused_over_read"] = round(
                med["paused_s"] / results["baseline"]["read_checkpoint_s"], 2
            )
            med["paused_over_call"] = round(
                med["paused_s"] / results["baseline"]["chat_call_64_tokens_s"], 2
            )
            results[transfer] = med
        results["machine"] = machine()
        results["git"] = git_state()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)
    write_json(results, args.out)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
