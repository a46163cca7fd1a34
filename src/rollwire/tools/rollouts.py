"""Run one rollout for the MCP server, keep its document, and describe its graph.

A rollout's failure is a result (``ok=false`` with ``error``); only bad arguments raise
:class:`RolloutArgumentError`, whose message starts with the offending field's name.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field

from rollwire.capture.export import Role, RolloutDocument, RolloutStats
from rollwire.capture.findings import Finding, fatal
from rollwire.sessions.result import RolloutResult
from rollwire.tools.endpoint import EndpointNotUsable, EndpointPool
from rollwire.tools.tasks import EnvRef, HarborRef, TaskRefError, parse_task_ref

log = logging.getLogger("rollwire.mcp")

NO_LLM_HARNESSES = ("oracle", "nop")
ENV_DEFAULT_MAX_TURNS = 8
ENV_DEFAULT_MAX_TOKENS = 256
ENV_DEFAULT_TEMPERATURE = 1.0
PHASES = 4  # resolve, endpoint, run, store

Progress = Callable[[float, str], Awaitable[None]]


class RolloutArgumentError(ValueError):
    """An argument that cannot become a rollout; the message starts with the field name."""


class TokenSequence(BaseModel):
    """One trainable-data sequence (root-to-leaf path), position-aligned."""

    sequence_id: str
    role: Role
    trainable: bool
    input_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]


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
    ok: bool = Field(description="usable: no error, no FATAL finding, trainable data if train")
    error: str | None = None
    reward: float | None = Field(description="null when the verifier never ran (not 0.0)")
    rewards: dict[str, float] = Field(default_factory=dict)
    tier: str = Field(description="capture tier: 'tokens' (trainable) or 'text' (eval only)")
    rollout_type: str
    counts: RolloutCounts
    stop_reason: str | None = None
    seed: int | None = None
    findings: list[Finding] = Field(default_factory=list)
    timings: dict[str, float] = Field(default_factory=dict)
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
            TokenSequence(
                sequence_id=s.sequence_id,
                role=s.role,
                trainable=s.trainable,
                input_ids=s.input_ids,
                loss_mask=s.loss_mask,
                logprobs=s.logprobs,
            )
            for s in result.sequences or []
        ]
    return RolloutSummary(
        rollout_id=result.rollout_id,
        task=result.task,
        harness=result.harness,
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
        findings=result.findings,
        timings=result.timings,
        has_document=has_document,
        sequences=sequences,
    )


@dataclass
class RolloutRequest:
    """run_rollout's arguments."""

    task: str
    llm_url: str | None = None
    model: str | None = None
    api_key: str | None = None
    harness: str = "terminus-2"
    seed: int | None = None
    task_config: dict[str, Any] | None = None
    max_turns: int | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    reward_key: str | None = None
    include_tokens: bool = False


def _check(req: RolloutRequest) -> EnvRef | HarborRef:
    for name in ("max_turns", "max_tokens"):
        value = getattr(req, name)
        if value is not None and value < 1:
            raise RolloutArgumentError(f"{name}: must be >= 1, got {value}")
    if req.temperature is not None and req.temperature < 0:
        raise RolloutArgumentError(f"temperature: must be >= 0, got {req.temperature}")
    try:
        ref = parse_task_ref(req.task)
    except TaskRefError as exc:
        raise RolloutArgumentError(f"task: {exc}") from None
    if isinstance(ref, HarborRef):
        if req.task_config:
            raise RolloutArgumentError("task_config: applies to env tasks only, not Harbor tasks")
        if req.seed is not None:
            raise RolloutArgumentError("seed: Harbor tasks take no seed (the harness samples)")
        needs_llm = req.harness not in NO_LLM_HARNESSES
    else:
        needs_llm = True
    if needs_llm and not req.llm_url:
        what = "env tasks call" if isinstance(ref, EnvRef) else f"harness {req.harness!r} calls"
        raise RolloutArgumentError(f"llm_url: required: {what} a model")
    return ref


def _harbor_agent_kwargs(req: RolloutRequest) -> dict[str, Any]:
    """max_turns, max_tokens and temperature as terminus-2-style agent kwargs (as the CLI)."""
    kwargs: dict[str, Any] = {}
    if req.max_turns is not None:
        kwargs["max_turns"] = req.max_turns
    if req.temperature is not None:
        kwargs["temperature"] = req.temperature
    if req.max_tokens is not None:
        kwargs["llm_call_kwargs"] = {"max_tokens": req.max_tokens}
    return kwargs


def _failed(req: RolloutRequest, rollout_id: str, error: str, start: float) -> RolloutResult:
    return RolloutResult(
        ok=False,
        error=error,
        rollout_id=rollout_id,
        task=req.task,
        harness=req.harness,
        seed=req.seed,
        findings=[fatal("rollout_failed", error)],
        timings={"total_s": round(time.perf_counter() - start, 4)},
    )


async def run_rollout(
    req: RolloutRequest,
    *,
    pool: EndpointPool,
    store: RolloutStore,
    progress: Progress | None = None,
) -> RolloutSummary:
    """Run one rollout, store it, and summarise it. Raises only :class:`RolloutArgumentError`."""

    async def step(done: int, message: str) -> None:
        if progress is not None:
            await progress(done, message)

    start = time.perf_counter()
    rollout_id = uuid.uuid4().hex
    ref = _check(req)
    await step(0, f"resolving {req.task}")
    task_entry = None
    if isinstance(ref, HarborRef):
        from rollwire.harnesses.harbor.datasets import DatasetError, resolve_dataset

        try:
            task_entry = resolve_dataset(ref.dataset).task(ref.name)
        except DatasetError as exc:
            raise RolloutArgumentError(f"task: {exc}") from None
    result: RolloutResult
    document: RolloutDocument | None = None
    endpoint = None
    try:
        if req.llm_url and (isinstance(ref, EnvRef) or req.harness not in NO_LLM_HARNESSES):
            await step(1, f"certifying {req.llm_url}")
            endpoint = await pool.endpoint(req.llm_url, model=req.model, api_key=req.api_key)
        await step(2, f"running {req.task}")
        if isinstance(ref, EnvRef):
            from rollwire.harnesses.envs.run import run_env_rollout
            from rollwire.sessions.toolloop import LoopLimits

            assert endpoint is not None
            limits = LoopLimits(
                seed=req.seed,
                max_turns=req.max_turns or ENV_DEFAULT_MAX_TURNS,
                max_tokens=req.max_tokens or ENV_DEFAULT_MAX_TOKENS,
                temperature=ENV_DEFAULT_TEMPERATURE if req.temperature is None else req.temperature,
            )
            env_out = await run_env_rollout(
                req.task,
                proxy=endpoint.proxy,
                config=req.task_config,
                seed=req.seed,
                limits=limits,
                reward_key=req.reward_key,
                episode_id=rollout_id,
                include_sequences=req.include_tokens,
            )
            result, document = env_out.result, env_out.document
        else:
            from rollwire.harnesses.harbor.rollout import run_harbor_rollout

            assert task_entry is not None
            harbor_out = await run_harbor_rollout(
                task_entry,
                harness=req.harness,
                proxy=endpoint.proxy if endpoint is not None else None,
                reward_key=req.reward_key,
                agent_kwargs=_harbor_agent_kwargs(req) if endpoint is not None else None,
                rollout_id=rollout_id,
                include_sequences=req.include_tokens,
            )
            result, document = harbor_out.result, harbor_out.document
            result = result.model_copy(update={"task": req.task})
    except EndpointNotUsable as exc:
        result = _failed(req, rollout_id, f"endpoint not usable: {exc}", start)
    except Exception as exc:  # an internal failure is a result, never a protocol error
        log.exception("rollout %s of %s failed", rollout_id, req.task)
        result = _failed(req, rollout_id, f"{type(exc).__name__}: {exc}", start)
    await step(3, "storing the rollout document")
    store.put(StoredRollout(result=result, document=document))
    summary = summary_of(
        result, include_tokens=req.include_tokens, has_document=document is not None
    )
    await step(PHASES, "done" if result.ok else f"failed: {result.error}")
    return summary


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
