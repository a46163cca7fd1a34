"""The real reference engine: vLLM's shape, vLLM's tokenisation, processed logprobs, exact re-scoring."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest

from rollwire.capture.certify import Verdict, validate_llm
from rollwire.capture.parity import rescore, run_parity
from rollwire.capture.upstream import Upstream
from tests.conftest import SERVED

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).parents[1] / "fixtures" / "vllm-cpu"
IDS = {"return_token_ids": True}


def fixture(name: str) -> dict:
    data = json.loads((FIXTURES / name).read_text())
    data["request"]["body"]["model"] = SERVED  # vLLM served it as "smol"
    return data


def chat(url: str, **body) -> dict:
    resp = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_reply_has_vllm_keys_and_token_id_logprobs(engine_url):
    real = fixture("02_chat_T1.0_token_ids_logprobs.json")
    ours = chat(engine_url, **real["request"]["body"])
    vllm = real["response"]["body"]
    assert set(vllm) - {"ec_transfer_params", "metrics"} <= set(ours)
    assert set(vllm["choices"][0]) <= set(ours["choices"][0])
    assert set(vllm["choices"][0]["message"]) <= set(ours["choices"][0]["message"])
    ids = ours["choices"][0]["token_ids"]
    entries = ours["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in entries] == [f"token_id:{i}" for i in ids]
    assert set(entries[0]) == set(vllm["choices"][0]["logprobs"]["content"][0])
    assert ours["usage"]["completion_tokens"] == len(ids)


def test_prompt_ids_match_real_vllm_tokenisation(engine_url):
    real = fixture("02_chat_T1.0_token_ids_logprobs.json")
    ours = chat(engine_url, **{**real["request"]["body"], "max_tokens": 1})
    assert ours["prompt_token_ids"] == real["response"]["body"]["prompt_token_ids"]


def test_first_token_distribution_agrees_with_real_vllm(engine_url):
    # Same model: vLLM ran it dequantised to fp32, llama.cpp runs the Q4_1 GGUF.
    real = fixture("02_chat_T1.0_token_ids_logprobs.json")
    ours = chat(engine_url, **{**real["request"]["body"], "max_tokens": 1})
    theirs = real["response"]["body"]["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    mine = ours["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    assert [t["token"] for t in mine] == [t["token"] for t in theirs]
    for a, b in zip(mine, theirs, strict=True):
        assert a["logprob"] == pytest.approx(b["logprob"], abs=0.15)


def test_logprobs_are_processed_by_temperature(engine_url):
    body = {
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 1,
        "logprobs": True,
        "top_logprobs": 2,
    }
    hot = chat(engine_url, **body, temperature=1.0)["choices"][0]["logprobs"]["content"][0][
        "top_logprobs"
    ]
    cold = chat(engine_url, **body, temperature=0.5)["choices"][0]["logprobs"]["content"][0][
        "top_logprobs"
    ]
    gap = lambda t: t[0]["logprob"] - t[1]["logprob"]  # noqa: E731
    assert gap(cold) == pytest.approx(2 * gap(hot), rel=1e-6)


def test_same_seed_same_tokens(engine_url):
    body = {
        "messages": [{"role": "user", "content": "Say something."}],
        "max_tokens": 12,
        "seed": 5,
        **IDS,
    }
    assert (
        chat(engine_url, **body)["choices"][0]["token_ids"]
        == chat(engine_url, **body)["choices"][0]["token_ids"]
    )


def test_max_tokens_cut_reports_length(engine_url):
    body = {
        "messages": [{"role": "user", "content": "Tell a story."}],
        "max_tokens": 5,
        "ignore_eos": True,
        **IDS,
    }
    choice = chat(engine_url, **body)["choices"][0]
    assert len(choice["token_ids"]) == 5 and choice["finish_reason"] == "length"


def test_distribution_reshaping_knobs_are_refused(engine_url):
    resp = httpx.post(
        f"{engine_url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "x"}], "top_p": 0.9},
    )
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "top_p"


def test_unknown_model_is_a_vllm_shaped_404(engine_url):
    resp = httpx.post(
        f"{engine_url}/v1/chat/completions",
        json={"model": "nope", "messages": [{"role": "user", "content": "x"}]},
    )
    assert resp.status_code == 404 and resp.json()["error"]["type"] == "NotFoundError"


def test_streaming_works_with_the_openai_sdk(engine_url):
    client = openai.OpenAI(base_url=f"{engine_url}/v1", api_key="x", max_retries=0)
    kw = {
        "model": SERVED,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 8,
        "seed": 3,
    }
    plain = client.chat.completions.create(**kw).choices[0].message.content
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(**kw, stream=True)
        if c.choices
    )
    assert streamed == plain


@pytest.mark.anyio
async def test_rescoring_reproduces_sampled_logprobs_exactly(engine_url):
    body = {
        "messages": [{"role": "user", "content": "Name a fruit."}],
        "max_tokens": 16,
        "logprobs": True,
        "temperature": 0.7,
        **IDS,
    }
    reply = chat(engine_url, **body)
    prompt, done = reply["prompt_token_ids"], reply["choices"][0]["token_ids"]
    captured = [e["logprob"] for e in reply["choices"][0]["logprobs"]["content"]]
    upstream = Upstream(engine_url)
    try:
        again = await rescore(upstream, SERVED, prompt + done, len(prompt), 0.7)
    finally:
        await upstream.aclose()
    assert again == captured


@pytest.mark.anyio
async def test_engine_certifies_train(engine_url):
    cert = await validate_llm(engine_url)
    assert cert.verdict is Verdict.TRAIN and cert.gap_ratio == pytest.approx(2.0, abs=1e-6)


@pytest.mark.anyio
async def test_engine_in_raw_logprob_mode_is_demoted(raw_engine_url):
    cert = await validate_llm(raw_engine_url)
    assert cert.verdict is Verdict.EVAL_ONLY
    assert "logprobs_raw" in {f.code for f in cert.findings}


@pytest.mark.anyio
async def test_parity_passes_with_controls_far_above_the_honest_residual(engine_url):
    report = await run_parity(engine_url, turns=2)
    assert report.verdict == "PASS", report.findings
    assert report.honest is not None and report.honest.max_abs <= 1e-3
    for control in report.controls:
        assert control.mean_abs > 100 * max(report.honest.mean_abs, 1e-4)


def test_required_tool_choice_forces_the_call_frame_like_vllm(engine_url):
    tools = [
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    ]
    body = {
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": tools,
        "tool_choice": "required",
        "max_tokens": 24,
        "logprobs": True,
        "top_logprobs": 3,
        **IDS,
    }
    choice = chat(engine_url, **body)["choices"][0]
    first = choice["logprobs"]["content"][0]
    assert first["logprob"] == 0.0
    assert [t["logprob"] for t in first["top_logprobs"][1:]] == [-9999.0, -9999.0]
    text = httpx.post(f"{engine_url}/detokenize", json={"tokens": choice["token_ids"]}).json()[
        "prompt"
    ]
    assert text.startswith('<tool_call>\n{"name": "get_weather", "arguments":')


def test_tool_choice_naming_an_unknown_tool_is_refused(engine_url):
    tools = [{"type": "function", "function": {"name": "a", "parameters": {}}}]
    resp = httpx.post(
        f"{engine_url}/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "x"}],
            "tools": tools,
            "tool_choice": {"type": "function", "function": {"name": "b"}},
        },
    )
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "tool_choice"


def test_a_prompt_longer_than_the_context_is_a_400_not_a_crash(engine_url, reference_model):
    # An agent's conversation can outgrow the context (a reply that ran to the cap, then more):
    # llama.cpp cannot place the overflow ("failed to find a memory slot"), so refuse it first.
    words = "word " * (reference_model.n_ctx + 100)
    resp = httpx.post(
        f"{engine_url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": words}]},
        timeout=120,
    )
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["param"] == "messages" and "maximum context length" in error["message"]
    assert chat(engine_url, messages=[{"role": "user", "content": "hi"}], max_tokens=2)["choices"]


@pytest.mark.anyio
async def test_parity_compares_captures_at_t13_on_an_engine_that_rescores_at_that_temperature(
    engine_url,
):
    # the reference engine applies the request's temperature to prompt_logprobs (vLLM does not)
    report = await run_parity(engine_url, turns=2, temperature=1.3)
    assert "rescore_ignores_temperature" not in [f.code for f in report.findings]
    assert report.verdict == "PASS", report.findings
