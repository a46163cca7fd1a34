"""Graph -> training data: one sequence per root-to-leaf path, plus per-turn records.

A sequence's ``input_ids`` are the leaf's prompt plus its sampled ids, exactly as the engine saw
and produced them. ``loss_mask`` is 1 only on sampled tokens whose logprobs passed every check,
on non-auxiliary turns of an agent path; everything else (prompt, tool output, template glue,
masked turns) is 0, and so is its logprob.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from enum import StrEnum
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from rollwire.capture.findings import Finding, Level, fatal, info, warn
from rollwire.capture.graph import Node, PrefixGraph, tie_key
from rollwire.capture.rollout import CaptureLevel, RolloutGraph, RolloutType, Turn, rollout_type_for

DOCUMENT_VERSION = "rollwire.rollout/1"


class Role(StrEnum):
    """What a path (or a turn) is for."""

    AGENT = "agent"
    AUXILIARY = "auxiliary"
    DISCARDED = "discarded"


class TurnSpan(BaseModel):
    """Where one turn's sampled tokens sit in a sequence: ``input_ids[start:end]``, and the
    weight version that sampled them (None: unknown)."""

    node_id: str
    start: int
    end: int
    trainable: bool
    weight_version: str | None = None


class TrainingSequence(BaseModel):
    """One root-to-leaf path, aligned position by position."""

    sequence_id: str
    node_ids: list[str]
    role: Role
    trainable: bool
    input_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    turn_spans: list[TurnSpan]
    n_trainable_tokens: int
    findings: list[Finding] = Field(default_factory=list)
    messages: list[dict[str, Any]] | None = None  # text tier: the conversation of this path


class TurnRecord(BaseModel):
    """One model call with its full prompt ids; ``logprobs`` is None when they are not usable."""

    node_id: str
    parent_id: str | None
    retokenized_from: str | None
    role: Role
    trainable: bool
    auxiliary: bool
    prompt_token_ids: list[int] | None
    completion_token_ids: list[int] | None
    logprobs: list[float] | None
    finish_reason: str | None
    dialect: str
    model: str | None
    requested_params: dict[str, Any]
    applied_params: dict[str, Any]
    findings: list[Finding]
    reply: dict[str, Any] | None
    usage: dict[str, Any] | None
    created_at: float
    messages: list[dict[str, Any]] | None = None
    # Completion positions forced by constrained decoding (logprob 0.0): masked in sequences.
    constrained_positions: list[int] = Field(default_factory=list)
    # Token-in continuation (see rollwire.capture.splice): how the prompt was built.
    token_in_mode: str = "rendered"
    token_in_path: str | None = None
    parent_call_id: str | None = None
    carried_len: int | None = None
    synthesized_positions: list[int] = Field(default_factory=list)
    drift: int | None = None
    # Per completion position, the engine's top candidates as [id, logprob] pairs, when the
    # agent asked for them (top_logprobs): for inspection only.
    top_logprobs: list[list[tuple[int, float]]] | None = None
    # The engine's weight version that sampled this call (None: unknown, or it changed during
    # the call, and then the turn is masked).
    weight_version: str | None = None


class RolloutStats(BaseModel):
    """Shape and yield of a rollout."""

    turns: int
    roots: int
    leaves: int
    forks: int
    discarded: int
    retokenized: int
    unlinked: int
    sequences: int
    trainable_sequences: int
    trainable_tokens: int
    # Calls per token-in mode: rendered, spliced, fallback:<reason>.
    token_in: dict[str, int] = Field(default_factory=dict)
    # The weight versions that sampled this rollout's agent calls, in the order first seen
    # (unknown ones left out); more than one gets a weight_versions_mixed finding.
    weight_versions: list[str] = Field(default_factory=list)


class RolloutDocument(BaseModel):
    """The versioned export of one captured rollout."""

    version: str = DOCUMENT_VERSION
    capture_level: CaptureLevel
    rollout_type: RolloutType
    stats: RolloutStats
    findings: list[Finding]
    turns: list[TurnRecord]
    sequences: list[TrainingSequence]
    metadata: dict[str, Any] = Field(default_factory=dict)


def _turn(node: Node) -> Turn:
    payload = node.payload
    assert isinstance(payload, Turn)
    return payload


def _usable(turn: Turn, level: CaptureLevel) -> bool:
    """May this turn's sampled tokens be loss targets (before path roles are considered)?"""
    return (
        level is CaptureLevel.TOKENS
        and turn.logprobs_ok
        and not turn.auxiliary
        and not turn.has_fatal
    )


def _same_prompt(a: Node, b: Node) -> bool:
    return a.prompt_key == b.prompt_key and np.array_equal(a.prompt, b.prompt)


def discarded_leaves(graph: PrefixGraph) -> dict[str, str]:
    """Leaves abandoned by the agent, with the reason.

    A childless sibling of a branch that went on is discarded; so is an earlier attempt at the
    same prompt when no attempt went on (the later retry is the one the agent kept). Roots are
    siblings when they share their exact prompt: a retried first call.
    """
    groups: list[list[Node]] = []
    roots = graph.roots()
    by_prompt: dict[int, list[Node]] = {}
    for root in roots:
        by_prompt.setdefault(root.prompt_key, []).append(root)
    for members in by_prompt.values():
        # Keys can collide; split on exact equality.
        while members:
            head, rest = members[0], members[1:]
            same = [head, *[m for m in rest if _same_prompt(head, m)]]
            groups.append(same)
            members = [m for m in rest if not _same_prompt(head, m)]
    for node in graph:
        kids = graph.children(node)
        if len(kids) > 1:
            groups.append(kids)
    out: dict[str, str] = {}
    for group in groups:
        went_on = [m for m in group if graph.children(m)]
        for leaf in group:
            if graph.children(leaf):
                continue
            if went_on:
                out[leaf.node_id] = f"a sibling ({went_on[0].node_id}) went on; this branch did not"
                continue
            later = [
                m
                for m in group
                if m is not leaf
                and _same_prompt(m, leaf)
                and tie_key(m.node_id) > tie_key(leaf.node_id)
            ]
            if later:
                out[leaf.node_id] = f"retried as {later[-1].node_id} with the same prompt"
    return out


def _path(leaf: Node) -> list[Node]:
    path: list[Node] = []
    node: Node | None = leaf
    while node is not None:
        path.append(node)
        node = node.parent
    path.reverse()
    return path


def check_sequence(seq: TrainingSequence) -> list[Finding]:
    """Structural checks a trainer relies on; any failure makes the sequence FATAL."""
    out: list[Finding] = []
    n = len(seq.input_ids)
    if not (len(seq.loss_mask) == n == len(seq.logprobs)):
        msg = f"lengths disagree: ids {n}, mask {len(seq.loss_mask)}, logprobs {len(seq.logprobs)}"
        out.append(fatal("sequence_length_mismatch", msg, seq.sequence_id))
        return out
    lp = np.asarray(seq.logprobs, dtype=np.float64)
    mask = np.asarray(seq.loss_mask, dtype=np.int8)
    if n and (not np.all(np.isfinite(lp)) or np.any(lp > 0)):
        out.append(
            fatal("sequence_logprob_invalid", "a logprob is not finite or > 0", seq.sequence_id)
        )
    if n and np.any(lp[mask == 0] != 0.0):
        out.append(
            fatal("masked_logprob_nonzero", "a masked position has a logprob", seq.sequence_id)
        )
    return out


def _sequence(
    leaf: Node, role: Role, level: CaptureLevel, usable: dict[str, bool]
) -> TrainingSequence:
    path = _path(leaf)
    ids = leaf.sequence()
    n = len(ids)
    mask = np.zeros(n, dtype=np.int8)
    lps = np.zeros(n, dtype=np.float64)
    spans: list[TurnSpan] = []
    findings: list[Finding] = []
    for node in path:
        turn = _turn(node)
        start, end = len(node.prompt), node.seq_len
        ok = role is Role.AGENT and usable[node.node_id]
        if ok:
            mask[start:end] = 1
            lps[start:end] = turn.sampled_logprobs
            if turn.certain is not None:
                mask[start:end][turn.certain] = 0
        spans.append(
            TurnSpan(
                node_id=node.node_id,
                start=start,
                end=end,
                trainable=ok,
                weight_version=turn.weight_version,
            )
        )
        findings.extend(f for f in turn.findings if f.level is not Level.INFO)
    n_train = int(mask.sum())
    has_fatal = any(f.level is Level.FATAL for f in findings)
    tokens = level is CaptureLevel.TOKENS
    seq = TrainingSequence(
        sequence_id=leaf.node_id,
        node_ids=[p.node_id for p in path],
        role=role,
        trainable=tokens and role is Role.AGENT and n_train > 0 and not has_fatal,
        input_ids=ids.tolist() if tokens else [],
        loss_mask=mask.tolist() if tokens else [],
        logprobs=lps.tolist() if tokens else [],
        turn_spans=spans if tokens else [],
        n_trainable_tokens=n_train if tokens else 0,
        findings=findings,
    )
    if not tokens:
        last = _turn(leaf)
        seq.messages = [*(last.messages or []), *([last.reply] if last.reply else [])]
    checks = check_sequence(seq)
    if checks:
        seq.findings.extend(checks)
        seq.trainable = False
    return seq


def export_rollout(
    rollout: RolloutGraph,
    *,
    extra_findings: Iterable[Finding] = (),
    metadata: dict[str, Any] | None = None,
) -> RolloutDocument:
    """The rollout document: turns (full prompt ids each), sequences, stats and findings."""
    graph, turns, unlinked = rollout.snapshot()
    level = rollout.capture_level
    usable = {t.node_id: _usable(t, level) for t in turns}
    carried = _check_carried(turns)
    for node_id in carried:
        usable[node_id] = False
    discarded = discarded_leaves(graph)
    leaves = [n for n in graph if not graph.children(n)]
    leaves.sort(key=lambda n: tie_key(n.node_id))

    roles: dict[str, Role] = {}
    sequences: list[TrainingSequence] = []
    node_role: dict[str, Role] = {}
    for leaf in leaves:
        path = _path(leaf)
        if leaf.node_id in discarded:
            role = Role.DISCARDED
        elif all(_turn(p).auxiliary for p in path):
            role = Role.AUXILIARY
        else:
            role = Role.AGENT
        roles[leaf.node_id] = role
        for p in path:
            prev = node_role.get(p.node_id)
            mine = Role.AUXILIARY if _turn(p).auxiliary else role
            if (
                prev is None
                or prev is Role.DISCARDED
                or (prev is Role.AUXILIARY and mine is Role.AGENT)
            ):
                node_role[p.node_id] = mine
        sequences.append(_sequence(leaf, role, level, usable))

    findings: list[Finding] = list(extra_findings)
    n_retok = 0
    for node in graph:
        if node.anchor is not None:
            n_retok += 1
            msg = (
                f"turn {node.node_id}'s prompt starts with turn {node.anchor.node_id}'s prompt but "
                "not with its sampled ids (the engine re-tokenised that reply, or the agent edited "
                "it): it starts a new training sequence"
            )
            findings.append(warn("retokenized", msg, node.node_id))
    for node_id, reason in discarded.items():
        findings.append(info("discarded", f"turn {node_id} discarded: {reason}", node_id))
    for turn in turns:
        findings.extend(turn.findings)
    findings.extend(carried.values())
    versions = weight_versions(turns)
    if len(versions) > 1:
        findings.append(
            warn(
                "weight_versions_mixed",
                f"this rollout's calls were sampled by {len(versions)} weight versions "
                f"{versions} (the engine's weights changed during it): each turn keeps its own "
                "version and logprobs; a trainer that assumes one policy per rollout must not",
            )
        )
    roots = len(graph.roots()) + len(unlinked)
    if not turns:
        findings.append(fatal("no_model_calls", "the rollout captured zero model calls"))
    n_trainable = sum(1 for s in sequences if s.trainable)
    if turns and level is CaptureLevel.TOKENS and n_trainable == 0:
        msg = "no trainable sequence: every path is masked, discarded or auxiliary"
        findings.append(fatal("nothing_trainable", msg))
    if level is CaptureLevel.TEXT and turns:
        findings.append(
            info("eval_only", "captured at the text tier: no engine ids, eval data only")
        )

    records = [_record(turn, graph, node_role, usable, level) for turn in turns]
    stats = RolloutStats(
        turns=len(turns),
        roots=roots,
        leaves=len(leaves) + len(unlinked),
        forks=sum(1 for n in graph if len(graph.children(n)) > 1),
        discarded=len(discarded),
        retokenized=n_retok,
        unlinked=len(unlinked),
        sequences=len(sequences),
        trainable_sequences=n_trainable,
        trainable_tokens=sum(s.n_trainable_tokens for s in sequences if s.trainable),
        token_in=dict(Counter(t.token_in_mode for t in turns)),
        weight_versions=versions,
    )
    return RolloutDocument(
        capture_level=level,
        rollout_type=rollout_type_for(level),
        stats=stats,
        findings=findings,
        turns=records,
        sequences=sequences,
        metadata=dict(metadata or {}),
    )


def weight_versions(turns: Iterable[Turn]) -> list[str]:
    """The known weight versions of the agent (not auxiliary) calls, in the order first seen."""
    out: list[str] = []
    for turn in turns:
        if not turn.auxiliary and turn.weight_version is not None:
            if turn.weight_version not in out:
                out.append(turn.weight_version)
    return out


def _check_carried(turns: list[Turn]) -> dict[str, Finding]:
    """The spliced turns whose prompt does not start with their parent's prompt + sampled ids
    (the token-in invariant): each is masked, with a FATAL finding."""
    by_id = {t.node_id: t for t in turns}
    broken: dict[str, Finding] = {}
    for turn in turns:
        if turn.token_in_mode != "spliced" or turn.parent_call_id is None:
            continue
        parent = by_id.get(turn.parent_call_id)
        ok = (
            parent is not None
            and turn.prompt_ids is not None
            and parent.prompt_ids is not None
            and parent.sampled_ids is not None
        )
        if ok:
            assert parent is not None and turn.prompt_ids is not None
            carried = np.concatenate([parent.prompt_ids, parent.sampled_ids])  # type: ignore[list-item]
            n = len(carried)
            ok = (
                turn.carried_len is not None
                and turn.carried_len >= n
                and len(turn.prompt_ids) >= n
                and bool(np.array_equal(turn.prompt_ids[:n], carried))
            )
        if not ok:
            broken[turn.node_id] = fatal(
                "carried_len_violated",
                f"turn {turn.node_id} was spliced onto {turn.parent_call_id} but its prompt does "
                "not start with that call's prompt + sampled ids: masked",
                turn.node_id,
            )
    return broken


def _record(
    turn: Turn,
    graph: PrefixGraph,
    node_role: dict[str, Role],
    usable: dict[str, bool],
    level: CaptureLevel,
) -> TurnRecord:
    linked = turn.node_id in graph
    node = graph.get(turn.node_id) if linked else None
    parent = node.parent if node is not None else None
    anchor = node.anchor if node is not None else None
    role = node_role.get(turn.node_id, Role.AGENT)
    if turn.auxiliary:
        role = Role.AUXILIARY
    trainable = linked and role is Role.AGENT and usable[turn.node_id]
    return TurnRecord(
        node_id=turn.node_id,
        parent_id=parent.node_id if parent is not None else None,
        retokenized_from=anchor.node_id if anchor is not None else None,
        role=role,
        trainable=trainable,
        auxiliary=turn.auxiliary,
        prompt_token_ids=turn.prompt_ids.tolist() if turn.prompt_ids is not None else None,
        completion_token_ids=turn.sampled_ids.tolist() if turn.sampled_ids is not None else None,
        logprobs=(
            turn.sampled_logprobs.tolist()
            if level is CaptureLevel.TOKENS
            and turn.logprobs_ok
            and turn.sampled_logprobs is not None
            else None
        ),
        finish_reason=turn.finish_reason,
        dialect=turn.dialect,
        model=turn.model,
        requested_params=turn.requested_params,
        applied_params=turn.applied_params,
        findings=turn.findings,
        reply=turn.reply,
        usage=turn.usage,
        created_at=turn.created_at,
        messages=turn.messages if level is CaptureLevel.TEXT else None,
        top_logprobs=(
            turn.top_logprobs.rows()
            if level is CaptureLevel.TOKENS and turn.top_logprobs is not None
            else None
        ),
        constrained_positions=np.flatnonzero(turn.certain).tolist()
        if turn.certain is not None
        else [],
        token_in_mode=turn.token_in_mode,
        token_in_path=turn.token_in_path,
        parent_call_id=turn.parent_call_id,
        carried_len=turn.carried_len,
        synthesized_positions=list(turn.synthesized),
        drift=turn.drift,
        weight_version=turn.weight_version,
    )
