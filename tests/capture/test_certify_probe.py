"""The tier probe the proxy runs at start: tokens only with evidence, text on any doubt."""

from __future__ import annotations

import pytest

from rollwire.capture.certify import gap_ratio, probe_tier
from rollwire.capture.rollout import CaptureLevel
from rollwire.capture.upstream import Upstream
from tests.fakes.serve import serve_in_thread
from tests.fakes.vllm import FakeVLLM


async def _probe(**behavior) -> tuple[CaptureLevel, set[str]]:
    fake = FakeVLLM(**behavior)
    with serve_in_thread(fake.app) as url:
        upstream = Upstream(url)
        try:
            evidence = await probe_tier(upstream, "smol")
        finally:
            await upstream.aclose()
    return evidence.capture_level, {f.code for f in evidence.findings}


@pytest.mark.anyio
async def test_processed_logprobs_with_ids_earn_the_tokens_tier():
    level, codes = await _probe()
    assert level is CaptureLevel.TOKENS and "logprobs_processed" in codes


@pytest.mark.anyio
async def test_raw_logprobs_are_demoted_to_text():
    level, codes = await _probe(raw_logprobs=True)
    assert level is CaptureLevel.TEXT and "logprobs_raw" in codes


@pytest.mark.anyio
async def test_endpoint_ignoring_return_token_ids_is_text():
    level, codes = await _probe(ignore_return_token_ids=True)
    assert level is CaptureLevel.TEXT and "no_token_ids" in codes


@pytest.mark.anyio
async def test_misaligned_logprobs_are_text():
    level, codes = await _probe(shift_logprobs=True)
    assert level is CaptureLevel.TEXT and "logprobs_unaligned" in codes


@pytest.mark.anyio
async def test_unreachable_endpoint_is_text_with_a_fatal_finding():
    upstream = Upstream("http://127.0.0.1:9")
    try:
        evidence = await probe_tier(upstream, "smol")
    finally:
        await upstream.aclose()
    assert evidence.capture_level is CaptureLevel.TEXT
    assert [f.code for f in evidence.findings] == ["probe_failed"]


def test_gap_ratio_of_processed_pair_is_two():
    hot = {"a": -0.1, "b": -1.1}
    cold = {"a": -0.01, "b": -2.01}
    assert gap_ratio(cold, hot) == pytest.approx(2.0)


def test_gap_ratio_needs_two_shared_candidates():
    assert gap_ratio({"a": -0.1}, {"a": -0.2, "b": -3.0}) is None
