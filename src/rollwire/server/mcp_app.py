"""The rollwire MCP server: tasks, endpoint certification, rollouts and their graphs.

``build_server()`` assembles an :class:`MCPServer` over one :class:`ServerState` (the endpoint
pool and the in-memory rollout store). ``serve_stdio`` and ``serve_http`` run it; logs go to
stderr only (stdout is the stdio transport).
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

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

from rollwire.capture.certify import Certification
from rollwire.datasets.hub import PushResult
from rollwire.datasets.store import CollectionError
from rollwire.sessions.base import AnswerMode
from rollwire.sessions.collect import (
    CollectConfig,
    CollectInputError,
    CollectProgress,
    CollectResult,
    collect,
    resolve_tasks,
)
from rollwire.tools.endpoint import EndpointNotUsable, EndpointPool
from rollwire.tools.info import info_report
from rollwire.tools.jobs import Job, JobRegistry, RolloutStatus, Runner
from rollwire.tools.rollouts import (
    ANSWER_MODE_HELP,
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
from rollwire.tools.tasks import TaskPage, TaskRefError, list_task_page

log = logging.getLogger("rollwire.mcp")

INSTRUCTIONS = """\
rollwire runs LLM-agent rollouts and captures trainable data (engine token ids, logprobs,
reward). Typical flow: list_tasks -> validate_llm(llm_url) -> run_rollout(task, llm_url) ->
get_rollout_graph(rollout_id) or read rollout://{rollout_id}/document; for datasets,
collect_episodes(out_dir, episodes, tasks) -> push_dataset(out_dir, repo_id). Task references:
'family:name' for env tasks (e.g. 'reasoning_gym:chain_sum'), 'harbor:<dataset>#<task>' for
Harbor tasks (e.g. 'harbor:examples/tasks#count-errors')."""


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
    _stack: contextlib.AsyncExitStack | None = None

    def data_path(self, out_dir: str) -> Path:
        """Where a collection named ``out_dir`` lives: always inside ``data_dir``.

        Relative names are taken under ``data_dir``; an absolute path must already be inside
        it. The path is resolved first (``..`` and symlinks followed), so neither can lead out:
        a path that resolves elsewhere, or to ``data_dir`` itself, is a ``ToolError`` naming
        ``out_dir``. Clients name collections; only the operator (``--data-dir``) names where
        they may be written."""
        root = self.data_dir.expanduser().resolve()
        given = Path(out_dir).expanduser()
        path = (given if given.is_absolute() else root / given).resolve()
        if root not in path.parents:
            raise ToolError(
                f"out_dir: {out_dir!r} resolves to {path}, which is not inside the data "
                f"directory {root} (--data-dir): name a directory inside it"
            )
        return path

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


def build_server(state: ServerState | None = None) -> MCPServer:
    """The MCP server over ``state`` (a fresh one by default)."""
    state = state or ServerState()
    mcp = MCPServer("rollwire", instructions=INSTRUCTIONS, log_level="WARNING")
    mcp.state = state  # type: ignore[attr-defined]

    @mcp.tool()
    async def list_tasks(
        source: str | None = None,
        offset: Annotated[int, Field(ge=0)] = 0,
        limit: Annotated[int, Field(ge=1, le=500)] = 50,
        query: str | None = None,
    ) -> TaskPage:
        """List runnable tasks, a page at a time.

        source: omit for every env task; an env family name (reasoning_gym, openspiel,
        textarena, browsergym) for that family only; or a Harbor dataset path on the server
        (a directory of task directories, one task directory, or a registry .json), e.g.
        "examples/tasks". query: keep tasks whose reference or description contains it
        (case-insensitive). Each task's `ref` is exactly what run_rollout's `task` accepts:
        env tasks are 'family:name' (e.g. 'reasoning_gym:chain_sum'); Harbor tasks are
        'harbor:<dataset>#<task name>' (e.g. 'harbor:examples/tasks#count-errors').
        Page with offset/limit; next_offset is null on the last page.
        """
        try:
            return await list_task_page(source, offset=offset, limit=limit, query=query)
        except TaskRefError as exc:
            raise ToolError(f"source: {exc}") from None

    @mcp.tool()
    async def validate_llm(
        llm_url: str, model: str | None = None, api_key: str | None = None
    ) -> Certification:
        """Certify an OpenAI-spec endpoint (e.g. vLLM at http://host:8000/v1).

        verdict TRAIN: the engine returns token ids and processed logprobs, rollouts are
        trainable; EVAL ONLY: text only, rollouts are for evaluation; NOT USABLE: see findings.
        token_in_paths: how the engine takes a token prompt (vllm_chat, sglang_chat,
        completions), so multi-turn conversations stay one training sequence; empty: turns
        link by exact token prefix only. model: which served model (needed when several are served). A usable result is
        cached for run_rollout on the same (llm_url, model, api_key).
        """
        return await state.pool.certify(llm_url, model=model, api_key=api_key)

    def request_of(
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
        try:
            spec = resolve_llm(
                llm, llm_url=llm_url, model=model, api_key=api_key, default=state.default_llm
            )
        except RolloutArgumentError as exc:
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
    async def run_rollout(
        task: str,
        ctx: Context,
        harness: str | None = None,
        sandbox: str | None = None,
        llm: LLMSpec | str | None = None,
        sampling: Sampling | None = None,
        limits: Limits | None = None,
        reward_key: str | None = None,
        include_tokens: bool = False,
        seed: int | None = None,
        task_config: dict[str, Any] | None = None,
        llm_url: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        answer_mode: Annotated[AnswerMode | None, Field(description=ANSWER_MODE_HELP)] = None,
    ) -> RolloutSummary:
        """Run one rollout to the end and return its reward and capture summary.

        task: a reference from list_tasks: 'family:name' (an env task, run by rollwire's own
        tool loop) or 'harbor:<dataset>#<task name>' (a Harbor task).
        harness: Harbor tasks only: terminus-2 (default; calls the model), oracle or nop (no
        model); see the info tool. sandbox: Harbor tasks only: 'local' (default; bubblewrap) or 'docker' (the task's image on the server's Docker daemon).
        llm: the engine: its OpenAI base URL, or {url, model, api_key}; llm_url/model/api_key
        are the same as flat fields; omitted, the server's --llm-url. Certified once per
        endpoint; every model call is captured through a proxy.
        sampling: {temperature, max_tokens, seed}; env defaults 1.0/256; for Harbor agents,
        the agent's own unless given. limits: {max_turns (env default 8), max_model_calls,
        timeout_s}. seed: env episode seed (and the agent's sampling seed).
        task_config: env tasks only, a JSON object for the task's generator.
        answer_mode: env tasks only: 'tool' (default), 'text' or 'either' (see its schema);
        use 'text' or 'either' for a model without tool calling, so the verifier still runs.
        reward_key: which reward of a multi-reward verifier is the reward.
        include_tokens: also return each sequence's input_ids, loss_mask and logprobs.
        The call stays open and reports progress per phase; cancelling it tears the sandbox
        down and closes the capture session. A failed rollout is ok=false with `error`, not a
        tool error. Keep `rollout_id` for get_rollout_graph and rollout://{rollout_id}/document.
        For a client that cannot hold a call open: start_rollout + get_rollout.
        """
        request = request_of(
            task,
            harness,
            sandbox,
            llm,
            sampling,
            limits,
            reward_key,
            include_tokens,
            seed,
            task_config,
            llm_url,
            model,
            api_key,
            answer_mode,
        )
        checked_plan = await checked(request)
        job = state.jobs.add(Job(uuid.uuid4().hex, task))
        summary = await job.run(runner(request, checked_plan, ctx))
        if summary is None:
            raise ToolError(f"rollout {job.rollout_id} was cancelled (cancel_rollout)")
        return summary

    @mcp.tool()
    async def start_rollout(
        task: str,
        harness: str | None = None,
        sandbox: str | None = None,
        llm: LLMSpec | str | None = None,
        sampling: Sampling | None = None,
        limits: Limits | None = None,
        reward_key: str | None = None,
        include_tokens: bool = False,
        seed: int | None = None,
        task_config: dict[str, Any] | None = None,
        llm_url: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        answer_mode: Annotated[AnswerMode | None, Field(description=ANSWER_MODE_HELP)] = None,
    ) -> RolloutStatus:
        """Start a rollout in the background and return at once with its rollout_id.

        Same arguments as run_rollout, checked before anything starts (a bad argument is a
        tool error). Poll get_rollout(rollout_id) for progress and, once status is done or
        failed, the result; cancel_rollout(rollout_id) stops it (sandbox torn down).
        """
        request = request_of(
            task,
            harness,
            sandbox,
            llm,
            sampling,
            limits,
            reward_key,
            include_tokens,
            seed,
            task_config,
            llm_url,
            model,
            api_key,
            answer_mode,
        )
        checked_plan = await checked(request)
        job = Job(uuid.uuid4().hex, task)
        try:
            state.jobs.start(job, runner(request, checked_plan, None))
        except RuntimeError as exc:
            raise ToolError(f"start_rollout: {exc}") from None
        return job.view()

    @mcp.tool()
    async def get_rollout(rollout_id: str) -> RolloutStatus:
        """A rollout's status (running, done, failed, cancelled), progress (phase done/total and
        message) and, once finished, its result (as run_rollout returns it)."""
        return lookup(rollout_id).view()

    @mcp.tool()
    async def cancel_rollout(rollout_id: str) -> RolloutStatus:
        """Cancel a running rollout and wait until it has cleaned up (sandbox torn down,
        capture session closed); nothing is stored for it. A finished rollout is left as is."""
        job = await state.jobs.cancel(lookup(rollout_id).rollout_id)
        assert job is not None
        return job.view()

    @mcp.tool()
    async def list_rollouts(
        status: Literal["running", "done", "failed", "cancelled"] | None = None,
    ) -> RolloutList:
        """Every rollout this server knows, newest first (without results: get_rollout has
        them); status filters. Counts cover all of them."""
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
    async def collect_episodes(
        out_dir: str,
        episodes: Annotated[int, Field(ge=1)],
        ctx: Context,
        tasks: list[str] | None = None,
        dataset: str | None = None,
        task_glob: str | None = None,
        group_size: Annotated[int, Field(ge=1)] = 1,
        harness: str | None = None,
        sandbox: str | None = None,
        llm: LLMSpec | str | None = None,
        sampling: Sampling | None = None,
        limits: Limits | None = None,
        reward_key: str | None = None,
        task_config: dict[str, Any] | None = None,
        answer_mode: Annotated[AnswerMode | None, Field(description=ANSWER_MODE_HELP)] = None,
        seed: int = 0,
        concurrency: Annotated[int, Field(ge=1, le=256)] = 4,
        min_reward: float | None = None,
        trainable_only: bool = False,
        keep_failures: bool = True,
        resume: bool = True,
        llm_url: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
    ) -> CollectResult:
        """Collect many rollouts into a dataset directory, crash-safe and resumable.

        tasks: task references (as run_rollout's task), or dataset: a Harbor dataset with
        task_glob over its task names. episodes: how many in all; group_size samples share one
        task instance (a GRPO group, same group_id). out_dir: a directory name inside the server's
        data directory (anything that resolves outside it, by .. or a symlink, is refused); it
        holds episodes.jsonl (kept episodes with
        token arrays), failures.jsonl, filtered.jsonl and manifest.json. Calling again with the
        same arguments resumes: written episodes are skipped, never duplicated; a larger
        `episodes` extends the collection. min_reward / trainable_only filter what is kept.
        llm, sampling, limits, harness, sandbox, reward_key, task_config, answer_mode: as
        run_rollout. Progress is
        reported per episode; cancelling stops with everything written kept. Then
        push_dataset(out_dir, repo_id) publishes it.
        """
        try:
            spec = resolve_llm(
                llm, llm_url=llm_url, model=model, api_key=api_key, default=state.default_llm
            )
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
            )
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

        try:
            return await collect(
                config, state.data_path(out_dir), pool=state.pool, on_progress=progress
            )
        except (CollectInputError, CollectionError, OSError) as exc:
            raise ToolError(f"{type(exc).__name__}: {exc}") from None

    @mcp.tool()
    async def push_dataset(
        out_dir: str,
        repo_id: str,
        private: bool = True,
        dry_run: bool = False,
        commit_message: str | None = None,
    ) -> PushResult:
        """Publish a collection (collect_episodes' out_dir) to the Hugging Face Hub as a dataset
        repo: the episodes as Parquet plus a generated dataset card, in one commit, so that
        datasets.load_dataset(repo_id) gives the train split. private: default true.
        dry_run: return exactly what would be sent (files, sizes, card) and send nothing. The
        server's Hugging Face token (HF_TOKEN or a saved login) is used and never returned.
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
    async def get_rollout_graph(
        rollout_id: str, format: Literal["json", "mermaid"] = "json"
    ) -> RolloutGraphView:
        """The call graph of a finished rollout: one node per model call with its parent
        (the call whose prompt + reply its prompt extends), role (agent, auxiliary,
        discarded), token counts and findings; which calls re-tokenised an earlier reply
        (a new root) or were discarded. format='mermaid' also fills `mermaid` with a
        flowchart. A rollout with no model call (oracle, nop) has no nodes.
        """
        stored = state.store.get(rollout_id)
        if stored is None:
            raise ToolError(f"rollout_id: no rollout {rollout_id!r} on this server")
        return graph_view(rollout_id, stored.document, format)

    @mcp.tool()
    async def info() -> InfoReport:
        """What this server's machine can run: sandboxes, agent harnesses, the bundled Harbor
        datasets, env families (with the reason when one is unavailable). Read-only."""
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
        return orjson.dumps(stored.document.model_dump(mode="json")).decode()

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
        return graph_view(rollout_id, stored.document, "mermaid").model_dump_json()

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
    the default endpoint's capture proxy at ``/capture``, and ``/health``.

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
            }
        )

    return Starlette(
        routes=[
            Route("/health", health),
            Mount("/capture", app=capture_app(state)),
            Mount("", app=guarded),
        ],
        lifespan=lifespan,
    )
