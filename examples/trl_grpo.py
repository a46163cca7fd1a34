"""GRPO with TRL, rollwire as the rollout source.

Each GRPO sample is one agent rollout that a rollwire server runs (``run_rollout``): the policy
is sampled through rollwire's capture proxy, so the trainer gets the engine's own token ids,
logprobs and a loss mask over the whole multi-turn conversation (``env_mask``: 1 on sampled
tokens, 0 on tool results and template tokens), and the verifier's reward.

Two modes:

    # check the rollout source against TRL's rollout_func contract (no torch, no trl needed)
    python examples/trl_grpo.py --check --server http://127.0.0.1:8400/mcp \\
        --tasks reasoning_gym --query chain_sum --limit 2 --group-size 4

    # train (needs torch + trl; see docs/guides/trainers.md)
    python examples/trl_grpo.py --server http://127.0.0.1:8400/mcp --model Qwen/Qwen3-0.6B \\
        --vllm-server http://127.0.0.1:8000 --tasks reasoning_gym --query chain_sum --limit 8

Training samples from ``--vllm-server``: a vLLM OpenAI server started for TRL's server mode
(``VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --weight-transfer-config '{"backend": "nccl"}'
--logprobs-mode processed_logprobs``) plus ``--return-tokens-as-token-ids`` and a tool-call
parser for rollwire. GRPOTrainer pushes the current weights to it before each batch of
rollouts (``--sync version_only`` then names each push's version, so the captured turns say
which step sampled them), and rollwire's agents call the same server's ``/v1``, so every
rollout samples the current policy. On a CPU, from a warmed checkpoint
(``examples/sft_warmup.py``) served by ``rollwire engine --model DIR --admin-key KEY
--weights-root CKPTS``, ``--sync disk`` pushes the trainer's weights into that engine before
each batch (``rollwire.trl.WeightSync``):

    python examples/trl_grpo.py --server http://127.0.0.1:8400/mcp --model DIR \\
        --llm-url http://127.0.0.1:8000/v1 --sync disk --engine-admin-key KEY \\
        --checkpoint-dir CKPTS --task reasoning_gym:chain_sum \\
        --task-config '{"min_terms": 2, "max_terms": 3}' --group-size 4 --max-steps 20

Without a sync nothing updates the engine: exact for the first step (the engine serves the
weights being trained), stale after it. ``--answer-mode text`` (or ``either``) gets rewards
from a policy that answers in prose. TRL's own per-token logprobs of the captured completions
are compared with the engine's (mean and max |diff| over the env_mask positions) at step 0, or
at every step with ``--agreement every`` (then also the previous step's completions under the
current weights: the drift a trainer without sync would train on); on stderr and in
``<output-dir>/rollwire_report.json`` with TRL's logged metrics, each step's rewards, groups
with signal, weight versions and sync times.

Checked against TRL 1.16.0 (``GRPOTrainer(rollout_func=...)``: ``rollout_func(prompts,
trainer)`` gets each prompt ``num_generations`` times in a row, needs ``prompt_ids``,
``completion_ids``, ``logprobs``, pops ``env_mask`` as the tool mask, and forwards every other
key to the reward functions; ``GRPOConfig(use_vllm=True, vllm_mode="server",
vllm_server_base_url=...)`` syncs weights into a plain ``vllm serve``). TRL marks
``rollout_func`` experimental.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rollwire.trl import (
    EXTRA_KEYS,
    REQUIRED_KEYS,
    make_rollout_func,
    reward_from_rollout,
    task_dataset,
)

REQUIRED = REQUIRED_KEYS
FORWARDED = (*EXTRA_KEYS, "error", "stale")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="GRPO with TRL, rollwire as the rollout source.")
    p.add_argument("--server", default="http://127.0.0.1:8400/mcp", help="rollwire's /mcp URL")
    p.add_argument("--token", default=os.environ.get("ROLLWIRE_TOKEN"), help="bearer token")
    p.add_argument("--llm-url", help="engine (default: --vllm-server's /v1, else the server's)")
    p.add_argument("--tasks", help="list_tasks source: an env family or a Harbor dataset path")
    p.add_argument("--query", help="keep tasks whose reference or description contains it")
    p.add_argument("--limit", type=int, default=4, help="number of tasks (default 4)")
    p.add_argument("--task", action="append", default=[], help="a task reference (repeatable)")
    p.add_argument("--harness", help="Harbor tasks: the agent harness (default terminus-2)")
    p.add_argument("--group-size", type=int, default=4, help="GRPO num_generations (default 4)")
    p.add_argument("--max-turns", type=int, default=4, help="agent turns per rollout")
    p.add_argument("--max-tokens", type=int, help="sampled tokens per model call")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling = TRL's temperature")
    p.add_argument("--seed", type=int, default=0, help="task seed of the first group")
    p.add_argument(
        "--answer-mode",
        choices=["tool", "text", "either"],
        help="env tasks: tool (the server's default), text or either: with text/either a policy "
        "that answers in text still gets the verifier's reward",
    )
    p.add_argument("--task-config", help="env tasks' generator config as JSON")
    p.add_argument("--check", action="store_true", help="check the contract; no torch, no trl")
    train = p.add_argument_group("training (without --check)")
    train.add_argument("--model", help="the policy: a Hugging Face model id or a local path")
    train.add_argument("--vllm-server", help="the vLLM server TRL syncs weights into (root URL)")
    train.add_argument("--batch-size", type=int, help="per-device batch (default: --group-size)")
    train.add_argument("--max-steps", type=int, default=10, help="optimizer steps (default 10)")
    train.add_argument("--learning-rate", type=float, default=1e-6)
    train.add_argument("--output-dir", default="runs/trl-grpo", help="checkpoints and state")
    train.add_argument(
        "--agreement",
        choices=["first", "every", "none"],
        default="first",
        help="compare TRL's logprobs of the captured completions with the engine's at step 0 "
        "(first, default), at every step (also the previous step's completions under the "
        "current weights), or never; one forward pass per rollout each time",
    )
    train.add_argument(
        "--no-agreement",
        dest="agreement",
        action="store_const",
        const="none",
        help="= --agreement none",
    )
    train.add_argument(
        "--sync",
        choices=["disk", "http", "vllm_reload", "version_only"],
        help="push the trainer's weights into the engine before each batch of rollouts "
        "(rollwire.trl.WeightSync): disk (a checkpoint in --checkpoint-dir), http (in the "
        "requests), vllm_reload (vLLM on CPU), version_only (TRL's vLLM server mode moved them)",
    )
    train.add_argument(
        "--engine-admin-key",
        default=os.environ.get("ROLLWIRE_ENGINE_ADMIN_KEY"),
        help="the engine's --admin-key (weight-sync routes)",
    )
    train.add_argument("--checkpoint-dir", help="--sync disk/vllm_reload: where pushes are saved")
    train.add_argument(
        "--max-staleness",
        type=int,
        help="drop samples more than this many optimizer steps behind the trainer",
    )
    train.add_argument(
        "--dataset-size",
        type=int,
        help="prompts in the training dataset (the task references repeated; default: enough "
        "for --max-steps)",
    )
    return p.parse_args(argv)


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def build(
    args: argparse.Namespace, pad_token_id: int = 0, weight_sync: Any = None
) -> tuple[Callable[..., Any], list[str]]:
    """The rollout_func and the task references (the dataset's prompts)."""
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else None
    if args.task:
        refs = list(args.task)
    else:
        dataset = task_dataset(
            args.tasks, query=args.query, limit=args.limit, server_url=args.server, headers=headers
        )
        refs = list(dataset["prompt"])
    llm = args.llm_url
    if llm is None and args.vllm_server:
        llm = args.vllm_server.rstrip("/") + "/v1"
    sampling: dict[str, Any] = {"temperature": args.temperature}
    if args.max_tokens:
        sampling["max_tokens"] = args.max_tokens
    rollout_func = make_rollout_func(
        args.server,
        headers=headers,
        harness=args.harness,
        llm=llm,  # None: the rollwire server's --llm-url
        sampling=sampling,
        limits={"max_turns": args.max_turns},
        group_size=args.group_size,  # = num_generations: a group shares one task seed
        seed=args.seed,
        pad_token_id=pad_token_id,
        answer_mode=args.answer_mode,
        task_config=json.loads(args.task_config) if args.task_config else None,
        weight_sync=weight_sync,
        max_staleness=getattr(args, "max_staleness", None),
    )
    return rollout_func, refs


def violations(out: dict[str, list[Any]], n: int, group_size: int) -> list[str]:
    """Where ``out`` breaks what GRPOTrainer relies on (empty: it holds)."""
    bad = [f"missing key {k!r}" for k in (*REQUIRED, *FORWARDED) if k not in out]
    bad += [f"{k}: {len(v)} rows, expected {n}" for k, v in out.items() if len(v) != n]
    if bad:
        return bad
    for i in range(n):
        prompt, completion = out["prompt_ids"][i], out["completion_ids"][i]
        logprobs, mask = out["logprobs"][i], out["env_mask"][i]
        where = f"row {i} ({out['rollout_id'][i]})"
        if not prompt or not completion:
            bad.append(f"{where}: empty prompt_ids or completion_ids")
        if not all(isinstance(t, int) for t in prompt + completion):
            bad.append(f"{where}: a token id is not an int")
        if not len(completion) == len(logprobs) == len(mask):
            bad.append(f"{where}: completion/logprobs/env_mask lengths differ")
            continue
        if not set(mask) <= {0, 1}:
            bad.append(f"{where}: env_mask holds {sorted(set(mask) - {0, 1})}")
        if any(lp != 0.0 for lp, m in zip(logprobs, mask, strict=True) if m == 0):
            bad.append(f"{where}: a logprob is not 0.0 where env_mask is 0")
        if any(not math.isfinite(lp) or lp > 0.0 for lp in logprobs):
            bad.append(f"{where}: a logprob is > 0 or not finite")
        if not out["ok"][i] and (any(mask) or out["reward"][i] is not None):
            bad.append(f"{where}: failed, yet env_mask has 1s or reward is not None")
    for g in range(0, n, group_size):
        if len({repr(s) for s in out["seed"][g : g + group_size]}) > 1:
            bad.append(f"group at row {g}: its samples have different task seeds")
    return bad


def check(args: argparse.Namespace) -> int:
    """One batch as TRL would ask for it; the rows, then the verdict."""
    rollout_func, refs = build(args)
    # TRL's RepeatSampler hands each prompt num_generations times, consecutively
    prompts = [ref for ref in refs for _ in range(args.group_size)]
    say(f"{len(prompts)} rollouts: {len(refs)} tasks x {args.group_size} (one GRPO group each)")
    try:
        out = rollout_func(prompts, None)
    finally:
        rollout_func.close()  # type: ignore[attr-defined]
    print(
        f"{'task':40} {'ok':3} {'reward':>6} {'prompt':>6} {'compl':>6} {'env=1':>6} {'env=0':>6}"
    )
    for i, task in enumerate(prompts):
        mask = out["env_mask"][i]
        reward = "-" if out["reward"][i] is None else f"{out['reward'][i]:.3f}"
        print(
            f"{task[:40]:40} {'yes' if out['ok'][i] else 'NO':3} {reward:>6} "
            f"{len(out['prompt_ids'][i]):>6} {len(mask):>6} {sum(mask):>6} "
            f"{len(mask) - sum(mask):>6}" + (f"  {out['error'][i]}" if out["error"][i] else "")
        )
    bad = violations(out, len(prompts), args.group_size)
    if not any(any(m) for m in out["env_mask"]):
        bad.append("no row has a trainable token (is the engine certified TRAIN?)")
    failed = sum(not ok for ok in out["ok"])
    print(
        f"rows {len(prompts)}, failed {failed}, trainable tokens "
        f"{sum(sum(m) for m in out['env_mask'])}, environment tokens "
        f"{sum(len(m) - sum(m) for m in out['env_mask'])}, extra keys forwarded: "
        + ", ".join(k for k in out if k not in REQUIRED)
    )
    for line in bad:
        print(f"VIOLATION {line}")
    print("contract: FAILED" if bad else "contract: OK")
    return 1 if bad else 0


def groups_with_signal(rewards: list[float | None], group_size: int) -> float:
    """The share of GRPO groups whose rewards differ (the others have zero advantage: no
    gradient); a missing reward does not count as a value."""
    groups = [rewards[g : g + group_size] for g in range(0, len(rewards), group_size)]
    live = [len({r for r in group if r is not None}) > 1 for group in groups]
    return sum(live) / len(live) if live else 0.0


def logprob_agreement(trainer: Any, out: dict[str, list[Any]]) -> dict[str, Any]:
    """TRL's own per-token logprobs of the captured completions (its
    ``_get_per_token_logps_and_entropies``, at its temperature, on the model it is about to
    train) against the engine's captured logprobs, over the positions env_mask marks: mean and
    max |diff| in nats. Near 0 when the engine serves the same weights and samples at the same
    temperature: the trainer and the engine agree on what was sampled."""
    import torch

    diffs: list[float] = []
    device = trainer.accelerator.device
    with torch.no_grad():
        for prompt, completion, logprobs, mask in zip(
            out["prompt_ids"], out["completion_ids"], out["logprobs"], out["env_mask"], strict=True
        ):
            if not any(mask):
                continue
            ids = torch.tensor([list(prompt) + list(completion)], device=device)
            logps, _, _ = trainer._get_per_token_logps_and_entropies(
                trainer.model, ids, torch.ones_like(ids), len(completion)
            )
            ours = logps[0].tolist()
            diffs += [abs(a - b) for a, b, m in zip(ours, logprobs, mask, strict=True) if m]
    if not diffs:
        return {"tokens": 0, "mean_abs_diff": None, "max_abs_diff": None}
    return {
        "tokens": len(diffs),
        "mean_abs_diff": sum(diffs) / len(diffs),
        "max_abs_diff": max(diffs),
    }


def train(args: argparse.Namespace) -> int:
    import datasets
    import torch
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    if not args.model:
        say("--model is required for training (or pass --check)")
        return 2
    if not args.vllm_server:
        say("no --vllm-server: rollouts sample an engine that training never updates")
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    weight_sync = None
    if args.sync:
        from rollwire.trl import WeightSync

        engine = args.vllm_server or args.llm_url
        if not engine:
            say("--sync needs the engine: --llm-url or --vllm-server")
            return 2
        weight_sync = WeightSync(
            engine,
            transfer=args.sync,
            admin_key=args.engine_admin_key,
            checkpoint_dir=args.checkpoint_dir,
        )
    rollout_func, refs = build(args, pad_token_id=pad, weight_sync=weight_sync)

    report: dict[str, Any] = {"steps": [], "sync": args.sync}
    previous: dict[str, Any] = {}  # the last step's rows: scored again under the new weights

    def logged_rollouts(prompts: list[Any], trainer: Any = None) -> dict[str, list[Any]]:
        pushes = len(weight_sync.history) if weight_sync else 0
        out = rollout_func(prompts, trainer)
        rewards = [r for r in out["reward"] if r is not None]
        mean = f"{sum(rewards) / len(rewards):.3f}" if rewards else "-"
        step = trainer.state.global_step if trainer is not None else "-"
        versions = sorted({str(v) for v in out["weight_version"]})
        say(
            f"step {step}: {len(prompts)} rollouts, {sum(not ok for ok in out['ok'])} failed, "
            f"mean reward {mean}, prompt tokens {sum(len(p) for p in out['prompt_ids'])}, "
            f"completion tokens {sum(len(m) for m in out['env_mask'])}, "
            f"trainable tokens {sum(sum(m) for m in out['env_mask'])}, weights {versions}"
        )
        entry: dict[str, Any] = {
            "step": step,
            "rewards": out["reward"],
            "failed": sum(not ok for ok in out["ok"]),
            "groups_with_signal": groups_with_signal(out["reward"], args.group_size),
            "weight_versions": out["weight_version"],
            "stale": sum(out["stale"]),
        }
        if weight_sync and len(weight_sync.history) > pushes:
            entry["sync"] = vars(weight_sync.history[-1])
        every = args.agreement == "every"
        if trainer is not None and (every or (args.agreement == "first" and step == 0)):
            agreement = logprob_agreement(trainer, out)
            entry["logprob_agreement"] = agreement
            if step == 0:
                report["step0_logprob_agreement"] = agreement
            if agreement["tokens"]:
                say(
                    f"step {step}: TRL's logprobs of the {agreement['tokens']} sampled tokens vs "
                    f"the engine's: mean |diff| {agreement['mean_abs_diff']:.2e}, "
                    f"max |diff| {agreement['max_abs_diff']:.2e} nats"
                )
            if every and previous:
                drift = logprob_agreement(trainer, previous)
                entry["previous_step_agreement"] = drift
                if drift["tokens"]:
                    say(
                        f"step {step}: the previous step's completions under these weights: "
                        f"mean |diff| {drift['mean_abs_diff']:.2e}, max "
                        f"{drift['max_abs_diff']:.2e} nats (what training on them would see)"
                    )
            previous.clear()
            previous.update(out)
        report["steps"].append(entry)
        return out

    batch = args.batch_size or args.group_size
    size = args.dataset_size or max(1, args.max_steps * batch // args.group_size)
    prompts = [refs[i % len(refs)] for i in range(max(size, len(refs)))]
    config = GRPOConfig(
        output_dir=args.output_dir,
        num_generations=args.group_size,
        per_device_train_batch_size=args.batch_size or args.group_size,
        max_steps=args.max_steps,
        learning_rate=args.learning_rate,
        temperature=args.temperature,  # TRL re-scores with it: the engine must sample with it
        use_vllm=bool(args.vllm_server),
        vllm_mode="server",
        vllm_server_base_url=args.vllm_server,
        bf16=torch.cuda.is_available(),
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=args.seed,
    )
    trainer = GRPOTrainer(
        model=args.model,
        processing_class=tokenizer,
        reward_funcs=reward_from_rollout,
        args=config,
        train_dataset=datasets.Dataset.from_dict({"prompt": prompts}),
        rollout_func=logged_rollouts,
    )
    try:
        trainer.train()
    finally:
        rollout_func.close()  # type: ignore[attr-defined]
        if weight_sync is not None:
            weight_sync.close()
    report["rollout_stats"] = dict(rollout_func.stats)  # type: ignore[attr-defined]
    trainer.save_state()  # trainer_state.json: TRL's logged metrics per step
    trainer.save_model()
    report["log_history"] = trainer.state.log_history
    (Path(args.output_dir) / "rollwire_report.json").write_text(json.dumps(report, indent=2))
    say(f"trained {trainer.state.global_step} steps; model and state in {args.output_dir}")
    return 0


if __name__ == "__main__":
    arguments = parse_args()
    sys.exit(check(arguments) if arguments.check else train(arguments))
