"""Parity names an engine it cannot re-score with instead of reporting a misalignment that is
not there: one whose re-score ignores the temperature (real vLLM 0.32: prompt_logprobs are
computed before temperature, fixture 12f2), or one with no prompt_logprobs at all (real SGLang
0.5.23)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from rollwire.capture.parity import ParityReport, score_document
from rollwire.capture.upstream import Upstream

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-cpu"
RESCORE = json.loads((FIXTURES / "12f2_completions_prompt_logprobs_rescore_T1.3.json").read_text())
SAMPLE = json.loads((FIXTURES / "12f1_completions_sample_T1.3.json").read_text())

pytestmark = pytest.mark.anyio


def engine(*, honours_temperature: bool) -> Upstream:
    """Blind: answers every re-score with the recorded vLLM reply (prompt_logprobs at T=1).
    Honouring: an entry per requested id whose logprob depends on the request's T."""

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        reply = json.loads(json.dumps(RESCORE["response"]["body"]))
        if honours_temperature:
            reply["choices"][0]["prompt_logprobs"] = [None] + [
                {str(t): {"logprob": -1.0 / body["temperature"], "rank": 1}}
                for t in body["prompt"][1:]
            ]
        return httpx.Response(200, json=reply)

    return Upstream("http://vllm/v1", transport=httpx.MockTransport(handle))


def document() -> SimpleNamespace:
    request = SAMPLE["request"]["body"]
    choice = SAMPLE["response"]["body"]["choices"][0]
    turn = SimpleNamespace(
        trainable=True,
        prompt_token_ids=request["prompt"],
        completion_token_ids=choice["token_ids"],
        logprobs=choice["logprobs"]["token_logprobs"],
        applied_params={"temperature": request["temperature"]},
        constrained_positions=[],
        token_in_path=None,
    )
    stats = SimpleNamespace(turns=1, token_in={"rendered": 1})
    return SimpleNamespace(turns=[turn], stats=stats, findings=[])


async def test_a_rescore_blind_to_temperature_is_reported_not_failed_as_misalignment():
    report = ParityReport(llm_url="http://vllm/v1", temperature=1.3)
    out = await score_document(report, engine(honours_temperature=False), "smol", document())
    assert out.verdict == "NOT RUN"
    (finding,) = out.findings
    assert finding.code == "rescore_ignores_temperature" and finding.level == "FATAL"
    assert "--temperature 1" in finding.message
    assert out.honest is None


async def test_a_rescore_that_follows_temperature_is_compared():
    report = ParityReport(llm_url="http://vllm/v1", temperature=1.3)
    out = await score_document(report, engine(honours_temperature=True), "smol", document())
    assert "rescore_ignores_temperature" not in [f.code for f in out.findings]
    assert out.honest is not None, out.findings


async def test_an_engine_without_prompt_logprobs_is_named_as_such():
    # real SGLang 0.5.23 answers /v1/completions without prompt_logprobs
    reply = json.loads(
        (FIXTURES.parent / "sglang-cpu" / "05_completions_token_prompt.json").read_text()
    )["response"]["body"]
    upstream = Upstream(
        "http://sglang/v1",
        transport=httpx.MockTransport(lambda _r: httpx.Response(200, json=reply)),
    )
    doc = document()
    doc.turns[0].applied_params = {"temperature": 1.0}
    report = ParityReport(llm_url="http://sglang/v1", temperature=1.0)
    out = await score_document(report, upstream, "smol", doc)
    assert out.verdict == "NOT RUN"
    (finding,) = out.findings
    assert finding.code == "rescore_unsupported" and "prompt_logprobs" in finding.message
