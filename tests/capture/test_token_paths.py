"""The token-in engine paths (pure): request shapes, echoes, and the completions path's chat
reply. Completions and SGLang replies are shaped from vLLM's completion protocol and SGLang's
OpenAI protocol (CompletionResponseChoice / ChatCompletionResponseChoice), with the sampled
ids and logprobs of the recorded vLLM tool call (fixture 05a)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollwire.capture.ingest import ingest_chat_reply
from rollwire.capture.rollout import CaptureLevel
from rollwire.capture.splice import Fallback
from rollwire.capture.token_paths import (
    PATH_ORDER,
    PATHS,
    TOOL_PARSERS,
    Parsers,
    chat_from_completion,
    completion_request,
    normalise_reply,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-cpu"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]


def _fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def completion_of(chat_fixture: str, text: str) -> dict:
    """The completions reply vLLM gives for the same sample as a recorded chat reply."""
    chat = _fixture(chat_fixture)["response"]["body"]
    choice = chat["choices"][0]
    content = choice["logprobs"]["content"]
    return {
        "id": "cmpl-9f1e",
        "object": "text_completion",
        "created": chat["created"],
        "model": chat["model"],
        "choices": [
            {
                "index": 0,
                "text": text,
                "logprobs": {
                    "text_offset": list(range(len(content))),
                    "token_logprobs": [e["logprob"] for e in content],
                    "tokens": [e["token"] for e in content],
                    "top_logprobs": [
                        {e["token"]: e["logprob"]}
                        | {a["token"]: a["logprob"] for a in e["top_logprobs"]}
                        for e in content
                    ],
                },
                "finish_reason": choice["finish_reason"],
                "stop_reason": None,
                "token_ids": choice["token_ids"],
                "prompt_logprobs": None,
                "prompt_token_ids": chat["prompt_token_ids"],
            }
        ],
        "usage": chat["usage"],
    }


def test_paths_are_ordered_chat_routes_first():
    assert PATH_ORDER == ("vllm_chat", "sglang_chat", "completions")
    assert set(PATHS) == set(PATH_ORDER)


def test_vllm_chat_path_sends_ids_in_kv_transfer_params_and_reads_the_top_level_echo():
    path = PATHS["vllm_chat"]
    body = path.request({"model": "m", "messages": []}, [1, 2, 3], None)
    assert body["kv_transfer_params"] == {"prompt_token_ids": [1, 2, 3]}
    assert path.echoed({"prompt_token_ids": [1, 2, 3]}) == [1, 2, 3]
    assert path.echoed({"prompt_token_ids": None}) is None


def test_sglang_chat_path_sends_input_ids_and_reads_the_choice_echo():
    path = PATHS["sglang_chat"]
    body = path.request({"model": "m", "messages": []}, [5, 6], None)
    assert body["input_ids"] == [5, 6]
    assert body["return_prompt_token_ids"] is True
    assert path.echoed({"choices": [{"prompt_token_ids": [5, 6]}]}) == [5, 6]


def test_completions_request_carries_the_ids_and_the_sampling_fields():
    body = {
        "model": "smol",
        "messages": [],
        "temperature": 1.3,
        "seed": 7,
        "top_logprobs": 3,
        "max_tokens": 40,
        "tools": TOOLS,
    }
    out = completion_request(body, [1, 2, 3], 2048)
    assert out["prompt"] == [1, 2, 3]
    assert out["max_tokens"] == 40
    assert (out["temperature"], out["seed"], out["logprobs"]) == (1.3, 7, 3)
    assert out["add_special_tokens"] is False
    assert out["return_token_ids"] is True
    assert out["skip_special_tokens"] is False  # the parser needs the tool markup
    assert "messages" not in out


def test_completions_request_keeps_the_callers_other_sampling_controls():
    body = {"model": "m", "max_tokens": 8, "stop_token_ids": [7], "top_k": 5, "min_p": 0.1}
    out = completion_request(body, [1, 2], 2048)
    assert (out["stop_token_ids"], out["top_k"], out["min_p"]) == ([7], 5, 0.1)


def test_completions_without_max_tokens_gets_the_room_left_in_the_context():
    out = completion_request({"model": "m"}, list(range(100)), 2048)
    assert out["max_tokens"] == 1948


def test_completions_without_max_tokens_or_context_length_falls_back():
    with pytest.raises(Fallback) as err:
        completion_request({"model": "m"}, [1, 2], None)
    assert err.value.reason == "max_tokens_unknown"


def test_completions_for_a_prompt_that_fills_the_context_falls_back():
    with pytest.raises(Fallback) as err:
        completion_request({"model": "m"}, list(range(2048)), 2048)
    assert err.value.reason == "context_full"


def test_completions_refuse_a_forced_tool_choice():
    refuses = PATHS["completions"].refuses
    assert refuses({"tools": TOOLS, "tool_choice": "required"}) == "tool_choice_forced"
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert refuses({"tools": TOOLS, "tool_choice": named}) == "tool_choice_forced"
    assert refuses({"tools": TOOLS, "tool_choice": "auto"}) is None


def test_completions_refuse_a_response_format():
    refuses = PATHS["completions"].refuses
    assert refuses({"response_format": {"type": "json_object"}}) == "response_format"


def test_completion_tool_call_text_becomes_a_chat_tool_call_with_tool_calls_finish():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lima"}}\n</tool_call>'
    reply = completion_of("05a_tool_call_named.json", text)
    chat = chat_from_completion(reply, {"tools": TOOLS, "top_logprobs": 3}, Parsers())
    choice = chat["choices"][0]
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Lima"}
    assert choice["message"]["content"] is None
    assert choice["finish_reason"] == "tool_calls"
    assert chat["object"] == "chat.completion"


def test_completion_reply_keeps_the_engine_ids_and_logprobs_for_the_capture():
    reply = completion_of("05a_tool_call_named.json", "<tool_call>\n{}\n</tool_call>")
    chat = chat_from_completion(reply, {"tools": TOOLS, "top_logprobs": 3}, Parsers())
    recorded = _fixture("05a_tool_call_named.json")["response"]["body"]
    assert chat["prompt_token_ids"] == recorded["prompt_token_ids"]
    assert chat["choices"][0]["token_ids"] == recorded["choices"][0]["token_ids"]
    content = chat["choices"][0]["logprobs"]["content"]
    expected = recorded["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in content] == [e["token"] for e in expected]
    assert [e["logprob"] for e in content] == [e["logprob"] for e in expected]
    assert all(len(e["top_logprobs"]) <= 3 for e in content)


def test_completion_reply_ingests_as_a_trainable_turn():
    reply = completion_of("02_chat_T1.0_token_ids_logprobs.json", "Hello there")
    chat = chat_from_completion(reply, {"top_logprobs": 3}, Parsers())
    ingested = ingest_chat_reply("n1", chat, capture_level=CaptureLevel.TOKENS)
    assert ingested.turn is not None
    assert ingested.turn.logprobs_ok
    assert ingested.turn.sampled_ids.tolist() == reply["choices"][0]["token_ids"]


def test_completion_text_without_tools_is_plain_content():
    reply = completion_of("02_chat_T1.0_token_ids_logprobs.json", "Just text.")
    chat = chat_from_completion(reply, {}, Parsers())
    message = chat["choices"][0]["message"]
    assert message["content"] == "Just text." and "tool_calls" not in message


def test_completion_reply_has_the_shape_of_a_recorded_vllm_chat_reply():
    recorded = _fixture("02_chat_T1.0_token_ids_logprobs.json")["response"]["body"]
    reply = completion_of("02_chat_T1.0_token_ids_logprobs.json", "Just text.")
    chat = chat_from_completion(reply, {"top_logprobs": 3}, Parsers())
    assert list(chat) == list(recorded)
    assert list(chat["choices"][0]) == list(recorded["choices"][0])
    assert list(chat["choices"][0]["message"]) == list(recorded["choices"][0]["message"])
    entry, want = chat["choices"][0]["logprobs"]["content"][0], recorded["choices"][0]["logprobs"]
    assert list(entry) == list(want["content"][0])


def test_think_parser_splits_reasoning_from_content():
    reply = completion_of("02_chat_T1.0_token_ids_logprobs.json", "<think>\nhmm\n</think>\n\nYes.")
    chat = chat_from_completion(reply, {}, Parsers(reasoning="think"))
    message = chat["choices"][0]["message"]
    assert message["reasoning"] == "hmm"
    assert message["content"] == "Yes."


def test_unknown_parser_names_are_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown tool parser 'qwen9'.*hermes"):
        Parsers(tool="qwen9")


def test_sglang_reply_is_normalised_to_vllm_shape():
    reply = {
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hi"},
                "logprobs": {
                    "content": [
                        {"token": "Hi", "logprob": -0.5, "bytes": [72, 105], "top_logprobs": []},
                        {"token": "", "logprob": -0.1, "bytes": [], "top_logprobs": []},
                    ]
                },
                "finish_reason": "stop",
                "matched_stop": 2,
                "prompt_token_ids": [1, 9, 2],
                "token_ids": [301, 2],
                "meta_info": {
                    "output_token_logprobs": [[-0.5, 301, None], [-0.1, 2, None]],
                    "output_top_logprobs": [[[-0.5, 301, None]], [[-0.1, 2, None]]],
                },
            }
        ],
    }
    out = normalise_reply(reply)
    assert out["prompt_token_ids"] == [1, 9, 2]
    content = out["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in content] == ["token_id:301", "token_id:2"]
    assert [e["logprob"] for e in content] == [-0.5, -0.1]
    ingested = ingest_chat_reply("n1", out, capture_level=CaptureLevel.TOKENS)
    assert ingested.turn is not None and ingested.turn.logprobs_ok


def test_vllm_reply_is_left_unchanged_by_normalisation():
    reply = _fixture("02_chat_T1.0_token_ids_logprobs.json")["response"]["body"]
    assert normalise_reply(reply) is reply


def test_hermes_parser_serialises_arguments_as_vllm_does():
    # fixture 05a: the model wrote a JSON string as arguments; vLLM returns it JSON-encoded
    recorded = _fixture("05a_tool_call_named.json")["response"]["body"]["choices"][0]
    text = '<tool_call>\n{"name": "get_weather", "arguments": "lema"}\n</tool_call>'
    content, calls = TOOL_PARSERS["hermes"](text)
    expected = recorded["message"]["tool_calls"][0]["function"]
    assert calls[0]["function"] == {"name": expected["name"], "arguments": expected["arguments"]}
    assert content is None


def test_hermes_parser_keeps_the_text_before_the_first_call_verbatim():
    content, calls = TOOL_PARSERS["hermes"]('Sure.\n<tool_call>{"name": "f", "arguments": {}}')
    assert content == "Sure.\n"
    assert [c["function"]["name"] for c in calls] == ["f"]  # an unclosed last call still counts


def test_hermes_parser_reads_nothing_when_one_call_is_not_json():
    text = '<tool_call>{"name": "f", "arguments": {}}</tool_call><tool_call>{oops</tool_call>'
    assert TOOL_PARSERS["hermes"](text) == (text, [])


def test_hermes_parser_writes_non_ascii_arguments_unescaped():
    _, calls = TOOL_PARSERS["hermes"](
        '<tool_call>{"name": "f", "arguments": {"c": "Zürich"}}</tool_call>'
    )
    assert calls[0]["function"]["arguments"] == '{"c": "Zürich"}'


def test_real_vllm_completions_reply_reads_as_the_chat_reply_for_the_same_sample():
    # 12c (completions on a token prompt) and 12e (chat whose render is that prompt), same seed:
    # real vLLM 0.32 sampled the same ids; the converted reply must carry what chat carried
    completion = _fixture("12c_completions_token_prompt.json")["response"]["body"]
    chat = _fixture("12e_chat_same_prompt_as_12c.json")["response"]["body"]
    out = chat_from_completion(completion, {"top_logprobs": 3}, Parsers())
    got, want = out["choices"][0], chat["choices"][0]
    assert out["prompt_token_ids"] == chat["prompt_token_ids"]
    assert got["token_ids"] == want["token_ids"]
    assert got["message"]["content"] == want["message"]["content"]
    assert got["finish_reason"] == want["finish_reason"]
    for a, b in zip(got["logprobs"]["content"], want["logprobs"]["content"], strict=True):
        assert (a["token"], a["logprob"]) == (b["token"], b["logprob"])
        assert a["top_logprobs"] == b["top_logprobs"]


def test_real_vllm_echoes_the_token_prompt_on_chat_and_completions():
    ids = _fixture("12a0_tokenize_say_no_please.json")["response"]["body"]["tokens"]
    chat = _fixture("12a_chat_kv_transfer_prompt_token_ids.json")
    assert chat["request"]["body"]["kv_transfer_params"]["prompt_token_ids"] == ids
    assert PATHS["vllm_chat"].echoed(chat["response"]["body"]) == ids
    completion = _fixture("12c_completions_token_prompt.json")["response"]["body"]
    assert PATHS["completions"].echoed(completion) == ids


def test_real_vllm_completion_text_has_no_close_text_when_it_stops_on_eos():
    reply = _fixture("12d2_completions_token_prompt_stops_on_eos.json")["response"]["body"]
    assert reply["choices"][0]["token_ids"][-1] == 2
    out = chat_from_completion(reply, {"tools": TOOLS}, Parsers())
    assert out["choices"][0]["message"]["content"] == reply["choices"][0]["text"]


SGLANG = Path(__file__).resolve().parents[1] / "fixtures" / "sglang-cpu"


def _sglang(name: str) -> dict:
    return json.loads((SGLANG / name).read_text())


def test_real_sglang_chat_reply_normalises_to_a_trainable_turn():
    reply = _sglang("02_chat_token_ids.json")["response"]["body"]
    choice = reply["choices"][0]
    out = normalise_reply(reply)
    assert out["prompt_token_ids"] == choice["prompt_token_ids"]
    assert out["choices"][0]["token_ids"] == choice["response_token_ids"]
    content = out["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in content] == [f"token_id:{t}" for t in choice["response_token_ids"]]
    # the logprobs SGLang paired with each id are the ones it wrote by text
    assert [e["logprob"] for e in content] == [e["logprob"] for e in choice["logprobs"]["content"]]
    ingested = ingest_chat_reply("n1", out, capture_level=CaptureLevel.TOKENS)
    assert ingested.turn is not None and ingested.turn.logprobs_ok


def test_real_sglang_uses_input_ids_and_echoes_them_on_the_choice():
    asked = _sglang("03_chat_input_ids.json")
    plain = _sglang("02_chat_token_ids.json")["response"]["body"]["choices"][0]
    sent = asked["request"]["body"]["input_ids"]
    reply = asked["response"]["body"]
    assert PATHS["sglang_chat"].echoed(reply) == sent
    # the messages said something else: the ids were the prompt
    assert reply["choices"][0]["response_token_ids"] == plain["response_token_ids"]


def test_real_sglang_completions_cannot_carry_logprobs_by_id():
    # its completions name tokens by text even when asked for ids (05b): no id pairing
    reply = _sglang("05b_completions_rollwire_shape_tokens_as_ids.json")["response"]["body"]
    out = chat_from_completion(reply, {"top_logprobs": 0}, Parsers())
    ingested = ingest_chat_reply("n1", out, capture_level=CaptureLevel.TOKENS)
    assert ingested.turn is not None and not ingested.turn.logprobs_ok
