"""ATIF reconciliation: the harness's own trajectory against what the proxy captured.

The only check that is not self-referential: the harness writes its trajectory
(``agent/trajectory.json``) independently of rollwire. Pure functions over plain data.

- Subagent trajectories cannot be attributed to the parent's reward: refused (FATAL).
- Fewer captured calls than the trajectory's LLM calls: the capture lost work (FATAL).
- More captured calls: the extra ones are auxiliary (a title, a summary) when the trajectory's
  calls appear, in order, as a subsequence of the capture; they are demoted, never trained.
- At the tokens tier each paired call's completion length (or ids, when the trajectory has
  them) must agree; at the text tier only the call counts are compared.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field

from rollwire.capture.findings import Finding, fatal, info, warn
from rollwire.capture.rollout import CaptureLevel


@dataclass(frozen=True)
class CapturedCall:
    """One captured model call, in arrival order."""

    node_id: str
    completion_tokens: int | None
    completion_ids: list[int] | None = None


@dataclass(frozen=True)
class TrajectoryCall:
    """One LLM call as the harness recorded it."""

    step_id: int
    completion_tokens: int | None
    completion_ids: list[int] | None = None


class AtifReport(BaseModel):
    """The verdict, the calls to demote to auxiliary, and why."""

    atif: Literal["match", "MISMATCH", "none"]
    expected_calls: int = 0
    captured_calls: int = 0
    auxiliary: list[str] = Field(default_factory=list)
    findings: list[Finding] = Field(default_factory=list)


def trajectory_calls(trajectory: dict[str, Any]) -> tuple[list[TrajectoryCall], list[Finding]]:
    """The LLM calls of an ATIF trajectory (copied context excluded), plus what could not be read."""
    calls: list[TrajectoryCall] = []
    findings: list[Finding] = []
    for step in trajectory.get("steps") or []:
        if (
            not isinstance(step, dict)
            or step.get("source") != "agent"
            or step.get("is_copied_context")
        ):
            continue
        count = step.get("llm_call_count")
        metrics = step.get("metrics") if isinstance(step.get("metrics"), dict) else {}
        if count == 0:
            continue
        if isinstance(count, int) and count > 1:
            # Aggregated metrics cannot be paired call by call: count them, compare no lengths.
            calls.extend(
                TrajectoryCall(step_id=int(step.get("step_id", 0)), completion_tokens=None)
                for _ in range(count)
            )
            findings.append(
                info(
                    "atif_aggregated_step",
                    f"step {step.get('step_id')} aggregates {count} LLM calls",
                )
            )
            continue
        ids = metrics.get("completion_token_ids")
        calls.append(
            TrajectoryCall(
                step_id=int(step.get("step_id", 0)),
                completion_tokens=metrics.get("completion_tokens")
                if isinstance(metrics.get("completion_tokens"), int)
                else None,
                completion_ids=ids if isinstance(ids, list) else None,
            )
        )
    return calls, findings


def _same(expected: TrajectoryCall, got: CapturedCall) -> bool:
    if expected.completion_ids is not None and got.completion_ids is not None:
        return expected.completion_ids == got.completion_ids
    if expected.completion_tokens is None or got.completion_tokens is None:
        return True  # nothing to compare on: pair by order
    return expected.completion_tokens == got.completion_tokens


def _subsequence(expected: list[TrajectoryCall], captured: list[CapturedCall]) -> list[int] | None:
    """Indices into ``captured`` that pair with ``expected`` in order, or None."""
    picked: list[int] = []
    j = 0
    for call in expected:
        while j < len(captured) and not _same(call, captured[j]):
            j += 1
        if j == len(captured):
            return None
        picked.append(j)
        j += 1
    return picked


def reconcile(
    trajectory: dict[str, Any] | None, captured: list[CapturedCall], capture_level: CaptureLevel
) -> AtifReport:
    """Compare a trajectory with the capture; never raises."""
    if trajectory is None:
        return AtifReport(atif="none", captured_calls=len(captured))
    if trajectory.get("subagent_trajectories"):
        msg = (
            "the harness ran subagents; ATIF does not say which captured calls are theirs, so the "
            "rollout cannot be attributed to the task's reward: refused"
        )
        return AtifReport(
            atif="MISMATCH",
            captured_calls=len(captured),
            findings=[fatal("subagent_trajectory", msg)],
        )
    expected, findings = trajectory_calls(trajectory)
    report = AtifReport(
        atif="match", expected_calls=len(expected), captured_calls=len(captured), findings=findings
    )
    if capture_level is CaptureLevel.TEXT:
        expected = [TrajectoryCall(c.step_id, None) for c in expected]
        captured = [CapturedCall(c.node_id, None) for c in captured]
    if len(captured) < len(expected):
        report.atif = "MISMATCH"
        msg = (
            f"the trajectory has {len(expected)} LLM calls but only {len(captured)} were captured: "
            "the capture lost agent work"
        )
        report.findings.append(fatal("atif_calls_missing", msg))
        return report
    pairs = _subsequence(expected, captured)
    if pairs is None:
        report.atif = "MISMATCH"
        detail = [
            (e.completion_tokens, c.completion_tokens)
            for e, c in zip(expected, captured, strict=False)
        ]
        msg = f"captured calls do not line up with the trajectory's (trajectory vs capture completion tokens: {detail})"
        report.findings.append(warn("atif_calls_differ", msg))
        return report
    extra = [captured[i].node_id for i in range(len(captured)) if i not in set(pairs)]
    if extra:
        report.auxiliary = extra
        msg = f"{len(extra)} captured call(s) are not in the trajectory ({extra}): demoted to auxiliary"
        report.findings.append(info("atif_auxiliary", msg))
    return report
