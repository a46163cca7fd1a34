"""Eval summaries: summarising an eval of 10,000 rollouts, and comparing two of them.

Writes two collection folders the way the episode store writes them (``episodes.jsonl`` lines of
``EpisodeRecord`` with a trainable sequence of ``--tokens`` ids and logprobs each, plus a share
of ``failures.jsonl`` lines), ``--problems`` problems x ``--samples`` samples each: B is A with
a higher pass rate. Then times, in this process, best of ``--repeats``, what ``rollwire eval``
does after its rollouts and what ``rollwire eval --compare`` does:

* ``floor`` (the baseline): ``orjson.loads`` of every line of one folder, nothing else: the
  cost of reading the files at all;
* ``read``: ``read_attempts`` of one folder (parse + keep each attempt's outcome);
* ``summarise``: ``summarise`` of its attempts: pass@1, pass@4 and pass@8 with standard errors;
* ``compare``: ``load_report`` of both folders' ``eval.json`` and ``compare`` (paired bootstrap,
  10,000 resamples, and the permutation test, for the mean reward and the three pass@k);
* ``total``: read + summarise + compare: the target is under 1 s.

    UV_PYTHON_DOWNLOADS=never uv run python bench/eval_summary.py     # ~20 s

Results: a table on stdout and ``bench/results/eval_summary.json``.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure import git_state, machine, write_json
from rollwire.collect.evaluation import EvalReport, load_report
from rollwire.datasets.evals import compare, read_attempts, summarise
from rollwire.datasets.records import episode_id, group_id

KS = [1, 4, 8]
TASK = "reasoning_gym:chain_sum"


def write_folder(out: Path, problems: int, samples: int, p_pass: float, tokens: int) -> int:
    """A collection folder of problems x samples attempts; returns the bytes written."""
    rng = random.Random(f"{out.name}-{p_pass}")
    out.mkdir(parents=True)
    task = TASK
    size = 0
    with (out / "episodes.jsonl").open("wb") as eps, (out / "failures.jsonl").open("wb") as fails:
        for seed in range(problems):
            for j in range(samples):
                eid = episode_id(task, seed * samples + j, seed)
                if rng.random() < 0.02:  # a failed rollout
                    line = orjson.dumps(
                        {"schema": "rollwire.failure/1", "episode_id": eid, "task": task,
                         "sample_index": seed * samples + j, "seed": seed,
                         "error": "the model was never reached: upstream answered 502"}
                    )  # fmt: skip
                    fails.write(line + b"\n")
                    size += len(line) + 1
                    continue
                reward = None if rng.random() < 0.05 else float(rng.random() < p_pass)
                ids = [rng.randrange(49152) for _ in range(tokens)]
                line = orjson.dumps(
                    {
                        "schema": "rollwire.episode/1", "episode_id": eid,
                        "group_id": group_id(task, seed, seed), "task": task,
                        "sample_index": seed * samples + j, "seed": seed, "reward": reward,
                        "rewards": {} if reward is None else {"reward": reward}, "ok": True,
                        "rollout_type": "eval", "capture_level": "tokens", "model": "smol",
                        "harness": "env",
                        "sequences": [{"sequence_id": "s0", "role": "policy", "trainable": True,
                                       "input_ids": ids, "loss_mask": [1] * tokens,
                                       "logprobs": [-rng.random() for _ in range(tokens)]}],
                        "n_turns": 1, "n_trainable_tokens": tokens,
                    }
                )  # fmt: skip
                eps.write(line + b"\n")
                size += len(line) + 1
    return size


def best(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--problems", type=int, default=1250)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--tokens", type=int, default=256, help="trainable tokens per episode")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="bench/results/eval_summary.json")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        a_dir, b_dir = Path(tmp) / "a", Path(tmp) / "b"
        size = write_folder(a_dir, args.problems, args.samples, 0.3, args.tokens)
        size += write_folder(b_dir, args.problems, args.samples, 0.4, args.tokens)

        def floor() -> int:
            n = 0
            for name in ("episodes.jsonl", "failures.jsonl"):
                with (a_dir / name).open("rb") as f:
                    n += sum(1 for line in f if orjson.loads(line))
            return n

        t_floor, lines = best(floor, args.repeats)
        t_read, att_a = best(lambda: read_attempts(a_dir), args.repeats)
        t_sum, (ma, sa) = best(lambda: summarise(att_a, ks=KS), args.repeats)
        mb, sb = summarise(read_attempts(b_dir), ks=KS)
        for d, m, sc in ((a_dir, ma, sa), (b_dir, mb, sb)):
            report = EvalReport(
                tasks=[TASK], planned=len(att_a), missing=0, complete=True, metrics=m, problems=sc
            )
            (d / "eval.json").write_text(report.model_dump_json(indent=2, by_alias=True))

        def compare_evals() -> Any:
            a, b = load_report(a_dir), load_report(b_dir)
            return compare(a.problems, b.problems, ks=KS)

        t_cmp, result = best(compare_evals, args.repeats)
    total = t_read + t_sum + t_cmp
    rows = [
        ("floor (orjson.loads of every line)", t_floor),
        ("read_attempts", t_read),
        ("summarise (pass@1,4,8)", t_sum),
        ("compare: two eval.json, 10,000 resamples", t_cmp),
        ("total: read + summarise + compare", total),
    ]
    print(
        f"an eval of {args.problems} problems x {args.samples} samples ({len(att_a):,} "
        f"attempts, {size / 2 / 2**20:.0f} MiB of JSONL), and its comparison with another; "
        f"best of {args.repeats}"
    )
    print("| step | seconds | x floor |\n|---|---|---|")
    for name, t in rows:
        print(f"| {name} | {t:.3f} | {t / t_floor:.2f} |")
    d = result.overall.differences[0]
    print(
        f"target: total < 1 s: {'met' if total < 1.0 else 'MISSED'}; "
        f"reward B - A {d.diff:+.3f} [{d.ci_low:+.3f}, {d.ci_high:+.3f}], p {d.p_value:.4f}"
    )
    write_json(
        {
            "bench": "eval_summary",
            "machine": machine(),
            "git": git_state(),
            "problems": args.problems,
            "samples": args.samples,
            "tokens_per_episode": args.tokens,
            "attempts": len(att_a),
            "lines": lines,
            "jsonl_bytes": size,
            "seconds": dict(rows),
            "x_floor": {name: t / t_floor for name, t in rows},
            "pass_at_1": [ma.overall.pass_at[0].estimate, mb.overall.pass_at[0].estimate],
            "target_met": total < 1.0,
        },
        args.out,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
