"""The capture proxy end to end: the official openai SDK -> proxy (uvicorn) -> fake vLLM (uvicorn)."""

from __future__ import annotations

import anyio
import httpx
import openai
import pytest

from rollwire.capture.rollout import CaptureLevel
from tests.capture.conftest import Proxy, start_proxy
from tests.fakes.vllm import CALL_TOOL_MARKER

IDS = {"return_token_ids": True}


def codes(findings: list[dict]) -> set[str]:
    return {f["code"] for f in findings}


def test_sdk_call_is_captured_with_the_engines_own_ids(proxy: Proxy):
    sid = proxy.open_session()
    reply = proxy.client(sid).chat.completions.create(
        model="whatever", messages=[{"role": "user", "content": "hello"}], extra_body=IDS
    )
    doc = proxy.rollout(sid)
    (turn,) = doc["turns"]
    assert turn["prompt_token_ids"] == reply.model_extra["prompt_token_ids"]
    assert turn["completion_token_ids"] == reply.choices[0].model_extra["token_ids"]
    assert doc["capture_level"] == "tokens" and doc["rollout_type"] == "train"
    assert doc["version"] == "rollwire.rollout/1"


def test_multi_turn_conversation_is_one_trainable_sequence(proxy: Proxy):
    sid = proxy.open_session()
    client = proxy.client(sid)
    messages = [{"role": "user", "content": "tell me about the sea"}]
    replies = []
    for question in ("and rivers?", "and lakes?", None):
        r = client.chat.completions.create(model="m", messages=messages, extra_body=IDS)
        replies.append(r)
        messages.append({"role": "assistant", "content": r.choices[0].message.content})
        if question:
            messages.append({"role": "user", "content": question})
    doc = proxy.rollout(sid)
    assert doc["stats"]["trainable_sequences"] == 1 and doc["stats"]["roots"] == 1
    (seq,) = doc["sequences"]
    last = replies[-1]
    assert (
        seq["input_ids"]
        == last.model_extra["prompt_token_ids"] + last.choices[0].model_extra["token_ids"]
    )
    assert [s["node_id"] for s in seq["turn_spans"]] == ["t1", "t2", "t3"]
    for span, r in zip(seq["turn_spans"], replies, strict=True):
        assert (
            seq["input_ids"][span["start"] : span["end"]] == r.choices[0].model_extra["token_ids"]
        )
        assert seq["loss_mask"][span["start"] : span["end"]] == [1] * (span["end"] - span["start"])
    assert sum(seq["loss_mask"]) == sum(len(r.choices[0].model_extra["token_ids"]) for r in replies)


def test_async_sdk_concurrent_sessions_stay_separate(proxy: Proxy):
    sids = [proxy.open_session(metadata={"i": i}) for i in range(8)]

    async def converse(sid: str) -> None:
        async with proxy.async_client(sid) as client:
            messages = [{"role": "user", "content": f"session {sid[-6:]}"}]
            for _ in range(3):
                r = await client.chat.completions.create(model="m", messages=messages)
                messages += [
                    {"role": "assistant", "content": r.choices[0].message.content},
                    {"role": "user", "content": "go on"},
                ]

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            for sid in sids:
                tg.start_soon(converse, sid)

    anyio.run(main)
    for sid in sids:
        doc = proxy.rollout(sid)
        assert doc["stats"]["turns"] == 3 and doc["stats"]["trainable_sequences"] == 1


def test_streaming_caller_gets_a_well_formed_replay(proxy: Proxy):
    sid = proxy.open_session()
    client = proxy.client(sid)
    messages = [{"role": "user", "content": "stream please"}]
    plain = client.chat.completions.create(model="m", messages=messages, seed=7)
    chunks = list(
        client.chat.completions.create(
            model="m",
            messages=messages,
            seed=7,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    assert [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ] == ["stop"]
    assert (
        chunks[-1].choices == []
        and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    )
    assert all(body["stream"] is False for body in proxy.upstream.fake.requests)
    assert proxy.rollout(sid)["stats"]["turns"] == 2


def test_streamed_tool_call_reassembles_in_the_sdk(proxy: Proxy):
    sid = proxy.open_session()
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
    ]
    with proxy.client(sid).chat.completions.stream(
        model="m",
        messages=[{"role": "user", "content": f"weather? {CALL_TOOL_MARKER}"}],
        tools=tools,
    ) as stream:
        final = stream.get_final_completion()
    call = final.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and "city" in call.function.arguments


@pytest.mark.anyio
async def test_async_streaming_is_replayed(proxy: Proxy):
    sid = proxy.open_session()
    async with proxy.async_client(sid) as client:
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text
    assert proxy.rollout(sid)["stats"]["turns"] == 1


def test_unknown_key_gets_401_and_nothing_is_forwarded(proxy: Proxy):
    with pytest.raises(openai.AuthenticationError):
        proxy.client("rw-not-a-session").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}]
        )
    resp = httpx.post(
        f"{proxy.url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}
    )
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_api_key"
    assert proxy.upstream.fake.requests == []


def test_upstream_gets_ids_logprobs_single_unstreamed_sample(proxy: Proxy):
    sid = proxy.open_session()
    proxy.client(sid).chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "x"}], n=2, stream=False
    )
    (sent,) = proxy.upstream.fake.requests
    assert sent["model"] == "smol"  # the served name is substituted
    assert sent["return_token_ids"] is True and sent["logprobs"] is True
    assert sent["n"] == 1 and sent["stream"] is False
    assert "n_forced" in codes(proxy.rollout(sid)["findings"])


def test_distribution_knobs_are_forced_to_no_op_and_recorded(proxy: Proxy):
    sid = proxy.open_session()
    proxy.client(sid).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "x"}],
        top_p=0.9,
        presence_penalty=0.5,
        temperature=0.7,
    )
    (sent,) = proxy.upstream.fake.requests
    assert sent["top_p"] == 1.0 and sent["presence_penalty"] == 0.0 and sent["top_k"] == -1
    assert sent["temperature"] == 0.7
    (turn,) = proxy.rollout(sid)["turns"]
    assert turn["requested_params"]["top_p"] == 0.9 and turn["applied_params"]["top_p"] == 1.0
    forced = [f for f in turn["findings"] if f["code"] == "sampling_param_forced"]
    assert {f["message"].split("=")[0] for f in forced} == {"top_p", "presence_penalty"}


def test_empty_tools_list_is_dropped_before_forwarding(proxy: Proxy):
    sid = proxy.open_session()
    r = proxy.client(sid).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}], tools=[]
    )
    assert r.choices[0].message.content
    assert "tools" not in proxy.upstream.fake.requests[0]


def test_caller_that_did_not_ask_for_logprobs_does_not_get_them(proxy: Proxy):
    sid = proxy.open_session()
    r = proxy.client(sid).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}]
    )
    assert r.choices[0].logprobs is None
    assert proxy.rollout(sid)["turns"][0]["logprobs"]  # ...but the capture has them


def test_upstream_500_reaches_caller_and_is_recorded(proxy: Proxy):
    sid = proxy.open_session()
    proxy.upstream.fake.behavior.update(fail_status=500, fail_count=1)
    with pytest.raises(openai.InternalServerError):
        proxy.client(sid).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}]
        )
    summary = httpx.get(f"{proxy.url}/sessions/{sid}", headers=proxy.admin).json()
    assert summary["errors"] == 1 and summary["turns"] == 0
    assert "upstream_http" in codes(summary["findings"])
    # the next call goes through: nothing was corrupted
    proxy.client(sid).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}]
    )
    assert proxy.rollout(sid)["stats"]["turns"] == 1


def test_upstream_400_is_passed_through_in_openai_shape(proxy: Proxy):
    sid = proxy.open_session()
    proxy.upstream.fake.behavior.update(reject_param="seed")
    with pytest.raises(openai.BadRequestError) as err:
        proxy.client(sid).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], seed=3
        )
    assert err.value.body["param"] == "seed"


def test_upstream_no_choices_is_an_error_not_a_node(proxy: Proxy):
    sid = proxy.open_session()
    proxy.upstream.fake.behavior.update(no_choices=True)
    with pytest.raises(openai.APIStatusError) as err:
        proxy.client(sid).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}]
        )
    assert err.value.status_code == 502
    doc = proxy.rollout(sid)
    assert doc["stats"]["turns"] == 0 and "no_choices" in codes(doc["findings"])


def test_upstream_invalid_json_is_a_502(proxy: Proxy):
    sid = proxy.open_session()
    proxy.upstream.fake.behavior.update(invalid_json=True)
    with pytest.raises(openai.APIStatusError) as err:
        proxy.client(sid).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}]
        )
    assert err.value.status_code == 502 and "not JSON" in err.value.message


def test_upstream_timeout_is_a_504(upstream):
    upstream.fake.behavior.update(delay_s=2.0)
    cap, server = start_proxy(upstream.url, timeout_s=0.3, model="smol")
    with server as url:
        p = Proxy(cap, url, upstream)
        sid = p.open_session()
        with pytest.raises(openai.APIStatusError) as err:
            p.client(sid).chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x"}]
            )
        assert err.value.status_code == 504
        summary = httpx.get(f"{url}/sessions/{sid}", headers=p.admin).json()
        assert "upstream_timeout" in codes(summary["findings"])


def test_upstream_down_is_a_502_and_the_proxy_survives():
    cap, server = start_proxy("http://127.0.0.1:9", model="smol")
    with server as url:
        p = Proxy(cap, url, None)  # type: ignore[arg-type]
        sid = p.open_session()
        with pytest.raises(openai.APIStatusError) as err:
            p.client(sid).chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x"}]
            )
        assert err.value.status_code == 502 and "cannot reach upstream" in err.value.message
        assert httpx.get(f"{url}/health").json()["status"] == "ok"


def test_shifted_logprobs_mask_the_turn_end_to_end_with_on_bad_data_mask(upstream):
    cap, server = start_proxy(f"{upstream.url}/v1", on_bad_data="mask")
    with server as url:
        proxy = Proxy(cap, url, upstream)
        sid = proxy.open_session()
        upstream.fake.behavior.update(shift_logprobs=True)
        proxy.client(sid).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}]
        )
        doc = proxy.rollout(sid)
    (turn,) = doc["turns"]
    assert turn["trainable"] is False and turn["logprobs"] is None and turn["completion_token_ids"]
    assert "logprob_id_mismatch" in codes(turn["findings"])
    assert doc["stats"]["trainable_sequences"] == 0


def test_shifted_logprobs_are_a_502_by_default(proxy: Proxy):
    sid = proxy.open_session()
    proxy.upstream.fake.behavior.update(shift_logprobs=True)
    with pytest.raises(openai.APIStatusError) as err:
        proxy.client(sid).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}]
        )
    assert err.value.status_code == 502
    assert err.value.body["message"].startswith(
        "upstream reply unusable for training: logprob_id_mismatch: position 0: "
    )
    assert err.value.body["type"] == "upstream_error"
    assert err.value.body["code"] == "logprob_id_mismatch"
    doc = proxy.rollout(sid)
    assert doc["turns"] == [] and doc["sequences"] == []
    assert "logprob_id_mismatch" in codes(doc["findings"])


def test_null_logprob_from_engine_is_refused_and_does_not_break_export(proxy: Proxy):
    sid = proxy.open_session()
    proxy.upstream.fake.behavior.update(null_logprob_at=2)
    with pytest.raises(openai.APIStatusError) as err:
        proxy.client(sid).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}]
        )
    assert err.value.status_code == 502 and "logprob_invalid: position 2:" in err.value.message
    proxy.upstream.fake.behavior.update(null_logprob_at=None)
    proxy.client(sid).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}]
    )
    doc = proxy.rollout(sid)
    (turn,) = doc["turns"]
    assert turn["node_id"] == "t2" and turn["trainable"]
    assert "logprob_invalid" in codes(doc["findings"])
    assert doc["stats"]["trainable_sequences"] == 1


def test_noncanonical_split_is_counted_as_retokenized(proxy: Proxy):
    sid = proxy.open_session()
    proxy.upstream.fake.behavior.update(noncanonical_split=True)
    client = proxy.client(sid)
    messages = [{"role": "user", "content": "x"}]
    r = client.chat.completions.create(model="m", messages=messages)
    messages += [
        {"role": "assistant", "content": r.choices[0].message.content},
        {"role": "user", "content": "y"},
    ]
    client.chat.completions.create(model="m", messages=messages)
    doc = proxy.rollout(sid)
    assert doc["stats"]["retokenized"] == 1 and doc["stats"]["trainable_sequences"] == 2
    assert doc["turns"][1]["retokenized_from"] == "t1"


def test_auxiliary_header_marks_the_call(proxy: Proxy):
    sid = proxy.open_session()
    proxy.client(sid, default_headers={"X-Rollwire-Role": "auxiliary"}).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "title?"}]
    )
    (turn,) = proxy.rollout(sid)["turns"]
    assert turn["auxiliary"] is True and turn["role"] == "auxiliary" and turn["trainable"] is False


def test_max_model_calls_refuses_further_calls(proxy: Proxy):
    sid = proxy.open_session(max_model_calls=1)
    client = proxy.client(sid)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert len(proxy.upstream.fake.requests) == 1


def test_text_tier_proxy_produces_eval_rollouts(upstream):
    cap, server = start_proxy(upstream.url, capture_level=CaptureLevel.TEXT)
    with server as url:
        p = Proxy(cap, url, upstream)
        sid = p.open_session()
        p.client(sid).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}]
        )
        doc = p.rollout(sid)
    assert doc["rollout_type"] == "eval" and doc["stats"]["trainable_sequences"] == 0
    assert "return_token_ids" not in upstream.fake.requests[0]


def test_certified_param_fix_is_applied_to_every_forwarded_request(upstream):
    upstream.fake.behavior.update(reject_param="top_k")
    cap, server = start_proxy(upstream.url, param_fixes=("top_k",))
    with server as url:
        p = Proxy(cap, url, upstream)
        sid = p.open_session()
        p.client(sid).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}]
        )
        (turn,) = p.rollout(sid)["turns"]
    assert "top_k" not in upstream.fake.requests[0]
    assert "param_fix_applied" in codes(turn["findings"])


def test_an_output_cap_beyond_the_context_is_clamped_to_the_room_the_prompt_leaves(proxy: Proxy):
    """claude-code asks for 32k-64k tokens; the engine's context is 2048 here."""
    sid = proxy.open_session()
    reply = proxy.client(sid).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hello"}], max_tokens=32000, extra_body=IDS
    )
    n_prompt = len(reply.model_extra["prompt_token_ids"])
    chat_calls = [r for r in proxy.upstream.fake.requests if "messages" in r and "max_tokens" in r]
    (sent,) = chat_calls
    assert sent["max_tokens"] == proxy.upstream.fake.max_model_len - n_prompt
    (turn,) = proxy.rollout(sid)["turns"]
    assert turn["requested_params"]["max_tokens"] == 32000
    assert turn["applied_params"]["max_tokens"] == sent["max_tokens"]
    (note,) = [f for f in turn["findings"] if f["code"] == "max_tokens_clamped"]
    assert note["level"] == "INFO" and "32000" in note["message"]


def test_an_output_cap_that_fits_is_sent_as_asked_without_measuring_the_prompt(proxy: Proxy):
    sid = proxy.open_session()
    proxy.client(sid).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hello"}], max_tokens=100
    )
    (sent,) = proxy.upstream.fake.requests
    assert sent["max_tokens"] == 100
    assert not [r for r in proxy.upstream.fake.request_log if r.get("path") == "/tokenize"]
    (turn,) = proxy.rollout(sid)["turns"]
    assert "max_tokens_clamped" not in codes(turn["findings"])
