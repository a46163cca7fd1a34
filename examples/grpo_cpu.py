"""GRPO on a CPU through rollwire, on-policy: the trainer's weights go into the engine before
every batch of rollouts, and every captured turn says which weights sampled it.

The SFT-warmed student of ``examples/sft_warmup.py`` (``<work>/student``) is served by
``rollwire engine --model DIR --admin-key KEY --weights-root CKPTS``; ``examples/trl_grpo.py``
trains it with TRL's ``GRPOTrainer`` through ``rollwire.trl``'s MCP ``rollout_func``, and with
``--sync disk`` pushes the trainer's weights into that engine (``rollwire.trl.WeightSync``)
before each batch, as version ``step-<k>``. Per step it records the mean reward, the share of
groups with signal (rewards that differ), the weight versions of the rows, and TRL's own
logprobs of the captured completions against the engine's (the agreement), also for the
previous step's completions under the new weights (the drift a trainer without sync trains
on). Before and after RL, the same held-out problems as the SFT warm-up (greedy, tool mode)
through ``collect_episodes``.

    uv run python examples/grpo_cpu.py --student runs/sft-warmup/student --steps 30
    uv run python examples/grpo_cpu.py --student runs/sft-warmup/student --steps 30 --no-sync

(the second is the control: the engine keeps the student's weights, the trainer moves on).
Each run is appended to ``--results`` (default ``bench/results/grpo_cpu.json``); the plot
(``--plot``, default ``bench/results/grpo_cpu.png``) draws every run in the file: reward and
agreement per step. Needs the ``train``, ``engine`` and ``envs`` extras.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sft_warmup import (  # the warm-up's own helpers: one way to run each step
    ROOT,
    TASK,
    TASK_CONFIG,
    compare_evals,
    engine,
    free_port,
    grpo,
    held_out_eval,
    process,
    record,
    rollwire_cmd,
    say,
    step_rows,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--student", help="the warmed model (a Hugging Face folder)")
    p.add_argument(
        "--summary",
        action="store_true",
        help="print the markdown table of the runs in --results (the docs' table), draw --plot "
        "again from them, and stop",
    )
    p.add_argument("--work", default="runs/grpo-cpu", help="working directory")
    p.add_argument("--steps", type=int, default=30, help="GRPO optimizer steps (default 30)")
    p.add_argument("--group-size", type=int, default=4, help="samples per task instance")
    p.add_argument("--groups", type=int, default=4, help="task instances per step (default 4)")
    p.add_argument("--learning-rate", type=float, default=1e-5, help="GRPO learning rate")
    p.add_argument("--temperature", type=float, default=1.0, help="GRPO sampling temperature")
    p.add_argument("--max-tokens", type=int, default=96, help="tokens per model call")
    p.add_argument("--eval-episodes", type=int, default=100, help="held-out episodes")
    p.add_argument("--eval-temperature", type=float, default=0.0, help="0: greedy (default)")
    p.add_argument("--no-sync", action="store_true", help="the control: no weights pushed")
    p.add_argument(
        "--eval",
        choices=["both", "after", "none"],
        default="both",
        help="held-out evaluations: before and after RL (default), after only (the student's "
        "numbers are in an earlier run of the same seeds), or none",
    )
    p.add_argument(
        "--task-config", default=json.dumps(TASK_CONFIG), help="GRPO tasks' generator config"
    )
    p.add_argument(
        "--results", default=str(ROOT / "bench" / "results" / "grpo_cpu.json"), help="JSON file"
    )
    p.add_argument("--plot", default=str(ROOT / "bench" / "results" / "grpo_cpu.png"))
    p.add_argument("--seed", type=int, default=0, help="training seed")
    return p.parse_args(argv)


def plot(results: Path, out: Path) -> None:
    """Reward and agreement per step for every run in ``results`` (one line per run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = json.loads(results.read_text())["runs"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    for run in runs:
        if run.get("quick"):
            continue
        label = "weights synced" if run["sync"] else "no sync (control)"
        steps = [r["step"] for r in run["steps"]]
        top.plot(steps, [r["mean_reward"] for r in run["steps"]], marker="o", ms=3, label=label)
        agree = [r["agreement_max"] for r in run["steps"]]
        (line,) = bottom.semilogy(steps, agree, marker="o", ms=3, label=f"{label}: max |diff|")
        if run["sync"]:  # what the same samples would look like one step later, unsynced
            drift = [r["previous_step_max"] for r in run["steps"]]
            bottom.semilogy(
                steps, drift, ls=":", color=line.get_color(),
                label=f"{label}: the previous step's samples, max |diff|",
            )  # fmt: skip
    bottom.axhline(1e-3, color="grey", ls="--", lw=1, label="1e-3 nats")
    top.set_ylabel("mean reward (batch)")
    top.set_title("GRPO on CPU through rollwire: SmolLM2-135M, reasoning_gym chain_sum")
    top.legend()
    bottom.set_ylabel("TRL vs captured logprobs (nats)")
    bottom.set_xlabel("GRPO step")
    bottom.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def versions(steps: list[dict[str, Any]]) -> str:
    """The rows' weight versions over a run: first ... last, or one name for them all."""
    if any(len(r["weight_versions"]) != 1 for r in steps):
        return "mixed within a step"
    first, last = steps[0]["weight_versions"][0], steps[-1]["weight_versions"][0]
    if all(r["weight_versions"] == [first] for r in steps):
        return f"{first} (every row)"
    return f"{first} ... {last}"


def summary(runs: list[dict[str, Any]]) -> str:
    """The docs' table: one column per run (synced, and the control), the numbers that say
    whether the data was on-policy and whether the policy learnt."""

    def col(run: dict[str, Any]) -> dict[str, str]:
        steps = run["steps"]
        agree = [r["agreement_max"] for r in steps if r["agreement_max"] is not None]
        drift = [r["previous_step_max"] for r in steps if r["previous_step_max"] is not None]
        syncs = sorted(r["sync_paused_s"] for r in steps if r["sync_paused_s"] is not None)
        k = max(1, len(steps) // 3)
        first = sum(r["mean_reward"] for r in steps[:k]) / k
        last = sum(r["mean_reward"] for r in steps[-k:]) / k
        out = {
            "steps": f"{len(steps)} x {run['groups_per_step']} groups of {run['group_size']}",
            "rows' weight versions": versions(steps),
            "TRL vs captured logprobs, max over steps": f"{max(agree):.1e} nats",
            "... at the last step": f"{agree[-1]:.1e} nats",
            "previous step's samples under new weights, median": (
                f"{sorted(drift)[len(drift) // 2]:.2g} nats" if drift else "-"
            ),
            "groups with signal (mean)": (
                f"{sum(r['groups_with_signal'] for r in steps) / len(steps):.2f}"
            ),
            "batch mean reward, first / last third of the steps": f"{first:.3f} / {last:.3f}",
            "rollouts waited per sync (median)": f"{syncs[len(syncs) // 2]:.2f} s"
            if syncs
            else "-",
        }
        if "before" in run:
            out["held-out accuracy before RL (the student)"] = (
                f"{100 * run['before']['accuracy']:.1f}%"
            )
        if "after" in run:
            a = run["after"]
            out["held-out accuracy after RL"] = f"{100 * a['accuracy']:.1f}%"
            out["held-out compliance after RL"] = f"{100 * a['tool_call_compliance']:.1f}%"
        return out

    runs = [r for r in runs if not r.get("quick")]
    cols = [col(r) for r in runs]
    names = ["synced every step" if r["sync"] else "no sync (control)" for r in runs]
    rows = list(dict.fromkeys(k for c in cols for k in c))
    lines = ["| | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    lines += [f"| {row} | " + " | ".join(c.get(row, "-") for c in cols) + " |" for row in rows]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from rollwire.trl import RolloutClient

    if args.summary:
        print(summary(json.loads(Path(args.results).read_text())["runs"]))
        plot(Path(args.results), Path(args.plot))
        return 0
    if not args.student:
        say("--student is required (the warmed model folder), or --summary")
        return 2
    work = (ROOT / args.work).resolve() if not Path(args.work).is_absolute() else Path(args.work)
    student = Path(args.student).resolve()
    if not (student / "config.json").is_file():
        say(f"--student {student}: not a Hugging Face folder (run examples/sft_warmup.py first)")
        return 2
    name = "sync" if not args.no_sync else "nosync"
    logs, checkpoints, out_dir = work / "logs", work / f"weights-{name}", work / f"grpo-{name}"
    for stale in (checkpoints, out_dir, work / f"collections-{name}"):
        shutil.rmtree(stale, ignore_errors=True)
    logs.mkdir(parents=True, exist_ok=True)
    checkpoints.mkdir(parents=True)
    data_dir = work / f"collections-{name}"
    results: dict[str, Any] = {
        "task": TASK,
        "task_config": json.loads(args.task_config),
        "sync": not args.no_sync,
        "quick": False,
        "student": str(student),
        "steps_asked": args.steps,
        "group_size": args.group_size,
        "groups_per_step": args.groups,
        "learning_rate": args.learning_rate,
        "temperature": args.temperature,
        "command": " ".join(["python", "examples/grpo_cpu.py", *sys.argv[1:]]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    key = secrets.token_urlsafe(16)
    port = free_port()
    serve = rollwire_cmd("serve", "--http", "--port", str(port), "--data-dir", str(data_dir))
    with process(f"serve-{name}", serve, logs, ready="rollwire MCP server on "):
        server = f"http://127.0.0.1:{port}/mcp"
        with RolloutClient(server, timeout=4 * 3600) as client:
            extra = ("--admin-key", key, "--weights-root", str(checkpoints))
            with engine(student, logs, f"engine-{name}", *extra) as url:
                if args.eval == "both":
                    results["student_engine"], results["before"] = held_out_eval(
                        args, client, url, data_dir, logs, f"before-{name}"
                    )
                report = grpo(
                    server=server, llm=url, model=student, out_dir=out_dir, logs=logs,
                    steps=args.steps, group_size=args.group_size, groups=args.groups,
                    learning_rate=args.learning_rate, temperature=args.temperature,
                    max_tokens=args.max_tokens, task_config=args.task_config,
                    sync=None if args.no_sync else {"key": key, "checkpoints": str(checkpoints)},
                )  # fmt: skip
            results["steps"] = step_rows(report)
            results["rollout_stats"] = report.get("rollout_stats")
            results["grpo_wall_s"] = report["wall_s"]
            if args.eval != "none":
                with engine(out_dir, logs, f"engine-after-{name}") as url:
                    results["trained_engine"], results["after"] = held_out_eval(
                        args, client, url, data_dir, logs, f"after-{name}"
                    )
    compared = ""
    if "before" in results and "after" in results:  # paired by held-out seed
        results["compare"], compared = compare_evals(
            data_dir, f"eval-before-{name}", f"eval-after-{name}"
        )
    results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    record(Path(args.results), results)
    plot(Path(args.results), Path(args.plot))
    print(table(results))
    if compared:
        print(compared)
    print(f"results: {args.results}; plot: {args.plot}")
    return 0


def table(results: dict[str, Any]) -> str:
    """Per-step lines, then held-out before and after."""
    lines = [
        f"{'step':>4} {'reward':>6} {'signal':>6} {'versions':>10} {'agree max':>10} "
        f"{'prev-step max':>13} {'sync s':>6}"
    ]
    for r in results["steps"]:
        lines.append(
            f"{r['step']:>4} {r['mean_reward']:>6.3f} {r['groups_with_signal']:>6.2f} "
            f"{','.join(r['weight_versions']):>10} {_e(r['agreement_max']):>10} "
            f"{_e(r['previous_step_max']):>13} {_f(r['sync_total_s']):>6}"
        )
    if "before" in results and "after" in results:
        b, a = results["before"], results["after"]
        lines.append(
            f"held-out accuracy (pass@1) {100 * b['accuracy']:.1f}% ± "
            f"{100 * (b.get('accuracy_se') or 0):.1f} -> {100 * a['accuracy']:.1f}% ± "
            f"{100 * (a.get('accuracy_se') or 0):.1f} "
            f"({100 * (a['accuracy'] - b['accuracy']):+.1f} pp), compliance "
            f"{100 * b['tool_call_compliance']:.1f}% -> {100 * a['tool_call_compliance']:.1f}%"
        )
    return "\n".join(lines)


def _e(v: float | None) -> str:
    return "-" if v is None else f"{v:.1e}"


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


if __name__ == "__main__":
    sys.exit(main(parse_args()))
