"""SFT warm-up on rollwire's data, end to end on a CPU: a small model learns to answer by tool.

SmolLM2-135M-Instruct answers reasoning-gym's ``chain_sum`` problems in prose and never calls the
task's ``answer`` tool, so in tool mode it earns no reward at all (the verifier never runs) and
RL has nothing to learn from. The warm-up, as the people who train models do it:

1. **Teacher collection**: ``collect_episodes`` through rollwire's MCP server with a capable
   model (``--teacher-url``, any OpenAI-spec endpoint), keeping episodes with reward 1.0.
   Without ``--teacher-url`` a scripted teacher (``examples/chain_sum_teacher.py``) stands in.
2. **Export**: ``rollwire export --format sft`` (messages + tools; split by task instance).
3. **Student**: the embedded GGUF as a Hugging Face folder (``rollwire convert``), served by
   ``rollwire engine --model`` and evaluated **before** on held-out seeds (disjoint from the
   teacher's) through the MCP server: ``validate_llm``, then ``collect_episodes``.
4. **SFT** with TRL's ``SFTTrainer`` (``assistant_only_loss``: only the assistant's tokens).
5. **After**: the fine-tuned folder served by ``rollwire engine --model``, certified
   (``validate_llm`` TRAIN, ``rollwire parity``), evaluated on the same held-out seeds.
6. **GRPO**: ``--grpo-steps`` steps (1; 2 with ``--quick``) of ``examples/trl_grpo.py`` from
   the warmed model, rollouts sampled by the engine serving it (at ``--grpo-temperature``: 1.0,
   or 0.7 with ``--quick``), the trainer's weights pushed into that engine before every batch
   (``rollwire.trl.WeightSync``; ``--no-sync`` to leave it serving the student): rewards are
   numbers, every row names the weights that sampled it, and TRL's logprobs of the captured
   completions are compared with the engine's at every step (and the previous step's
   completions under the new weights). ``examples/grpo_cpu.py`` runs the long version.

The table (tool-call compliance, accuracy = pass@1 and mean reward with their standard errors,
from ``collect_episodes``' metrics block; before and after) and ``rollwire eval --compare`` of
the two held-out evals (paired by seed: the difference with its 95% interval) go to stdout, every
number of the run is appended to ``--results`` (default ``bench/results/sft_warmup.json``, a
list of runs, ``quick`` ones marked). Progress and the commands' logs go to stderr and
``<work>/logs``.

    uv run python examples/sft_warmup.py --quick          # the whole path, tiny budget (minutes)
    uv run python examples/sft_warmup.py                  # the published run (about 2-3 hours)
    uv run python examples/sft_warmup.py --teacher-url https://api.example.com/v1 --teacher-model M

Needs the ``train`` extra (torch, transformers, trl) and the ``engine`` and ``envs`` extras.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TASK = "reasoning_gym:chain_sum"
TASK_CONFIG = {"min_terms": 2, "max_terms": 3}
TRAIN_SEED = 0  # teacher instances: seeds TRAIN_SEED .. TRAIN_SEED + n - 1
EVAL_SEED = 1_000_000  # held-out instances: disjoint from any teacher seed this script uses
GRPO_SEED = EVAL_SEED + 500_000  # GRPO's task instances: disjoint from teacher and held-out seeds
QUICK_GRPO_CONFIG = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the whole path on a tiny budget")
    p.add_argument("--work", default="runs/sft-warmup", help="working directory")
    p.add_argument(
        "--results",
        default=str(ROOT / "bench" / "results" / "sft_warmup.json"),
        help="the JSON file this run is appended to (default bench/results/sft_warmup.json)",
    )
    p.add_argument("--teacher-url", help="the teacher's OpenAI base URL (default: scripted)")
    p.add_argument("--teacher-model", help="the teacher's model name, when it serves several")
    p.add_argument("--teacher-api-key", default=os.environ.get("TEACHER_API_KEY"))
    p.add_argument("--train-episodes", type=int, help="teacher episodes (default 2000; quick 32)")
    p.add_argument("--eval-episodes", type=int, help="held-out episodes (default 200; quick 12)")
    p.add_argument("--epochs", type=float, default=1.0, help="SFT epochs (default 1)")
    p.add_argument("--learning-rate", type=float, default=1e-4, help="SFT learning rate")
    p.add_argument("--batch-size", type=int, default=8, help="SFT batch size")
    p.add_argument("--eval-temperature", type=float, default=0.0, help="0: greedy (default)")
    p.add_argument("--max-tokens", type=int, default=96, help="tokens per model call in evals")
    p.add_argument("--grpo-steps", type=int, help="GRPO steps (default 1; quick 2)")
    p.add_argument("--grpo-group", type=int, help="GRPO group size (default 4; quick 8)")
    p.add_argument(
        "--grpo-task-config",
        help="GRPO tasks' generator config as JSON (default the warm-up's; quick: two one-digit "
        "terms, so a group of the quick student's samples holds a right and a wrong answer)",
    )
    p.add_argument(
        "--no-sync", action="store_true", help="GRPO without pushing weights into the engine"
    )
    p.add_argument(
        "--grpo-temperature",
        type=float,
        help="GRPO sampling temperature (default 1.0; quick 0.7: 32 teacher episodes leave a "
        "model whose T=1 samples often answer in prose, so a group of 4 can hold no tool call)",
    )
    p.add_argument("--no-grpo", action="store_true", help="stop after the SFT evaluation")
    p.add_argument("--seed", type=int, default=0, help="training seed")
    args = p.parse_args(argv)
    args.train_episodes = args.train_episodes or (32 if args.quick else 2000)
    args.eval_episodes = args.eval_episodes or (12 if args.quick else 200)
    if args.grpo_temperature is None:
        args.grpo_temperature = 0.7 if args.quick else 1.0
    args.grpo_steps = args.grpo_steps or (2 if args.quick else 1)
    args.grpo_group = args.grpo_group or (8 if args.quick else 4)
    if args.grpo_task_config is None:
        args.grpo_task_config = json.dumps(QUICK_GRPO_CONFIG if args.quick else TASK_CONFIG)
    return args


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rollwire_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "rollwire", *args]


@contextmanager
def process(
    name: str, argv: list[str], logs: Path, ready: str, timeout: float = 300
) -> Iterator[str]:
    """A background process whose stderr logs to ``logs/<name>.log``; yields the first stderr
    line containing ``ready`` once it appears."""
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{name}.log"
    with log.open("w") as err:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err, env=_env())
    try:
        deadline = time.monotonic() + timeout
        while True:
            line = next((x for x in log.read_text().splitlines() if ready in x), None)
            if line is not None:
                break
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{name} not ready after {timeout} s:\n{log.read_text()[-3000:]}"
                )
            time.sleep(0.2)
        yield line
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "TRL_EXPERIMENTAL_SILENCE": "1",
        "PYTHONUNBUFFERED": "1",
    }


@contextmanager
def engine(model_dir: Path, logs: Path, name: str, *extra: str) -> Iterator[str]:
    """``rollwire engine --model DIR`` (and ``extra`` options) on a free port; yields its /v1
    URL."""
    port = free_port()
    argv = rollwire_cmd("engine", "--model", str(model_dir), "--port", str(port), *extra)
    with process(name, argv, logs, ready="serving"):
        yield f"http://127.0.0.1:{port}/v1"


@contextmanager
def scripted_teacher() -> Iterator[str]:
    """examples/chain_sum_teacher.py's app on a free port, in this process."""
    import uvicorn

    sys.path.insert(0, str(ROOT / "examples"))
    from chain_sum_teacher import create_app

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def mcp_call(client: Any, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    started = time.perf_counter()
    shown = [0.0]

    def progress(done: float, total: float | None, message: str | None) -> None:
        if time.monotonic() - shown[0] > 15:  # a line every 15 s at most
            shown[0] = time.monotonic()
            say(f"  {tool}: {done:g}/{total or '?'} {message or ''}")

    out = client.call_tool(tool, args, progress=progress)
    say(f"{tool}: done in {time.perf_counter() - started:.1f} s")
    return out


def collect(
    client: Any, out_dir: str, llm: dict[str, Any], episodes: int, seed: int, **extra: Any
) -> dict[str, Any]:
    args = {
        "out_dir": out_dir,
        "episodes": episodes,
        "tasks": [TASK],
        "task_config": TASK_CONFIG,
        "llm": llm,
        "seed": seed,
        "answer_mode": "tool",
        "concurrency": 2,
        **extra,
    }
    say(f"collect_episodes {out_dir}: {episodes} episodes from seed {seed} on {llm['url']}")
    return mcp_call(client, "collect_episodes", args)


def scores(collection: Path, result: dict[str, Any]) -> dict[str, Any]:
    """Held-out accuracy and mean reward from ``collect_episodes``' metrics block (``rollwire
    eval``'s numbers: pass@1 and mean reward, each with its standard error over problems; a
    failed or unscored rollout is a failed attempt, scoring 0); tool-call compliance and stop
    reasons from the episodes themselves.

    Compliance: the model submitted its answer through the ``answer`` tool (in tool mode the
    verifier runs exactly then, so the reward is a number)."""
    overall = result["metrics"]["overall"]
    rows = [json.loads(x) for x in (collection / "episodes.jsonl").read_text().splitlines()]
    n = overall["samples"]
    return {
        "episodes": n,
        "failed": n - len(rows),
        "tool_call_compliance": sum(r["reward"] is not None for r in rows) / n,
        "accuracy": overall["pass_at"][0]["estimate"],
        "accuracy_se": overall["pass_at"][0]["se"],
        "mean_reward": overall["reward_mean"],
        "mean_reward_se": overall["reward_se"],
        "failed_causes": result["metrics"]["causes"],
        "stop_reasons": _count(r["stop_reason"] for r in rows),
    }


def compare_evals(data_dir: Path, before: str, after: str) -> tuple[dict[str, Any], str]:
    """``rollwire eval --compare`` of two held-out evals (paired by seed): JSON and the table
    the command prints."""
    from rollwire.datasets.evals import Comparison
    from rollwire.server.collect_cli import format_comparison

    a, b = str(data_dir / before), str(data_dir / after)
    data = subprocess.run(
        rollwire_cmd("eval", "--compare", a, b, "--json"), cwd=ROOT, capture_output=True,
        text=True, env=_env(), check=True,
    )  # fmt: skip
    return json.loads(data.stdout), format_comparison(Comparison.model_validate_json(data.stdout))


def _count(values: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[str(v)] = out.get(str(v), 0) + 1
    return out


def certify(client: Any, url: str, logs: Path, name: str) -> dict[str, Any]:
    """validate_llm (through the MCP server) and ``rollwire parity`` of one engine."""
    cert = mcp_call(client, "validate_llm", {"llm_url": url})
    say(f"{name}: validate_llm {cert['verdict']} (tier {cert['capture_level']})")
    parity = subprocess.run(
        rollwire_cmd("parity", "--llm-url", url, "--json"),
        cwd=ROOT, capture_output=True, text=True, env=_env(), timeout=900,
    )  # fmt: skip
    (logs / f"parity-{name}.log").write_text(parity.stderr)
    report = json.loads(parity.stdout) if parity.stdout.strip() else {}
    say(f"{name}: rollwire parity {report.get('verdict')}")
    return {
        "verdict": cert["verdict"],
        "capture_level": cert["capture_level"],
        "token_in_paths": cert.get("token_in_paths"),
        "parity": report.get("verdict"),
        "parity_honest_max_abs": (report.get("honest") or {}).get("max_abs"),
        "parity_controls_min_mean_abs": min(
            (c["mean_abs"] for c in report.get("controls") or []), default=None
        ),
    }


def held_out_eval(
    args: argparse.Namespace, client: Any, url: str, data_dir: Path, logs: Path, name: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Certify an engine, then evaluate it on the held-out instances (``collect_episodes``
    with ``eval``; tool mode, greedy by default): the same seeds for every model."""
    engine_report = certify(client, url, logs, name)
    extra = {
        "sampling": {"temperature": args.eval_temperature, "max_tokens": args.max_tokens},
        "limits": {"max_turns": 2},
    }
    # an eval (rollouts marked eval, no filter, every failure counted): one sample per seed
    extra["eval"] = True
    out = collect(client, f"eval-{name}", {"url": url}, args.eval_episodes, EVAL_SEED, **extra)
    held_out = [EVAL_SEED, EVAL_SEED + args.eval_episodes - 1]
    scored = {**scores(data_dir / f"eval-{name}", out), "seeds": held_out}
    say(f"{name}: {scored}")
    return engine_report, scored


def fine_tune(args: argparse.Namespace, base: Path, data: Path, out: Path, logs: Path) -> dict:
    """TRL's SFTTrainer on the exported conversations, assistant tokens only."""
    import datasets
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    splits = datasets.load_dataset(str(data), cache_dir=str(data / ".hf-cache"))
    tokenizer = AutoTokenizer.from_pretrained(base)
    config = SFTConfig(
        output_dir=str(out.parent / "sft-run"),
        num_train_epochs=args.epochs,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=0.05,  # a float below 1: a share of the steps
        assistant_only_loss=True,  # the chat template marks the assistant's own tokens
        max_length=1024,
        logging_steps=5,
        eval_strategy="epoch" if "eval" in splits else "no",
        save_strategy="no",
        report_to="none",
        bf16=False,
        # TRL turns it on by default (as gradient_checkpointing); for 135M parameters on a CPU
        # memory is not short, and recomputing each forward pass in the backward one costs time
        activation_checkpointing=False,
        seed=args.seed,
    )
    trainer = SFTTrainer(
        model=str(base),
        processing_class=tokenizer,
        train_dataset=splits["train"],
        eval_dataset=splits.get("eval"),
        args=config,
    )
    say(f"SFT: {splits['train'].num_rows} conversations x {args.epochs} epochs on {base.name}")
    started = time.perf_counter()
    with redirect_stdout(sys.stderr):  # the trainer prints its logs: stdout is for the table
        trainer.train()
    trainer.save_model(str(out))
    tokenizer.save_pretrained(str(out))
    history = trainer.state.log_history
    (logs / "sft_log_history.json").write_text(json.dumps(history, indent=2))
    losses = [e["loss"] for e in history if "loss" in e]
    evals = [e["eval_loss"] for e in history if "eval_loss" in e]
    return {
        "train_rows": splits["train"].num_rows,
        "eval_rows": splits["eval"].num_rows if "eval" in splits else 0,
        "epochs": args.epochs,
        "steps": trainer.state.global_step,
        "learning_rate": args.learning_rate,
        "batch_size": args.batch_size,
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "eval_loss": evals,
        "wall_s": round(time.perf_counter() - started, 1),
    }


def grpo(
    *,
    server: str,
    llm: str,
    model: Path,
    out_dir: Path,
    logs: Path,
    steps: int,
    group_size: int,
    groups: int,
    learning_rate: float,
    temperature: float,
    max_tokens: int,
    task_config: str,
    sync: dict[str, str] | None,
) -> dict[str, Any]:
    """``examples/trl_grpo.py`` for ``steps`` steps from ``model``, rollouts sampled by the engine
    at ``llm``; ``sync`` (``{"key": <its --admin-key>, "checkpoints": <in its
    --weights-root>}``) pushes the trainer's weights into it before every batch. Returns its
    report (``rollwire_report.json``) with the wall time."""
    argv = [
        sys.executable, str(ROOT / "examples" / "trl_grpo.py"),
        "--server", server, "--llm-url", llm, "--model", str(model),
        "--task", TASK, "--task-config", task_config, "--answer-mode", "tool",
        "--group-size", str(group_size), "--batch-size", str(group_size * groups),
        "--max-steps", str(steps), "--learning-rate", str(learning_rate),
        "--max-turns", "2", "--max-tokens", str(max_tokens), "--seed", str(GRPO_SEED),
        "--temperature", str(temperature), "--agreement", "every",
        "--output-dir", str(out_dir),
    ]  # fmt: skip
    env = _env()
    if sync is not None:
        argv += ["--sync", "disk", "--checkpoint-dir", sync["checkpoints"]]
        env["ROLLWIRE_ENGINE_ADMIN_KEY"] = sync["key"]
    say(
        f"GRPO: {steps} step(s) x {groups} group(s) of {group_size} from {model.name}, sync {bool(sync)}"
    )
    started = time.perf_counter()
    log_path = logs / f"{out_dir.name}.log"
    with log_path.open("w") as log:
        done = subprocess.run(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"trl_grpo.py failed:\n{log_path.read_text()[-4000:]}")
    report = json.loads((out_dir / "rollwire_report.json").read_text())
    report["wall_s"] = round(time.perf_counter() - started, 1)
    return report


def step_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per GRPO step: rollwire's numbers beside TRL's logged loss and grad norm."""
    logged = {e["step"]: e for e in report["log_history"] if "loss" in e}
    rows = []
    for entry in report["steps"]:
        k = entry["step"]
        rewards = entry["rewards"]
        agree = entry.get("logprob_agreement") or {}
        drift = entry.get("previous_step_agreement") or {}
        sync = entry.get("sync") or {}
        trl = logged.get(k + 1, {})  # TRL logs step k's update as global step k + 1
        rows.append(
            {
                "step": k,
                "rewards": rewards,
                "mean_reward": sum(r or 0.0 for r in rewards) / len(rewards),
                "answered": sum(r is not None for r in rewards) / len(rewards),
                "groups_with_signal": entry["groups_with_signal"],
                "weight_versions": sorted({str(v) for v in entry["weight_versions"]}),
                "agreement_max": agree.get("max_abs_diff"),
                "agreement_mean": agree.get("mean_abs_diff"),
                "agreement_tokens": agree.get("tokens"),
                "previous_step_max": drift.get("max_abs_diff"),
                "previous_step_mean": drift.get("mean_abs_diff"),
                "sync_paused_s": sync.get("paused_s"),
                "sync_total_s": sync.get("total_s"),
                "loss": trl.get("loss"),
                "grad_norm": trl.get("grad_norm"),
            }
        )
    return rows


def grpo_step(
    args: argparse.Namespace, server: str, llm: str, model: Path, work: Path, key: str
) -> dict:
    """``--grpo-steps`` GRPO steps from the warmed model, sampled by its engine (weights synced
    into it unless ``--no-sync``)."""
    report = grpo(
        server=server, llm=llm, model=model, out_dir=work / "grpo", logs=work / "logs",
        steps=args.grpo_steps, group_size=args.grpo_group, groups=1, learning_rate=1e-5,
        temperature=args.grpo_temperature, max_tokens=args.max_tokens,
        task_config=args.grpo_task_config,
        sync=None if args.no_sync else {"key": key, "checkpoints": str(work / "weights")},
    )  # fmt: skip
    steps = step_rows(report)
    return {
        "temperature": args.grpo_temperature,
        "task_config": json.loads(args.grpo_task_config),
        "sync": not args.no_sync,
        "steps": steps,
        "rewards": steps[0]["rewards"],
        "loss": steps[0]["loss"],
        "grad_norm": steps[0]["grad_norm"],
        "step0_logprob_agreement": report.get("step0_logprob_agreement"),
        "rollout_stats": report.get("rollout_stats"),
        "wall_s": report["wall_s"],
    }


def record(path: Path, results: dict[str, Any]) -> None:
    """Append this run to the results file (``{"runs": [...]}``, the latest last)."""
    runs: list[dict[str, Any]] = []
    if path.exists():
        earlier = json.loads(path.read_text())
        runs = earlier.get("runs", []) if isinstance(earlier, dict) else []
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"runs": [*runs, results]}, indent=2) + "\n")


def table(before: dict[str, Any], after: dict[str, Any]) -> str:
    def pm(value: float, se: float | None, pct: bool) -> str:
        scale, unit = (100, "%") if pct else (1, "")
        digits = 1 if pct else 3
        text = f"{scale * value:.{digits}f}{unit}"
        return text if se is None else f"{text} ± {scale * se:.{digits}f}"

    rows = [("tool-call compliance", "tool_call_compliance", None, True),
            ("accuracy (pass@1)", "accuracy", "accuracy_se", True),
            ("mean reward", "mean_reward", "mean_reward_se", False)]  # fmt: skip
    lines = [f"{'held-out seeds':22} {'before':>16} {'after':>16} {'delta':>9}"]
    for label, key, se, pct in rows:
        b, a = before[key], after[key]
        delta = f"{100 * (a - b):+.1f} pp" if pct else f"{a - b:+.3f}"
        cells = (
            pm(b, before.get(se) if se else None, pct),
            pm(a, after.get(se) if se else None, pct),
        )
        lines.append(f"{label:22} {cells[0]:>16} {cells[1]:>16} {delta:>9}")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from rollwire.trl import RolloutClient

    work = (ROOT / args.work).resolve() if not Path(args.work).is_absolute() else Path(args.work)
    logs = work / "logs"
    data_dir = work / "collections"
    for stale in ("collections", "sft", "student", "sft-run", "grpo", "weights"):
        shutil.rmtree(work / stale, ignore_errors=True)
    logs.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "task": TASK,
        "task_config": TASK_CONFIG,
        "quick": args.quick,
        "command": " ".join(["python", "examples/sft_warmup.py", *sys.argv[1:]]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    base = work / "base"
    if not (base / "config.json").exists():
        say("rollwire convert: the embedded SmolLM2-135M-Instruct as a Hugging Face folder")
        subprocess.run(
            rollwire_cmd("convert", "--out", str(base), "--force"), cwd=ROOT, check=True, env=_env()
        )
    port = free_port()
    serve = rollwire_cmd("serve", "--http", "--port", str(port), "--data-dir", str(data_dir))
    with process("serve", serve, logs, ready="rollwire MCP server on "):
        server = f"http://127.0.0.1:{port}/mcp"
        with RolloutClient(server, timeout=4 * 3600) as client, teacher(args) as teacher_llm:
            # 1. teacher collection, keep what the verifier scored 1.0
            t = collect(
                client, "teacher", teacher_llm, args.train_episodes, TRAIN_SEED, min_reward=1.0
            )
            results["teacher"] = {
                "llm": "scripted (examples/chain_sum_teacher.py)" if not args.teacher_url else args.teacher_url,
                "kept": t["collected"], "filtered": t["filtered"], "failed": t["failed"],
                "engine_tier": t["engine_tier"], "seeds": [TRAIN_SEED, TRAIN_SEED + args.train_episodes - 1],
            }  # fmt: skip
        # 2. the SFT dataset
        from rollwire.datasets.sft import export_sft

        exported = export_sft(
            data_dir / "teacher", work / "sft", min_reward=1.0, eval_fraction=0.05
        )
        results["sft_export"] = exported.model_dump()
        say(f"export --format sft: {exported.rows}")
        with RolloutClient(server, timeout=4 * 3600) as client:
            # 3. before
            with engine(base, logs, "engine-base") as url:
                results["base_engine"], results["before"] = held_out_eval(
                    args, client, url, data_dir, logs, "base"
                )
            # 4. SFT
            student = work / "student"
            results["sft"] = fine_tune(args, base, work / "sft", student, logs)
            # 5. after (and 6. GRPO from the warmed model, on its engine, weights synced)
            key = secrets.token_urlsafe(16)
            (work / "weights").mkdir()
            extra = ("--admin-key", key, "--weights-root", str(work / "weights"))
            with engine(student, logs, "engine-student", *extra) as url:
                results["student_engine"], results["after"] = held_out_eval(
                    args, client, url, data_dir, logs, "student"
                )
                if not args.no_grpo:
                    results["grpo"] = grpo_step(args, server, url, student, work, key)
    results["compare"], compared = compare_evals(data_dir, "eval-base", "eval-student")
    results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    record(Path(args.results), results)
    print(table(results["before"], results["after"]))
    print(compared)
    for row in (results.get("grpo") or {}).get("steps", []):
        print(
            f"GRPO step {row['step']} (weights {','.join(row['weight_versions'])}): rewards "
            f"{row['rewards']}, loss {row['loss']}, grad norm {row['grad_norm']}; TRL vs engine "
            f"logprobs over {row['agreement_tokens']} tokens: max |diff| {row['agreement_max']}"
            + (
                f"; the previous step's under these weights: max {row['previous_step_max']}"
                if row["previous_step_max"] is not None
                else ""
            )
        )
    print(f"results: {args.results}")
    return 0


@contextmanager
def teacher(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    """The teacher as collect_episodes' ``llm``: the given endpoint, or the scripted one."""
    if args.teacher_url:
        spec = {
            "url": args.teacher_url,
            "model": args.teacher_model,
            "api_key": args.teacher_api_key,
        }
        yield {k: v for k, v in spec.items() if v}
        return
    with scripted_teacher() as url:
        yield {"url": url}


if __name__ == "__main__":
    sys.exit(main(parse_args()))
