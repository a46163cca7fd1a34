"""Evals: a collection of fixed problems x samples, marked eval, summarised into ``eval.json``.

An eval is a collection (``collection.collect``: resumable, on Ray, with progress) whose config
is built from ``problems`` task instances per task and ``samples`` per instance (the
collection's groups; task seeds ``seed .. seed + problems - 1``, so two runs of the same command
see the same problems), with no filter and every failure recorded. Its numbers come from the
folder afterwards (``rollwire.datasets.evals``), so an eval killed and resumed gives the numbers
of one that never stopped. ``eval.json`` keeps them with the command, the model, the engine
and rollwire's version; ``--compare`` pairs two such folders.
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
from pydantic import BaseModel, Field

from rollwire.collect.collection import (
    CollectConfig,
    CollectInputError,
    CollectResult,
    OnProgress,
    collect,
)
from rollwire.datasets.evals import (
    Comparison,
    EvalMetrics,
    EvalMismatch,
    ProblemScore,
    Scoring,
    compare,
    parse_ks,
    read_attempts,
    summarise,
)
from rollwire.datasets.records import rollwire_version, utc_now
from rollwire.datasets.store import read_manifest
from rollwire.tools.endpoint import EndpointPool
from rollwire.tools.tasks import HARBOR_PREFIX, HarborRef, parse_task_ref
from rollwire.writes import write_atomic

EVAL_FILE = "eval.json"
EVAL_SCHEMA = "rollwire.eval/1"
DEFAULT_PROBLEMS = 10


class EvalReport(BaseModel):
    """``eval.json``: what ran and what it scored."""

    schema_: str = Field(default=EVAL_SCHEMA, alias="schema")
    command: list[str] = Field(default_factory=list, description="the command line that ran it")
    model: str | None = None
    engine_tier: str | None = None
    engines: list[str] = Field(default_factory=list, description="the engines' URLs")
    tasks: list[str]
    problems_per_task: int | None = None
    samples: int | None = None
    seed: int | None = None
    planned: int = Field(description="episodes the eval set out to run")
    missing: int = Field(description="planned episodes with no outcome (0 once complete)")
    complete: bool
    halted: str | None = None
    metrics: EvalMetrics
    problems: list[ProblemScore]
    rollwire_version: str = Field(default_factory=rollwire_version)
    created_at: str = Field(default_factory=utc_now)


def declared_reward_keys(task: str) -> list[str]:
    """The rewards a Harbor task's ``task.toml`` declares (``metadata.reward_keys``); [] for
    an env task or a task that declares none (blocking)."""
    ref = parse_task_ref(task)
    if not isinstance(ref, HarborRef):
        return []
    from rollwire.harnesses.harbor.datasets import resolve_dataset

    path = resolve_dataset(ref.dataset).task(ref.name).path / "task.toml"
    try:
        meta = tomllib.loads(path.read_text()).get("metadata") or {}
    except (OSError, tomllib.TOMLDecodeError):
        return []
    keys = meta.get("reward_keys") or []
    return [str(k) for k in keys] if isinstance(keys, list) else []


def refuse_unnamed_rewards(tasks: Sequence[str], reward_key: str | None) -> None:
    """An eval scores one reward: a task that declares several needs ``reward_key`` (blocking).
    Raises :class:`CollectInputError` naming the task and its rewards."""
    if reward_key is not None:
        return
    for task in dict.fromkeys(t for t in tasks if t.startswith(HARBOR_PREFIX)):
        keys = declared_reward_keys(task)
        if len(keys) > 1:
            raise CollectInputError(
                f"reward_key: task {task!r} declares several rewards {keys}; name the one to "
                "score with reward_key (--reward-key; rewards are never averaged)"
            )


def eval_config(
    *,
    tasks: Sequence[str],
    problems: int | None,
    samples: int,
    ks: Sequence[int],
    **collection: Any,
) -> CollectConfig:
    """The collection an eval runs (blocking: checks Harbor tasks' declared rewards).
    ``problems``: per env task (None: :data:`DEFAULT_PROBLEMS`, or 1 when a task is a Harbor
    task). Raises :class:`CollectInputError` naming the bad value."""
    harbor = [t for t in tasks if t.startswith(HARBOR_PREFIX)]
    if problems is None:
        problems = 1 if harbor else DEFAULT_PROBLEMS
    if problems < 1:
        raise CollectInputError(f"problems: {problems} is not at least 1")
    if samples < 1:
        raise CollectInputError(f"samples: {samples} is not at least 1")
    try:
        ks = parse_ks(ks)
    except ValueError as exc:
        raise CollectInputError(str(exc)) from None
    if ks[-1] > samples:
        raise CollectInputError(
            f"k: pass@{ks[-1]} needs at least {ks[-1]} samples per problem; --samples is "
            f"{samples} (each k must be <= samples)"
        )
    if harbor and problems > 1:
        raise CollectInputError(
            f"problems: a Harbor task is one problem (it has no task seed); --problems "
            f"{problems} applies to env tasks only: drop it for {harbor[0]!r}"
        )
    refuse_unnamed_rewards(tasks, collection.get("reward_key"))
    for off in ("min_reward", "trainable_only"):
        if collection.get(off):
            raise CollectInputError(f"{off}: an eval keeps every episode; it takes no filter")
    return CollectConfig(
        tasks=list(tasks),
        episodes=len(tasks) * problems * samples,
        group_size=samples,
        purpose="eval",
        keep_failures=True,
        **collection,
    )


def report_for(
    out_dir: str | Path,
    *,
    scoring: Scoring | None = None,
    command: Sequence[str] = (),
    result: CollectResult | None = None,
) -> EvalReport:
    """The report of a collection folder: its manifest's config and what it holds (blocking)."""
    out = Path(out_dir)
    manifest = read_manifest(out)
    if manifest is None:
        raise CollectInputError(f"{out}: not a collection (no manifest.json)")
    attempts = read_attempts(out)
    s = scoring or Scoring()
    metrics, scores = summarise(
        attempts, ks=s.ks, pass_threshold=s.pass_threshold, failed_reward=s.failed_reward
    )
    config = manifest.config
    llm = config.get("llm") or {}
    urls = llm.get("url") or []
    planned = manifest.planned or len(attempts)
    missing = max(0, planned - len(attempts))
    group = int(config.get("group_size") or 1)
    tasks = list(config.get("tasks") or [])
    return EvalReport(
        command=list(command),
        model=manifest.model,
        engine_tier=manifest.engine_tier,
        engines=[urls] if isinstance(urls, str) else list(urls),
        tasks=tasks,
        problems_per_task=planned // (group * len(tasks)) if tasks else None,
        samples=group,
        seed=config.get("seed"),
        planned=planned,
        missing=missing,
        complete=missing == 0 and (result is None or result.halted is None),
        halted=result.halted if result is not None else None,
        metrics=metrics,
        problems=scores,
    )


def load_report(path: str | Path) -> EvalReport:
    """An eval folder's report: its ``eval.json`` (or that file itself), or, for an eval made
    over MCP (``collect_episodes`` with ``eval``: no ``eval.json``), the folder summarised with
    the default scoring (pass@1 at reward >= 1.0). A ValueError says what is wrong."""
    p = Path(path)
    file = p / EVAL_FILE if p.is_dir() else p
    try:
        return EvalReport.model_validate_json(file.read_bytes())
    except FileNotFoundError:
        if p.is_dir() and read_manifest(p) is not None:
            return report_for(p)
        raise ValueError(
            f"{p}: neither an eval nor a collection (no {EVAL_FILE}; run `rollwire eval --out "
            f"{p}` first)"
        ) from None
    except ValueError as exc:
        raise ValueError(f"{file}: not a rollwire eval report ({exc})") from None


def compare_reports(a: EvalReport, b: EvalReport, names: tuple[str, str]) -> Comparison:
    """B against A (``rollwire eval --compare``), at the ks both report. Raises
    :class:`EvalMismatch` when they do not pair (other tasks, problems, samples per problem or
    pass threshold)."""
    if a.metrics.pass_threshold != b.metrics.pass_threshold:
        raise EvalMismatch(
            f"the evals pass at different thresholds: {a.metrics.pass_threshold} in A, "
            f"{b.metrics.pass_threshold} in B"
        )
    ks = sorted(set(a.metrics.ks) & set(b.metrics.ks)) or [1]
    return compare(a.problems, b.problems, ks=ks, names=names)


async def run_eval(
    config: CollectConfig,
    out_dir: str | Path,
    *,
    scoring: Scoring,
    command: Sequence[str] = (),
    pool: EndpointPool | None = None,
    on_progress: OnProgress | None = None,
    ray_address: str | None = None,
) -> tuple[EvalReport, CollectResult]:
    """Run (or resume) the eval's collection, then summarise the folder (once) into
    ``eval.json`` and the result's ``metrics``."""
    result = await collect(
        config, out_dir, pool=pool, on_progress=on_progress, ray_address=ray_address
    )
    report = await anyio.to_thread.run_sync(
        lambda: report_for(out_dir, scoring=scoring, command=command, result=result)
    )
    result.metrics = report.metrics
    await anyio.to_thread.run_sync(
        write_atomic,
        Path(out_dir) / EVAL_FILE,
        report.model_dump_json(indent=2, by_alias=True).encode() + b"\n",
    )
    return report, result


__all__ = [
    "EVAL_FILE",
    "EvalReport",
    "compare_reports",
    "declared_reward_keys",
    "eval_config",
    "load_report",
    "refuse_unnamed_rewards",
    "report_for",
    "run_eval",
]
