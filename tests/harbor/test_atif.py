"""ATIF reconciliation: the harness's trajectory against the capture (pure)."""

from __future__ import annotations

from rollwire.capture.rollout import CaptureLevel
from rollwire.harnesses.harbor.atif import CapturedCall, reconcile

TOKENS = CaptureLevel.TOKENS


def trajectory(*completions, **extra) -> dict:
    steps = [{"step_id": 1, "source": "user", "message": "task"}]
    for i, n in enumerate(completions, start=2):
        steps.append(
            {"step_id": i, "source": "agent", "message": "x", "metrics": {"completion_tokens": n}}
        )
    return {
        "schema_version": "ATIF-v1.8",
        "agent": {"name": "a", "version": "1"},
        "steps": steps,
        **extra,
    }


def captured(*counts) -> list[CapturedCall]:
    return [CapturedCall(f"t{i}", n) for i, n in enumerate(counts, start=1)]


def codes(report) -> set[str]:
    return {f.code for f in report.findings}


def test_no_trajectory_is_none():
    assert reconcile(None, captured(3), TOKENS).atif == "none"


def test_same_calls_and_lengths_match():
    report = reconcile(trajectory(5, 7), captured(5, 7), TOKENS)
    assert report.atif == "match" and report.auxiliary == [] and report.findings == []


def test_a_call_missing_from_the_capture_is_fatal():
    report = reconcile(trajectory(5, 7), captured(5), TOKENS)
    assert report.atif == "MISMATCH" and "atif_calls_missing" in codes(report)


def test_extra_captured_calls_in_order_are_demoted_to_auxiliary():
    report = reconcile(trajectory(5, 7), captured(5, 12, 7), TOKENS)
    assert report.atif == "match" and report.auxiliary == ["t2"]


def test_an_aux_call_at_the_start_is_found_too():
    report = reconcile(trajectory(5, 7), captured(3, 5, 7), TOKENS)
    assert report.auxiliary == ["t1"]


def test_completion_lengths_that_disagree_are_a_mismatch():
    report = reconcile(trajectory(5, 7), captured(5, 8), TOKENS)
    assert report.atif == "MISMATCH" and "atif_calls_differ" in codes(report)


def test_text_tier_compares_call_counts_only():
    assert reconcile(trajectory(5, 7), captured(None, None), CaptureLevel.TEXT).atif == "match"


def test_subagents_are_refused():
    report = reconcile(trajectory(5, subagent_trajectories=[{"steps": []}]), captured(5), TOKENS)
    assert report.atif == "MISMATCH" and "subagent_trajectory" in codes(report)
    assert any(f.level == "FATAL" for f in report.findings)


def test_copied_context_and_dispatch_steps_are_not_calls():
    t = trajectory(5)
    t["steps"].append(
        {
            "step_id": 3,
            "source": "agent",
            "message": "old",
            "is_copied_context": True,
            "metrics": {"completion_tokens": 9},
        }
    )
    t["steps"].append(
        {"step_id": 4, "source": "agent", "message": "tool dispatch", "llm_call_count": 0}
    )
    assert reconcile(t, captured(5), TOKENS).atif == "match"


def test_ids_when_present_are_compared_exactly():
    t = trajectory(2)
    t["steps"][1]["metrics"]["completion_token_ids"] = [4, 5]
    assert reconcile(t, [CapturedCall("t1", 2, [4, 5])], TOKENS).atif == "match"
    assert reconcile(t, [CapturedCall("t1", 2, [4, 6])], TOKENS).atif == "MISMATCH"
