"""``rollwire collect``, ``rollwire eval``, ``rollwire export`` and ``rollwire push``: collections
on the command line.

``collect`` shows a rich progress bar on stderr (collected, failed, mean reward, episodes/s,
ETA); Ctrl-C stops it with every written episode intact, and running the same command again
resumes. Results go to stdout (a summary line, or JSON with ``--json``).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from typing import Any

import anyio

from rollwire.server import options
from rollwire.writes import WriteFailed


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _config(args: argparse.Namespace) -> Any:
    from rollwire.collect.collection import CollectConfig, resolve_tasks

    tasks = resolve_tasks(args.task, dataset=args.dataset, task_glob=args.tasks)
    return CollectConfig(
        tasks=tasks,
        episodes=args.n,
        group_size=args.group_size,
        min_reward=args.min_reward,
        trainable_only=args.trainable_only,
        keep_failures=not args.drop_failures,
        resume=not args.no_resume,
        **_run_settings(args),
    )


def _run_settings(args: argparse.Namespace) -> dict[str, Any]:
    """What ``collect`` and ``eval`` take alike: harness, sandbox, engines, sampling, limits,
    reward key, task config, answer mode, first seed, concurrency."""
    from rollwire.tools.rollouts import Limits, Sampling

    task_config = None
    if args.task_config:
        try:
            task_config = json.loads(args.task_config)
        except ValueError as exc:
            raise ValueError(
                f"--task-config is not valid JSON ({exc}): {args.task_config!r}"
            ) from None
        if not isinstance(task_config, dict):
            raise ValueError(f"--task-config must be a JSON object, got {args.task_config!r}")
    return {
        "harness": args.harness,
        "sandbox": args.sandbox,
        "llm": _llm(args),
        "sampling": Sampling(temperature=args.temperature, max_tokens=args.max_tokens),
        "limits": Limits(max_turns=args.max_turns, timeout_s=args.timeout_s),
        "reward_key": args.reward_key,
        "task_config": task_config,
        "answer_mode": args.answer_mode,
        "seed": args.seed,
        "concurrency": args.concurrency,
    }


def _llm(args: argparse.Namespace) -> Any:
    """One engine, several (``--llm-url`` repeated), or none."""
    from rollwire.tools.rollouts import LLMSpec

    specs = [LLMSpec(url=u, model=args.model, api_key=args.api_key) for u in args.llm_url or ()]
    if len(specs) > 1:
        return specs
    return specs[0] if specs else None


async def _collect(args: argparse.Namespace, config: Any, run: Any = None) -> Any:
    """``config``'s collection with a progress bar; ``run(config, out, **kw)`` instead of
    ``collect`` when given (an eval)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from rollwire.collect.collection import CollectProgress, collect

    console = Console(stderr=True)
    bar = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[stats]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
        disable=args.no_progress,
    )
    with bar:
        task_id = bar.add_task(args.command, total=config.episodes, stats="")

        def on_progress(p: CollectProgress) -> None:
            mean = "-" if p.reward_mean is None else f"{p.reward_mean:.3f}"
            stats = (
                f"kept {p.collected} filtered {p.filtered} failed {p.failed} "
                f"skipped {p.skipped_done} reward {mean} {p.episodes_per_s:.2f} ep/s"
                + (f" retried {p.retried}" if p.retried else "")
            )
            bar.update(task_id, completed=p.done, stats=stats)

        from rollwire.tools.endpoint import EndpointPool

        pool = EndpointPool(**options.token_in_settings(args))
        try:
            return await (run or collect)(
                config, args.out, pool=pool, on_progress=on_progress, ray_address=args.ray
            )
        finally:
            await pool.aclose()


def _cmd_collect(args: argparse.Namespace) -> int:
    """collect many rollouts into a resumable dataset directory

    Run a task set x group size episodes at bounded concurrency into --out (episodes.jsonl,
    failures.jsonl, filtered.jsonl, manifest.json). Every episode is written once and fsynced;
    re-running the same command resumes (what is written is skipped); -n may grow to extend a
    collection.
    """
    from rollwire.collect.collection import CollectInputError, collect
    from rollwire.datasets.evals import Scoring
    from rollwire.datasets.store import CollectionError

    try:
        config = _config(args)
        run = functools.partial(collect, scoring=Scoring())  # --json carries the metrics
        result = anyio.run(functools.partial(_collect, args, config, run))
    except WriteFailed as exc:  # a full or read-only disk: what was written is kept
        _say(f"rollwire collect: {exc}")
        return 1
    except (CollectInputError, CollectionError, ValueError) as exc:
        _say(f"rollwire collect: {exc}")
        return 2
    except KeyboardInterrupt:
        _say(
            f"rollwire collect: interrupted; every written episode is in {args.out} "
            "(run the same command again to resume)"
        )
        return 130
    for line in result.recovery:
        _say(f"rollwire collect: resumed: {line}")
    for use in result.engines:
        if use.drained:
            _say(f"rollwire collect: engine {use.url} drained: {use.drained}")
    for node in result.nodes:
        if node.lost:
            _say(f"rollwire collect: Ray node {node.node_id} ({node.address}) lost: {node.lost}")
    if result.retried:
        _say(f"rollwire collect: {result.retried} episodes ran again after their node was lost")
    if args.json:
        print(result.model_dump_json(indent=2))
    else:
        mean = "-" if result.reward_mean is None else f"{result.reward_mean:.4f}"
        print(
            f"collected {result.collected}, filtered {result.filtered}, failed {result.failed}, "
            f"skipped (already done) {result.skipped_done}; mean reward {mean}; "
            f"{result.trainable_tokens} trainable tokens; {result.wall_s:.1f} s -> {result.out_dir}"
        )
    if result.halted:
        _say(
            f"rollwire collect: halted: {result.halted}; every written episode is kept "
            "(run the same command again to resume)"
        )
        return 1
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    """evaluate a model: problems x samples, mean reward and pass@k with standard errors

    Runs a collection of --problems task instances per task (seeds --seed onward: the same
    command sees the same problems) x --samples samples each, every rollout marked eval, into
    --out (resumable like collect: run the same command again). Prints per task family and
    overall: problems, samples, failed attempts, mean reward +- standard error and the unbiased
    pass@k +- standard error over problems; a failed or never-scored rollout is a failed
    attempt, counted and grouped by cause. --out/eval.json keeps the numbers with the command,
    model, engine and rollwire version. --compare A B pairs two eval folders by problem: B minus
    A with a 95% paired-bootstrap interval (10,000 resamples, fixed seed) and a permutation
    p-value; evals that do not pair are refused with what differs.
    """
    from rollwire.collect.collection import CollectInputError, resolve_tasks
    from rollwire.collect.evaluation import eval_config, run_eval
    from rollwire.datasets.evals import EvalMismatch, Scoring, parse_ks
    from rollwire.datasets.store import CollectionError

    if args.compare:
        return _compare(args)
    try:
        if args.out is None:
            raise CollectInputError("out: give --out DIR (the eval folder), or --compare A B")
        if not args.task and not args.dataset:
            raise CollectInputError("task: give --task REF (repeatable) or --dataset PATH")
        ks = parse_ks(args.k)
        scoring = Scoring(
            ks=ks, pass_threshold=args.pass_threshold, failed_reward=args.failed_reward
        )
        tasks = resolve_tasks(args.task, dataset=args.dataset, task_glob=args.tasks)
        config = eval_config(
            tasks=tasks, problems=args.problems, samples=args.samples, ks=ks, **_run_settings(args)
        )

        async def run(config: Any, out: Any, **kw: Any) -> Any:
            return await run_eval(
                config, out, scoring=scoring, command=["rollwire", *sys.argv[1:]], **kw
            )

        report, result = anyio.run(functools.partial(_collect, args, config, run))
    except WriteFailed as exc:
        _say(f"rollwire eval: {exc}")
        return 1
    except (CollectInputError, CollectionError, EvalMismatch, ValueError) as exc:
        _say(f"rollwire eval: {exc}")
        return 2
    except KeyboardInterrupt:
        _say(
            f"rollwire eval: interrupted; every written episode is in {args.out} "
            "(run the same command again to resume)"
        )
        return 130
    for line in result.recovery:
        _say(f"rollwire eval: resumed: {line}")
    if args.json:
        print(report.model_dump_json(indent=2, by_alias=True))
    else:
        print(format_report(report))
        print(f"-> {args.out}/eval.json")
    if not report.complete:
        _say(
            f"rollwire eval: incomplete: {report.missing} of {report.planned} planned episodes "
            f"have no outcome{f' (halted: {report.halted})' if report.halted else ''}; run the "
            "same command again to finish"
        )
        return 1
    return 0


def _compare(args: argparse.Namespace) -> int:
    from rollwire.collect.evaluation import compare_reports, load_report
    from rollwire.datasets.evals import EvalMismatch

    a_dir, b_dir = args.compare
    try:
        result = compare_reports(load_report(a_dir), load_report(b_dir), (a_dir, b_dir))
    except (EvalMismatch, ValueError) as exc:
        _say(f"rollwire eval --compare: {exc}")
        return 2
    if args.json:
        print(result.model_dump_json(indent=2))
    else:
        print(format_comparison(result))
    return 0


def _pm(value: float | None, se: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" + ("" if se is None else f" ± {se:.3f}")


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    )


def format_report(report: Any) -> str:
    """An eval's table: per task family and overall, then the failed attempts by cause."""
    m = report.metrics
    header = [
        "family",
        "problems",
        "samples",
        "failed",
        "mean reward",
        *(f"pass@{k}" for k in m.ks),
    ]
    rows = [
        [
            f.family,
            str(f.problems),
            str(f.samples),
            str(f.failed),
            _pm(f.reward_mean, f.reward_se),
            *(_pm(p.estimate, p.se) for p in f.pass_at),
        ]
        for f in [*m.families, m.overall]
    ]
    model = f"model {report.model} (tier {report.engine_tier})" if report.model else "no model"
    lines = [
        f"eval: {report.metrics.overall.problems} problems, {report.metrics.overall.samples} "
        f"samples; {model}; a sample passes at reward >= {m.pass_threshold:g}; ± is the "
        "standard error over problems",
        _table(header, rows),
    ]
    if m.causes:
        lines.append(f"failed attempts ({m.overall.failed}), by cause:")
        lines += [f"  {n:>5}  {cause}" for cause, n in m.causes.items()]
    return "\n".join(lines)


def format_comparison(c: Any) -> str:
    """A comparison's table: B minus A per family and metric, interval, p-value; then
    wins/losses/ties per family."""

    def signed(x: float) -> str:
        return f"{x:+.3f}"

    rows = [
        [
            f.family,
            d.metric,
            f"{d.a:.3f}",
            f"{d.b:.3f}",
            signed(d.diff),
            f"[{signed(d.ci_low)}, {signed(d.ci_high)}]",
            f"{d.p_value:.4f}",
        ]
        for f in [*c.families, c.overall]
        for d in f.differences
    ]
    header = ["family", "metric", "A", "B", "B - A", f"{c.confidence:.0%} CI", "p"]
    lines = [
        f"A: {c.a}",
        f"B: {c.b}",
        f"paired by problem: {c.overall.problems} problems; {c.confidence:.0%} interval from "
        f"a paired bootstrap over problems ({c.resamples:,} resamples, seed {c.seed}); p from "
        f"a paired permutation test ({c.overall.permutation})",
        _table(header, rows),
        "per family, mean reward per problem, B against A:",
        _table(
            ["family", "wins", "losses", "ties"],
            [[f.family, str(f.wins), str(f.losses), str(f.ties)] for f in [*c.families, c.overall]],
        ),
    ]
    return "\n".join(lines)


def _cmd_export(args: argparse.Namespace) -> int:
    """export a collection: Parquet or JSONL (the Hub's schema), or an SFT dataset

    parquet/jsonl: every episode with its token arrays, to <DIR>/data/train-*.parquet or
    train.jsonl. sft: a dataset TRL's SFTTrainer trains on as-is, to <DIR>/sft: `messages` + `tools`
    per kept episode and, for a token-tier collection, `input_ids` + `assistant_masks` (the captured
    ids, mask 1 on sampled tokens); train/eval split by task instance (task, seed), recorded in
    split.json.
    """
    from rollwire.datasets.export import ExportError, export_collection

    if args.format == "sft":
        return _export_sft(args)
    if args.min_reward is not None or args.messages_only:
        _say("rollwire export: --min-reward and --messages-only apply to --format sft")
        return 2
    try:
        result = export_collection(
            args.dir,
            args.out,
            parquet=args.format == "parquet",
            jsonl=args.format == "jsonl",
        )
    except WriteFailed as exc:  # a full or read-only disk: an earlier export is as it was
        _say(f"rollwire export: {exc}")
        return 1
    except (ExportError, OSError, ValueError) as exc:
        _say(f"rollwire export: {exc}")
        return 2
    files = result.parquet_files + ([result.jsonl_file] if result.jsonl_file else [])
    print(f"{result.n_rows} episodes -> {result.out_dir}: {', '.join(files)}")
    return 0


def _export_sft(args: argparse.Namespace) -> int:
    from rollwire.datasets.export import ExportError
    from rollwire.datasets.sft import export_sft

    try:
        result = export_sft(
            args.dir,
            args.out,
            min_reward=args.min_reward,
            eval_fraction=args.eval_fraction,
            messages_only=args.messages_only,
        )
    except WriteFailed as exc:  # a full or read-only disk: an earlier export is as it was
        _say(f"rollwire export: {exc}")
        return 1
    except (ExportError, OSError, ValueError) as exc:
        _say(f"rollwire export: {exc}")
        return 2
    skipped = ", ".join(f"{n} {why}" for why, n in result.skipped.items() if n) or "none"
    columns = "messages, tools" + (", input_ids, assistant_masks" if result.token_columns else "")
    print(
        f"sft: train {result.rows['train']} rows, eval {result.rows['eval']} rows "
        f"({columns}) -> {result.out_dir}; skipped: {skipped}"
    )
    return 0


def _cmd_push(args: argparse.Namespace) -> int:
    """push a collection to the Hugging Face Hub as a dataset repo

    Uploads the episodes as Parquet with a generated dataset card in one commit, so
    load_dataset(REPO) gives the train split. The token comes from HF_TOKEN or `huggingface-cli
    login`, and is never printed. Private unless --public.
    """
    from rollwire.datasets.hub import HubError, push_collection

    try:
        result = push_collection(
            args.dir,
            args.repo_id,
            private=not args.public,
            commit_message=args.message,
            dry_run=args.dry_run,
        )
    except (HubError, OSError, ValueError) as exc:
        _say(f"rollwire push: {exc}")
        return 2
    if args.dry_run:
        print(result.plan.describe())
    else:
        print(f"pushed {result.plan.n_rows} episodes to {result.repo_url} ({result.commit_url})")
    return 0


def add_commands(sub: Any) -> None:
    """Register collect, eval, export and push on the ``rollwire`` parser."""
    o = options
    o.command(
        sub,
        "collect",
        _cmd_collect,
        o.endpoint(o.LLM_URLS),
        o.COLLECT_RAY,
        o.COLLECT_SOURCE,
        o.TASK_GLOB,
        o.COLLECT_EPISODES,
        o.GROUP_SIZE,
        o.COLLECT_HARNESS,
        o.COLLECT_SANDBOX,
        o.CONCURRENCY,
        o.COLLECTION_OUT,
        o.NO_RESUME,
        o.MIN_REWARD,
        o.TRAINABLE_ONLY,
        o.DROP_FAILURES,
        o.RUN_SETTINGS,
        o.JSON,
        o.NO_PROGRESS,
    )
    o.command(
        sub,
        "eval",
        _cmd_eval,
        o.endpoint(o.LLM_URLS),
        o.COLLECT_RAY,
        o.EVAL_SOURCE,
        o.TASK_GLOB,
        o.PROBLEMS,
        o.SAMPLES,
        o.KS,
        o.PASS_THRESHOLD,
        o.FAILED_REWARD,
        o.COLLECT_HARNESS,
        o.COLLECT_SANDBOX,
        o.CONCURRENCY,
        o.EVAL_OUT,
        o.RUN_SETTINGS,
        o.COMPARE,
        o.JSON,
        o.NO_PROGRESS,
    )
    o.command(sub, "export", _cmd_export, o.COLLECTION_DIR, o.EXPORT_FORMAT, o.EXPORT_OUT, o.SFT)
    o.command(
        sub, "push", _cmd_push, o.COLLECTION_DIR, o.REPO_ID, o.VISIBILITY, o.MESSAGE, o.DRY_RUN
    )


__all__ = ["add_commands"]
