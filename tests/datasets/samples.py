"""Rollout results and episode records to store, export and publish (test data)."""

from __future__ import annotations

from typing import Any

from rollwire.capture.export import Role, TrainingSequence, TurnSpan
from rollwire.capture.findings import warn
from rollwire.capture.rollout import CaptureLevel, RolloutType
from rollwire.datasets.records import EpisodeRecord, group_id, group_index
from rollwire.result import RolloutResult


def make_result(
    *, task: str = "chain_sum", reward: float | None = 1.0, n_prompt: int = 4, n_sampled: int = 3
) -> RolloutResult:
    """A train rollout with one trainable agent sequence (sampled by weights ``step-3``) and
    one discarded retry."""
    ids = list(range(100, 100 + n_prompt + n_sampled))
    mask = [0] * n_prompt + [1] * n_sampled
    lps = [0.0] * n_prompt + [-0.25 * (k + 1) for k in range(n_sampled)]
    agent = TrainingSequence(
        sequence_id="n2",
        node_ids=["n2"],
        role=Role.AGENT,
        trainable=True,
        input_ids=ids,
        loss_mask=mask,
        logprobs=lps,
        turn_spans=[
            TurnSpan(
                node_id="n2",
                start=n_prompt,
                end=n_prompt + n_sampled,
                trainable=True,
                weight_version="step-3",
            )
        ],
        n_trainable_tokens=n_sampled,
    )
    retry = agent.model_copy(
        update={"sequence_id": "n1", "node_ids": ["n1"], "role": Role.DISCARDED, "trainable": False}
    )
    return RolloutResult(
        ok=True,
        rollout_id="r1",
        task=task,
        harness="toolloop",
        reward=reward,
        rewards={"correct": reward} if reward is not None else {},
        rollout_type=RolloutType.TRAIN,
        capture_level=CaptureLevel.TOKENS,
        findings=[warn("sampling_forced", "top_p forced to 1.0")],
        n_turns=2,
        n_trainable_tokens=n_sampled,
        stop_reason="done",
        sequences=[retry, agent],
        timings={"total_s": 1.5},
        weight_versions=["step-3"],
    )


def make_record(
    sample_index: int = 0,
    *,
    task: str = "chain_sum",
    seed: int | None = 7,
    reward: float | None = 1.0,
    group_size: int = 4,
    messages: list[dict[str, Any]] | None = None,
    **fields: Any,
) -> EpisodeRecord:
    record = EpisodeRecord.from_result(
        make_result(task=task, reward=reward, n_sampled=2 + sample_index % 3),
        task=task,
        sample_index=sample_index,
        seed=seed,
        group_id=group_id(task, group_index(sample_index, group_size), seed),
        model="smollm2-135m",
        messages=messages,
    )
    return record.model_copy(update=fields) if fields else record
