"""Harbor oracle trials per second in the ``local`` (bubblewrap) sandbox, against the sandbox alone.

Round-robin over the bundled tasks in ``examples/tasks`` (every trial must reach reward 1.0),
through ``run_trial(task, agent="oracle")`` at concurrency 1, 8 and 32 (an anyio task group
bounded by a semaphore). Baseline in the same run, at the same concurrencies and on the same
tasks' environments: the sandbox's own life cycle with no Harbor trial, i.e. ``LocalEnvironment``
construction + ``start`` + ``exec("true")`` + ``stop``. The ratio of the two shows what a trial
adds on top of the sandbox: Harbor's trial machinery (config, task loading, agent and verifier
setup, uploads and downloads, result files) plus the task's own solve.sh and test.sh.

Every timed run is bounded by a count and by a time cap (no new item starts after
``--run-seconds``; the whole benchmark starts no new run after ``--max-seconds``). CPU is
accounted per item: this process (Harbor + rollwire, Python) and its reaped children (bwrap,
nsenter, the task's shell commands), plus what *other* processes used meanwhile (from
/proc/stat), since the machine is shared. Targets (issue 20) at concurrency 8 on 2 cores:
>= 15 trials/s, and a trial <= 2x the bare sandbox cycle. Wall rates swing with the other
processes on a shared machine; CPU per item (this process + its children) does much less, so the
tables give both ratios: of throughputs, and of CPU per item.

    uv run python bench/harbor_trials.py [--concurrency 1,8,32] [--trials 12,48,96] \
        [--rounds 1] [--profile] [--out bench/results/harbor_trials.json]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import anyio
from harbor.models.task.config import EnvironmentConfig as TaskEnvironmentConfig
from harbor.models.task.task import Task
from harbor.models.trial.paths import TrialPaths

from rollwire.harnesses.harbor.datasets import TaskEntry, resolve_dataset
from rollwire.harnesses.harbor.local import LocalEnvironment, sandbox_problem
from rollwire.harnesses.harbor.trial import TrialOutcome, run_trial

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "examples" / "tasks" / "registry.json"
REWARD_KEYS = {"sales-report": "correct"}  # its reward.json has three keys, all 1.0 for oracle
TARGET_CONCURRENCY = 8
TARGET_TRIALS_PER_S = 15.0
TARGET_RATIO = 2.0  # a trial's cost over the bare sandbox cycle's
_HZ = os.sysconf("SC_CLK_TCK")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _cpu_self_and_children() -> tuple[float, float]:
    t = os.times()
    return t.user + t.system, t.children_user + t.children_system


def _busy_seconds() -> float:
    """CPU seconds all processes on the machine have used (from /proc/stat), or nan."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return float("nan")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / _HZ


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def reached_full_reward(outcome: TrialOutcome) -> bool:
    """reward 1.0, and (for a multi-key reward.json) every key 1.0."""
    return (
        outcome.ok
        and outcome.reward == 1.0
        and all(value == 1.0 for value in outcome.rewards.values())
    )


class Bench:
    def __init__(self, tasks: list[TaskEntry], work: Path) -> None:
        self.tasks = tasks
        self.work = work
        self.env_configs: dict[str, TaskEnvironmentConfig] = {
            t.name: Task(t.path).config.environment for t in tasks
        }

    async def sandbox_cycle(self, i: int) -> dict[str, Any]:
        """The baseline: one sandbox's life, no Harbor trial: construct, start, exec, stop."""
        task = self.tasks[i % len(self.tasks)]
        start = time.perf_counter()
        trial_paths = TrialPaths(self.work / "cycles" / f"{task.name}-{i}-{uuid.uuid4().hex[:6]}")
        trial_paths.mkdir()
        env = LocalEnvironment(
            environment_dir=task.path / "environment",
            environment_name=task.name,
            session_id=f"{task.name}__bench{i}__env",
            trial_paths=trial_paths,
            task_env_config=self.env_configs[task.name],
        )
        ok = False
        error = None
        try:
            await env.start(force_build=False)
            result = await env.exec("true")
            ok = result.return_code == 0
            if not ok:
                error = f"exec returned {result.return_code}: {result.stderr}"
        except Exception as exc:  # a benchmark item that fails is counted, not raised
            error = f"{type(exc).__name__}: {exc}"
        finally:
            await env.stop(delete=True)
        return {
            "task": task.name,
            "ok": ok,
            "error": error,
            "seconds": time.perf_counter() - start,
        }

    async def oracle_trial(self, i: int) -> dict[str, Any]:
        task = self.tasks[i % len(self.tasks)]
        outcome = await run_trial(
            task,
            agent="oracle",
            reward_key=REWARD_KEYS.get(task.name),
            trials_dir=self.work / "trials",
        )
        return {
            "task": task.name,
            "ok": reached_full_reward(outcome),
            "error": None if reached_full_reward(outcome) else (outcome.error or outcome.rewards),
            "seconds": outcome.timings.get("total", float("nan")),
            "phases": {k: v for k, v in outcome.timings.items() if k != "total"},
        }


async def run_many(
    n: int, concurrency: int, item: Callable[[int], Awaitable[dict[str, Any]]], cap_s: float
) -> dict[str, Any]:
    """Run ``n`` items at ``concurrency``; none starts after ``cap_s``. Wall, CPU and results."""
    limiter = anyio.Semaphore(concurrency)
    results: list[dict[str, Any]] = []
    skipped = 0
    cpu0 = _cpu_self_and_children()
    busy0 = _busy_seconds()
    start = time.perf_counter()

    async def one(i: int) -> None:
        nonlocal skipped
        async with limiter:
            if time.perf_counter() - start > cap_s:
                skipped += 1
                return
            results.append(await item(i))

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    wall = time.perf_counter() - start
    cpu1 = _cpu_self_and_children()
    busy = _busy_seconds() - busy0
    own_self, own_children = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
    done = len(results)
    secs = [r["seconds"] for r in results]
    return {
        "items": done,
        "skipped_by_time_cap": skipped,
        "ok": sum(r["ok"] for r in results),
        "failures": [r for r in results if not r["ok"]][:5],
        "wall_s": wall,
        "per_s": done / wall if wall > 0 else float("nan"),
        "item_median_s": statistics.median(secs) if secs else float("nan"),
        "item_p90_s": _pct(secs, 0.9),
        "item_max_s": max(secs) if secs else float("nan"),
        "cpu_self_ms_per_item": 1000 * own_self / done if done else float("nan"),
        "cpu_children_ms_per_item": 1000 * own_children / done if done else float("nan"),
        "foreign_cores": (busy - own_self - own_children) / wall if wall > 0 else float("nan"),
        "phase_medians_s": _phase_medians(results),
    }


def _phase_medians(results: list[dict[str, Any]]) -> dict[str, float]:
    names = sorted({k for r in results for k in r.get("phases", {})})
    return {
        name: statistics.median([r["phases"][name] for r in results if name in r["phases"]])
        for name in names
        if not name.startswith("step.")
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    problem = sandbox_problem()
    if problem is not None:
        raise SystemExit(f"the local sandbox cannot run here: {problem}")
    tasks = list(resolve_dataset(TASKS).tasks)
    work = Path(tempfile.mkdtemp(prefix="rollwire-bench-trials-"))
    bench = Bench(tasks, work)
    report: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "harbor": version("harbor"),
        },
        "params": {
            "concurrency": args.concurrency,
            "trials": args.trials,
            "rounds": args.rounds,
            "run_seconds": args.run_seconds,
            "max_seconds": args.max_seconds,
            "tasks": [t.name for t in tasks],
            "reward_keys": REWARD_KEYS,
        },
        "loadavg_start": os.getloadavg(),
        "warmup": [],
        "rows": [],
    }
    begun = time.perf_counter()
    try:
        # Warm-up outside the timing: imports, first sandbox, and one oracle trial per task,
        # which must each reach reward 1.0 before anything is timed.
        for i in range(len(tasks)):
            cycle = await bench.sandbox_cycle(i)
            trial = await bench.oracle_trial(i)
            report["warmup"].append({"task": tasks[i].name, "cycle": cycle, "trial": trial})
            if not (cycle["ok"] and trial["ok"]):
                raise SystemExit(f"warm-up failed for {tasks[i].name}: {cycle} {trial}")
        for rnd in range(args.rounds):
            for conc, n in zip(args.concurrency, args.trials, strict=True):
                if time.perf_counter() - begun > args.max_seconds:
                    report["stopped_early"] = f"--max-seconds {args.max_seconds} reached"
                    break
                kinds = ["sandbox", "trial"] if rnd % 2 == 0 else ["trial", "sandbox"]
                for kind in kinds:
                    item = bench.sandbox_cycle if kind == "sandbox" else bench.oracle_trial
                    row = await run_many(n, conc, item, args.run_seconds)
                    row.update(round=rnd, kind=kind, concurrency=conc, requested=n)
                    report["rows"].append(row)
                    print(
                        f"round {rnd} {kind:7} c={conc:2}: {row['items']} items "
                        f"({row['ok']} ok) {row['per_s']:.2f}/s, median {row['item_median_s']:.3f} s",
                        file=sys.stderr,
                    )
                    shutil.rmtree(work / "trials", ignore_errors=True)
                    shutil.rmtree(work / "cycles", ignore_errors=True)
        if args.profile:
            report["profile"] = await _profile(bench, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report["loadavg_end"] = os.getloadavg()
    return report


async def _profile(bench: Bench, args: argparse.Namespace) -> str:
    """cProfile of this process over trials at the target concurrency (children not included)."""
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        await run_many(
            args.trials[args.concurrency.index(TARGET_CONCURRENCY)]
            if TARGET_CONCURRENCY in args.concurrency
            else 48,
            TARGET_CONCURRENCY,
            bench.oracle_trial,
            args.run_seconds,
        )
    finally:
        profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(40)
    return out.getvalue()


def markdown(report: dict[str, Any]) -> str:
    rows = report["rows"]
    lines = [
        "| conc | sandbox cycles/s (baseline) | cycles ok | trials/s | ratio | sandbox cycle "
        "median s | trial median / p90 s | trials ok (reward 1.0) | cycle CPU ms: self / children "
        "| trial CPU ms: rollwire+Harbor / children | CPU ratio | other processes (cores) "
        "| target |",
        "|---:|---:|---:|---:|---:|---:|---|---:|---|---|---:|---:|---|",
    ]
    for rnd in sorted({r["round"] for r in rows}):
        for conc in report["params"]["concurrency"]:
            pair = {r["kind"]: r for r in rows if r["round"] == rnd and r["concurrency"] == conc}
            if len(pair) != 2:
                continue
            base, trial = pair["sandbox"], pair["trial"]
            target = "-"
            if conc == TARGET_CONCURRENCY:
                ok = trial["ok"] == trial["items"]
                rate = trial["per_s"] >= TARGET_TRIALS_PER_S and ok
                ratio = base["per_s"] / trial["per_s"] <= TARGET_RATIO and ok
                target = (
                    f"{'**met**' if rate else '**missed**'} (>= {TARGET_TRIALS_PER_S:g}/s), "
                    f"{'**met**' if ratio else '**missed**'} (<= {TARGET_RATIO:g}x)"
                )
            base_cpu = base["cpu_self_ms_per_item"] + base["cpu_children_ms_per_item"]
            trial_cpu = trial["cpu_self_ms_per_item"] + trial["cpu_children_ms_per_item"]
            lines.append(
                f"| {conc} | {base['per_s']:.1f} | {base['ok']}/{base['items']} | "
                f"{trial['per_s']:.2f} | "
                f"{base['per_s'] / trial['per_s']:.1f}x | {base['item_median_s']:.3f} | "
                f"{trial['item_median_s']:.3f} / {trial['item_p90_s']:.3f} | "
                f"{trial['ok']}/{trial['items']} | "
                f"{base['cpu_self_ms_per_item']:.0f} / {base['cpu_children_ms_per_item']:.0f} | "
                f"{trial['cpu_self_ms_per_item']:.0f} / {trial['cpu_children_ms_per_item']:.0f} | "
                f"{trial_cpu / base_cpu:.1f}x | {trial['foreign_cores']:.2f} | {target} |"
            )
    return "\n".join(lines)


def phases_markdown(report: dict[str, Any]) -> str:
    lines = ["| conc | " + " | ".join(_PHASE_NAMES) + " |", "|---:|" + "---:|" * len(_PHASE_NAMES)]
    for row in report["rows"]:
        if row["kind"] != "trial" or row["round"] != 0:
            continue
        cells = [f"{row['phase_medians_s'].get(p, float('nan')):.3f}" for p in _PHASE_NAMES]
        lines.append(f"| {row['concurrency']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


_PHASE_NAMES = ("environment_setup", "agent_setup", "agent_execution", "verifier", "trial")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--concurrency", type=_ints, default=[1, 8, 32])
    parser.add_argument("--trials", type=_ints, default=[12, 48, 96], help="per concurrency")
    parser.add_argument("--rounds", type=int, default=1, help="alternate baseline/trial order")
    parser.add_argument("--run-seconds", type=float, default=60.0, help="cap per timed run")
    parser.add_argument("--max-seconds", type=float, default=300.0, help="cap for the benchmark")
    parser.add_argument("--profile", action="store_true", help="cProfile trials at c=8")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "harbor_trials.json"
    )
    args = parser.parse_args()
    if len(args.trials) != len(args.concurrency):
        parser.error("--trials needs one count per --concurrency")
    report = anyio.run(main_async, args)
    la0, la1 = report["loadavg_start"][0], report["loadavg_end"][0]
    print(
        f"\n{report['machine']['cpus']} CPUs; load average (1 min) {la0:.2f} at start, "
        f"{la1:.2f} at end; tasks: {', '.join(report['params']['tasks'])}\n"
    )
    print(markdown(report))
    print("\nTrial phase medians (s), round 0 (Harbor's own timings):\n")
    print(phases_markdown(report))
    if "profile" in report:
        print("\n" + report["profile"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
