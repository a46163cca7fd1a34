"""The rollwire MCP server: tasks, endpoint certification, rollouts and their graphs.

``build_server()`` assembles an :class:`MCPServer` over one :class:`ServerState` (the endpoint
pool and the in-memory rollout store). ``serve_stdio`` and ``serve_http`` run it; logs go to
stderr only (stdout is the stdio transport).
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import orjson
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceNotFoundError, ToolError
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import BaseModel, Field
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route

from rollwire import bounds
from rollwire.capture.certify import Certification
from rollwire.collect.collection import (
    CollectConfig,
    CollectInputError,
    CollectProgress,
    CollectResult,
    collect,
    resolve_tasks,
)
from rollwire.collect.evaluation import refuse_unnamed_rewards
from rollwire.datasets.evals import Scoring
from rollwire.datasets.hub import PushResult
from rollwire.datasets.store import CollectionError
from rollwire.engine.process import EngineProcess
from rollwire.roots import OutsideRoots, Roots
from rollwire.server import arguments as a
from rollwire.server.arguments import takes
from rollwire.server.calls import CallLog, LoggedMCPServer
from rollwire.sessions.base import AnswerMode
from rollwire.tools.endpoint import EndpointNotUsable, EndpointPool
from rollwire.tools.info import info_report
from rollwire.tools.jobs import Job, JobRegistry, RolloutStatus, Runner
from rollwire.tools.rollouts import (
    PHASES,
    Limits,
    LLMSpec,
    Plan,
    RolloutArgumentError,
    RolloutGraphView,
    RolloutRequest,
    RolloutStore,
    RolloutSummary,
    Sampling,
    graph_view,
    plan,
    resolve_llm,
)
from rollwire.tools.rollouts import run_rollout as execute_rollout
from rollwire.tools.tasks import (
    ADAPTERS,
    HarborRef,
    TaskPage,
    TaskRefError,
    list_task_page,
    parse_task_ref,
)

log = logging.getLogger("rollwire.mcp")

INSTRUCTIONS = """\
rollwire runs LLM-agent rollouts and captures trainable data (engine token ids, logprobs,
reward). Typical flow: list_tasks -> validate_llm(llm_url) -> run_rollout(task, llm_url) ->
get_rollout_graph(rollout_id) or read rollout://{rollout_id}/document; for datasets,
collect_episodes(out_dir, episodes, tasks) -> push_dataset(out_dir, repo_id). Task references:
'family:name' for env tasks (e.g. 'reasoning_gym:chain_sum'), 'harbor:<dataset>#<task>' for
Harbor tasks (e.g. 'harbor:examples/tasks#count-errors')."""


@dataclass
class Collecting:
    """A collection running in the background (``collect_episodes`` with ``background``): its
    arguments, its progress, and once it ends, its result or the error it ended on."""

    config: CollectConfig
    out_dir: str
    progress: CollectProgress
    started: float = field(default_factory=time.monotonic)
    result: CollectResult | None = None
    error: str | None = None
    finished: anyio.Event = field(default_factory=anyio.Event)

    def snapshot(self) -> CollectResult:
        """Where it is now, as a result with ``status: running``."""
        p = self.progress
        return CollectResult(
            out_dir=self.out_dir,
            collected=p.collected,
            filtered=p.filtered,
            failed=p.failed,
            skipped_done=p.skipped_done,
            episode_ids=[],
            reward_mean=p.reward_mean,
            retried=p.retried,
            wall_s=round(time.monotonic() - self.started, 3),
            status="running",
            progress=p,
        )


@dataclass
class ServerState:
    """What outlives one call: certified endpoints, rollouts in flight and finished ones.

    Enter it (``async with ServerState() as state``) to serve: it then owns the background
    rollouts and the proxies' loopback servers, and leaving it cancels and cleans up every
    running rollout before closing the upstream clients.
    """

    pool: EndpointPool = field(default_factory=EndpointPool)
    store: RolloutStore = field(default_factory=RolloutStore)
    jobs: JobRegistry = field(default_factory=JobRegistry)
    default_llm: LLMSpec | None = None
    data_dir: Path = field(default_factory=lambda: Path("collections"))
    dataset_roots: tuple[Path, ...] = ()
    ray_address: str | None = None  # collect_episodes runs on this Ray cluster's nodes
    call_log: Path | None = None  # every tools/call, one JSON line each (serve --call-log)
    collecting: dict[Path, Collecting] = field(default_factory=dict)  # background collections
    # The embedded engine in its child process (serve --embedded-engine, demo --http): its death
    # ends a tool call in flight with a tool error; the server goes on serving.
    engine: EngineProcess | None = None
    _stack: contextlib.AsyncExitStack | None = None

    @property
    def roots(self) -> Roots:
        """The operator's roots: --data-dir, --dataset-root and the bundled examples."""
        return Roots(self.data_dir, tuple(self.dataset_roots))

    def data_path(self, out_dir: str) -> Path:
        """Where a collection named ``out_dir`` lives: always inside ``data_dir`` (relative
        names under it; ``..``, symlinks and absolute paths that lead out are a ``ToolError``
        naming ``out_dir``). Clients name collections; only the operator names the roots."""
        try:
            return self.roots.collection("out_dir", out_dir)
        except OutsideRoots as exc:
            raise ToolError(str(exc)) from None

    async def confine_dataset(self, field: str, source: str) -> None:
        """A Harbor dataset a client names (a directory, a task directory or a registry JSON)
        must resolve inside a dataset root, and so must every task directory a registry
        names; else a ``ToolError`` naming ``field``. Nothing else about it is checked here."""
        roots = self.roots

        def check() -> None:
            path = roots.dataset(field, source)
            if path.is_file():
                try:
                    from rollwire.harnesses.harbor.datasets import DatasetError, registry_task_paths
                except ImportError:
                    return  # no harbor extra: resolving it later says what to install
                try:
                    paths = registry_task_paths(path)
                except DatasetError:
                    return  # not a registry: resolving it later says so
                roots.task_paths(field, source, paths)

        try:
            await anyio.to_thread.run_sync(check)
        except OutsideRoots as exc:
            raise ToolError(str(exc)) from None

    async def confine_task(self, field: str, task: str) -> None:
        """A Harbor task reference's dataset must be inside a dataset root (env tasks name
        no path); a malformed reference is left for the rollout's own checks to name."""
        try:
            ref = parse_task_ref(task)
        except TaskRefError:
            return
        if isinstance(ref, HarborRef):
            await self.confine_dataset(field, ref.dataset)

    async def __aenter__(self) -> ServerState:
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(self.pool)
            await stack.enter_async_context(self.jobs)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc: object) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()  # jobs first (cancel, clean up), then the pool
        await self.pool.aclose()

    async def aclose(self) -> None:
        """Close every upstream client (for a state that was never entered)."""
        await self.pool.aclose()


class HarnessStatus(BaseModel):
    """One agent harness."""

    name: str
    available: bool
    reason: str | None = None
    dialect: str | None = Field(default=None, description="the wire dialect it speaks")


class RolloutList(BaseModel):
    """list_rollouts' answer."""

    rollouts: list[RolloutStatus]
    counts: dict[str, int] = Field(description="rollouts per status")


class InfoReport(BaseModel):
    """What this machine can run."""

    sandboxes: list[dict[str, Any]]
    harnesses: list[HarnessStatus]
    dialects: list[str] = Field(description="wire dialects the capture proxy serves")
    datasets: list[dict[str, Any]]
    env_families: dict[str, dict[str, Any]]


def harbor_datasets(refs: list[str] | tuple[str, ...]) -> list[str]:
    """The distinct Harbor datasets named by ``refs`` (env refs and malformed ones name none:
    the rollout's own checks name a malformed reference)."""
    found: dict[str, None] = {}
    for ref in refs:
        try:
            parsed = parse_task_ref(ref)
        except TaskRefError:
            continue
        if isinstance(parsed, HarborRef):
            found[parsed.dataset] = None
    return list(found)


def build_server(state: ServerState | None = None) -> MCPServer:
    """The MCP server over ``state`` (a fresh one by default)."""
    state = state or ServerState()
    mcp = LoggedMCPServer("rollwire", instructions=INSTRUCTIONS, log_level="WARNING")
    mcp.state = state  # type: ignore[attr-defined]
    if state.call_log is not None:
        mcp.call_log = CallLog(state.call_log)
    mcp.engine = state.engine

    @mcp.tool()
    @takes(a.SOURCE, a.OFFSET, a.LIMIT, a.QUERY)
    async def list_tasks(*, source, offset, limit, query) -> TaskPage:
        """Find tasks to run; use it first. A task's `ref` is what run_rollout and
        collect_episodes take as `task`. source: omit for every env task; an env family
        (reasoning_gym, openspiel, textarena, browsergym); or a Harbor dataset path the server
        allows (e.g. 'examples/tasks'). query keeps refs or descriptions containing it. Page with
        offset/limit (next_offset null: last page).
        """
        if source is not None and source not in ADAPTERS:
            await state.confine_dataset("source", source)
        try:
            return await list_task_page(source, offset=offset, limit=limit, query=query)
        except TaskRefError as exc:
            raise ToolError(f"source: {exc}") from None

    @mcp.tool()
    @takes(a.ENGINE_URL, a.MODEL, a.API_KEY)
    async def validate_llm(*, llm_url, model, api_key) -> Certification:
        """Check an OpenAI-spec engine (vLLM, SGLang ...) before rollouts. verdict TRAIN: token ids and logprobs come back, trainable; EVAL ONLY: text
        only (eval data); NOT USABLE: see findings. token_in_paths: how multi-turn
        conversations stay one training sequence. A usable result is cached.
        """
        return await state.pool.certify(llm_url, model=model, api_key=api_key)

    def request_of(
        *,
        task: str,
        harness: str | None,
        sandbox: str | None,
        llm: LLMSpec | str | None,
        sampling: Sampling | None,
        limits: Limits | None,
        reward_key: str | None,
        include_tokens: bool,
        seed: int | None,
        task_config: dict[str, Any] | None,
        llm_url: str | None,
        model: str | None,
        api_key: str | None,
        answer_mode: AnswerMode | None,
    ) -> RolloutRequest:
        """A rollout request from the tool arguments of :data:`arguments.ROLLOUT`."""
        try:
            spec = resolve_llm(
                llm, llm_url=llm_url, model=model, api_key=api_key, default=state.default_llm
            )
        except RolloutArgumentError as exc:
            raise ToolError(str(exc)) from None
        try:
            bounds.check_task_config(task_config)
        except ValueError as exc:
            raise ToolError(str(exc)) from None
        return RolloutRequest(
            task=task,
            harness=harness,
            sandbox=sandbox,
            llm=spec,
            sampling=sampling or Sampling(),
            limits=limits or Limits(),
            seed=seed,
            task_config=task_config,
            reward_key=reward_key,
            include_tokens=include_tokens,
            answer_mode=answer_mode,
        )

    async def checked(request: RolloutRequest) -> Plan:
        await state.confine_task("task", request.task)
        try:
            return await anyio.to_thread.run_sync(plan, request)
        except RolloutArgumentError as exc:
            raise ToolError(str(exc)) from None

    def runner(request: RolloutRequest, checked_plan: Plan, ctx: Context | None) -> Runner:
        async def run(job: Job) -> RolloutSummary:
            async def progress(done: float, message: str) -> None:
                job.report(done, PHASES, message)
                if ctx is not None:
                    await ctx.report_progress(done, PHASES, message)

            return await execute_rollout(
                request,
                pool=state.pool,
                store=state.store,
                progress=progress,
                rollout_id=job.rollout_id,
                checked=checked_plan,
            )

        return run

    @mcp.tool()
    @takes(a.ROLLOUT)
    async def run_rollout(ctx: Context, **given: Any) -> RolloutSummary:
        """Run one rollout (an agent on one task, every model call captured); wait for
        its reward and capture summary. task: a list_tasks ref. llm: URL or {url, model,
        api_key} (or llm_url/model/api_key); default: the server's. Harbor tasks: harness
        terminus-2 (default), oracle, nop or one info lists; sandbox local (default) or docker.
        Env tasks: seed picks the instance, task_config configures it; answer_mode tool
        (default; no tool call: reward null), text or either. include_tokens adds ids, loss
        mask and logprobs. Failure: ok=false with `error`. Then get_rollout_graph or
        rollout://{rollout_id}/document.
        """
        request = request_of(**given)
        checked_plan = await checked(request)
        job = state.jobs.add(Job(uuid.uuid4().hex, request.task))
        summary = await job.run(runner(request, checked_plan, ctx))
        if summary is None:
            raise ToolError(f"rollout {job.rollout_id} was cancelled (cancel_rollout)")
        return summary

    @mcp.tool()
    @takes(a.ROLLOUT)
    async def start_rollout(**given: Any) -> RolloutStatus:
        """run_rollout without waiting: same arguments, returns the rollout_id at
        once. Poll get_rollout; stop with cancel_rollout.
        """
        request = request_of(**given)
        checked_plan = await checked(request)
        job = Job(uuid.uuid4().hex, request.task)
        try:
            state.jobs.start(job, runner(request, checked_plan, None))
        except RuntimeError as exc:
            raise ToolError(f"start_rollout: {exc}") from None
        return job.view()

    @mcp.tool()
    @takes(a.ROLLOUT_ID)
    async def get_rollout(*, rollout_id) -> RolloutStatus:
        """Status, progress and, once done or failed, the result of a rollout."""
        return lookup(rollout_id).view()

    @mcp.tool()
    @takes(a.ROLLOUT_ID)
    async def cancel_rollout(*, rollout_id) -> RolloutStatus:
        """Stop a running rollout and wait for its cleanup (sandbox down, capture
        closed); nothing is kept."""
        job = await state.jobs.cancel(lookup(rollout_id).rollout_id)
        assert job is not None
        return job.view()

    @mcp.tool()
    @takes(a.STATUS)
    async def list_rollouts(*, status) -> RolloutList:
        """Rollouts this server knows, newest first, with counts per status
        (results: get_rollout)."""
        jobs = state.jobs.jobs()
        counts: dict[str, int] = {}
        for job in jobs:
            counts[job.status] = counts.get(job.status, 0) + 1
        shown = [j.view(with_result=False) for j in reversed(jobs) if status in (None, j.status)]
        return RolloutList(rollouts=shown, counts=counts)

    def lookup(rollout_id: str) -> Job:
        job = state.jobs.get(rollout_id)
        if job is None:
            raise ToolError(f"rollout_id: no rollout {rollout_id!r} on this server")
        return job

    @mcp.tool()
    @takes(
        (a.OUT_DIR, a.EPISODES, a.TASKS, a.DATASET, a.TASK_GLOB, a.GROUP_SIZE, a.HARNESS),
        (a.SANDBOX, a.ENGINES, a.SAMPLING, a.LIMITS, a.REWARD_KEY, a.TASK_CONFIG),
        (a.ANSWER_MODE, a.FIRST_SEED, a.CONCURRENCY, a.MIN_REWARD, a.TRAINABLE_ONLY),
        (a.KEEP_FAILURES, a.RESUME, a.LLM_URL, a.MODEL, a.API_KEY, a.BACKGROUND),
        (a.EVAL, a.KS, a.PASS_THRESHOLD),
    )
    async def collect_episodes(
        ctx: Context,
        *,
        out_dir,
        episodes,
        tasks,
        dataset,
        task_glob,
        group_size,
        harness,
        sandbox,
        llm,
        sampling,
        limits,
        reward_key,
        task_config,
        answer_mode,
        seed,
        concurrency,
        min_reward,
        trainable_only,
        keep_failures,
        resume,
        llm_url,
        model,
        api_key,
        background,
        eval,
        k,
        pass_threshold,
    ) -> CollectResult:
        """Build a dataset or run an eval: rollouts into out_dir (under the data dir),
        crash-safe. tasks: refs; or dataset (+ task_glob). episodes in all; group_size
        samples share one task instance (a GRPO group). The same call resumes (nothing twice;
        more `episodes` extends). min_reward, trainable_only filter what is kept; other
        arguments as run_rollout; llm may be a list of engines. Cancelling keeps what is
        written. background: return at once; call again for progress, then the result.
        metrics: per task family, mean reward and pass@k (k; pass: reward >= pass_threshold)
        with standard errors. eval: rollouts marked eval, no filter. Then push_dataset.
        """
        try:
            spec: LLMSpec | list[LLMSpec] | None
            if isinstance(llm, list):
                if llm_url:
                    raise RolloutArgumentError("llm: give a list in `llm` or `llm_url`, not both")
                spec = [
                    LLMSpec(url=e, model=model, api_key=api_key) if isinstance(e, str) else e
                    for e in llm
                ]
            else:
                spec = resolve_llm(
                    llm, llm_url=llm_url, model=model, api_key=api_key, default=state.default_llm
                )
            if dataset is not None:
                await state.confine_dataset("dataset", dataset)
            for source in harbor_datasets(tasks or ()):  # each dataset once, not per ref
                await state.confine_dataset("tasks", source)
            task_refs = await anyio.to_thread.run_sync(
                lambda: resolve_tasks(tasks, dataset=dataset, task_glob=task_glob)
            )
            config = CollectConfig(
                tasks=task_refs,
                episodes=episodes,
                group_size=group_size,
                harness=harness,
                sandbox=sandbox,
                llm=spec,
                sampling=sampling or Sampling(),
                limits=limits or Limits(),
                reward_key=reward_key,
                task_config=task_config,
                answer_mode=answer_mode,
                seed=seed,
                concurrency=concurrency,
                min_reward=min_reward,
                trainable_only=trainable_only,
                keep_failures=keep_failures,
                resume=resume,
                purpose="eval" if eval else "train",
            )
            if eval and (min_reward is not None or trainable_only or not keep_failures):
                raise CollectInputError(
                    "eval: an eval keeps every episode and records every failure; drop "
                    "min_reward, trainable_only and keep_failures=false"
                )
            if eval:
                await anyio.to_thread.run_sync(refuse_unnamed_rewards, task_refs, reward_key)
            if max(k) > group_size:
                raise CollectInputError(
                    f"k: pass@{max(k)} needs at least {max(k)} samples per task instance; "
                    f"group_size is {group_size} (each k must be <= group_size)"
                )
            scoring = Scoring(ks=sorted(set(k)), pass_threshold=pass_threshold)
        except (RolloutArgumentError, CollectInputError, ValueError) as exc:
            raise ToolError(str(exc)) from None

        async def progress(p: CollectProgress) -> None:
            mean = "-" if p.reward_mean is None else f"{p.reward_mean:.3f}"
            await ctx.report_progress(
                p.done,
                p.total,
                f"kept {p.collected}, filtered {p.filtered}, failed {p.failed}, "
                f"skipped {p.skipped_done}; mean reward {mean}",
            )

        path = state.data_path(out_dir)
        running = state.collecting.get(path)
        if running is not None:
            return await rejoin(running, path, config, background, progress)
        if background:
            return start_background(path, out_dir, config, scoring)
        try:
            return await run_collection(config, path, progress, scoring)
        except (CollectInputError, CollectionError, OSError) as exc:
            raise ToolError(f"{type(exc).__name__}: {exc}") from None

    async def run_collection(
        config: CollectConfig, path: Path, on_progress: Any, scoring: Scoring
    ) -> CollectResult:
        """The collection, on this server's engines (and Ray cluster, if it has one)."""
        return await collect(
            config,
            path,
            pool=state.pool,
            on_progress=on_progress,
            ray_address=state.ray_address,
            scoring=scoring,
        )

    def start_background(
        path: Path, out_dir: str, config: CollectConfig, scoring: Scoring
    ) -> CollectResult:
        """Run the collection in the server's task group; its state is kept under ``path``
        until a call collects its result."""
        job = Collecting(config, out_dir, CollectProgress(total=config.episodes))
        state.collecting[path] = job

        async def on_progress(p: CollectProgress) -> None:
            job.progress = p

        async def run() -> None:
            try:
                job.result = await run_collection(config, path, on_progress, scoring)
            except (CollectInputError, CollectionError, OSError) as exc:
                job.error = f"{type(exc).__name__}: {exc}"
            except Exception as exc:  # reported to the next call, never lost
                log.exception("background collection %s failed", path)
                job.error = f"{type(exc).__name__}: {exc}"
            finally:
                job.finished.set()

        state.jobs.spawn(run)
        return job.snapshot()

    async def rejoin(
        job: Collecting,
        path: Path,
        config: CollectConfig,
        background: bool,
        progress: Any,
    ) -> CollectResult:
        """A call for a collection that runs in the background: its progress (background, or
        still running), else its result, once (the next call starts a new run: a resume)."""
        if job.config != config:
            raise ToolError(
                f"out_dir: {job.out_dir!r} is being collected in the background with other "
                "arguments; call collect_episodes with the arguments that started it to see "
                "its progress and result"
            )
        if not job.finished.is_set():
            if background:
                return job.snapshot()
            while not job.finished.is_set():  # a blocking call: wait, reporting progress
                await progress(job.progress)
                with anyio.move_on_after(1.0):
                    await job.finished.wait()
        state.collecting.pop(path, None)  # two calls may rejoin one finished run
        if job.error is not None:
            raise ToolError(job.error)
        assert job.result is not None
        return job.result

    @mcp.tool()
    @takes(a.OUT_DIR, a.REPO_ID, a.PRIVATE, a.DRY_RUN, a.COMMIT_MESSAGE)
    async def push_dataset(*, out_dir, repo_id, private, dry_run, commit_message) -> PushResult:
        """Publish a collection (collect_episodes' out_dir) to the Hugging Face Hub:
        Parquet and a card in one commit, private by default, loadable with
        datasets.load_dataset(repo_id). dry_run sends nothing, shows what would go.
        """
        from rollwire.datasets.hub import HubError, apush_collection

        path = state.data_path(out_dir)
        if not (path / "manifest.json").exists():
            raise ToolError(f"out_dir: {out_dir!r} holds no collection (no manifest.json)")
        try:
            return await apush_collection(
                path, repo_id, private=private, dry_run=dry_run, commit_message=commit_message
            )
        except (HubError, OSError, ValueError) as exc:
            raise ToolError(f"{type(exc).__name__}: {exc}") from None

    @mcp.tool()
    @takes(a.ROLLOUT_ID, a.GRAPH_FORMAT)
    async def get_rollout_graph(*, rollout_id, format) -> RolloutGraphView:
        """How a finished rollout's model calls link, to debug untrainable data: a
        node per call with its parent, role, token counts and findings; re-tokenised calls
        (new roots) and discarded ones. format 'mermaid' adds a flowchart.
        """
        stored = state.store.get(rollout_id)
        if stored is None:
            raise ToolError(f"rollout_id: no rollout {rollout_id!r} on this server")
        return await anyio.to_thread.run_sync(graph_view, rollout_id, stored.document, format)

    @mcp.tool()
    async def info() -> InfoReport:
        """What this server can run: sandboxes, agent harnesses and their dialects,
        bundled datasets, env families (unavailable ones with the reason)."""
        report = await info_report()
        return InfoReport(**report)

    @mcp.resource(
        "rollout://{rollout_id}/document",
        name="rollout_document",
        description="The full rollout document (rollwire.rollout/1 JSON): turns with prompt "
        "and completion token ids, logprobs, sequences with loss masks, stats and findings.",
        mime_type="application/json",
    )
    async def rollout_document(rollout_id: str) -> str:
        stored = state.store.get(rollout_id)
        if stored is None:
            raise ResourceNotFoundError(f"no rollout {rollout_id!r} on this server")
        if stored.document is None:
            raise ResourceNotFoundError(
                f"rollout {rollout_id!r} captured no model call, so it has no document"
            )
        document = stored.document  # large: serialised off the event loop
        return await anyio.to_thread.run_sync(
            lambda: orjson.dumps(document.model_dump(mode="json")).decode()
        )

    @mcp.resource(
        "rollout://{rollout_id}/graph",
        name="rollout_graph",
        description="The rollout's call graph (as get_rollout_graph returns it) with its "
        "Mermaid flowchart.",
        mime_type="application/json",
    )
    async def rollout_graph(rollout_id: str) -> str:
        stored = state.store.get(rollout_id)
        if stored is None:
            raise ResourceNotFoundError(f"no rollout {rollout_id!r} on this server")
        document = stored.document
        return await anyio.to_thread.run_sync(
            lambda: graph_view(rollout_id, document, "mermaid").model_dump_json()
        )

    return mcp


# --- transports ---------------------------------------------------------------------------------


async def serve_stdio(state: ServerState | None = None) -> None:
    """Serve over stdin/stdout until the client closes it; then cancel what still runs."""
    state = state or ServerState()
    async with state:
        await build_server(state).run_stdio_async()


async def _json(send: Any, status: int, body: dict[str, Any], headers: Any = ()) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), *headers],
        }
    )
    await send({"type": "http.response.body", "body": orjson.dumps(body)})


def _bearer(app: Any, token: str) -> Any:
    """Reject HTTP requests without ``Authorization: Bearer <token>`` (401)."""
    expected = f"Bearer {token}".encode()

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, expected):
                await _json(
                    send, 401, {"error": "unauthorized"}, [(b"www-authenticate", b"Bearer")]
                )
                return
        await app(scope, receive, send)

    return asgi


def _max_body(app: Any, limit: int) -> Any:
    """Refuse an HTTP request whose body is over ``limit`` bytes (413), by its Content-Length
    or, without one, as it arrives (the body is read first, at most ``limit`` bytes, then
    handed on): the app never sees more than ``limit`` bytes."""

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length", b"").decode("latin-1")
        too_large = {"error": f"request body is larger than {limit} bytes"}
        if declared.isdigit() and int(declared) > limit:
            await _json(send, 413, too_large)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away before its body arrived
            body += message.get("body", b"")
            if len(body) > limit:
                await _json(send, 413, too_large)
                return
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await app(scope, replay, send)

    return asgi


def capture_app(state: ServerState) -> Any:
    """The capture proxy of the server's default endpoint (``--llm-url``), as an ASGI app.

    Certified on first use; agents call ``<mount>/v1/...`` with a session key, the control
    plane (``<mount>/sessions``) takes the server's admin key.
    """

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        llm = state.default_llm
        if llm is None:
            await _json(
                send,
                404,
                {"error": "this server has no default endpoint (start it with --llm-url)"},
            )
            return
        try:
            endpoint = await state.pool.endpoint(llm.url, model=llm.model, api_key=llm.api_key)
        except EndpointNotUsable as exc:
            await _json(send, 503, {"error": f"endpoint not usable: {exc}"})
            return
        await endpoint.proxy.app(scope, receive, send)

    return asgi


def http_app(
    server: MCPServer,
    *,
    host: str = "127.0.0.1",
    token: str | None = None,
    loopback: bool = True,
) -> Starlette:
    """One ASGI app: the MCP endpoint at ``/mcp`` (behind bearer auth when ``token`` is set),
    the default endpoint's capture proxy at ``/capture``, the read-only web UI at ``/ui`` (same
    token: once in the URL, then a cookie; see :mod:`rollwire.server.ui`), and ``/health``.

    Its lifespan enters the server's state (background rollouts, proxy servers) and the MCP
    session manager; shutdown cancels and cleans up every running rollout. Off loopback the
    SDK's Host-header allow-list (DNS-rebinding protection for local servers) does not apply:
    the bearer token is what guards the server there.
    """
    state: ServerState = server.state  # type: ignore[attr-defined]
    security = (
        None if loopback else TransportSecuritySettings(enable_dns_rebinding_protection=False)
    )
    mcp_asgi = server.streamable_http_app(transport_security=security, host=host)
    guarded = _bearer(mcp_asgi, token) if token else mcp_asgi
    guarded = _max_body(guarded, bounds.MAX_MCP_BODY_BYTES)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with state, server.session_manager.run():
            yield

    async def health(request: Request) -> JSONResponse:
        llm = state.default_llm
        return JSONResponse(
            {
                "status": "ok",
                "rollouts_running": state.jobs.running,
                "rollouts_stored": len(state.store),
                "llm_url": llm.url if llm else None,
                "mcp": "/mcp",
                "capture": "/capture/v1" if llm else None,
                "ui": "/ui",
            }
        )

    async def weight_version(request: Request) -> JSONResponse:
        # A trainer announces the weights its engine now serves (rollwire.trl's
        # announce_weight_version), for engines that do not report their own.
        if token and not hmac.compare_digest(
            request.headers.get("authorization", "").encode(), f"Bearer {token}".encode()
        ):
            return JSONResponse({"error": "unauthorized"}, 401, {"www-authenticate": "Bearer"})
        if request.method == "GET":
            return JSONResponse({"announced": state.pool.announced()})
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > 64 * 1024:
                return JSONResponse({"error": "body is larger than 64 KiB"}, 413)
        try:
            body = orjson.loads(bytes(raw) or b"null")
        except orjson.JSONDecodeError as exc:
            return JSONResponse({"error": f"body is not JSON: {exc}"}, 400)
        if not isinstance(body, dict) or set(body) - {"weight_version", "llm_url"}:
            return JSONResponse(
                {"error": "send {'weight_version': str, 'llm_url': str (optional)}"}, 400
            )
        version, llm_url = body.get("weight_version"), body.get("llm_url")
        if not isinstance(version, str) or not version:
            return JSONResponse({"error": "weight_version must be a non-empty string"}, 400)
        if llm_url is None and state.default_llm is not None:
            llm_url = state.default_llm.url
        if not isinstance(llm_url, str) or not llm_url:
            return JSONResponse(
                {"error": "llm_url is required: this server has no default engine (--llm-url)"},
                400,
            )
        applied = state.pool.announce(llm_url, version)
        return JSONResponse({"weight_version": version, "llm_url": llm_url, "endpoints": applied})

    from rollwire.server.ui import ui_app

    ui = ui_app(state, token=token, loopback=loopback)
    return Starlette(
        routes=[
            Route("/health", health),
            Route("/weight_version", weight_version, methods=["GET", "POST"]),
            Mount("/capture", app=capture_app(state)),
            Route("/ui", ui),
            Mount("/ui", app=ui),
            Mount("", app=guarded),
        ],
        lifespan=lifespan,
    )
