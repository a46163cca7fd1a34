"""Run one rollout for the MCP server, keep its document, and describe its graph.

A rollout's failure is a result (``ok=false`` with ``error``); only bad arguments raise
:class:`RolloutArgumentError`, whose message starts with the offending field's name.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import anyio
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator

from rollwire import bounds
from rollwire.capture.export import Role, RolloutDocument, RolloutStats
from rollwire.capture.findings import Finding, fatal
from rollwire.datasets.records import SequenceRow
from rollwire.result import RolloutResult
from rollwire.sessions.base import DEFAULT_ANSWER_MODE, AnswerMode
from rollwire.tools.endpoint import EndpointNotUsable, EndpointPool
from rollwire.tools.tasks import (
    EnvRef,
    HarborRef,
    TaskRefError,
    check_env_task,
    parse_task_ref,
)

log = logging.getLogger("rollwire.mcp")

NO_LLM_HARNESSES = ("oracle", "nop")
ENV_HARNESS = "rollwire-toolloop"
DEFAULT_HARBOR_HARNESS = "terminus-2"
LOCAL_SANDBOX = "local"
ENV_DEFAULT_MAX_TURNS = 8
ENV_DEFAULT_MAX_TOKENS = 256
ENV_DEFAULT_TEMPERATURE = 1.0
PHASES = 4  # resolve, endpoint, run, store

Progress = Callable[[float, str], Awaitable[None]]


class RolloutArgumentError(ValueError):
    """An argument that cannot become a rollout; the message starts with the field name."""


class TokenSequence(SequenceRow):
    """One trainable-data sequence (root-to-leaf path), position-aligned, with where its
    prompt ends and its turns are."""

    prompt_len: int = Field(
        description="positions before the first sampled token: the first turn's prompt"
    )
    turn_spans: list[list[int]] = Field(
        description="[start, end) of each turn's sampled tokens in input_ids"
    )


class RolloutCounts(BaseModel):
    """Shape and yield of the rollout."""

    turns: int = 0
    roots: int = 0
    trainable_sequences: int = 0
    trainable_tokens: int = 0
    tool_calls: int = 0


class RolloutSummary(BaseModel):
    """What run_rollout returns: compact, token arrays only on request."""

    rollout_id: str
    task: str
    harness: str
    sandbox: str | None = None
    ok: bool = Field(description="usable: no error, no FATAL finding, trainable data if train")
    error: str | None = None
    reward: float | None = Field(description="null when the verifier never ran (not 0.0)")
    rewards: dict[str, float] = Field(default_factory=dict)
    tier: str = Field(description="capture tier: 'tokens' (trainable) or 'text' (eval only)")
    rollout_type: str
    counts: RolloutCounts
    stop_reason: str | None = None
    seed: int | None = None
    answer_mode: str | None = Field(
        default=None, description="env tasks: how the answer reached the environment"
    )
    findings: list[Finding] = Field(default_factory=list)
    timings: dict[str, float] = Field(default_factory=dict)
    weight_versions: list[str] = Field(
        default_factory=list,
        description="the engine weight versions that sampled the agent's calls, in order",
    )
    has_document: bool = Field(
        description="true when rollout://{rollout_id}/document and get_rollout_graph have data"
    )
    sequences: list[TokenSequence] | None = Field(
        default=None, description="only with include_tokens=true"
    )


@dataclass
class StoredRollout:
    """A finished rollout, kept in memory."""

    result: RolloutResult
    document: RolloutDocument | None
    llm: LLMSpec | None = None  # the engine its calls went to (the web UI detokenises with it)


class RolloutStore:
    """The last ``capacity`` rollouts by id, oldest evicted first (memory only, per process)."""

    def __init__(self, capacity: int = 256) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, StoredRollout] = OrderedDict()

    def put(self, stored: StoredRollout) -> None:
        """Keep one rollout (evicting the oldest past capacity)."""
        self._items[stored.result.rollout_id] = stored
        self._items.move_to_end(stored.result.rollout_id)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, rollout_id: str) -> StoredRollout | None:
        """The rollout with this id, or None."""
        return self._items.get(rollout_id)

    def __len__(self) -> int:
        return len(self._items)


def summary_of(
    result: RolloutResult, *, include_tokens: bool, has_document: bool
) -> RolloutSummary:
    """The compact form of a result."""
    sequences = None
    if include_tokens:
        sequences = [
            TokenSequence.from_sequence(
                s,
                prompt_len=s.turn_spans[0].start if s.turn_spans else len(s.input_ids),
                turn_spans=[[t.start, t.end] for t in s.turn_spans],
            )
            for s in result.sequences or []
        ]
    return RolloutSummary(
        rollout_id=result.rollout_id,
        task=result.task,
        harness=result.harness,
        sandbox=result.sandbox,
        ok=result.ok,
        error=result.error,
        reward=result.reward,
        rewards=result.rewards,
        tier=result.capture_level.value,
        rollout_type=result.rollout_type.value,
        counts=RolloutCounts(
            turns=result.n_turns,
            roots=result.n_roots,
            trainable_sequences=result.n_trainable_sequences,
            trainable_tokens=result.n_trainable_tokens,
            tool_calls=result.n_tool_calls,
        ),
        stop_reason=result.stop_reason,
        seed=result.seed,
        answer_mode=result.answer_mode,
        findings=result.findings,
        timings=result.timings,
        weight_versions=result.weight_versions,
        has_document=has_document,
        sequences=sequences,
    )


class LLMSpec(BaseModel):
    """Which engine a rollout's model calls go to (an OpenAI-spec base URL)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    url: str = Field(
        max_length=bounds.MAX_TEXT,
        validation_alias=AliasChoices("url", "llm_url", "base_url"),
        description="OpenAI base URL, e.g. http://h:8000/v1",
    )
    model: str | None = Field(
        default=None, max_length=bounds.MAX_TEXT, description="served model (when several)"
    )
    api_key: str | None = Field(
        default=None, max_length=bounds.MAX_TEXT, description="if the engine needs one"
    )


class Sampling(BaseModel):
    """Sampling for the agent's model calls. At the tokens tier, knobs that reshape the
    distribution (top_p, top_k, penalties) are forced to no-op by the capture proxy."""

    model_config = ConfigDict(extra="forbid")

    temperature: float | None = Field(default=None, ge=0, le=100, description="env default 1.0")
    max_tokens: int | None = Field(
        default=None, ge=1, le=bounds.MAX_TOKENS, description="per call; env default 256"
    )
    seed: int | None = Field(
        default=None,
        ge=bounds.MIN_SEED,
        le=bounds.MAX_SEED,
        description="default: the rollout's seed",
    )
    top_logprobs: int | None = Field(
        default=None,
        ge=0,
        le=bounds.MAX_TOP_LOGPROBS,
        description="env: top candidates per token",
    )


class Limits(BaseModel):
    """Bounds on one rollout."""

    model_config = ConfigDict(extra="forbid")

    max_turns: int | None = Field(
        default=None, ge=1, le=bounds.MAX_TURNS, description="agent turns; env default 8"
    )
    max_model_calls: int | None = Field(
        default=None,
        ge=1,
        le=bounds.MAX_MODEL_CALLS,
        description="model calls",
    )
    timeout_s: float | None = Field(
        default=None,
        gt=0,
        le=bounds.MAX_TIMEOUT_S,
        description="whole rollout, seconds",
    )


class RolloutRequest(BaseModel):
    """run_rollout's arguments, resolved (the llm is a spec or None)."""

    task: bounds.Text
    harness: bounds.Text | None = None
    sandbox: bounds.Text | None = None
    llm: LLMSpec | None = None
    sampling: Sampling = Field(default_factory=Sampling)
    limits: Limits = Field(default_factory=Limits)
    seed: bounds.Seed | None = None
    task_config: dict[str, Any] | None = None
    reward_key: bounds.Text | None = None
    include_tokens: bool = False
    answer_mode: AnswerMode | None = None  # env tasks; None: the default (tool)

    @field_validator("task_config")
    @classmethod
    def _bounded_config(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        bounds.check_task_config(value)
        return value


ANSWER_MODE_HELP = (
    "env tasks: how the answer reaches the environment. 'tool' (the default): through the "
    "task's tools only, and a reply with no tool call ends the episode with reward null; "
    "'text': no tools are offered and the final reply is read by the environment's own answer "
    "extraction (reasoning-gym: <answer>...</answer>; a reply without one scores 0.0); "
    "'either': a tool call, or else the reply text. reasoning_gym and textarena take text."
)


def resolve_llm(
    llm: LLMSpec | str | None,
    *,
    llm_url: str | None = None,
    model: str | None = None,
    api_key: str | None = None,
    default: LLMSpec | None = None,
) -> LLMSpec | None:
    """One LLM spec from ``llm`` (a spec or a bare URL), the flat shorthand, or the default."""
    if llm is not None and (llm_url or model or api_key):
        raise RolloutArgumentError("llm: give `llm` or `llm_url`/`model`/`api_key`, not both")
    if isinstance(llm, str):
        return LLMSpec(url=llm)
    if llm is not None:
        return llm
    if llm_url:
        return LLMSpec(url=llm_url, model=model, api_key=api_key)
    if model or api_key:
        if default is None:
            raise RolloutArgumentError("llm_url: required with `model`/`api_key`")
        return default.model_copy(
            update={"model": model or default.model, **({"api_key": api_key} if api_key else {})}
        )
    return default


def _sampling_seed(req: RolloutRequest) -> int | None:
    return req.sampling.seed if req.sampling.seed is not None else req.seed


@dataclass(frozen=True)
class Plan:
    """A checked request: what runs, where, with which model."""

    ref: EnvRef | HarborRef
    harness: str
    sandbox: str | None
    needs_llm: bool
    seed: int | None  # the task's seed (env tasks: which instance)
    sampling_seed: int | None  # the model's sampling seed
    task_entry: Any = None  # the resolved Harbor task


def _check_harness(name: str) -> None:
    from rollwire.harnesses.harbor.seams import SEAMS, get_seam

    if name not in SEAMS and ":" not in name:
        raise RolloutArgumentError(
            f"harness: unknown harness {name!r} for a Harbor task; accepted: {sorted(SEAMS)}"
        )
    try:
        problem = get_seam(name).check()
    except Exception as exc:
        problem = f"{type(exc).__name__}: {exc}"
    if problem is not None:
        raise RolloutArgumentError(f"harness: {name!r} cannot run here: {problem}")


def _check_sandbox(name: str) -> None:
    from rollwire.harnesses.harbor.sandboxes import RUNNABLE, available_sandboxes

    if name in RUNNABLE:
        problem = RUNNABLE[name][1]({})
        if problem is None:
            return
        reason = f"not available here ({problem})"
    else:
        status = {s.name: s for s in available_sandboxes()}.get(name)
        if status is None:
            reason = "unknown sandbox"
        elif not status.available:
            reason = f"not available here ({status.reason})"
        else:
            reason = "available, but rollouts run only in " + ", ".join(sorted(RUNNABLE))
    raise RolloutArgumentError(
        f"sandbox: {name!r}: {reason}; accepted: {sorted(RUNNABLE)} (see the info tool)"
    )


def _check_answer_mode(ref: EnvRef, mode: str) -> None:
    from rollwire.harnesses.envs.registry import TaskError, check_answer_mode, load_adapter

    try:
        check_answer_mode(load_adapter(ref.family), mode)
    except TaskError as exc:
        raise RolloutArgumentError(f"{exc} (task {str(ref)!r})") from None


def plan(req: RolloutRequest) -> Plan:
    """Check every argument before anything runs; raises :class:`RolloutArgumentError`.

    Blocking (resolves a Harbor dataset, may import an agent): call it from a worker thread.
    """
    seed, sampling_seed = req.seed, _sampling_seed(req)
    try:
        ref = parse_task_ref(req.task)
    except TaskRefError as exc:
        raise RolloutArgumentError(f"task: {exc}") from None
    if isinstance(ref, EnvRef):
        if req.harness not in (None, ENV_HARNESS):
            raise RolloutArgumentError(
                f"harness: env tasks run in rollwire's own tool loop; accepted: "
                f"[{ENV_HARNESS!r}] (or omit it), got {req.harness!r}"
            )
        if req.sandbox not in (None, "none"):
            raise RolloutArgumentError(
                f"sandbox: env tasks run in-process, not in a sandbox; omit it "
                f"(got {req.sandbox!r})"
            )
        try:
            check_env_task(ref)
        except TaskRefError as exc:
            raise RolloutArgumentError(f"task: {exc}") from None
        if req.answer_mode is not None:
            _check_answer_mode(ref, req.answer_mode)
        if req.llm is None:
            raise RolloutArgumentError("llm_url: required: env tasks call a model (or pass llm)")
        return Plan(ref, ENV_HARNESS, None, True, seed, sampling_seed)
    if req.task_config:
        raise RolloutArgumentError("task_config: applies to env tasks only, not Harbor tasks")
    if req.answer_mode is not None:
        raise RolloutArgumentError(
            "answer_mode: applies to env tasks only; a Harbor task's verifier reads what the "
            "agent did in its sandbox"
        )
    if req.sampling.top_logprobs:
        raise RolloutArgumentError(
            "sampling.top_logprobs: applies to env tasks only (rollwire's tool loop asks the "
            "engine for them); a Harbor agent makes its own requests, and its candidates are "
            "kept when it asks for them itself"
        )

    harness = req.harness or DEFAULT_HARBOR_HARNESS
    sandbox = req.sandbox or LOCAL_SANDBOX
    _check_sandbox(sandbox)
    from rollwire.harnesses.harbor.datasets import DatasetError, resolve_dataset

    try:
        entry = resolve_dataset(ref.dataset).task(ref.name)
    except DatasetError as exc:
        raise RolloutArgumentError(f"task: {exc}") from None
    _check_harness(harness)
    needs_llm = harness not in NO_LLM_HARNESSES
    if needs_llm and req.llm is None:
        raise RolloutArgumentError(f"llm_url: required: harness {harness!r} calls a model")
    if not needs_llm and sampling_seed is not None:
        raise RolloutArgumentError(f"seed: harness {harness!r} samples nothing to seed")
    # A Harbor task has no instance seed: the seed is the agent's sampling seed.
    return Plan(ref, harness, sandbox, needs_llm, sampling_seed, sampling_seed, entry)


def _harbor_agent_kwargs(req: RolloutRequest, seed: int | None) -> dict[str, Any]:
    """Sampling and limits as terminus-2-style agent kwargs (as the CLI)."""
    kwargs: dict[str, Any] = {}
    if req.limits.max_turns is not None:
        kwargs["max_turns"] = req.limits.max_turns
    if req.sampling.temperature is not None:
        kwargs["temperature"] = req.sampling.temperature
    call: dict[str, Any] = {}
    if seed is not None:
        call["seed"] = seed
    if req.sampling.max_tokens is not None:
        call["max_tokens"] = req.sampling.max_tokens
    if call:
        kwargs["llm_call_kwargs"] = call
    return kwargs


def failed_result(
    req: RolloutRequest, p: Plan | None, rollout_id: str, error: str, start: float
) -> RolloutResult:
    """A rollout that produced nothing usable: ``error`` as its result and a FATAL finding."""
    return RolloutResult(
        ok=False,
        error=error,
        rollout_id=rollout_id,
        task=req.task,
        harness=p.harness if p else (req.harness or ""),
        sandbox=p.sandbox if p else req.sandbox,
        seed=p.seed if p else req.seed,
        findings=[fatal("rollout_failed", error)],
        timings={"total_s": round(time.perf_counter() - start, 4)},
    )


async def run_rollout(
    req: RolloutRequest,
    *,
    pool: EndpointPool,
    store: RolloutStore,
    progress: Progress | None = None,
    rollout_id: str | None = None,
    checked: Plan | None = None,
) -> RolloutSummary:
    """Run one rollout, store it, and summarise it. Raises only :class:`RolloutArgumentError`
    (before anything runs) and cancellation (after cleaning up: sandbox down, session closed)."""

    async def step(done: int, message: str) -> None:
        if progress is not None:
            await progress(done, message)

    rollout_id = rollout_id or uuid.uuid4().hex
    await step(0, f"resolving {req.task}")
    p = checked or await anyio.to_thread.run_sync(plan, req)
    result, document = await attempt(req, p, rollout_id, pool, step)
    await step(3, "storing the rollout document")
    store.put(StoredRollout(result=result, document=document, llm=req.llm if p.needs_llm else None))
    summary = summary_of(
        result, include_tokens=req.include_tokens, has_document=document is not None
    )
    await step(PHASES, "done" if result.ok else f"failed: {result.error}")
    return summary


async def attempt(
    req: RolloutRequest,
    p: Plan,
    rollout_id: str,
    pool: EndpointPool,
    step: Callable[[int, str], Awaitable[None]] | None = None,
) -> tuple[RolloutResult, RolloutDocument | None]:
    """One checked rollout, within its time limit; every failure is a result (``ok=False``).
    Only cancellation propagates (after cleanup)."""
    start = time.perf_counter()
    result: RolloutResult
    document: RolloutDocument | None = None
    try:
        with anyio.move_on_after(req.limits.timeout_s or math.inf) as deadline:
            result, document = await execute(req, p, rollout_id, pool, step)
        if deadline.cancelled_caught:
            error = f"timeout: the rollout ran past {req.limits.timeout_s} s"
            return failed_result(req, p, rollout_id, error, start), None
    except EndpointNotUsable as exc:
        result = failed_result(req, p, rollout_id, f"endpoint not usable: {exc}", start)
    except Exception as exc:  # an internal failure is a result, never a protocol error
        log.exception("rollout %s of %s failed", rollout_id, req.task)
        result = failed_result(req, p, rollout_id, f"{type(exc).__name__}: {exc}", start)
    return result, document


async def _no_step(done: int, message: str) -> None:
    return None


async def execute(
    req: RolloutRequest,
    p: Plan,
    rollout_id: str,
    pool: EndpointPool,
    step: Callable[[int, str], Awaitable[None]] | None = None,
) -> tuple[RolloutResult, RolloutDocument | None]:
    """Run a checked rollout (raises on internal failures: :func:`attempt` turns them into
    results)."""
    step = step or _no_step
    endpoint = None
    if p.needs_llm:
        assert req.llm is not None
        await step(1, f"certifying {req.llm.url}")
        endpoint = await pool.endpoint(req.llm.url, model=req.llm.model, api_key=req.llm.api_key)
    await step(2, f"running {req.task}")
    if isinstance(p.ref, EnvRef):
        from rollwire.harnesses.envs.run import run_env_rollout
        from rollwire.sessions.toolloop import LoopLimits

        assert endpoint is not None
        max_turns = req.limits.max_turns or ENV_DEFAULT_MAX_TURNS
        if req.limits.max_model_calls is not None:  # one model call per turn
            max_turns = min(max_turns, req.limits.max_model_calls)
        temperature = req.sampling.temperature
        limits = LoopLimits(
            seed=p.sampling_seed,
            max_turns=max_turns,
            max_tokens=req.sampling.max_tokens or ENV_DEFAULT_MAX_TOKENS,
            temperature=ENV_DEFAULT_TEMPERATURE if temperature is None else temperature,
            top_logprobs=req.sampling.top_logprobs or 0,
        )
        env_out = await run_env_rollout(
            req.task,
            proxy=endpoint.proxy,
            config=req.task_config,
            seed=p.seed,
            limits=limits,
            reward_key=req.reward_key,
            episode_id=rollout_id,
            include_sequences=req.include_tokens,
            answer_mode=req.answer_mode or DEFAULT_ANSWER_MODE,
        )
        return env_out.result, env_out.document
    from rollwire.harnesses.harbor.rollout import run_harbor_rollout

    harbor_out = await run_harbor_rollout(
        p.task_entry,
        harness=p.harness,
        proxy=endpoint.proxy if endpoint is not None else None,
        proxy_url=await pool.served_url(endpoint) if endpoint is not None else None,
        reward_key=req.reward_key,
        agent_kwargs=_harbor_agent_kwargs(req, p.sampling_seed) if endpoint else None,
        agent_timeout_sec=req.limits.timeout_s,
        max_model_calls=req.limits.max_model_calls,
        rollout_id=rollout_id,
        include_sequences=req.include_tokens,
        sandbox=p.sandbox,
    )
    result = harbor_out.result.model_copy(update={"task": req.task, "seed": p.seed})
    return result, harbor_out.document


# --- the graph ---------------------------------------------------------------------------------


class GraphNode(BaseModel):
    """One model call."""

    node_id: str
    parent_id: str | None
    retokenized_from: str | None
    role: Role
    trainable: bool
    auxiliary: bool
    prompt_tokens: int | None
    completion_tokens: int | None
    finish_reason: str | None
    findings: list[Finding]


class GraphEdge(BaseModel):
    """``parent`` (the child's prompt extends the parent's prompt + reply) or ``retokenized``."""

    source: str
    target: str
    kind: Literal["parent", "retokenized"]


class RolloutGraphView(BaseModel):
    """The rollout's call graph."""

    rollout_id: str
    format: Literal["json", "mermaid"]
    nodes: list[GraphNode]
    edges: list[GraphEdge]
    roles: dict[str, int] = Field(description="node count per role")
    retokenized: list[str] = Field(description="nodes that started a new root by re-tokenising")
    discarded: list[str] = Field(description="nodes on abandoned branches")
    stats: RolloutStats | None = None
    findings: list[Finding] = Field(default_factory=list, description="rollout-level findings")
    mermaid: str | None = Field(default=None, description="a Mermaid flowchart (format='mermaid')")


def graph_view(
    rollout_id: str, document: RolloutDocument | None, fmt: Literal["json", "mermaid"] = "json"
) -> RolloutGraphView:
    """Nodes and edges of a document (empty for a rollout that made no model call)."""
    nodes: list[GraphNode] = []
    edges: list[GraphEdge] = []
    roles: dict[str, int] = {}
    for turn in document.turns if document is not None else []:
        nodes.append(
            GraphNode(
                node_id=turn.node_id,
                parent_id=turn.parent_id,
                retokenized_from=turn.retokenized_from,
                role=turn.role,
                trainable=turn.trainable,
                auxiliary=turn.auxiliary,
                prompt_tokens=None if turn.prompt_token_ids is None else len(turn.prompt_token_ids),
                completion_tokens=None
                if turn.completion_token_ids is None
                else len(turn.completion_token_ids),
                finish_reason=turn.finish_reason,
                findings=turn.findings,
            )
        )
        roles[turn.role.value] = roles.get(turn.role.value, 0) + 1
        if turn.parent_id is not None:
            edges.append(GraphEdge(source=turn.parent_id, target=turn.node_id, kind="parent"))
        if turn.retokenized_from is not None:
            edges.append(
                GraphEdge(source=turn.retokenized_from, target=turn.node_id, kind="retokenized")
            )
    view = RolloutGraphView(
        rollout_id=rollout_id,
        format=fmt,
        nodes=nodes,
        edges=edges,
        roles=roles,
        retokenized=[n.node_id for n in nodes if n.retokenized_from is not None],
        discarded=[n.node_id for n in nodes if n.role is Role.DISCARDED],
        stats=document.stats if document is not None else None,
        findings=[f for f in document.findings if f.node_id is None] if document else [],
    )
    if fmt == "mermaid":
        view.mermaid = to_mermaid(view)
    return view


def _label(text: str) -> str:
    return text.replace('"', "#quot;").replace("\n", " ")


def to_mermaid(view: RolloutGraphView) -> str:
    """A ``flowchart TD``: one box per call (role, tokens), solid parent edges, dotted
    re-tokenisation edges; discarded calls are dashed grey, trainable ones green."""
    ids = {n.node_id: f"n{i}" for i, n in enumerate(view.nodes)}
    lines = ["flowchart TD"]
    for node in view.nodes:
        tokens = f"{node.prompt_tokens or 0}+{node.completion_tokens or 0} tok"
        marks = "".join(f" {f.level.value}:{f.code}" for f in node.findings if f.level != "INFO")
        label = _label(f"{node.node_id} · {node.role.value} · {tokens}{marks}")
        lines.append(f'  {ids[node.node_id]}["{label}"]')
    for edge in view.edges:
        if edge.source not in ids:
            continue
        arrow = "-->" if edge.kind == "parent" else "-.->|retokenized|"
        lines.append(f"  {ids[edge.source]} {arrow} {ids[edge.target]}")
    lines.append("  classDef trainable fill:#d4f7d4,stroke:#2a2")
    lines.append("  classDef discarded fill:#eee,stroke:#999,stroke-dasharray:4 2")
    for node in view.nodes:
        if node.role is Role.DISCARDED:
            lines.append(f"  class {ids[node.node_id]} discarded")
        elif node.trainable:
            lines.append(f"  class {ids[node.node_id]} trainable")
    return "\n".join(lines) + "\n"
