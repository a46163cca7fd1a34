"""The lines of a collection: one ``EpisodeRecord`` per kept episode, one ``FailureRecord`` per
failed attempt, one ``FilteredRecord`` per episode the collector chose not to keep.

Identities are deterministic so a resumed collection recognises the episodes it already holds:
``episode_id`` hashes ``(task, sample_index, seed)`` and ``group_id`` hashes
``(task, group_index, seed)``. Both are the first 24 hex digits (96 bits) of the SHA-256 of a
canonical JSON array (no spaces, non-ASCII kept as UTF-8) whose first item names the kind, so an
episode id never equals a group id.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field

from rollwire.capture.export import Role, TrainingSequence
from rollwire.capture.findings import Finding
from rollwire.capture.rollout import CaptureLevel, RolloutType
from rollwire.result import RolloutResult

SCHEMA = "rollwire.episode/1"
FAILURE_SCHEMA = "rollwire.failure/1"
FILTERED_SCHEMA = "rollwire.filtered/1"

ID_HEX_DIGITS = 24


def canonical_json(value: Any) -> str:
    """One spelling per value: sorted keys, no spaces, UTF-8 kept, NaN refused.

    Values JSON does not know (paths, enums, dates) are written with ``str``.
    """
    return json.dumps(
        value,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
        default=str,
    )


def _digest(*parts: Any) -> str:
    data = canonical_json(list(parts)).encode()
    return hashlib.sha256(data).hexdigest()[:ID_HEX_DIGITS]


def episode_id(task: str, sample_index: int, seed: int | None) -> str:
    """The episode's id: ``sha256(canonical_json(["episode", task, sample_index, seed]))[:24]``.

    The same triple always gives the same id, in any process, so a resume can skip what is done.
    """
    return _digest("episode", task, sample_index, seed)


def group_id(task: str, group_index: int, seed: int | None) -> str:
    """The id shared by the samples of one task instance drawn as one group (a GRPO group).

    ``sha256(canonical_json(["group", task, group_index, seed]))[:24]``. With a group size of G,
    sample ``i`` of a task instance belongs to group ``i // G`` (see ``group_index``).
    """
    return _digest("group", task, group_index, seed)


def group_index(sample_index: int, group_size: int) -> int:
    """Which group sample ``sample_index`` belongs to when groups hold ``group_size`` samples."""
    if group_size < 1:
        raise ValueError(f"group_size must be at least 1, got {group_size}")
    return sample_index // group_size


def utc_now() -> str:
    """The current time as ISO 8601 UTC with milliseconds, e.g. ``2026-01-02T03:04:05.678Z``."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@cache
def rollwire_version() -> str:
    """The installed rollwire version (``0+unknown`` when run from an uninstalled tree)."""
    try:
        return version("rollwire")
    except PackageNotFoundError:
        return "0+unknown"


class SequenceRow(BaseModel):
    """One training sequence as a trainer reads it: aligned ids, mask and logprobs, and the
    weight version that sampled each of its turns (in order; None: unknown)."""

    sequence_id: str
    role: Role
    trainable: bool
    input_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    weight_versions: list[str | None] = Field(default_factory=list)

    @classmethod
    def from_sequence(cls, seq: TrainingSequence, **extra: Any) -> Self:
        """The row of a captured sequence; ``extra``: the fields a subclass adds."""
        return cls(
            sequence_id=seq.sequence_id,
            role=seq.role,
            trainable=seq.trainable,
            input_ids=seq.input_ids,
            loss_mask=seq.loss_mask,
            logprobs=seq.logprobs,
            weight_versions=[span.weight_version for span in seq.turn_spans],
            **extra,
        )


class EpisodeRecord(BaseModel):
    """One line of ``episodes.jsonl``: everything a trainer needs from one kept episode.

    ``reward`` is None when the verifier never ran (not 0.0); ``rewards`` is the verifier's dict
    verbatim and ``reward_key`` names the key ``reward`` came from, if any.
    """

    model_config = ConfigDict(extra="forbid")

    schema_: str = Field(default=SCHEMA, alias="schema")
    episode_id: str
    group_id: str
    task: str
    sample_index: int
    seed: int | None
    reward: float | None
    rewards: dict[str, float] = Field(default_factory=dict)
    reward_key: str | None = None
    ok: bool
    rollout_type: RolloutType
    capture_level: CaptureLevel
    model: str
    engine: str | None = Field(default=None, description="the engine URL that served it")
    node: str | None = Field(default=None, description="the Ray node that ran it")
    harness: str
    sandbox: str | None = None
    findings: list[Finding] = Field(default_factory=list)
    sequences: list[SequenceRow] = Field(default_factory=list)
    # The conversation as the agent held it (OpenAI chat format, tool calls and results
    # included) and the tools offered; None where the harness does not record them.
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    n_turns: int = 0
    n_trainable_tokens: int = 0
    stop_reason: str | None = None
    timings: dict[str, float] = Field(default_factory=dict)
    # The weight versions that sampled the episode's agent calls, in order (unknown left out).
    weight_versions: list[str] = Field(default_factory=list)
    created_at: str = Field(default_factory=utc_now)
    rollwire_version: str = Field(default_factory=rollwire_version)

    @classmethod
    def from_result(
        cls,
        result: RolloutResult,
        *,
        task: str,
        sample_index: int,
        seed: int | None,
        group_id: str,
        model: str,
        messages: list[dict[str, Any]] | None = None,
        tools: list[dict[str, Any]] | None = None,
        engine: str | None = None,
        node: str | None = None,
    ) -> EpisodeRecord:
        """The record of a rollout's result. The id is derived from ``(task, sample_index, seed)``.

        A train rollout must have been run with its sequences included (``RolloutResult.sequences``
        not None); without them the record would hold no training data, so that is a ValueError.
        """
        if result.sequences is None and result.rollout_type is RolloutType.TRAIN:
            raise ValueError(
                f"rollout {result.rollout_id} of task {task!r} has no sequences: run it with its "
                "sequences included to record a train episode"
            )
        return cls(
            episode_id=episode_id(task, sample_index, seed),
            group_id=group_id,
            task=task,
            sample_index=sample_index,
            seed=seed,
            reward=result.reward,
            rewards=dict(result.rewards),
            reward_key=result.reward_key,
            ok=result.ok,
            rollout_type=result.rollout_type,
            capture_level=result.capture_level,
            model=model,
            engine=engine,
            node=node,
            harness=result.harness,
            sandbox=result.sandbox,
            findings=list(result.findings),
            sequences=[SequenceRow.from_sequence(s) for s in result.sequences or []],
            messages=messages,
            tools=tools,
            n_turns=result.n_turns,
            n_trainable_tokens=result.n_trainable_tokens,
            stop_reason=result.stop_reason,
            timings=dict(result.timings),
            weight_versions=list(result.weight_versions),
        )

    def to_line(self) -> bytes:
        """The record as one JSONL line, newline included."""
        return self.model_dump_json(by_alias=True).encode() + b"\n"


class FailureRecord(BaseModel):
    """One line of ``failures.jsonl``: an attempt that produced no episode, and why.

    The same episode may fail more than once (each attempt is a line); a later success on resume
    writes its episode and the failure stays as history.
    """

    model_config = ConfigDict(extra="forbid")

    schema_: str = Field(default=FAILURE_SCHEMA, alias="schema")
    episode_id: str
    task: str
    sample_index: int
    seed: int | None
    error: str
    exception_type: str | None = None
    findings: list[Finding] = Field(default_factory=list)
    engine: str | None = Field(default=None, description="the engine URL it was pinned to")
    node: str | None = Field(default=None, description="the Ray node that ran it")
    created_at: str = Field(default_factory=utc_now)

    @classmethod
    def from_result(
        cls,
        result: RolloutResult,
        *,
        task: str,
        sample_index: int,
        seed: int | None,
        engine: str | None = None,
        node: str | None = None,
    ) -> FailureRecord:
        """The failure of a rollout that came back not ok."""
        return cls(
            episode_id=episode_id(task, sample_index, seed),
            task=task,
            sample_index=sample_index,
            seed=seed,
            error=result.error or "the rollout is not usable (see findings)",
            exception_type=result.exception_type,
            findings=list(result.findings),
            engine=engine,
            node=node,
        )

    @classmethod
    def from_exception(
        cls, exc: BaseException, *, task: str, sample_index: int, seed: int | None
    ) -> FailureRecord:
        """The failure of an attempt that raised (the collector's own guard caught it)."""
        return cls(
            episode_id=episode_id(task, sample_index, seed),
            task=task,
            sample_index=sample_index,
            seed=seed,
            error=str(exc) or type(exc).__name__,
            exception_type=type(exc).__name__,
        )

    def to_line(self) -> bytes:
        return self.model_dump_json(by_alias=True).encode() + b"\n"


class FilteredRecord(BaseModel):
    """One line of ``filtered.jsonl``: an episode that ran but was not kept (e.g. its reward).

    Recorded so that a resume does not run it again and the manifest can count it.
    """

    model_config = ConfigDict(extra="forbid")

    schema_: str = Field(default=FILTERED_SCHEMA, alias="schema")
    episode_id: str
    task: str
    sample_index: int
    seed: int | None
    reward: float | None
    reason: str
    created_at: str = Field(default_factory=utc_now)

    @classmethod
    def of(cls, record: EpisodeRecord, reason: str) -> FilteredRecord:
        """The filtered note for an episode record that will not be kept."""
        return cls(
            episode_id=record.episode_id,
            task=record.task,
            sample_index=record.sample_index,
            seed=record.seed,
            reward=record.reward,
            reason=reason,
        )

    def to_line(self) -> bytes:
        return self.model_dump_json(by_alias=True).encode() + b"\n"
