"""Collections: many rollouts turned into a dataset, crash-safe and resumable.

A collection is a task set x ``group_size`` samples per task, run at bounded concurrency, each
episode written once to an :class:`EpisodeStore` (``episodes.jsonl``, ``failures.jsonl``,
``filtered.jsonl``, ``manifest.json``). The work list is a fresh, deterministic list on every
run: episode ``k`` of the collection is sample ``k % group_size`` of group ``k // group_size``;
groups go round the task list, so group ``g`` is task ``tasks[g % T]``, that task's group number
``g // T``. Every sample of a group shares the task seed (``seed + group number``: one problem
instance, as GRPO needs) and gets its own sampling seed. Episode ids come from
(task, sample index, task seed), so a resume skips exactly what is written and runs the rest.

Nothing accumulates per episode in memory except the ids written (the result names them);
statistics are running (O(1) per episode). Cancellation stops the run with every written
episode intact; the store is closed (manifest written) on the way out.

Where an episode runs is an :class:`EpisodeRunner`: :class:`LocalRunner` in this process, or
``rollwire.collect.cluster.RayRunner`` on a Ray cluster's nodes. Either way the result comes
back here and this process alone writes the store. Several engines (``llm`` as a list) are an
:class:`~rollwire.tools.engines.EngineSet`: each rollout is pinned to one, and a run with no
engine (or no node) left halts (``CollectResult.halted``) rather than failing every episode.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

import anyio
from pydantic import BaseModel, Field

from rollwire import bounds
from rollwire.capture.rollout import RolloutType
from rollwire.datasets.evals import EvalMetrics, Scoring, summarise_dir
from rollwire.datasets.records import (
    EpisodeRecord,
    FailureRecord,
    FilteredRecord,
    episode_id,
    group_id,
)
from rollwire.datasets.stats import RunningStats
from rollwire.datasets.store import CollectionError, EpisodeStore
from rollwire.result import RolloutResult
from rollwire.sessions.base import AnswerMode
from rollwire.tools.endpoint import EndpointPool
from rollwire.tools.engines import EnginesDiffer, EngineSet, EngineUse, NoEngineLeft
from rollwire.tools.rollouts import (
    Limits,
    LLMSpec,
    Plan,
    RolloutArgumentError,
    RolloutRequest,
    Sampling,
    attempt,
    plan,
)
from rollwire.tools.tasks import HARBOR_PREFIX, HarborRef
from rollwire.writes import WriteFailed

log = logging.getLogger("rollwire.collect")

#: settled episodes skipped in a row before a resume yields to the event loop
SKIP_BATCH = 256


class CollectInputError(ValueError):
    """A collection that cannot start; the message starts with the offending field's name."""


class CollectConfig(BaseModel):
    """What to collect. Everything but ``episodes``, ``concurrency`` and ``resume`` is the
    collection's identity: re-running with the same identity and ``--out`` resumes it, and
    ``episodes`` may grow to extend it."""

    tasks: bounds.TaskList = Field(description="task references (list_tasks refs)")
    episodes: bounds.Episodes = Field(description="episodes to collect in all")
    group_size: bounds.GroupSize = Field(default=1, description="samples per task instance (GRPO)")
    harness: str | None = None
    sandbox: str | None = None
    llm: (
        LLMSpec
        | Annotated[list[LLMSpec], Field(min_length=1, max_length=bounds.MAX_ENGINES)]
        | None
    ) = Field(
        default=None,
        description="the engine, or several serving one model (each rollout pinned to one)",
    )
    sampling: Sampling = Field(default_factory=Sampling)
    limits: Limits = Field(default_factory=Limits)
    reward_key: str | None = None
    task_config: dict[str, Any] | None = None
    answer_mode: AnswerMode | None = Field(
        default=None, description="env tasks: tool (default), text or either"
    )
    seed: bounds.Seed = Field(default=0, description="the first group's task seed")
    concurrency: bounds.Concurrency = 4
    min_reward: float | None = Field(default=None, description="keep episodes at or above it")
    trainable_only: bool = Field(default=False, description="keep train episodes with tokens")
    keep_failures: bool = Field(
        default=True, description="record failed rollouts in failures.jsonl (always counted)"
    )
    resume: bool = True
    purpose: Literal["train", "eval"] = Field(
        default="train", description="eval: every episode is marked eval (rollwire eval)"
    )

    def identity(self) -> dict[str, Any]:
        """The part that names the collection (no secrets, no run settings)."""
        data = self.model_dump(
            mode="json", exclude={"episodes", "concurrency", "resume", "keep_failures"}
        )
        if data.get("purpose") == "train":
            del data["purpose"]  # collections made before evals keep their identity
        if data.get("answer_mode") is None:
            del data["answer_mode"]  # collections made before answer modes keep their identity
        if data["sampling"].get("top_logprobs") is None:
            del data["sampling"]["top_logprobs"]  # nor do those made before top_logprobs change
        llm = data.get("llm")
        if isinstance(llm, list):
            urls = sorted(e["url"] for e in llm)
            data["llm"] = {"url": urls, "model": llm[0]["model"]}
        elif llm:
            data["llm"] = {"url": llm["url"], "model": llm["model"]}
        return data

    def llms(self) -> list[LLMSpec]:
        """The engines, as a list (empty when none is given)."""
        if self.llm is None:
            return []
        return list(self.llm) if isinstance(self.llm, list) else [self.llm]


@dataclass(frozen=True)
class Work:
    """One episode to collect."""

    index: int
    task: str
    sample_index: int
    seed: int | None
    sampling_seed: int
    group_id: str
    episode_id: str


def work_list(config: CollectConfig, harbor: set[str]) -> list[Work]:
    """The collection's episodes, in order, as a list (a new one each call)."""
    return list(iter_work(config, harbor))


def iter_work(config: CollectConfig, harbor: set[str]) -> Iterator[Work]:
    """The collection's episodes, in order, made one at a time (a new generator each call:
    never an exhausted iterator, and no memory per planned episode).
    ``harbor``: the task refs that take no task seed (Harbor tasks)."""
    n_tasks = len(config.tasks)
    for k in range(config.episodes):
        g, j = divmod(k, config.group_size)
        task = config.tasks[g % n_tasks]
        group_no = g // n_tasks
        sample_index = group_no * config.group_size + j
        seed = None if task in harbor else config.seed + group_no
        eid = episode_id(task, sample_index, seed)
        yield Work(
            index=k,
            task=task,
            sample_index=sample_index,
            seed=seed,
            # distinct per episode and reproducible: derived from its id
            sampling_seed=int(eid[:8], 16),
            group_id=group_id(task, group_no, seed),
            episode_id=eid,
        )


class CollectProgress(BaseModel):
    """Where a collection is (sent after every episode)."""

    total: int
    done: int = 0
    collected: int = 0
    filtered: int = 0
    failed: int = 0
    skipped_done: int = 0
    retried: int = 0
    reward_mean: float | None = None
    episodes_per_s: float = 0.0
    eta_s: float | None = None


class CollectResult(BaseModel):
    """What a collection run did."""

    out_dir: str
    collected: int = Field(description="episodes written to episodes.jsonl by this run")
    filtered: int = Field(description="ran but not kept (filtered.jsonl)")
    failed: int = Field(description="failed rollouts (failures.jsonl when keep_failures)")
    skipped_done: int = Field(description="already in the collection: not run again")
    episode_ids: list[str] = Field(
        description=f"ids of the episodes this run wrote (the first {bounds.MAX_IDS_IN_RESULT:,})"
    )
    episode_ids_omitted: int = Field(
        default=0, description="ids written beyond those listed (episodes.jsonl has them all)"
    )
    reward_mean: float | None = Field(description="over this run's kept episodes with a reward")
    reward_std: float | None = None
    trainable_tokens: int = 0
    wall_s: float = 0.0
    cancelled: bool = False
    model: str | None = None
    engine_tier: str | None = None
    totals: dict[str, int] = Field(
        default_factory=dict, description="the whole collection's counts (manifest)"
    )
    retried: int = Field(
        default=0, description="episodes run again on another Ray node after theirs was lost"
    )
    engines: list[EngineUse] = Field(
        default_factory=list, description="per engine: rollouts started, failed, drained"
    )
    nodes: list[NodeUse] = Field(
        default_factory=list, description="per Ray node: episodes run, lost (empty in-process)"
    )
    halted: str | None = Field(
        default=None,
        description="why the run stopped before the plan's end (e.g. every engine drained); "
        "the rest is not run: resume later",
    )
    recovery: list[str] = Field(
        default_factory=list, description="what resuming found (e.g. a torn last line)"
    )
    status: Literal["done", "running"] = Field(
        default="done",
        description="running: a background collection's progress so far (call again for more)",
    )
    progress: CollectProgress | None = Field(
        default=None, description="while running: episodes done of total, rate, eta"
    )
    metrics: EvalMetrics | None = Field(
        default=None,
        description="the whole collection's eval numbers: per task family and overall, mean "
        "reward and pass@k with standard errors over problems; failed attempts by cause",
    )


OnProgress = Callable[[CollectProgress], Awaitable[None] | None]


class NodeUse(BaseModel):
    """What one Ray node did in a run."""

    node_id: str
    address: str | None = None
    episodes: int = Field(default=0, description="episodes it returned")
    lost: str | None = Field(default=None, description="why it was given up on, if it was")


@dataclass
class Ran:
    """One episode's result and where it ran."""

    result: RolloutResult
    engine: str | None = None
    node: str | None = None


class EpisodeRunner(Protocol):
    """Runs one checked episode somewhere: in this process, or on a Ray node. Raises
    :class:`~rollwire.tools.engines.NoEngineLeft` when no engine can take it, or
    :class:`HaltCollection` when nothing can run it any more; every other failure is a
    result."""

    async def run(self, request: RolloutRequest, plan: Plan, episode_id: str) -> Ran: ...

    def engines_use(self) -> list[EngineUse]: ...

    def nodes_use(self) -> list[NodeUse]: ...

    @property
    def retried(self) -> int: ...


class HaltCollection(RuntimeError):
    """Nothing can run the collection's episodes any more (every engine or node lost)."""


class LocalRunner:
    """Episodes in this process, each pinned to one engine of the set."""

    retried = 0

    def __init__(self, pool: EndpointPool, engines: EngineSet | None) -> None:
        self.pool = pool
        self.engines = engines

    async def run(self, request: RolloutRequest, plan: Plan, episode_id: str) -> Ran:
        return await run_pinned(self.pool, self.engines, request, plan, episode_id)

    def engines_use(self) -> list[EngineUse]:
        return self.engines.use() if self.engines is not None else []

    def nodes_use(self) -> list[NodeUse]:
        return []


async def run_pinned(
    pool: EndpointPool,
    engines: EngineSet | None,
    request: RolloutRequest,
    plan: Plan,
    episode_id: str,
) -> Ran:
    """One episode on the least-loaded live engine of ``engines`` (the whole rollout on it)."""
    if engines is None or not plan.needs_llm:
        result, _ = await attempt(request, plan, episode_id, pool)
        return Ran(result)
    with engines.lease() as engine:
        pinned = request.model_copy(
            update={"llm": LLMSpec(url=engine.url, model=engine.model, api_key=engine.api_key)}
        )
        result, _ = await attempt(pinned, plan, episode_id, pool)
        if not result.ok:
            engine.failed += 1
        return Ran(result, engine=engine.url)


def _keep(config: CollectConfig, result: RolloutResult) -> str | None:
    """Why an ok episode is not kept, or None to keep it."""
    if config.min_reward is not None and (
        result.reward is None or result.reward < config.min_reward
    ):
        return f"reward {result.reward} < min_reward {config.min_reward}"
    if config.trainable_only and (
        result.rollout_type is not RolloutType.TRAIN or result.n_trainable_tokens == 0
    ):
        return "not trainable"
    return None


def _plans(config: CollectConfig) -> dict[str, Plan]:
    """Check every distinct task once, before anything runs (blocking)."""
    plans: dict[str, Plan] = {}
    for task in dict.fromkeys(config.tasks):
        request = RolloutRequest(
            task=task,
            harness=config.harness,
            sandbox=config.sandbox,
            llm=config.llms()[0] if config.llms() else None,
            sampling=config.sampling,
            limits=config.limits,
            seed=None if task.startswith(HARBOR_PREFIX) else config.seed,
            task_config=config.task_config,
            reward_key=config.reward_key,
            answer_mode=config.answer_mode,
        )
        try:
            plans[task] = plan(request)
        except RolloutArgumentError as exc:
            raise CollectInputError(f"{exc} (task {task!r})") from None
    return plans


async def collect(
    config: CollectConfig,
    out_dir: str | Path,
    *,
    pool: EndpointPool | None = None,
    on_progress: OnProgress | None = None,
    ray_address: str | None = None,
    scoring: Scoring | None = None,
) -> CollectResult:
    """Run (or resume) a collection into ``out_dir``.

    ``scoring``: the result's ``metrics`` are the whole folder's eval numbers once the run is
    over, scored as it says (``rollwire.datasets.evals``; it reads the folder once more); None:
    no metrics (``rollwire eval`` summarises the folder itself, once).

    ``ray_address``: run the episodes on that Ray cluster's nodes (rollwire.collect.cluster);
    this process stays the only writer of the store.

    Raises :class:`CollectInputError` or :class:`CollectionError` before any rollout runs
    (bad arguments, an endpoint that is not usable, engines that are not one model, an
    ``out_dir`` holding another collection), or :class:`rollwire.writes.WriteFailed` for an
    ``out_dir`` that cannot be written; afterwards every episode's failure is a counted result,
    and only the store failing to write (a full or read-only disk) stops the collection: a
    ``WriteFailed`` naming the file, the cause and what was kept. Cancellation propagates, with
    the store closed and every written episode intact.
    """
    start = time.perf_counter()
    plans = await anyio.to_thread.run_sync(_plans, config)
    own_pool = pool is None
    pool = pool or EndpointPool()
    try:
        model = tier = None
        engines = None
        if any(p.needs_llm for p in plans.values()):
            specs = [(s.url, s.model, s.api_key) for s in config.llms()]
            try:
                engines = await EngineSet.certify(pool, specs)
            except EnginesDiffer as exc:
                raise CollectInputError(str(exc)) from None
            model = engines.first.endpoint.certification.model
            tier = engines.first.endpoint.certification.capture_level.value
        if ray_address is not None:  # before anything is written: a bad address writes nothing
            from rollwire.collect.cluster import connect

            await anyio.to_thread.run_sync(connect, ray_address)
        out = Path(out_dir)
        if not config.resume and (out / "manifest.json").exists():
            raise CollectInputError(
                f"out: {out} already holds a collection and resume is off: choose another "
                "directory (nothing was deleted)"
            )
        store = await EpisodeStore.aopen(
            out, config=config.identity(), model=model, engine_tier=tier, planned=config.episodes
        )
        async with store:
            if ray_address is None:
                runner = LocalRunner(pool, engines)
                result = await _run(config, plans, store, runner, start, on_progress, model, tier)
            else:
                from rollwire.collect.cluster import RayRunner

                async with RayRunner(
                    ray_address, config, pool, concurrency=config.concurrency
                ) as ray:
                    result = await _run(config, plans, store, ray, start, on_progress, model, tier)
        if scoring is not None:
            result.metrics, _ = await anyio.to_thread.run_sync(summarise_dir, out, scoring)
        return result
    finally:
        if own_pool:
            await pool.aclose()


async def _run(
    config: CollectConfig,
    plans: dict[str, Plan],
    store: EpisodeStore,
    runner: EpisodeRunner,
    start: float,
    on_progress: OnProgress | None,
    model: str | None,
    tier: str | None,
) -> CollectResult:
    harbor = {t for t, p in plans.items() if isinstance(p.ref, HarborRef)}
    llm = config.llms()[0] if config.llms() else None  # replaced by the engine each is pinned to
    # Made lazily and shared by `concurrency` workers: memory does not grow with the plan, and
    # nothing runs over the whole plan before the first episode. Episodes already in the
    # collection are skipped as the workers reach them; skipping yields to the event loop
    # every SKIP_BATCH episodes, so a resume of a large collection never stalls other clients.
    todo = iter_work(config, harbor)
    progress = CollectProgress(total=config.episodes)
    written: list[str] = []
    skipped = 0
    rewards = RunningStats()
    tokens = 0
    ran = 0
    halted: list[str] = []
    unwritable: list[WriteFailed] = []

    async def report() -> None:
        elapsed = time.perf_counter() - start
        progress.reward_mean = rewards.summary().mean if rewards.count else None
        progress.episodes_per_s = ran / elapsed if elapsed > 0 else 0.0
        progress.retried = runner.retried
        left = progress.total - progress.done
        progress.eta_s = left / progress.episodes_per_s if progress.episodes_per_s else None
        if on_progress is not None:
            maybe = on_progress(progress.model_copy())
            if maybe is not None:
                await maybe

    async def worker(scope: anyio.CancelScope) -> None:
        nonlocal skipped
        in_a_row = 0
        # next() never awaits, so the workers share the generator safely
        for work in todo:
            if store.is_settled(work.episode_id):
                skipped += 1
                store.note_skipped()
                progress.done += 1
                progress.skipped_done += 1
                in_a_row += 1
                if in_a_row % SKIP_BATCH == 0:
                    await report()  # also a checkpoint: cancellable, other clients served
                continue
            in_a_row = 0
            try:
                await one(work)
            except (NoEngineLeft, HaltCollection) as exc:
                if not halted:
                    halted.append(str(exc))
                    log.error("collection halted: %s", exc)
                scope.cancel()
                return
            except WriteFailed as exc:  # a full or read-only disk: stop, say so, keep the rest
                if not unwritable:
                    unwritable.append(exc)
                scope.cancel()
                return

    async def one(work: Work) -> None:
        nonlocal ran, tokens
        p = plans[work.task]
        request = RolloutRequest(
            task=work.task,
            harness=config.harness,
            sandbox=config.sandbox,
            llm=llm,
            sampling=config.sampling.model_copy(update={"seed": work.sampling_seed})
            if p.needs_llm
            else config.sampling,
            limits=config.limits,
            seed=work.seed,
            task_config=config.task_config,
            reward_key=config.reward_key,
            include_tokens=True,
            answer_mode=config.answer_mode,
        )
        sampling_seed = work.sampling_seed if p.needs_llm else None
        episode_plan = dataclasses.replace(
            p,
            seed=sampling_seed if work.task in harbor else work.seed,
            sampling_seed=sampling_seed,
        )
        out = await runner.run(request, episode_plan, work.episode_id)
        result = out.result
        ran += 1
        if not result.ok:
            progress.failed += 1
            if config.keep_failures:
                await store.append_failure(
                    FailureRecord.from_result(
                        result,
                        task=work.task,
                        sample_index=work.sample_index,
                        seed=work.seed,
                        engine=out.engine,
                        node=out.node,
                    )
                )
        else:
            record = EpisodeRecord.from_result(
                result,
                task=work.task,
                sample_index=work.sample_index,
                seed=work.seed,
                group_id=work.group_id,
                model=model or "",
                messages=result.messages,
                tools=result.tools,
                engine=out.engine,
                node=out.node,
            )
            if config.purpose == "eval":  # held out: never training data, whatever its tier
                record.rollout_type = RolloutType.EVAL
            why_not = _keep(config, result)
            if why_not is None:
                await store.append_episode(record)
                written.append(work.episode_id)
                progress.collected += 1
                if result.reward is not None:
                    rewards.update(result.reward)
                tokens += result.n_trainable_tokens
            else:
                await store.append_filtered(FilteredRecord.of(record, why_not))
                progress.filtered += 1
        progress.done += 1
        await report()

    cancelled = False
    try:
        await report()
        async with anyio.create_task_group() as tg:
            for _ in range(config.concurrency):
                tg.start_soon(worker, tg.cancel_scope)
    except anyio.get_cancelled_exc_class():
        cancelled = True
        raise
    finally:
        if cancelled:
            log.warning(
                "collection cancelled after %d of %d episodes; everything written is kept",
                progress.done,
                progress.total,
            )
    if unwritable:
        counts = store.counts
        raise unwritable[0].with_then(
            f"the collection stopped with {counts.collected} episodes kept, "
            f"{counts.filtered} filtered and {counts.failed} failed of {config.episodes} "
            f"planned, each committed whole in {store.out_dir}; run the same collection "
            "again once it can be written to resume"
        )
    summary = rewards.summary() if rewards.count else None
    counts = store.counts
    return CollectResult(
        out_dir=str(store.out_dir),
        collected=progress.collected,
        filtered=progress.filtered,
        failed=progress.failed,
        skipped_done=skipped,
        episode_ids=written[: bounds.MAX_IDS_IN_RESULT],
        episode_ids_omitted=max(0, len(written) - bounds.MAX_IDS_IN_RESULT),
        reward_mean=summary.mean if summary else None,
        reward_std=summary.std if summary else None,
        trainable_tokens=tokens,
        wall_s=round(time.perf_counter() - start, 3),
        model=model,
        engine_tier=tier,
        totals=counts.model_dump(),
        retried=runner.retried,
        engines=runner.engines_use(),
        nodes=runner.nodes_use(),
        halted=halted[0] if halted else None,
        recovery=[f.message for f in store.recovery],
    )


def resolve_tasks(
    tasks: list[str] | None = None,
    *,
    dataset: str | None = None,
    task_glob: str | None = None,
) -> list[str]:
    """Task references from ``--task`` refs, or every task of a Harbor ``dataset`` whose name
    matches ``task_glob`` (blocking). Raises :class:`CollectInputError`."""
    if tasks and dataset:
        raise CollectInputError("task: give task references or a dataset, not both")
    if tasks:
        return list(tasks)
    if not dataset:
        raise CollectInputError("task: give --task REF (repeatable) or --dataset PATH")
    from rollwire.harnesses.harbor.datasets import DatasetError, resolve_dataset
    from rollwire.tools.tasks import format_harbor_ref

    try:
        ds = resolve_dataset(dataset)
    except DatasetError as exc:
        raise CollectInputError(f"dataset: {exc}") from None
    names = [t.name for t in ds.tasks]
    chosen = [n for n in names if task_glob is None or fnmatch.fnmatch(n, task_glob)]
    if not chosen:
        raise CollectInputError(f"tasks: no task of {dataset} matches {task_glob!r} ({names})")
    return [format_harbor_ref(dataset, n) for n in chosen]


__all__ = [
    "CollectConfig",
    "CollectInputError",
    "CollectProgress",
    "CollectResult",
    "CollectionError",
    "EpisodeRunner",
    "HaltCollection",
    "LocalRunner",
    "NodeUse",
    "Ran",
    "Work",
    "collect",
    "resolve_tasks",
    "work_list",
]
