"""validate_llm: tokens only with evidence, text on any doubt, fixes only for named parameters."""

from __future__ import annotations

import pytest

from rollwire.capture.certify import Verdict, gap_ratio, rejected_param, render_table, validate_llm
from rollwire.capture.rollout import CaptureLevel
from tests.fakes.serve import serve_in_thread
from tests.fakes.vllm import FakeVLLM

pytestmark = pytest.mark.anyio


async def _validate(model: str | None = None, **behavior):
    fake = FakeVLLM(**behavior)
    with serve_in_thread(fake.app) as url:
        cert = await validate_llm(url, model=model)
    return cert, {f.code for f in cert.findings}, fake


async def test_processed_logprobs_with_ids_earn_train():
    cert, codes, _ = await _validate()
    assert cert.verdict is Verdict.TRAIN and cert.capture_level is CaptureLevel.TOKENS
    assert cert.model == "smol" and cert.gap_ratio == pytest.approx(2.0, abs=0.01)
    assert "logprobs_processed" in codes


async def test_raw_logprobs_are_demoted_to_eval():
    cert, codes, _ = await _validate(raw_logprobs=True)
    assert cert.verdict is Verdict.EVAL_ONLY and cert.capture_level is CaptureLevel.TEXT
    assert "logprobs_raw" in codes and cert.gap_ratio == pytest.approx(1.0, abs=0.01)


async def test_endpoint_ignoring_return_token_ids_is_eval():
    cert, codes, _ = await _validate(ignore_return_token_ids=True)
    assert cert.verdict is Verdict.EVAL_ONLY and "no_token_ids" in codes


async def test_misaligned_logprobs_are_eval():
    cert, codes, _ = await _validate(shift_logprobs=True)
    assert cert.verdict is Verdict.EVAL_ONLY and "logprobs_unaligned" in codes


async def test_rejected_parameter_is_dropped_retried_and_recorded():
    cert, codes, fake = await _validate(reject_param="top_k")
    assert [f.param for f in cert.param_fixes] == ["top_k"]
    assert cert.verdict is Verdict.TRAIN and "param_fix" in codes
    assert "top_k" not in fake.requests[-1]


async def test_down_endpoint_is_not_usable_with_a_clear_message():
    cert = await validate_llm("http://127.0.0.1:9/v1")
    assert cert.verdict is Verdict.NOT_USABLE and not cert.reachable
    (finding,) = cert.findings
    assert finding.code == "not_reachable" and "cannot reach" in finding.message


async def test_several_models_and_none_named_is_ambiguous_eval():
    cert, codes, fake = await _validate(served_models=["a", "b"])
    assert cert.capture_level is CaptureLevel.TEXT and cert.model is None
    assert "model_ambiguous" in codes and fake.requests == []


async def test_several_models_with_one_named_is_certified():
    cert, _, _ = await _validate(model="b", served_models=["a", "b"])
    assert cert.model == "b" and cert.verdict is Verdict.TRAIN


async def test_unserved_model_is_not_usable():
    cert, codes, _ = await _validate(model="nope")
    assert cert.verdict is Verdict.NOT_USABLE and "model_not_served" in codes


async def test_tool_calls_are_probed_with_a_manifest():
    cert, codes, _ = await _validate(tool_call_every_turn=True)
    assert cert.tool_calls == "supported" and "tools_supported" in codes


async def test_tool_manifest_without_a_call_is_a_warning_not_fatal():
    cert, codes, _ = await _validate()
    assert cert.tool_calls == "not_called" and "tools_not_called" in codes
    assert cert.verdict is Verdict.TRAIN


async def test_table_has_the_verdict_in_its_last_column():
    cert, _, _ = await _validate()
    header, row = render_table(cert).splitlines()[:2]
    assert header.split()[-1] == "verdict" and row.split()[-1] == "TRAIN"


async def test_table_says_not_usable_for_a_down_endpoint():
    cert = await validate_llm("http://127.0.0.1:9/v1")
    assert render_table(cert).splitlines()[1].endswith("NOT USABLE")


def test_rejected_param_is_taken_from_the_error_field():
    body = {"model": "m", "top_k": -1}
    assert rejected_param({"error": {"message": "bad", "param": "top_k"}}, body) == "top_k"


@pytest.mark.parametrize(
    "message",
    [
        "Unrecognized request argument supplied: top_k",
        "top_k: Extra inputs are not permitted",
        "`top_k` is not supported by this model",
    ],
)
def test_rejected_param_reads_common_phrasings(message):
    assert (
        rejected_param({"error": {"message": message}}, {"model": "m", "top_k": -1, "seed": 1})
        == "top_k"
    )


def test_rejected_param_never_invents_a_name_from_prose():
    body = {"model": "m", "seed": 1}
    assert (
        rejected_param(
            {"error": {"message": "Unrecognized request argument supplied: top_k"}}, body
        )
        is None
    )
    assert rejected_param({"error": {"message": "bad request"}}, body) is None


def test_rejected_param_refuses_when_two_fields_are_named():
    body = {"model": "m", "seed": 1, "top_k": 2}
    assert rejected_param({"error": {"message": "seed and top_k conflict"}}, body) is None


def test_gap_ratio_of_processed_pair_is_two():
    assert gap_ratio({"a": -0.01, "b": -2.01}, {"a": -0.1, "b": -1.1}) == pytest.approx(2.0)


def test_gap_ratio_needs_two_shared_candidates():
    assert gap_ratio({"a": -0.1}, {"a": -0.2, "b": -3.0}) is None
