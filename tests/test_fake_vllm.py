"""The vLLM-shaped fake upstream must look like the real vLLM fixtures and keep its promises."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.fakes.serve import serve_in_thread
from tests.fakes.vllm import (
    DEFAULT_SYSTEM_PROMPT,
    EOS_ID,
    IM_START_ID,
    NEWLINE_ID,
    TOKENIZER,
    FakeVLLM,
    create_fake_vllm,
    render_chat,
    tool_call_text,
)

FIXTURES = next(
    (
        p
        for p in (
            Path(__file__).parent / "fixtures" / "vllm-cpu",
            Path("/work/shared/fixtures/vllm-cpu"),
        )
        if p.is_dir()
    ),
    Path(__file__).parent / "fixtures" / "vllm-cpu",
)
CHAT = "/v1/chat/completions"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"}},
            "required": ["city"],
        },
    },
}
BASE = {
    "model": "smol",
    "messages": [{"role": "user", "content": "Write one sentence about the sea."}],
    "max_tokens": 24,
    "temperature": 1.0,
    "seed": 1234,
    "logprobs": True,
    "top_logprobs": 3,
    "return_token_ids": True,
}


def fixture(name: str) -> dict[str, Any]:
    path = FIXTURES / name
    assert path.exists(), f"recorded fixture {path} is missing (tests/fixtures/vllm-cpu)"
    return json.loads(path.read_text())


def shape(obj: Any) -> Any:
    """Key structure: dicts keep their keys, lists keep the shape of their first element."""
    if isinstance(obj, dict):
        return {k: shape(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [shape(obj[0])] if obj and isinstance(obj[0], dict | list) else "list"
    return None


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[FakeVLLM, str]]:
    app = create_fake_vllm()
    with serve_in_thread(app) as url:
        yield app.state.fake, url


@pytest.fixture
def fake(server: tuple[FakeVLLM, str]) -> FakeVLLM:
    server[0].reset()
    return server[0]


@pytest.fixture
def http(server: tuple[FakeVLLM, str], fake: FakeVLLM) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server[1], timeout=10) as client:
        yield client


@pytest.fixture
def sdk(server: tuple[FakeVLLM, str], fake: FakeVLLM) -> openai.OpenAI:
    return openai.OpenAI(base_url=server[1] + "/v1", api_key="x", max_retries=0)


def chat(http: httpx.Client, **overrides: Any) -> dict[str, Any]:
    r = http.post(CHAT, json={**BASE, **overrides})
    assert r.status_code == 200, r.text
    return r.json()


# ----------------------------------------------------------------------------- shapes


@pytest.mark.parametrize(
    ("name", "overrides"),
    [
        ("02_chat_T1.0_token_ids_logprobs.json", {}),
        ("09_chat_T1.0_without_return_token_ids.json", {"return_token_ids": None}),
        ("07b_n2_with_return_token_ids_accepted.json", {"n": 2}),
        ("07d_unknown_extra_param_accepted.json", {"frobnicate_level": 3}),
    ],
)
def test_chat_body_shape_matches_fixture(http: httpx.Client, name: str, overrides: dict) -> None:
    fx = fixture(name)
    r = http.post(CHAT, json=fx["request"]["body"])
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    body, expected = r.json(), fx["response"]["body"]
    assert list(body) == list(expected)
    assert list(body["choices"][0]) == list(expected["choices"][0])
    assert list(body["choices"][0]["message"]) == list(expected["choices"][0]["message"])
    assert shape(body) == shape(expected)
    assert body["id"].startswith("chatcmpl-") and len(body["id"]) == len(expected["id"])
    assert (body["object"], body["model"]) == ("chat.completion", "smol")
    assert body["system_fingerprint"] == expected["system_fingerprint"]
    assert len(body["choices"]) == len(expected["choices"])


def test_chat_values_are_consistent(http: httpx.Client) -> None:
    body = chat(http)
    ch = body["choices"][0]
    ids, prompt = ch["token_ids"], body["prompt_token_ids"]
    assert ch["finish_reason"] == "stop" and ids[-1] == EOS_ID
    assert prompt[:3] == [IM_START_ID, TOKENIZER.encode("system")[0], NEWLINE_ID]
    assert prompt[-3:] == [IM_START_ID, *TOKENIZER.encode("assistant"), NEWLINE_ID]
    assert body["usage"]["prompt_tokens"] == len(prompt)
    assert body["usage"]["completion_tokens"] == len(ids) == 12
    assert TOKENIZER.decode(ids) == ch["message"]["content"]
    assert TOKENIZER.encode(ch["message"]["content"]) == ids[:-1]
    for tid, entry in zip(ids, ch["logprobs"]["content"], strict=True):
        assert entry["token"] == f"token_id:{tid}"
        assert bytes(entry["bytes"]).decode() == TOKENIZER.piece(tid)
        assert entry["logprob"] <= 0 and len(entry["top_logprobs"]) == 3
        assert entry["top_logprobs"][0] == {
            "token": entry["token"],
            "logprob": entry["logprob"],
            "bytes": list(entry["token"].encode()),
        }
        alts = [t["logprob"] for t in entry["top_logprobs"][1:]]
        assert alts == sorted(alts, reverse=True)
    assert chat(http, top_logprobs=0)["choices"][0]["logprobs"]["content"][0]["top_logprobs"] == []
    assert chat(http, logprobs=False)["choices"][0]["logprobs"] is None


def test_openai_sdk_parses_reply(sdk: openai.OpenAI) -> None:
    r = sdk.chat.completions.create(
        model="smol",
        messages=[{"role": "user", "content": "hi"}],
        logprobs=True,
        top_logprobs=2,
        seed=7,
        extra_body={"return_token_ids": True},
    )
    assert r.id.startswith("chatcmpl-") and r.choices[0].finish_reason == "stop"
    assert r.model_extra["prompt_token_ids"][-1] == NEWLINE_ID
    ids = r.choices[0].model_extra["token_ids"]
    assert [e.token for e in r.choices[0].logprobs.content] == [f"token_id:{t}" for t in ids]
    assert r.usage.completion_tokens == len(ids)


def test_deterministic_and_n2(http: httpx.Client) -> None:
    one = chat(http)["choices"][0]
    assert chat(http)["choices"][0]["token_ids"] == one["token_ids"]
    assert chat(http, frobnicate_level=3)["choices"][0]["token_ids"] == one["token_ids"]
    two = chat(http, n=2)
    assert [c["index"] for c in two["choices"]] == [0, 1]
    assert two["choices"][0]["token_ids"] == one["token_ids"]
    assert two["choices"][1]["token_ids"] != one["token_ids"]
    assert two["usage"]["completion_tokens"] == 24
    assert chat(http, seed=99)["choices"][0]["token_ids"] != one["token_ids"]


def test_finish_length_without_eos(http: httpx.Client) -> None:
    fx = fixture("08_finish_length_max_tokens_5.json")
    body = http.post(CHAT, json=fx["request"]["body"]).json()
    assert shape(body) == shape(fx["response"]["body"])
    ch = body["choices"][0]
    assert ch["finish_reason"] == "length" and len(ch["token_ids"]) == 5
    assert EOS_ID not in ch["token_ids"] and len(ch["logprobs"]["content"]) == 5
    assert ch["message"]["content"] == TOKENIZER.decode(ch["token_ids"])


def test_reply_tokens_and_ignore_eos(http: httpx.Client, fake: FakeVLLM) -> None:
    fake.behavior.reply_tokens = 256
    ch = chat(http, max_tokens=None)["choices"][0]
    assert len(ch["token_ids"]) == 256 and ch["token_ids"][-1] == EOS_ID
    assert ch["finish_reason"] == "stop"
    ch = chat(http, max_tokens=40, ignore_eos=True)["choices"][0]
    assert len(ch["token_ids"]) == 40 and ch["finish_reason"] == "length"
    assert EOS_ID not in ch["token_ids"]


def test_models_tokenize_detokenize(http: httpx.Client, fake: FakeVLLM) -> None:
    fx = fixture("01_models.json")
    models = http.get("/v1/models").json()
    assert shape(models) == shape(fx["response"]["body"])
    assert [m["id"] for m in models["data"]] == ["smol"]
    assert models["data"][0]["max_model_len"] == 2048

    body = chat(http)
    tok = http.post("/tokenize", json=fixture("11a_tokenize_messages.json")["request"]["body"])
    assert shape(tok.json()) == shape(fixture("11a_tokenize_messages.json")["response"]["body"])
    assert tok.json()["tokens"] == body["prompt_token_ids"]
    ids = body["choices"][0]["token_ids"][:-1]
    detok = http.post("/detokenize", json={"model": "smol", "tokens": ids}).json()
    assert detok == {"prompt": body["choices"][0]["message"]["content"]}

    fake.behavior.served_models = ["a", "b"]
    assert [m["id"] for m in http.get("/v1/models").json()["data"]] == ["a", "b"]
    r = http.post(CHAT, json={**BASE, "model": "smol"})
    assert r.status_code == 404
    assert r.json()["error"]["message"] == "The model `smol` does not exist. Valid aliases: a, b."


# ----------------------------------------------------------------------------- template/prefix


def test_prefix_property_across_three_turns(sdk: openai.OpenAI) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Name one fruit."}]
    prev: list[int] | None = None
    for turn in range(3):
        r = sdk.chat.completions.create(
            model="smol",
            messages=messages,
            max_tokens=48,
            seed=1234,
            extra_body={"return_token_ids": True},
        )
        prompt = r.model_extra["prompt_token_ids"]
        completion = r.choices[0].model_extra["token_ids"]
        if prev is not None:
            assert prompt[: len(prev)] == prev
            assert prompt[len(prev) : len(prev) + 2] == [NEWLINE_ID, IM_START_ID]
        assert r.choices[0].finish_reason == "stop" and completion[-1] == EOS_ID
        prev = prompt + completion
        messages += [
            {"role": "assistant", "content": r.choices[0].message.content},
            {"role": "user", "content": f"And turn {turn + 2}?"},
        ]


def test_noncanonical_split_breaks_prefix_but_not_text(http: httpx.Client, fake: FakeVLLM) -> None:
    fake.behavior.noncanonical_split = True
    first = chat(http, max_tokens=16)
    ids, content = first["choices"][0]["token_ids"], first["choices"][0]["message"]["content"]
    assert TOKENIZER.decode(ids) == content
    canonical = TOKENIZER.encode(content)
    assert len(canonical) == len(ids) - 2  # one piece shorter, and no EOS
    messages = [*BASE["messages"], {"role": "assistant", "content": content}]
    second = chat(http, max_tokens=4, messages=[*messages, {"role": "user", "content": "More."}])
    p1, p2 = first["prompt_token_ids"], second["prompt_token_ids"]
    assert p2[: len(p1)] == p1
    assert p2[: len(p1) + len(ids)] != p1 + ids
    assert p2[len(p1) : len(p1) + len(canonical) + 1] == [*canonical, EOS_ID]


def test_template_details() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert render_chat([{"role": "user", "content": parts}]) == render_chat(
        [{"role": "user", "content": "a\nb"}]
    )
    explicit = render_chat(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        add_generation_prompt=False,
    )
    assert explicit[:2] == [IM_START_ID, TOKENIZER.encode("system")[0]]
    assert explicit[3 : 3 + 3] == TOKENIZER.encode("Be brief.")
    assert explicit[-2:] == [EOS_ID, NEWLINE_ID]
    text = "Hello,  world_x\n\tdone?! ü"
    assert TOKENIZER.decode(TOKENIZER.encode(text)) == text


# ----------------------------------------------------------------------------- logprobs


def _gaps(body: dict[str, Any]) -> list[float]:
    out = []
    for entry in body["choices"][0]["logprobs"]["content"]:
        tops = entry["top_logprobs"]
        out.append(tops[1]["logprob"] - tops[2]["logprob"])
        out.append(tops[0]["logprob"] - tops[1]["logprob"])
    return out


@pytest.mark.parametrize(("raw", "ratio"), [(False, 2.0), (True, 1.0)])
def test_temperature_gap_ratio(http: httpx.Client, fake: FakeVLLM, raw: bool, ratio: float):
    fake.behavior.raw_logprobs = raw
    at_1 = chat(http, temperature=1.0, top_logprobs=5)
    at_half = chat(http, temperature=0.5, top_logprobs=5)
    assert at_1["choices"][0]["token_ids"] == at_half["choices"][0]["token_ids"]
    for g1, g05 in zip(_gaps(at_1), _gaps(at_half), strict=True):
        assert g05 == pytest.approx(ratio * g1, rel=1e-9, abs=1e-12)


# ----------------------------------------------------------------------------- streaming


def _sse(text: str) -> list[Any]:
    lines = text.split("\n")
    assert lines[-2:] == ["", ""]
    events = lines[:-2]
    assert all(line == "" for line in events[1::2])
    assert all(line.startswith("data: ") for line in events[0::2])
    return [line[6:] if line == "data: [DONE]" else json.loads(line[6:]) for line in events[0::2]]


def test_stream_shape_matches_fixture(http: httpx.Client) -> None:
    fx = fixture("06_chat_stream_T1.0.json")
    r = http.post(CHAT, json=fx["request"]["body"])
    assert r.headers["content-type"] == fx["response"]["headers"]["content-type"]
    got = _sse(r.text)
    want = _sse("\n".join(fx["response"]["body"]) + "\n")
    assert got[-1] == want[-1] == "[DONE]"
    for i in (0, 1, -3, -2):  # role chunk, a token chunk, the last token chunk, the usage chunk
        assert shape(got[i]) == shape(want[i])
        assert list(got[i]) == list(want[i])
        if got[i]["choices"]:
            assert list(got[i]["choices"][0]) == list(want[i]["choices"][0])
    assert got[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    tokens = got[1:-2]
    assert all(len(c["choices"]) == 1 for c in tokens)
    plain = chat(http, max_tokens=24)
    ch = plain["choices"][0]
    assert got[0]["prompt_token_ids"] == plain["prompt_token_ids"]
    assert [c["choices"][0]["token_ids"][0] for c in tokens] == ch["token_ids"]
    assert "".join(c["choices"][0]["delta"]["content"] for c in tokens) == ch["message"]["content"]
    stream_lps = [c["choices"][0]["logprobs"]["content"][0] for c in tokens]
    assert stream_lps == ch["logprobs"]["content"]
    assert tokens[-1]["choices"][0]["finish_reason"] == "stop"
    assert all(c["choices"][0]["finish_reason"] is None for c in tokens[:-1])
    assert got[-2]["usage"] == {
        "prompt_tokens": len(plain["prompt_token_ids"]),
        "total_tokens": len(plain["prompt_token_ids"]) + len(ch["token_ids"]),
        "completion_tokens": len(ch["token_ids"]),
    }


def test_stream_with_openai_sdk(sdk: openai.OpenAI) -> None:
    stream = sdk.chat.completions.create(
        model="smol",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        extra_body={"return_token_ids": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].choices[0].finish_reason == "stop"
    assert chunks[0].model_extra["prompt_token_ids"][0] == IM_START_ID

    stream = sdk.chat.completions.create(
        model="smol",
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=[WEATHER_TOOL],
        tool_choice="required",
        stream=True,
    )
    calls = [tc for c in stream if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert [tc.function.name for tc in calls] == ["get_weather"]
    assert "city" in json.loads(calls[0].function.arguments)


def test_serve_in_thread_stops_cleanly() -> None:
    with serve_in_thread(create_fake_vllm()) as url:
        assert httpx.get(url + "/health").status_code == 200
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/health")


# ----------------------------------------------------------------------------- tools


def test_named_tool_call_like_05a_and_prefix(http: httpx.Client, fake: FakeVLLM) -> None:
    fx = fixture("05a_tool_call_named.json")
    body = http.post(CHAT, json=fx["request"]["body"]).json()
    assert shape(body) == shape(fx["response"]["body"])
    ch = body["choices"][0]
    assert list(ch["message"]) == list(fx["response"]["body"]["choices"][0]["message"])
    call = ch["message"]["tool_calls"][0]
    assert ch["message"]["content"] == "" and ch["finish_reason"] == "stop"
    assert call["id"].startswith("chatcmpl-tool-") and call["type"] == "function"
    assert call["function"]["name"] == "get_weather"
    assert isinstance(json.loads(call["function"]["arguments"])["city"], str)
    ids = ch["token_ids"]
    assert ids[-1] == EOS_ID
    assert TOKENIZER.decode(ids) == tool_call_text("get_weather", call["function"]["arguments"])
    for entry in ch["logprobs"]["content"]:  # forced decoding, like the fixture
        assert entry["logprob"] == 0.0
        assert {t["logprob"] for t in entry["top_logprobs"][1:]} == {-9999.0}

    follow = {
        **fx["request"]["body"],
        "tool_choice": "auto",
        "messages": [
            *fx["request"]["body"]["messages"],
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": '{"sky": "cloudy"}'},
        ],
    }
    second = http.post(CHAT, json=follow).json()
    prev = body["prompt_token_ids"] + ids
    assert second["prompt_token_ids"][: len(prev)] == prev
    assert "tool_calls" not in second["choices"][0]["message"]

    fake.behavior.drop_tool_calls_in_history = True  # real SmolLM2 template (fixture 05b)
    dropped = http.post(CHAT, json=follow).json()["prompt_token_ids"]
    n = len(body["prompt_token_ids"])
    assert dropped[: n + 2] == body["prompt_token_ids"] + [EOS_ID, NEWLINE_ID]
    assert dropped[: len(prev)] != prev


def test_tool_call_truncated_by_length_like_05c(http: httpx.Client) -> None:
    fx = fixture("05c_tool_call_named_truncated_by_length.json")
    body = http.post(CHAT, json={**fx["request"]["body"], "max_tokens": 10}).json()
    assert shape(body) == shape(fx["response"]["body"])
    ch = body["choices"][0]
    assert ch["finish_reason"] == "length" and "tool_calls" not in ch["message"]
    assert ch["message"]["content"].startswith("<tool_call>\n")
    assert ch["message"]["content"] == TOKENIZER.decode(ch["token_ids"])


def test_auto_tool_call_on_marker(sdk: openai.OpenAI, fake: FakeVLLM) -> None:
    def ask(text: str):
        return sdk.chat.completions.create(
            model="smol",
            messages=[{"role": "user", "content": text}],
            tools=[WEATHER_TOOL],
            logprobs=True,
        )

    r = ask("Weather in Paris? CALL_TOOL")
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert any(e.logprob != 0.0 for e in r.choices[0].logprobs.content)  # not forced
    assert ask("Weather in Paris?").choices[0].message.tool_calls is None
    fake.behavior.tool_call_every_turn = True
    assert ask("Weather in Paris?").choices[0].message.tool_calls is not None


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "name",
    [
        "07a_err_tools_empty_list.json",
        "07c_err_unknown_model.json",
        "07e_err_max_tokens_over_context.json",
        "07f_err_malformed_json.json",
        "07g_err_top_logprobs_50.json",
    ],
)
def test_error_bodies_match_fixtures(http: httpx.Client, name: str) -> None:
    fx = fixture(name)
    req = fx["request"]
    if req.get("body_is_raw_text"):
        headers = {"content-type": "application/json"}
        r = http.post(req["path"], content=req["body"].encode(), headers=headers)
    else:
        r = http.post(req["path"], json=req["body"])
    assert r.status_code == fx["response"]["status"]
    assert r.headers["content-type"] == "application/json"
    assert r.json() == fx["response"]["body"]


def test_openai_sdk_raises_on_errors(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        sdk.chat.completions.create(model="smol", messages=BASE["messages"], tools=[])
    assert exc.value.body["param"] == "tools"
    with pytest.raises(openai.NotFoundError):
        sdk.chat.completions.create(model="nope", messages=BASE["messages"])


# ----------------------------------------------------------------------------- misbehaviour


def test_logprob_faults(http: httpx.Client, fake: FakeVLLM) -> None:
    good = chat(http)["choices"][0]
    fake.behavior.shift_logprobs = True
    shifted = chat(http)["choices"][0]
    assert shifted["token_ids"] == good["token_ids"]
    entries = good["logprobs"]["content"]
    assert shifted["logprobs"]["content"] == [*entries[1:], entries[0]]
    fake.reset()
    fake.behavior.update(null_logprob_at=1, nonfinite_logprob_at=2, positive_logprob_at=3)
    r = http.post(CHAT, json=BASE)
    assert "NaN" in r.text
    content = json.loads(r.text)["choices"][0]["logprobs"]["content"]
    assert content[1]["logprob"] is None
    assert math.isnan(content[2]["logprob"])
    assert content[3]["logprob"] == 0.5


def test_response_faults(http: httpx.Client, fake: FakeVLLM) -> None:
    fake.behavior.no_choices = True
    assert chat(http)["choices"] == []
    fake.reset()
    fake.behavior.ignore_return_token_ids = True
    body = chat(http)
    assert body["prompt_token_ids"] is None and body["choices"][0]["token_ids"] is None
    fake.reset()
    fake.behavior.reject_param = "seed"
    r = http.post(CHAT, json=BASE)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "seed"
    assert r.json()["error"]["type"] == "BadRequestError"
    fake.reset()
    fake.behavior.invalid_json = True
    r = http.post(CHAT, json=BASE)
    assert r.status_code == 200
    with pytest.raises(json.JSONDecodeError):
        json.loads(r.text)


def test_control_endpoints_and_injected_failures(http: httpx.Client, fake: FakeVLLM) -> None:
    r = http.post("/_fake/behavior", json={"fail_status": 500, "fail_count": 2, "delay_s": 0.01})
    assert r.status_code == 200 and r.json()["fail_count"] == 2
    assert http.post("/_fake/behavior", json={"no_such_field": 1}).status_code == 400
    for _ in range(2):
        r = http.post(CHAT, json=BASE)
        assert r.status_code == 500
        err = r.json()["error"]
        assert err["type"] == "InternalServerError" and err["code"] == 500
        assert set(err) == {"message", "type", "param", "code"}
    assert http.post(CHAT, json=BASE).status_code == 200
    assert http.get("/_fake/requests").json() == [BASE, BASE, BASE]
    stats = http.get("/_fake/stats").json()
    assert stats["injected_failures"] == 2 and stats["ok"] == 1 and stats["in_flight"] == 0

    assert http.post("/_fake/reset").json()["fail_status"] is None
    assert http.get("/_fake/requests").json() == []
    assert fake.behavior.delay_s == 0.0


def test_reset_restores_constructor_behavior() -> None:
    app = create_fake_vllm(raw_logprobs=True, served_models=["m"], max_model_len=64)
    fake: FakeVLLM = app.state.fake
    fake.behavior.raw_logprobs = False
    fake.reset()
    assert fake.behavior.raw_logprobs is True and fake.behavior.served_models == ["m"]
    assert app.state.behavior is fake.behavior


# ----------------------------------------------------------------------------- completions

COMPLETIONS = "/v1/completions"


def prompt_ids_of(http: httpx.Client, **overrides: Any) -> list[int]:
    body = {"model": "smol", "messages": BASE["messages"], **overrides}
    r = http.post("/tokenize", json=body)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def complete(http: httpx.Client, **body: Any) -> dict[str, Any]:
    r = http.post(COMPLETIONS, json={"model": "smol", **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_completions_on_token_prompt_sample_what_chat_does(http: httpx.Client) -> None:
    ids = prompt_ids_of(http, messages=[{"role": "user", "content": "Another prompt."}])
    k = 3
    via_chat = chat(http, top_logprobs=k + 1, kv_transfer_params={"prompt_token_ids": ids})
    done = complete(http, prompt=ids, max_tokens=24, seed=1234, logprobs=k, return_token_ids=True)
    cc, ch = done["choices"][0], via_chat["choices"][0]
    assert via_chat["prompt_token_ids"] == cc["prompt_token_ids"] == ids
    assert cc["token_ids"] == ch["token_ids"]
    assert cc["text"] == ch["message"]["content"]
    assert cc["finish_reason"] == ch["finish_reason"] == "stop"
    content = ch["logprobs"]["content"]
    assert cc["logprobs"]["tokens"] == [e["token"] for e in content]
    assert cc["logprobs"]["token_logprobs"] == [e["logprob"] for e in content]
    # chat's top k+1 (sampled first) are completions' sampled token plus its top k
    assert cc["logprobs"]["top_logprobs"] == [
        {t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in content
    ]
    assert done["usage"]["completion_tokens"] == via_chat["usage"]["completion_tokens"]


def test_completions_reply_shape(http: httpx.Client) -> None:
    ids = prompt_ids_of(http)
    body = complete(http, prompt=ids, return_token_ids=True)
    assert list(body) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "service_tier",
        "system_fingerprint",
        "usage",
        "kv_transfer_params",
        "ec_transfer_params",
        "metrics",
    ]
    assert list(body["choices"][0]) == [
        "index",
        "text",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "token_ids",
        "prompt_logprobs",
        "prompt_token_ids",
        "routed_experts",
    ]
    assert body["id"].startswith("cmpl-") and len(body["id"]) == len("cmpl-") + 16
    assert (body["object"], body["model"]) == ("text_completion", "smol")
    recorded = fixture("02_chat_T1.0_token_ids_logprobs.json")["response"]["body"]
    assert body["system_fingerprint"] == recorded["system_fingerprint"]
    ch = body["choices"][0]
    assert ch["prompt_token_ids"] == ids and ch["logprobs"] is None
    assert body["usage"] == {
        "prompt_tokens": len(ids),
        "total_tokens": len(ids) + len(ch["token_ids"]),
        "completion_tokens": len(ch["token_ids"]),
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    plain = complete(http, prompt=ids)["choices"][0]
    assert plain["token_ids"] is None and plain["prompt_token_ids"] is None


def test_completions_logprobs_shape(http: httpx.Client) -> None:
    ids = prompt_ids_of(http)
    for k in (0, 2, 20):
        ch = complete(http, prompt=ids, logprobs=k, return_token_ids=True)["choices"][0]
        lps, tokens = ch["logprobs"], ch["token_ids"]
        assert list(lps) == ["text_offset", "token_logprobs", "tokens", "top_logprobs"]
        assert lps["tokens"] == [f"token_id:{t}" for t in tokens]
        assert all(lp <= 0 for lp in lps["token_logprobs"])
        assert [len(d) for d in lps["top_logprobs"]] == [k + 1] * len(tokens)
        rows = zip(lps["tokens"], lps["token_logprobs"], lps["top_logprobs"], strict=True)
        assert all(top[token] == lp for token, lp, top in rows)
        lengths = [len(t) for t in lps["tokens"]]
        assert lps["text_offset"] == [sum(lengths[:i]) for i in range(len(lengths))]
    as_text = complete(http, prompt=ids, logprobs=1, return_tokens_as_token_ids=False)
    tokens = as_text["choices"][0]["logprobs"]["tokens"]
    assert "".join(tokens[:-1]) == as_text["choices"][0]["text"] and tokens[-1] == "<|im_end|>"


def test_completions_text_prompt_is_tokenised(http: httpx.Client) -> None:
    text = "<|im_start|>user\nHello there.<|im_end|>\n<|im_start|>assistant\n"
    by_text = complete(http, prompt=text, return_token_ids=True)["choices"][0]
    by_ids = complete(http, prompt=TOKENIZER.encode(text), return_token_ids=True)["choices"][0]
    assert by_text["prompt_token_ids"] == TOKENIZER.encode(text)
    assert by_text["token_ids"] == by_ids["token_ids"]


def test_completions_default_max_tokens_is_16(http: httpx.Client, fake: FakeVLLM) -> None:
    fake.behavior.reply_tokens = 100
    ids = prompt_ids_of(http)
    for body in ({"prompt": ids}, {"prompt": ids, "max_tokens": None}):
        ch = complete(http, return_token_ids=True, **body)["choices"][0]
        assert len(ch["token_ids"]) == 16 and ch["finish_reason"] == "length"
    given = complete(http, prompt=ids, max_tokens=40, return_token_ids=True)["choices"][0]
    assert len(given["token_ids"]) == 40


def test_completions_text_skips_special_tokens_by_default(http: httpx.Client) -> None:
    ids = prompt_ids_of(http)
    ch = complete(http, prompt=ids, return_token_ids=True)["choices"][0]
    assert ch["token_ids"][-1] == EOS_ID and "<|im_end|>" not in ch["text"]
    kept = complete(http, prompt=ids, skip_special_tokens=False)["choices"][0]["text"]
    assert kept == ch["text"] + "<|im_end|>"


def test_completions_tool_call_is_hermes_text(http: httpx.Client, fake: FakeVLLM) -> None:
    fake.behavior.tools_in_prompt = True
    messages = [{"role": "user", "content": "Weather in Oslo? CALL_TOOL"}]
    ids = prompt_ids_of(http, messages=messages, tools=[WEATHER_TOOL])
    ch = complete(http, prompt=ids, max_tokens=128, seed=5, return_token_ids=True)["choices"][0]
    assert ch["text"].startswith("<tool_call>\n") and ch["text"].endswith("\n</tool_call>")
    call = json.loads(ch["text"].split("\n")[1])
    assert call["name"] == "get_weather" and isinstance(call["arguments"]["city"], str)
    assert ch["text"] == tool_call_text("get_weather", call["arguments"])
    assert ch["finish_reason"] == "stop" and ch["token_ids"][-1] == EOS_ID
    # the chat request these ids render from samples the same call, parsed
    chat_ch = chat(http, messages=messages, tools=[WEATHER_TOOL], max_tokens=128, seed=5)
    assert chat_ch["prompt_token_ids"] == ids
    assert chat_ch["choices"][0]["token_ids"] == ch["token_ids"]
    parsed = chat_ch["choices"][0]["message"]["tool_calls"][0]["function"]
    assert json.loads(parsed["arguments"]) == call["arguments"]


def test_completions_call_no_tool_without_marker_or_tools_section(
    http: httpx.Client, fake: FakeVLLM
) -> None:
    fake.behavior.tools_in_prompt = True
    asked = [{"role": "user", "content": "Weather in Oslo?"}]
    no_marker = prompt_ids_of(http, messages=asked, tools=[WEATHER_TOOL])
    assert "<tool_call>" not in complete(http, prompt=no_marker)["choices"][0]["text"]
    fake.behavior.tool_call_every_turn = True  # any user turn, as on chat
    assert "<tool_call>" in complete(http, prompt=no_marker, max_tokens=128)["choices"][0]["text"]
    fake.behavior.tools_in_prompt = False  # the real SmolLM2 template: no tools section
    marker = [{"role": "user", "content": "Weather in Oslo? CALL_TOOL"}]
    no_section = prompt_ids_of(http, messages=marker, tools=[WEATHER_TOOL])
    assert "<tool_call>" not in complete(http, prompt=no_section)["choices"][0]["text"]


def test_completions_errors(http: httpx.Client) -> None:
    ids = prompt_ids_of(http)
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"model": "nope", "prompt": ids}, 404, "model"),
        ({"prompt": [1, -2]}, 400, "prompt"),
        ({"prompt": [[1, 2]]}, 400, "prompt"),
        ({"prompt": None}, 400, "prompt"),
        ({"prompt": ids, "logprobs": 21}, 400, "logprobs"),
        ({"prompt": ids, "logprobs": -3}, 400, "logprobs"),
        ({"prompt": ids, "max_tokens": 4096}, 400, "max_tokens"),
        ({"prompt": ids, "stream": True}, 400, "stream"),
    ]
    for body, status, param in cases:
        r = http.post(COMPLETIONS, json={"model": "smol", **body})
        assert r.status_code == status, body
        assert r.json()["error"]["param"] == param, body
    r = http.post(COMPLETIONS, json={"model": "smol", "prompt": ids, "logprobs": 21})
    assert r.json()["error"]["message"].startswith("Requested sample logprobs of 21")


def test_completions_faults_stats_and_request_log(http: httpx.Client, fake: FakeVLLM) -> None:
    ids = prompt_ids_of(http)
    fake.reset()
    fake.behavior.update(fail_status=503, fail_count=1)
    assert http.post(COMPLETIONS, json={"prompt": ids}).status_code == 503
    fake.behavior.no_choices = True
    assert complete(http, prompt=ids)["choices"] == []
    fake.behavior.no_choices = False
    fake.behavior.reject_param = "seed"
    assert http.post(COMPLETIONS, json={"prompt": ids, "seed": 1}).json()["error"]["param"] == (
        "seed"
    )
    fake.behavior.reject_param = None
    fake.behavior.invalid_json = True
    r = http.post(COMPLETIONS, json={"prompt": ids})
    assert r.status_code == 200
    with pytest.raises(json.JSONDecodeError):
        json.loads(r.text)
    stats = http.get("/_fake/stats").json()
    assert stats["completions"] == 4 and stats["requests"] == 4 and stats["chat_completions"] == 0
    assert (stats["ok"], stats["errors"], stats["injected_failures"]) == (2, 2, 1)
    assert stats["prompt_tokens"] == 2 * len(ids) and stats["in_flight"] == 0
    assert http.get("/_fake/requests").json()[0] == {"prompt": ids}
    assert {e["path"] for e in fake.request_log} == {COMPLETIONS}


def test_completions_consume_scripted_replies(http: httpx.Client, fake: FakeVLLM) -> None:
    fake.behavior.scripted_replies = ["Scripted text.", "Second."]
    ids = prompt_ids_of(http)
    first = complete(http, prompt=ids, return_token_ids=True)["choices"][0]
    assert first["text"] == "Scripted text."
    assert first["token_ids"] == [*TOKENIZER.encode("Scripted text."), EOS_ID]
    assert chat(http)["choices"][0]["message"]["content"] == "Second."
    assert fake.behavior.scripted_replies == []


def test_openai_sdk_parses_completions(sdk: openai.OpenAI) -> None:
    ids = TOKENIZER.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    r = sdk.completions.create(
        model="smol", prompt=ids, logprobs=2, seed=7, extra_body={"return_token_ids": True}
    )
    assert r.id.startswith("cmpl-") and r.choices[0].finish_reason == "stop"
    assert r.choices[0].model_extra["prompt_token_ids"] == ids
    assert len(r.choices[0].logprobs.top_logprobs[0]) == 3
    assert r.usage.completion_tokens == len(r.choices[0].model_extra["token_ids"])


# ----------------------------------------------------------------------------- tools in prompt


def test_tools_in_prompt_renders_the_manifest_into_the_system_turn(
    http: httpx.Client, fake: FakeVLLM
) -> None:
    from rollwire.capture.dialects.hermes import manifest_prompt

    user = [{"role": "user", "content": "hi"}]
    with_default = render_chat(user, tools=[WEATHER_TOOL])
    manifest = manifest_prompt([WEATHER_TOOL])
    assert with_default == render_chat(
        [{"role": "system", "content": f"{DEFAULT_SYSTEM_PROMPT}\n\n{manifest}"}, *user]
    )
    given = [{"role": "system", "content": "Be brief."}, *user]
    assert render_chat(given, tools=[WEATHER_TOOL]) == render_chat(
        [{"role": "system", "content": f"Be brief.\n\n{manifest}"}, *user]
    )
    assert render_chat(user, tools=[]) == render_chat(user)

    plain = chat(http, messages=user, tools=[WEATHER_TOOL])["prompt_token_ids"]
    assert plain == render_chat(user)  # default: the SmolLM2 template has no tool section
    assert prompt_ids_of(http, messages=user, tools=[WEATHER_TOOL]) == plain
    fake.behavior.tools_in_prompt = True
    assert chat(http, messages=user, tools=[WEATHER_TOOL])["prompt_token_ids"] == with_default
    assert prompt_ids_of(http, messages=user, tools=[WEATHER_TOOL]) == with_default


# ----------------------------------------------------------------------------- sglang mode


def test_engine_must_be_vllm_or_sglang(http: httpx.Client, fake: FakeVLLM) -> None:
    assert http.post("/_fake/behavior", json={"engine": "sglang"}).json()["engine"] == "sglang"
    r = http.post("/_fake/behavior", json={"engine": "tgi"})
    assert r.status_code == 400 and "engine" in r.json()["error"]["message"]
    assert fake.behavior.engine == "sglang"
    with pytest.raises(ValueError):
        fake.behavior.update(engine="tgi")
    with pytest.raises(ValueError):
        create_fake_vllm(engine="tgi")
    assert http.post("/_fake/reset").json()["engine"] == "vllm"


def test_sglang_input_ids_are_the_prompt_echoed_on_the_choice(
    http: httpx.Client, fake: FakeVLLM
) -> None:
    ids = prompt_ids_of(http, messages=[{"role": "user", "content": "Another prompt."}])
    vllm_reply = chat(http, kv_transfer_params={"prompt_token_ids": ids})
    fake.behavior.engine = "sglang"
    body = chat(http, input_ids=ids, return_prompt_token_ids=True)
    ch = body["choices"][0]
    assert ch["prompt_token_ids"] == ids and "prompt_token_ids" not in body
    assert ch["response_token_ids"] == vllm_reply["choices"][0]["token_ids"]
    want = [e["logprob"] for e in vllm_reply["choices"][0]["logprobs"]["content"]]
    assert [e["logprob"] for e in ch["logprobs"]["content"]] == want
    assert body["usage"]["prompt_tokens"] == len(ids)
    bare = chat(http, input_ids=ids, return_token_ids=None)["choices"][0]
    assert "prompt_token_ids" not in bare


def test_sglang_reply_shape(http: httpx.Client, fake: FakeVLLM) -> None:
    fake.behavior.engine = "sglang"
    body = chat(http, return_token_ids=None)
    assert list(body) == ["id", "object", "created", "model", "choices", "usage", "metadata"]
    ch = body["choices"][0]
    assert list(ch) == ["index", "message", "logprobs", "finish_reason", "matched_stop"]
    assert list(ch["message"]) == ["role", "content", "reasoning_content", "tool_calls"]
    assert ch["finish_reason"] == "stop" and ch["matched_stop"] == EOS_ID
    assert body["usage"]["reasoning_tokens"] == 0
    # SGLang 0.5.23 (tests/fixtures/sglang-cpu/02): return_token_ids fills both id fields,
    # and logprob entries name tokens by text
    ids = chat(http)["choices"][0]
    assert ids["response_token_ids"][-1] == EOS_ID and "prompt_token_ids" in ids
    assert "token_ids" not in ids
    assert not ids["logprobs"]["content"][0]["token"].startswith("token_id:")
    cut = chat(http, max_tokens=3)["choices"][0]
    assert (cut["finish_reason"], cut["matched_stop"]) == ("length", None)


def test_sglang_ignores_kv_transfer_params(http: httpx.Client, fake: FakeVLLM) -> None:
    fake.behavior.engine = "sglang"
    other = prompt_ids_of(http, messages=[{"role": "user", "content": "Another prompt."}])
    body = chat(http, kv_transfer_params={"prompt_token_ids": other}, return_prompt_token_ids=True)
    assert body["choices"][0]["prompt_token_ids"] == render_chat(BASE["messages"])
    bad = http.post(CHAT, json={**BASE, "input_ids": [1, "x"]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input_ids"


def test_sglang_tokenize_honours_add_generation_prompt(http: httpx.Client, fake: FakeVLLM) -> None:
    # SGLang 0.5.23 (tests/fixtures/sglang-cpu/04, 04c)
    fake.behavior.engine = "sglang"
    r = http.post(
        "/tokenize",
        json={"model": "smol", "messages": BASE["messages"], "add_generation_prompt": False},
    ).json()
    history = render_chat(BASE["messages"], add_generation_prompt=False)
    assert r == {"tokens": history, "count": len(history), "max_model_len": 2048}
    assert http.post("/detokenize", json={"tokens": [1, 2, 198]}).json() == {"text": "\n"}


def test_sglang_tool_call_finishes_with_tool_calls(http: httpx.Client, fake: FakeVLLM) -> None:
    fake.behavior.engine = "sglang"
    messages = [{"role": "user", "content": "Weather in Oslo? CALL_TOOL"}]
    ch = chat(http, messages=messages, tools=[WEATHER_TOOL], max_tokens=128)["choices"][0]
    call = ch["message"]["tool_calls"][0]
    assert call["id"].startswith("call_") and call["index"] == 0
    assert call["function"]["name"] == "get_weather"
    assert (ch["finish_reason"], ch["matched_stop"]) == ("tool_calls", None)
    assert ch["message"]["content"] == "" and ch["response_token_ids"][-1] == EOS_ID


def test_sglang_meta_info_with_return_meta_info(http: httpx.Client, fake: FakeVLLM) -> None:
    fake.behavior.engine = "sglang"
    ch = chat(http, return_meta_info=True)["choices"][0]
    meta = ch["meta_info"]
    assert meta["finish_reason"] == {"type": "stop", "matched": EOS_ID}
    assert [e[1] for e in meta["output_token_logprobs"]] == ch["response_token_ids"]
    assert [e[2] for e in meta["output_token_logprobs"]] == [
        e["token"] for e in ch["logprobs"]["content"]
    ]
    content = ch["logprobs"]["content"]
    assert [e[0] for e in meta["output_token_logprobs"]] == [e["logprob"] for e in content]
    assert [len(t) for t in meta["output_top_logprobs"]] == [3] * len(content)
    assert "meta_info" not in chat(http)["choices"][0]


def test_sglang_stream_has_sglang_chunk_keys(http: httpx.Client, fake: FakeVLLM) -> None:
    fake.behavior.engine = "sglang"
    r = http.post(CHAT, json={**BASE, "stream": True, "stream_options": {"include_usage": True}})
    got = _sse(r.text)
    assert got[-1] == "[DONE]" and "prompt_token_ids" not in got[0]
    tokens = got[1:-2]
    assert all(
        list(c["choices"][0]) == ["index", "delta", "logprobs", "finish_reason", "matched_stop"]
        for c in tokens
    )
    assert tokens[-1]["choices"][0]["matched_stop"] == EOS_ID
    text = "".join(c["choices"][0]["delta"]["content"] for c in tokens)
    assert text == chat(http)["choices"][0]["message"]["content"]
    assert got[-2]["choices"] == [] and got[-2]["usage"]["reasoning_tokens"] == 0


def test_sglang_completions_shape(http: httpx.Client, fake: FakeVLLM) -> None:
    ids = prompt_ids_of(http)
    vllm_reply = complete(http, prompt=ids, logprobs=1, return_token_ids=True)
    fake.behavior.engine = "sglang"
    body = complete(http, prompt=ids, logprobs=1, return_token_ids=True)
    assert list(body) == ["id", "object", "created", "model", "choices", "usage", "metadata"]
    ch = body["choices"][0]
    assert list(ch) == [
        "index",
        "text",
        "logprobs",
        "finish_reason",
        "matched_stop",
        "token_ids",
        "prompt_token_ids",
    ]
    assert ch["prompt_token_ids"] == ids and ch["matched_stop"] == EOS_ID
    assert ch["token_ids"] == vllm_reply["choices"][0]["token_ids"]
    want = vllm_reply["choices"][0]["logprobs"]
    assert ch["logprobs"]["token_logprobs"] == want["token_logprobs"]
    # SGLang 0.5.23 (tests/fixtures/sglang-cpu/05): tokens by text, offsets -1
    assert not any(t.startswith("token_id:") for t in ch["logprobs"]["tokens"])
    assert set(ch["logprobs"]["text_offset"]) == {-1}
    assert list(complete(http, prompt=ids)["choices"][0])[-1] == "matched_stop"
