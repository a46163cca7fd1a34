"""Graph ingest: the cost of turning engine replies into linked rollout-graph nodes.

Every turn is a vLLM-shaped chat-completions reply (``prompt_token_ids``, ``choices[0].token_ids``,
``choices[0].logprobs.content`` with ``token_id:N`` entries and one top logprob), serialised with
orjson and parsed back, so token ids arrive as freshly parsed Python lists exactly as they do in
the proxy. Each turn then goes through the proxy's own path: ``ingest_chat_reply`` (id and
logprob checks, list -> array conversion) and ``RolloutGraph.add`` (the linker).

Rollouts:

* linear: 100, 200, 400 and 800 turns whose prompts grow to ~128k tokens. Turn k's prompt is
  turn k-1's prompt + its 64 sampled ids + new "tool output" ids, sized so that the last prompt
  is ``--final-tokens`` long. More turns means more nodes *and* fewer new tokens per turn.
* fork: a trunk of ``--fork-trunk-turns`` turns to ~``--fork-trunk-tokens`` tokens, then
  ``--fork-width`` children of the trunk's last node (each with its own tool output), each
  continuing ``--fork-depth`` turns; branches arrive interleaved, as parallel agents would.

Timed per turn (perf_counter_ns), all in this process:

* ``parse``: ``orjson.loads`` of the reply (paid by the proxy's upstream client anyway; context);
* ``floor``: the baseline, ``np.fromiter`` of the prompt and sampled id lists to int64: no
  checks, no linking; the plain numpy conversion of list-shaped ids. (``ingest`` converts and
  checks the types in one pass through marshal, which is cheaper than this floor.)
* ``ingest``: ``ingest_chat_reply`` (checks + conversion);
* ``link``: ``RolloutGraph.add`` (find a node known to prefix the prompt, hash from there on,
  find parent, adopt);
* ``hash_ref``: ``prefix_hashes(np.concatenate([prompt, sampled]))`` alone, timed after ``link``
  on the same arrays: what hashing the whole sequence would cost (``link`` no longer does it:
  it hashes only past a node known to prefix the prompt, usually the parent).

``ingest + link`` is the ingest cost of a turn; the target is that an 800-turn, 128k-token
rollout ingests in at most 1 s, and that the per-turn cost is flat in the number of nodes.
Export (``export_rollout``, and its JSON serialisation as the proxy's ``GET /rollout`` does)
is timed once per rollout.

Run from the repository root::

    UV_PYTHON_DOWNLOADS=never uv run python bench/graph_ingest.py            # ~1 minute
    UV_PYTHON_DOWNLOADS=never uv run python bench/graph_ingest.py --turns 800 --no-fork
    UV_PYTHON_DOWNLOADS=never uv run python bench/graph_ingest.py --profile 200

Results: a markdown table on stdout and ``bench/results/graph_ingest.json``.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import datetime as dt
import gc
import io
import itertools
import math
import os
import platform
import pstats
import resource
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from rollwire.capture.export import export_rollout
from rollwire.capture.graph import TOKEN_DTYPE, prefix_hashes
from rollwire.capture.ingest import ingest_chat_reply
from rollwire.capture.rollout import CaptureLevel, RolloutGraph

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "bench" / "results"
TARGET_800_TURN_S = 1.0
VOCAB_LO, VOCAB_HI = 100, 49152


# --------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class TurnSpec:
    """One call of a rollout: its node id and where its prompt and sampled ids come from."""

    node_id: str
    prompt: np.ndarray  # the full prompt ids (a view into the rollout's token pool)
    sampled: np.ndarray
    group: str  # "linear", "trunk", "branch-round-<j>"


def _ids(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(VOCAB_LO, VOCAB_HI, size=n, dtype=TOKEN_DTYPE)


def linear_rollout(
    turns: int, final_tokens: int, initial: int, sampled: int, seed: int
) -> list[TurnSpec]:
    """``turns`` calls, prompt k = prompt k-1 + sampled k-1 + tool output k; last prompt is
    ``final_tokens`` long (tool outputs take the remainder evenly)."""
    rng = np.random.default_rng(seed)
    if turns < 2:
        raise ValueError("a linear rollout needs at least 2 turns")
    growth = final_tokens - initial - (turns - 1) * sampled
    if growth < turns - 1:
        raise ValueError(f"{final_tokens} final tokens leave no room for tool output")
    base, extra = divmod(growth, turns - 1)
    tool = [base + (1 if k < extra else 0) for k in range(turns - 1)]
    total = final_tokens + sampled
    pool = _ids(rng, total)
    specs = []
    n_p = initial
    for k in range(turns):
        specs.append(TurnSpec(f"t{k + 1}", pool[:n_p], pool[n_p : n_p + sampled], group="linear"))
        if k < turns - 1:
            n_p += sampled + tool[k]
    assert n_p == final_tokens
    return specs


def fork_rollout(
    trunk_turns: int,
    trunk_tokens: int,
    width: int,
    depth: int,
    added: int,
    initial: int,
    sampled: int,
    seed: int,
) -> list[TurnSpec]:
    """A trunk, then ``width`` children of its last node, each ``depth`` turns deep; the
    branches arrive round-robin (all first turns, then all second turns, ...)."""
    trunk = [
        dataclasses.replace(t, group="trunk")
        for t in linear_rollout(trunk_turns, trunk_tokens, initial, sampled, seed)
    ]
    rng = np.random.default_rng(seed + 1)
    head = np.concatenate([trunk[-1].prompt, trunk[-1].sampled])
    branches = []
    for _ in range(width):
        tail = _ids(rng, depth * (added + sampled))
        branches.append(np.concatenate([head, tail]))
    specs = list(trunk)
    for j in range(depth):
        for b, seq in enumerate(branches):
            n_p = len(head) + j * (added + sampled) + added
            node_id = f"t{trunk_turns + 1 + j * width + b}"
            specs.append(
                TurnSpec(node_id, seq[:n_p], seq[n_p : n_p + sampled], group=f"branch-{j}")
            )
    return specs


def vllm_reply(prompt: list[int], sampled: list[int], logprobs: list[float]) -> dict[str, Any]:
    """A non-streaming chat completion as vLLM (--return-tokens-as-token-ids) shapes it."""
    content = []
    for tid, lp in zip(sampled, logprobs, strict=True):
        token = f"token_id:{tid}"
        content.append(
            {
                "token": token,
                "logprob": lp,
                "bytes": list(token.encode()),
                "top_logprobs": [{"token": token, "logprob": lp, "bytes": list(token.encode())}],
            }
        )
    return {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 0,
        "model": "smol",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "x" * len(sampled),
                    "refusal": None,
                    "annotations": None,
                    "audio": None,
                    "function_call": None,
                    "tool_calls": [],
                    "reasoning": None,
                },
                "logprobs": {"content": content},
                "finish_reason": "stop",
                "stop_reason": None,
                "token_ids": sampled,
                "routed_experts": None,
            }
        ],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": {
            "prompt_tokens": len(prompt),
            "total_tokens": len(prompt) + len(sampled),
            "completion_tokens": len(sampled),
            "prompt_tokens_details": None,
        },
        "prompt_logprobs": None,
        "prompt_token_ids": prompt,
        "kv_transfer_params": None,
    }


def reply_bytes(spec: TurnSpec, rng: np.random.Generator) -> bytes:
    sampled = spec.sampled.tolist()
    logprobs = (-np.abs(rng.normal(0.0, 1.0, len(sampled)))).tolist()
    return orjson.dumps(vllm_reply(spec.prompt.tolist(), sampled, logprobs))


# --------------------------------------------------------------------------- measurement


@dataclass
class TurnTiming:
    node_id: str
    group: str
    prompt_tokens: int
    parse_ns: int
    floor_ns: int
    ingest_ns: int
    link_ns: int
    hash_ref_ns: int

    @property
    def total_ns(self) -> int:
        return self.ingest_ns + self.link_ns


@dataclass
class RolloutRun:
    name: str
    turns: list[TurnTiming] = field(default_factory=list)
    export_s: float | None = None
    export_json_s: float | None = None
    export_bytes: int | None = None
    export_stats: dict[str, Any] | None = None
    checks: list[str] = field(default_factory=list)


def ingest_rollout(
    name: str, specs: list[TurnSpec], seed: int, profile: cProfile.Profile | None = None
) -> tuple[RolloutRun, RolloutGraph]:
    rng = np.random.default_rng(seed)
    rollout = RolloutGraph(CaptureLevel.TOKENS)
    run = RolloutRun(name)
    clock = time.perf_counter_ns
    for spec in specs:
        raw = reply_bytes(spec, rng)  # untimed: the engine's side

        t0 = clock()
        reply = orjson.loads(raw)
        t1 = clock()
        prompt_list = reply["prompt_token_ids"]
        sampled_list = reply["choices"][0]["token_ids"]
        np.fromiter(prompt_list, dtype=TOKEN_DTYPE, count=len(prompt_list))
        np.fromiter(sampled_list, dtype=TOKEN_DTYPE, count=len(sampled_list))
        t2 = clock()
        if profile is not None:
            profile.enable()
        ingested = ingest_chat_reply(spec.node_id, reply, capture_level=CaptureLevel.TOKENS)
        t3 = clock()
        turn = ingested.turn
        if turn is None:
            raise RuntimeError(f"{spec.node_id}: not ingested: {ingested.findings}")
        rollout.add(turn)
        t4 = clock()
        if profile is not None:
            profile.disable()
        assert turn.prompt_ids is not None and turn.sampled_ids is not None
        prefix_hashes(np.concatenate([turn.prompt_ids, turn.sampled_ids]))
        t5 = clock()
        run.turns.append(
            TurnTiming(
                spec.node_id,
                spec.group,
                len(prompt_list),
                t1 - t0,
                t2 - t1,
                t3 - t2,
                t4 - t3,
                t5 - t4,
            )
        )
        if not turn.logprobs_ok or turn.has_fatal:
            run.checks.append(f"{spec.node_id}: logprobs not ok / fatal: {turn.findings}")
        del raw, reply, prompt_list, sampled_list
    return run, rollout


def check_linear(rollout: RolloutGraph, specs: list[TurnSpec]) -> list[str]:
    problems = []
    for prev, spec in itertools.pairwise(specs):
        parent = rollout.node(spec.node_id).parent
        if parent is None or parent.node_id != prev.node_id:
            problems.append(
                f"{spec.node_id}: parent {parent and parent.node_id}, want {prev.node_id}"
            )
    return problems[:5]


def check_fork(rollout: RolloutGraph, specs: list[TurnSpec], trunk: int, width: int) -> list[str]:
    problems = check_linear(rollout, specs[:trunk])
    trunk_end = specs[trunk - 1].node_id
    for i, spec in enumerate(specs[trunk:]):
        want = trunk_end if i < width else specs[trunk + i - width].node_id
        parent = rollout.node(spec.node_id).parent
        if parent is None or parent.node_id != want:
            problems.append(f"{spec.node_id}: parent {parent and parent.node_id}, want {want}")
    return problems[:5]


def time_export(run: RolloutRun, rollout: RolloutGraph, serialise: bool) -> None:
    gc.collect()
    t0 = time.perf_counter()
    doc = export_rollout(rollout)
    run.export_s = time.perf_counter() - t0
    run.export_stats = doc.stats.model_dump(mode="json")
    if serialise:
        t0 = time.perf_counter()
        blob = orjson.dumps(doc.model_dump(mode="json"))
        run.export_json_s = time.perf_counter() - t0
        run.export_bytes = len(blob)
        del blob
    del doc
    gc.collect()


# --------------------------------------------------------------------------- statistics


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def quarter(turns: list[TurnTiming], which: str) -> list[TurnTiming]:
    q = max(1, len(turns) // 4)
    return turns[:q] if which == "first" else turns[-q:]


def per_k(t: TurnTiming, ns: int) -> float:
    """Microseconds per 1k prompt tokens."""
    return ns / 1e3 / max(t.prompt_tokens / 1e3, 1e-9)


def summarise(run: RolloutRun) -> dict[str, Any]:
    ts = run.turns
    s = 1e-9

    def total(attr: str) -> float:
        return sum(getattr(t, attr) for t in ts) * s

    out: dict[str, Any] = {
        "rollout": run.name,
        "turns": len(ts),
        "final_prompt_tokens": ts[-1].prompt_tokens,
        "sum_prompt_tokens": sum(t.prompt_tokens for t in ts),
        "parse_s": total("parse_ns"),
        "floor_s": total("floor_ns"),
        "ingest_s": total("ingest_ns"),
        "link_s": total("link_ns"),
        "hash_ref_s": total("hash_ref_ns"),
        "ingest_plus_link_s": total("ingest_ns") + total("link_ns"),
        "export_s": run.export_s,
        "export_json_s": run.export_json_s,
        "export_bytes": run.export_bytes,
        "export_stats": run.export_stats,
        "checks": run.checks,
    }
    out["ratio_to_floor"] = out["ingest_plus_link_s"] / out["floor_s"] if out["floor_s"] else None
    for which in ("first", "last"):
        q = quarter(ts, which)
        out[f"{which}_q_prompt_tokens_mean"] = _mean([t.prompt_tokens for t in q])
        out[f"{which}_q_turn_ms"] = _mean([t.total_ns / 1e6 for t in q])
        out[f"{which}_q_link_ms"] = _mean([t.link_ns / 1e6 for t in q])
        out[f"{which}_q_hash_ref_ms"] = _mean([t.hash_ref_ns / 1e6 for t in q])
        out[f"{which}_q_floor_ms"] = _mean([t.floor_ns / 1e6 for t in q])
        out[f"{which}_q_turn_us_per_1k"] = _mean([per_k(t, t.total_ns) for t in q])
        out[f"{which}_q_link_us_per_1k"] = _mean([per_k(t, t.link_ns) for t in q])
        out[f"{which}_q_floor_us_per_1k"] = _mean([per_k(t, t.floor_ns) for t in q])
    groups: dict[str, list[TurnTiming]] = {}
    for t in ts:
        groups.setdefault(t.group, []).append(t)
    out["groups"] = {
        g: {
            "turns": len(v),
            "prompt_tokens_mean": _mean([t.prompt_tokens for t in v]),
            "turn_ms": _mean([t.total_ns / 1e6 for t in v]),
            "link_ms": _mean([t.link_ns / 1e6 for t in v]),
            "turn_us_per_1k": _mean([per_k(t, t.total_ns) for t in v]),
        }
        for g, v in groups.items()
    }
    return out


def _f(x: float | None, nd: int = 2) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def markdown(rows: list[dict[str, Any]]) -> str:
    f = _f
    lines = [
        "| rollout | turns | final prompt | floor s | ingest s | link s | ingest+link s "
        "| x floor | parse s (ctx) | export s | export JSON s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['rollout']} | {r['turns']} | {r['final_prompt_tokens']} | {f(r['floor_s'])} "
            f"| {f(r['ingest_s'])} | {f(r['link_s'])} | **{f(r['ingest_plus_link_s'])}** "
            f"| {f(r['ratio_to_floor'], 1)} | {f(r['parse_s'])} | {f(r['export_s'])} "
            f"| {f(r['export_json_s'])} |"
        )
    lines += [
        "",
        "| rollout | quarter | mean prompt | turn ms | link ms | hash ref ms "
        "| turn us / 1k tok | link us / 1k tok | floor us / 1k tok |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        for q in ("first", "last"):
            lines.append(
                f"| {r['rollout']} | {q} | {f(r[f'{q}_q_prompt_tokens_mean'], 0)} "
                f"| {f(r[f'{q}_q_turn_ms'], 3)} | {f(r[f'{q}_q_link_ms'], 3)} "
                f"| {f(r[f'{q}_q_hash_ref_ms'], 3)} | {f(r[f'{q}_q_turn_us_per_1k'], 1)} "
                f"| {f(r[f'{q}_q_link_us_per_1k'], 1)} | {f(r[f'{q}_q_floor_us_per_1k'], 1)} |"
            )
    forks = [r for r in rows if len(r["groups"]) > 1]
    if forks:
        lines += [
            "",
            "| rollout | group | turns | mean prompt | turn ms | link ms | turn us / 1k tok |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for r in forks:
            for g, v in r["groups"].items():
                lines.append(
                    f"| {r['rollout']} | {g} | {v['turns']} | {f(v['prompt_tokens_mean'], 0)} "
                    f"| {f(v['turn_ms'], 3)} | {f(v['link_ms'], 3)} "
                    f"| {f(v['turn_us_per_1k'], 1)} |"
                )
    return "\n".join(lines)


def target_check(rows: list[dict[str, Any]]) -> dict[str, Any]:
    linear = [r for r in rows if r["rollout"].startswith("linear")]
    out: dict[str, Any] = {}
    r800 = next((r for r in linear if r["turns"] == 800), None)
    if r800 is not None:
        out["ingest_800_s"] = r800["ingest_plus_link_s"]
        out["ingest_800_ok"] = r800["ingest_plus_link_s"] <= TARGET_800_TURN_S
    if len(linear) >= 2:
        lo = min(linear, key=lambda r: r["turns"])
        hi = max(linear, key=lambda r: r["turns"])
        # Same final prompt length, `hi` has turns/lo turns times more nodes: a per-turn cost
        # that grew with nodes would show as a ratio well above 1 on similar prompt lengths.
        out["nodes_ratio"] = hi["turns"] / lo["turns"]
        out["last_q_turn_us_per_1k_ratio"] = (
            hi["last_q_turn_us_per_1k"] / lo["last_q_turn_us_per_1k"]
        )
        out["last_q_link_us_per_1k_ratio"] = (
            hi["last_q_link_us_per_1k"] / lo["last_q_link_us_per_1k"]
        )
        out["flat_in_nodes_ok"] = out["last_q_turn_us_per_1k_ratio"] < 1.5
    return out


# --------------------------------------------------------------------------- main


def rollouts(args: argparse.Namespace) -> Iterator[tuple[str, list[TurnSpec], dict[str, Any]]]:
    for n in args.turns:
        specs = linear_rollout(n, args.final_tokens, args.initial_tokens, args.sampled, args.seed)
        yield f"linear-{n}", specs, {"kind": "linear"}
    if not args.no_fork:
        specs = fork_rollout(
            args.fork_trunk_turns,
            args.fork_trunk_tokens,
            args.fork_width,
            args.fork_depth,
            args.fork_added,
            args.initial_tokens,
            args.sampled,
            args.seed,
        )
        name = f"fork-{args.fork_width}x{args.fork_depth}"
        yield name, specs, {"kind": "fork"}


def warm_up(args: argparse.Namespace) -> None:
    """Imports, numpy dispatch, allocator: one small throwaway rollout, untimed."""
    specs = linear_rollout(20, 4096, args.initial_tokens, args.sampled, args.seed + 99)
    ingest_rollout("warm-up", specs, args.seed)


def run(args: argparse.Namespace) -> dict[str, Any]:
    load_start = os.getloadavg()[0]
    if load_start > 0.5:
        print(
            f"warning: load average {load_start:.2f}: other work shares the CPUs", file=sys.stderr
        )
    started = time.monotonic()
    warm_up(args)
    rows = []
    skipped = []
    for name, specs, meta in rollouts(args):
        if time.monotonic() - started > args.max_seconds:
            skipped.append(name)
            continue
        gc.collect()
        run_, rollout = ingest_rollout(name, specs, args.seed)
        if meta["kind"] == "linear":
            run_.checks += check_linear(rollout, specs)
        else:
            run_.checks += check_fork(rollout, specs, args.fork_trunk_turns, args.fork_width)
        if not args.no_export:
            time_export(run_, rollout, serialise=not args.no_export_json)
        row = summarise(run_)
        rows.append(row)
        print(
            f"  {name}: ingest+link {row['ingest_plus_link_s']:.3f} s "
            f"(floor {row['floor_s']:.3f} s), export {_f(row['export_s'])} s"
            + (f"  CHECKS FAILED: {run_.checks}" if run_.checks else ""),
            file=sys.stderr,
            flush=True,
        )
        del rollout, run_
    profile_text = None
    if args.profile:
        specs = linear_rollout(
            args.profile, args.final_tokens, args.initial_tokens, args.sampled, args.seed
        )
        prof = cProfile.Profile()
        ingest_rollout(f"profile-linear-{args.profile}", specs, args.seed, profile=prof)
        buf = io.StringIO()
        stats = pstats.Stats(prof, stream=buf)
        stats.sort_stats("tottime").print_stats(20)
        stats.sort_stats("cumulative").print_stats("rollwire", 20)
        profile_text = buf.getvalue()
    return {
        "benchmark": "graph_ingest",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "machine": platform.machine(),
            "python": platform.python_version(),
            "numpy": np.__version__,
        },
        "params": {k: v for k, v in vars(args).items() if k not in ("json",) and not callable(v)},
        "targets": {"ingest_800_turn_128k_s": TARGET_800_TURN_S, "per_turn": "flat in nodes"},
        "results": rows,
        "target_check": target_check(rows),
        "skipped_for_time": skipped,
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "elapsed_s": round(time.monotonic() - started, 1),
        "loadavg_start_end": [load_start, os.getloadavg()[0]],
        "profile": profile_text,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", default="100,200,400,800", help="linear rollout sizes")
    p.add_argument("--final-tokens", type=int, default=131072, help="last prompt's length")
    p.add_argument("--initial-tokens", type=int, default=512, help="first prompt's length")
    p.add_argument("--sampled", type=int, default=64, help="sampled ids per turn")
    p.add_argument("--no-fork", action="store_true", help="skip the forking rollout")
    p.add_argument("--fork-width", type=int, default=64)
    p.add_argument("--fork-depth", type=int, default=4, help="turns per branch")
    p.add_argument("--fork-trunk-turns", type=int, default=16)
    p.add_argument("--fork-trunk-tokens", type=int, default=32768)
    p.add_argument("--fork-added", type=int, default=448, help="tool ids per branch turn")
    p.add_argument("--no-export", action="store_true", help="skip export_rollout timing")
    p.add_argument("--no-export-json", action="store_true", help="skip the JSON serialisation")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument(
        "--max-seconds", type=float, default=300.0, help="start no new rollout after this"
    )
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="TURNS",
        help="also cProfile ingest+link of a linear rollout of TURNS turns (slow)",
    )
    p.add_argument("--json", default=str(RESULTS_DIR / "graph_ingest.json"))
    args = p.parse_args(argv)
    args.turns = [int(t) for t in args.turns.split(",") if t.strip()]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    doc = run(args)
    table = markdown(doc["results"])
    doc["markdown"] = table
    print()
    print(table)
    print()
    print("target check:", orjson.dumps(doc["target_check"]).decode())
    if doc["profile"]:
        print(doc["profile"])
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    print(f"wrote {out} ({doc['elapsed_s']} s, max RSS {doc['max_rss_mib']:.0f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
