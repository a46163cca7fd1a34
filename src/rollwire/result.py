"""One rollout's outcome: the environment's verdict, and the result every boundary returns.

``EnvVerdict`` is what an environment or a verifier judged (forwarded, never synthesised);
``RolloutResult`` is what a trainer, an eval script, an agent or the episode store gets back
from one rollout: a value, never an exception. ``summarise`` builds it from the rollout
document and the verdict (pure); a reward the verifier never gave is None, never 0.0.

Shared by the layers that run rollouts (``sessions``, ``harnesses``, ``tools``, ``collect``) and
the one that stores them (``datasets``), so it sits below all of them. May import only
``capture`` (the rollout document, findings, rollout types) and the base modules.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, Field

from rollwire.capture.export import RolloutDocument, TrainingSequence, TurnRecord
from rollwire.capture.findings import Finding, Level
from rollwire.capture.rollout import CaptureLevel, RolloutType


class EnvVerdict(BaseModel):
    """The environment's own judgement of an episode: forwarded, never synthesised.

    ``reward`` is None when the environment never reached a verdict (distinct from 0.0, a wrong
    answer). ``rewards`` holds every named reward verbatim.
    """

    reward: float | None
    rewards: dict[str, float] = Field(default_factory=dict)
    metrics: dict[str, Any] = Field(default_factory=dict)
    reason: str | None = None


class RolloutResult(BaseModel):
    """What a trainer, an eval script or an agent gets back from one rollout.

    ``ok`` means usable: no error, no FATAL finding, and for train at least one trainable
    sequence. ``reward`` is None when the verifier never ran, which is not 0.0 (a wrong answer).
    """

    ok: bool
    error: str | None = None
    rollout_id: str
    task: str
    harness: str
    sandbox: str | None = None
    reward: float | None = None
    rewards: dict[str, float] = Field(default_factory=dict)
    reward_key: str | None = None
    rollout_type: RolloutType = RolloutType.EVAL
    capture_level: CaptureLevel = CaptureLevel.TEXT
    param_fixes: list[str] = Field(default_factory=list)
    findings: list[Finding] = Field(default_factory=list)
    n_turns: int = 0
    n_roots: int = 0
    n_trainable_sequences: int = 0
    n_trainable_tokens: int = 0
    n_tool_calls: int = 0
    stop_reason: str | None = None
    seed: int | None = None
    # Env tasks: how the answer reached the environment (tool, text or either).
    answer_mode: str | None = None
    sequences: list[TrainingSequence] | None = None
    turns: list[TurnRecord] | None = None
    # Env tasks, with the sequences: the conversation as the agent held it (OpenAI chat format,
    # tool calls and tool results included) and the tools it was offered (None: none, or written
    # into the messages by the text tool format).
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    atif: Literal["match", "MISMATCH", "none"] = "none"
    timings: dict[str, float] = Field(default_factory=dict)
    # The weight versions that sampled the agent's calls, in order (unknown ones left out).
    weight_versions: list[str] = Field(default_factory=list)
    # Where the harness left its own records (Harbor trials), and what went wrong, by type.
    exception_type: str | None = None
    trial_dir: str | None = None
    agent_log_tail: str | None = None


def coerce_reward(value: Any) -> tuple[float | None, str | None]:
    """A verifier's value as a finite float, or None; the second item says what was wrong.

    Verifiers are task code: None means no verdict; "N/A", nested dicts, inf and nan are errors
    (inf reads as solved and nan poisons every batch average).
    """
    if value is None:
        return None, None
    if isinstance(value, bool):
        return float(value), None
    if isinstance(value, int | float):
        if not math.isfinite(value):
            return None, f"reward {value!r} is not finite"
        return float(value), None
    if isinstance(value, str):
        try:
            return coerce_reward(float(value))
        except ValueError:
            return None, f"reward {value!r} is not a number"
    return None, f"reward of type {type(value).__name__} is not a number"


def pick_reward(verdict: EnvVerdict, reward_key: str | None) -> tuple[float | None, str | None]:
    """The rollout's reward from a verdict: the named key, or the single reward; never an average."""
    if reward_key is not None:
        if reward_key not in verdict.rewards:
            return (
                None,
                f"reward_key {reward_key!r} is not among the rewards {sorted(verdict.rewards)}",
            )
        return coerce_reward(verdict.rewards[reward_key])
    if verdict.reward is not None:
        return coerce_reward(verdict.reward)
    if len(verdict.rewards) > 1:
        return (
            None,
            f"several rewards {sorted(verdict.rewards)} and no reward_key: name one, they are never averaged",
        )
    if len(verdict.rewards) == 1:
        return coerce_reward(next(iter(verdict.rewards.values())))
    return None, None


def summarise(
    *,
    rollout_id: str,
    task: str,
    harness: str,
    document: RolloutDocument | None,
    verdict: EnvVerdict | None,
    reward_key: str | None = None,
    error: str | None = None,
    extra_findings: list[Finding] | None = None,
    include_sequences: bool = False,
    **fields: Any,
) -> RolloutResult:
    """Build the result from a rollout document and a verdict (pure)."""
    findings = list(extra_findings or [])
    result = RolloutResult(
        ok=False, rollout_id=rollout_id, task=task, harness=harness, error=error, **fields
    )
    if verdict is not None:
        reward, problem = pick_reward(verdict, reward_key)
        result.reward, result.reward_key = reward, reward_key
        result.rewards = {
            k: v
            for k, v in verdict.rewards.items()
            if isinstance(v, int | float) and math.isfinite(v)
        }
        if problem is not None:
            result.error = result.error or problem
    if document is not None:
        findings = [*document.findings, *findings]
        result.rollout_type = document.rollout_type
        result.capture_level = document.capture_level
        result.n_turns = document.stats.turns
        result.n_roots = document.stats.roots
        result.n_trainable_sequences = document.stats.trainable_sequences
        result.n_trainable_tokens = document.stats.trainable_tokens
        result.weight_versions = list(document.stats.weight_versions)
        if include_sequences:
            result.sequences = document.sequences
            result.turns = document.turns
    result.findings = findings
    fatal = any(f.level is Level.FATAL for f in findings)
    trainable = result.rollout_type is RolloutType.EVAL or result.n_trainable_sequences > 0
    result.ok = result.error is None and document is not None and not fatal and trainable
    return result
