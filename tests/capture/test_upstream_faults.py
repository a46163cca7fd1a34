"""The upstream fault suite: every fault of :mod:`tests.fakes.faults` driven through every dialect
the proxy serves (OpenAI chat and Responses, Anthropic messages, Google generateContent), whole
and streamed, with each dialect's official SDK as the client (``max_retries=0``).

What each fault must give:

* an HTTP-level fault (an error status, a hang, a cut or malformed body, an event stream where
  JSON was asked): the SDK raises its own status error, in the dialect's error shape, with the
  proxy's status and a message naming the fault, within the configured upstream timeout; the
  failure is a finding (and an error) on the session; no turn is recorded; the next call works.
  An engine's error status is passed on as that status with its ``Retry-After`` (never waited
  on by the proxy); anything else is a 502, or a 504 when the engine did not answer in time.
* a data-level fault (ids and logprobs that disagree, no prompt ids, a ``NaN`` logprob, another
  model's reply) at the tokens tier: by default the same as an HTTP-level fault, a 502 whose
  message names the finding (``upstream reply unusable for training: <code>: ...``), recorded on
  the session, no turn, the next call trains. With ``on_bad_data="mask"`` the agent gets its
  reply instead, the turn is recorded with a finding naming the fault, and none of its tokens
  is ever a loss target in any exported sequence. An engine certified text-only (eval tier) is
  unaffected either way.
"""

from __future__ import annotations

import copy
import dataclasses
import ssl
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import httpx2
import numpy as np
import openai
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types

from rollwire.capture.proxy import CaptureProxy, _check_reply_model, _malformed_reply
from rollwire.capture.rollout import CaptureLevel, Turn, ids_array
from tests.capture.conftest import start_proxy
from tests.fakes import faults
from tests.fakes.faults import (
    DATA_FAULTS,
    OTHER_MODEL,
    RETRY_AFTER,
    TRANSPORT_FAULTS,
    FaultyVLLM,
)
from tests.fakes.serve import serve_in_thread
from tests.fakes.vllm import EOS_ID

# The proxy's upstream timeout in this suite: short, so that a hang costs little.
TIMEOUT_S = 1.5
# What a fault may take on top of the timeout (a loaded 2-core machine).
SLACK_S = 3.0


@dataclass
class Rig:
    proxy: CaptureProxy
    url: str
    upstream: FaultyVLLM
    # One connection pool for every client of the suite (an SDK client builds its own, with an
    # SSL context, which costs more than the call it makes here).
    http: httpx.Client
    http2: httpx2.Client  # the anthropic SDK's (it is built on httpx2)
    upstream_url: str

    def open_session(self) -> str:
        resp = self.http.post(f"{self.url}/sessions", headers=self._admin)
        resp.raise_for_status()
        return resp.json()["session_id"]

    def summary(self, sid: str) -> dict[str, Any]:
        resp = self.http.get(f"{self.url}/sessions/{sid}", headers=self._admin)
        resp.raise_for_status()
        return resp.json()

    def rollout(self, sid: str) -> dict[str, Any]:
        resp = self.http.get(f"{self.url}/sessions/{sid}/rollout", headers=self._admin)
        resp.raise_for_status()
        return resp.json()

    @property
    def _admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.proxy.admin_key}"}


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    faulty = FaultyVLLM()
    with serve_in_thread(faulty.app) as upstream_url:
        cap, server = start_proxy(f"{upstream_url}/v1", timeout_s=TIMEOUT_S)
        with server as url, httpx.Client(timeout=60.0) as http, httpx2.Client(timeout=60.0) as h2:
            yield Rig(cap, url, faulty, http, h2, upstream_url)


@pytest.fixture
def faulty(rig: Rig) -> Iterator[Rig]:
    rig.upstream.set(None)
    rig.upstream.served.clear()
    rig.upstream.fake.reset()
    yield rig
    rig.upstream.set(None)


# ---- one call in each dialect ---------------------------------------------------------------


def _chat(rig: Rig, sid: str, stream: bool) -> str:
    client = openai.OpenAI(
        base_url=f"{rig.url}/v1", api_key=sid, max_retries=0, http_client=rig.http
    )
    messages = [{"role": "user", "content": "tell me about the sea"}]
    if not stream:
        reply = client.chat.completions.create(model="m", messages=messages)
        return reply.choices[0].message.content
    chunks = list(client.chat.completions.create(model="m", messages=messages, stream=True))
    assert chunks[-1].choices[0].finish_reason == "stop"
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def _responses(rig: Rig, sid: str, stream: bool) -> str:
    client = openai.OpenAI(
        base_url=f"{rig.url}/v1", api_key=sid, max_retries=0, http_client=rig.http
    )
    if not stream:
        return client.responses.create(model="m", input="tell me about the sea").output_text
    events = list(client.responses.create(model="m", input="tell me about the sea", stream=True))
    assert events[-1].type == "response.completed"
    return events[-1].response.output_text


def _anthropic(rig: Rig, sid: str, stream: bool) -> str:
    client = anthropic.Anthropic(
        base_url=rig.url, api_key=sid, max_retries=0, http_client=rig.http2
    )
    request = {
        "model": "claude-sonnet-4-6",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "tell me about the sea"}],
    }
    if not stream:
        return client.messages.create(**request).content[0].text
    events = list(client.messages.create(**request, stream=True))
    assert events[-1].type == "message_stop"
    return "".join(e.delta.text for e in events if e.type == "content_block_delta")


_SSL = ssl.create_default_context()


def _google(rig: Rig, sid: str, stream: bool) -> str:
    options = genai_types.HttpOptions(
        base_url=rig.url,
        api_version="v1beta",
        httpx_client=rig.http,
        # a client builds three SSL contexts unless given one (~0.2 s each time)
        client_args={"verify": _SSL},
        async_client_args={"verify": _SSL, "ssl": _SSL},
    )
    models = genai.Client(api_key=sid, http_options=options).models
    if not stream:
        return models.generate_content(model="m", contents="tell me about the sea").text
    chunks = list(models.generate_content_stream(model="m", contents="tell me about the sea"))
    return "".join(c.text or "" for c in chunks)


CALLS: dict[str, Callable[[Rig, str, bool], str]] = {
    "chat": _chat,
    "responses": _responses,
    "anthropic": _anthropic,
    "google": _google,
}
MODES = [(d, s) for d in CALLS for s in (False, True)]
MODE_IDS = [f"{d}-{'stream' if s else 'whole'}" for d, s in MODES]


# ---- each dialect's error shape -------------------------------------------------------------


@dataclass
class Raised:
    status: int
    message: str
    kind: str  # the error's type (OpenAI, Anthropic) or status (Google)
    headers: httpx.Headers


# The error type each dialect gives a status (the engine's own type on the chat route).
ANTHROPIC_TYPES = {
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    504: "timeout_error",
}
RESPONSES_TYPES = {
    429: "rate_limit_error",
    500: "server_error",
    502: "server_error",
    504: "server_error",
}
GOOGLE_STATUS = {
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    502: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def _raised(dialect: str, exc: BaseException) -> Raised:
    """The status, message and type of the SDK's own error, checked against the dialect's shape."""
    if dialect in ("chat", "responses"):
        assert isinstance(exc, openai.APIStatusError), repr(exc)
        body = exc.body
        assert isinstance(body, dict) and set(body) >= {"message", "type", "param", "code"}
        return Raised(exc.status_code, body["message"], body["type"], exc.response.headers)
    if dialect == "anthropic":
        assert isinstance(exc, anthropic.APIStatusError), repr(exc)
        body = exc.body
        assert isinstance(body, dict) and body["type"] == "error"
        err = body["error"]
        return Raised(exc.status_code, err["message"], err["type"], exc.response.headers)
    assert isinstance(exc, genai_errors.APIError), repr(exc)
    assert exc.details["error"]["code"] == exc.code
    return Raised(exc.code, exc.message, exc.status, exc.response.headers)


# On the chat route an engine's own error object is passed on (its type); the proxy's own
# failures are typed upstream_error.
CHAT_TYPES = {
    "http_500": "InternalServerError",
    "http_429_retry_after": "RateLimitError",
    "http_429": "RateLimitError",
}


def _expected_kind(dialect: str, status: int, fault: str) -> str:
    if dialect == "chat":
        return CHAT_TYPES.get(fault, "upstream_error")
    if dialect == "responses":
        return RESPONSES_TYPES[status]
    if dialect == "anthropic":
        return ANTHROPIC_TYPES[status]
    return GOOGLE_STATUS[status]


@dataclass(frozen=True)
class Expect:
    status: int
    words: str  # in the message
    code: str  # the session finding


INCOMPLETE = (
    f"answered 200 but its body was still incomplete when it timed out after {TIMEOUT_S:g}s"
)
EXPECT: dict[str, Expect] = {
    "http_500": Expect(
        500, "upstream answered 500: EngineCore encountered an issue", "upstream_http"
    ),
    "http_502": Expect(502, "upstream answered 502: 502 Bad Gateway", "upstream_http"),
    "http_429_retry_after": Expect(
        429, "upstream answered 429: Too many requests", "upstream_http"
    ),
    "http_429": Expect(429, "upstream answered 429: Too many requests", "upstream_http"),
    "hang": Expect(504, f"timed out after {TIMEOUT_S:g}s with no reply", "upstream_timeout"),
    "stall_mid_body": Expect(504, INCOMPLETE, "upstream_timeout"),
    # a byte every 0.25 s never trips a per-read timeout: only the total deadline ends it
    "trickle": Expect(504, f"{INCOMPLETE} (total deadline)", "upstream_timeout"),
    "closed_mid_body": Expect(
        502, "closed the connection in the middle of its 200 reply", "upstream_disconnected"
    ),
    "malformed_json": Expect(
        502, "upstream answered 200 with a body that is not JSON", "upstream_invalid_json"
    ),
    "truncated_sse": Expect(
        502, "cut before data: [DONE] (truncated stream)", "upstream_unexpected_stream"
    ),
    "malformed_reply": Expect(
        502,
        "malformed chat completion: choices[0].message.tool_calls[0] has no function object",
        "upstream_malformed_reply",
    ),
}
assert set(EXPECT) == set(TRANSPORT_FAULTS)
# The faults that only differ from a hang in how the upstream stops: their path is the same in
# every dialect (the proxy's one upstream call), so one dialect pins each.
SLOW_FAULTS = ("stall_mid_body", "trickle")
MATRIX = [
    pytest.param(fault, dialect, stream, id=f"{fault}-{mid}")
    for fault in TRANSPORT_FAULTS
    for (dialect, stream), mid in zip(MODES, MODE_IDS, strict=True)
    if fault not in SLOW_FAULTS or (dialect, stream) == ("chat", False)
]


def _codes(findings: list[dict[str, Any]]) -> set[str]:
    return {f["code"] for f in findings}


# ---- HTTP-level faults ----------------------------------------------------------------------


@pytest.mark.parametrize(("fault", "dialect", "stream"), MATRIX)
def test_upstream_fault_reaches_the_sdk_as_its_own_error_and_is_recorded(
    faulty: Rig, fault: str, dialect: str, stream: bool
):
    sid = faulty.open_session()
    faulty.upstream.set(fault)
    expect = EXPECT[fault]
    start = time.monotonic()
    with pytest.raises(Exception) as caught:
        CALLS[dialect](faulty, sid, stream)
    elapsed = time.monotonic() - start
    raised = _raised(dialect, caught.value)

    # (1) the dialect's own error, the proxy's status, a message naming the fault, in time
    assert raised.status == expect.status, raised
    assert expect.words in raised.message, raised.message
    assert raised.kind == _expected_kind(dialect, expect.status, fault)
    assert elapsed < TIMEOUT_S + SLACK_S
    if expect.status == 504:
        assert elapsed >= TIMEOUT_S * 0.9
    # Retry-After is passed on as the engine sent it, never invented
    if fault == "http_429_retry_after":
        assert raised.headers.get("retry-after") == RETRY_AFTER
    else:
        assert "retry-after" not in raised.headers
    assert faulty.upstream.served[fault] == 1  # the proxy never retries on its own

    # (2) recorded on the session: an error, a finding naming the fault, no turn
    summary = faulty.summary(sid)
    assert summary["errors"] == 1 and summary["turns"] == 0
    (finding,) = summary["findings"]
    assert finding["code"] == expect.code and finding["node_id"] == "t1"
    assert expect.words in finding["message"]

    # (3) nothing to train on, and the proxy is unharmed: the next call is captured as usual
    doc = faulty.rollout(sid)
    assert doc["stats"]["turns"] == 0 and doc["sequences"] == []
    assert expect.code in _codes(doc["findings"])
    faulty.upstream.set(None)
    assert CALLS[dialect](faulty, sid, stream)
    doc = faulty.rollout(sid)
    assert doc["stats"]["turns"] == 1 and doc["stats"]["trainable_sequences"] == 1


def test_engine_error_object_is_passed_on_with_its_source_named(faulty: Rig):
    sid = faulty.open_session()
    faulty.upstream.set("http_500")
    resp = faulty.http.post(
        f"{faulty.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {sid}"},
        json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
    )
    assert resp.status_code == 500 and resp.headers["content-type"] == "application/json"
    assert resp.json() == {
        "error": {
            "message": "upstream answered 500: EngineCore encountered an issue. See stack trace "
            "(above) for the root cause.",
            "type": "InternalServerError",
            "param": None,
            "code": 500,
        }
    }


# ---- data-level faults ----------------------------------------------------------------------

DATA_CODES = {
    "ids_shorter_than_logprobs": "logprob_length_mismatch",
    "logprobs_for_other_ids": "logprob_id_mismatch",
    "missing_prompt_ids": "missing_token_ids",
    "nan_logprob": "logprob_invalid",
    "other_model": "model_mismatch",
}
assert set(DATA_CODES) == set(DATA_FAULTS)
UNUSABLE = "upstream reply unusable for training: "


@pytest.fixture(scope="module")
def mask_rig(rig: Rig) -> Iterator[Rig]:
    """A second proxy on the same faulty upstream that passes bad data on, masked."""
    cap, server = start_proxy(f"{rig.upstream_url}/v1", timeout_s=TIMEOUT_S, on_bad_data="mask")
    with server as url:
        yield dataclasses.replace(rig, proxy=cap, url=url)


@pytest.fixture
def masking(faulty: Rig, mask_rig: Rig) -> Rig:
    return mask_rig  # the upstream is shared: ``faulty`` has reset it


@pytest.fixture(scope="module")
def text_rig(rig: Rig) -> Iterator[Rig]:
    """A proxy on the same faulty upstream for an engine certified text-only (eval tier)."""
    cap, server = start_proxy(
        f"{rig.upstream_url}/v1", timeout_s=TIMEOUT_S, capture_level=CaptureLevel.TEXT
    )
    with server as url:
        yield dataclasses.replace(rig, proxy=cap, url=url)


def _never_a_target(doc: dict[str, Any], node_id: str) -> None:
    """No exported sequence trains on any token of ``node_id``."""
    (turn,) = [t for t in doc["turns"] if t["node_id"] == node_id]
    assert turn["trainable"] is False and turn["logprobs"] is None
    for seq in doc["sequences"]:
        for span in seq["turn_spans"]:
            if span["node_id"] == node_id:
                assert span["trainable"] is False
                assert set(seq["loss_mask"][span["start"] : span["end"]]) <= {0}
                assert set(seq["logprobs"][span["start"] : span["end"]]) <= {0.0}


@pytest.mark.parametrize("fault", DATA_FAULTS)
@pytest.mark.parametrize(("dialect", "stream"), MODES, ids=MODE_IDS)
def test_bad_data_reaches_the_sdk_as_a_502_naming_the_finding_and_is_never_trained_on(
    faulty: Rig, fault: str, dialect: str, stream: bool
):
    sid = faulty.open_session()
    faulty.upstream.set(fault)
    code = DATA_CODES[fault]
    with pytest.raises(Exception) as caught:
        CALLS[dialect](faulty, sid, stream)
    raised = _raised(dialect, caught.value)

    # (1) the dialect's own error (before any stream byte), a 502 naming the finding
    assert raised.status == 502, raised
    assert raised.message.startswith(UNUSABLE + code + ": "), raised.message
    assert "turn masked" not in raised.message  # nothing was recorded to mask
    assert raised.kind == _expected_kind(dialect, 502, fault)
    assert "retry-after" not in raised.headers
    assert faulty.upstream.served[fault] == 1  # the proxy never retries on its own

    # (2) recorded on the session: an error, a finding naming the fault, no turn
    summary = faulty.summary(sid)
    assert summary["errors"] == 1 and summary["turns"] == 0
    (finding,) = summary["findings"]
    assert finding["code"] == code and finding["node_id"] == "t1"
    if fault == "other_model":
        assert OTHER_MODEL in finding["message"] and OTHER_MODEL in raised.message

    # (3) nothing misaligned to train on; the next good call is captured and trains
    doc = faulty.rollout(sid)
    assert doc["turns"] == [] and doc["sequences"] == []
    assert code in _codes(doc["findings"])
    faulty.upstream.set(None)
    assert CALLS[dialect](faulty, sid, stream)
    doc = faulty.rollout(sid)
    assert [t["node_id"] for t in doc["turns"]] == ["t2"]
    assert doc["stats"]["trainable_sequences"] == 1 and doc["turns"][0]["trainable"]


@pytest.mark.parametrize("fault", DATA_FAULTS)
def test_on_bad_data_mask_passes_the_reply_on_and_never_trains_on_it(masking: Rig, fault: str):
    """``on_bad_data="mask"`` (``--on-bad-data mask``): the agent gets its reply, the turn is
    recorded with a finding naming the fault, and none of its tokens is ever a loss target."""
    sid = masking.open_session()
    masking.upstream.set(fault)
    text = CALLS["chat"](masking, sid, False)
    assert text  # the engine's sample is the agent's reply: the capture, not the agent, lost it
    assert masking.upstream.served[fault] == 1
    summary = masking.summary(sid)
    assert summary["errors"] == 0 and summary["turns"] == 1  # a reply, not an error

    doc = masking.rollout(sid)
    (turn,) = doc["turns"]
    code = DATA_CODES[fault]
    (finding,) = [f for f in turn["findings"] if f["code"] == code]
    assert finding["node_id"] == "t1" and finding["level"] in ("WARN", "FATAL")
    assert code in _codes(doc["findings"])
    _never_a_target(doc, "t1")
    assert doc["stats"]["trainable_sequences"] == 0 and doc["stats"]["trainable_tokens"] == 0
    if fault == "other_model":
        assert turn["model"] == OTHER_MODEL and OTHER_MODEL in finding["message"]
    if fault == "missing_prompt_ids":
        assert turn["prompt_token_ids"] is None and doc["stats"]["unlinked"] == 1


@pytest.mark.parametrize("fault", [None, "other_model"])
def test_text_tier_engine_is_unchanged_by_the_bad_data_check(
    faulty: Rig, text_rig: Rig, fault: str | None
):
    """An engine certified text-only (eval tier) is never asked for ids or logprobs: a reply
    without them (at the tokens tier: missing_token_ids) is its normal reply, and another
    model's reply is noted on the turn, not refused."""
    sid = text_rig.open_session()
    text_rig.upstream.set(fault)
    assert CALLS["chat"](text_rig, sid, False)
    summary = text_rig.summary(sid)
    assert summary["errors"] == 0 and summary["turns"] == 1 and summary["findings"] == []
    doc = text_rig.rollout(sid)
    assert doc["capture_level"] == "text" and doc["stats"]["trainable_sequences"] == 0
    (turn,) = doc["turns"]
    assert turn["prompt_token_ids"] is None and turn["completion_token_ids"] is None
    noted = _codes(turn["findings"]) & set(DATA_CODES.values())
    assert noted == ({"model_mismatch"} if fault else set())


def test_a_dated_alias_of_the_served_model_is_not_bad_data(
    faulty: Rig, monkeypatch: pytest.MonkeyPatch
):
    sid = faulty.open_session()
    served = faulty.http.get(
        f"{faulty.url}/v1/models", headers={"Authorization": f"Bearer {sid}"}
    ).json()["data"][0]["id"]
    monkeypatch.setattr(faults, "OTHER_MODEL", f"{served}-2024-08-06")
    faulty.upstream.set("other_model")
    assert CALLS["chat"](faulty, sid, False)
    doc = faulty.rollout(sid)
    (turn,) = doc["turns"]
    assert turn["model"] == f"{served}-2024-08-06" and turn["trainable"]
    assert "model_mismatch" not in _codes(turn["findings"])
    assert doc["stats"]["trainable_sequences"] == 1


def _converse(rig: Rig, sid: str, fault: str) -> None:
    """Three chat turns of one conversation; the upstream serves ``fault`` to the first."""
    client = openai.OpenAI(
        base_url=f"{rig.url}/v1", api_key=sid, max_retries=0, http_client=rig.http
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": "tell me about the sea"}]
    for i, question in enumerate(("and rivers?", "and lakes?", None)):
        rig.upstream.set(fault if i == 0 else None)
        reply = client.chat.completions.create(model="m", messages=messages)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        if question:
            messages.append({"role": "user", "content": question})


@pytest.mark.parametrize("fault", DATA_FAULTS)
def test_masked_turn_stays_masked_inside_a_trainable_conversation(masking: Rig, fault: str):
    """With ``on_bad_data="mask"``, the faulty turn is the first of three: later turns train,
    its own tokens never do."""
    sid = masking.open_session()
    _converse(masking, sid, fault)
    doc = masking.rollout(sid)
    assert [t["node_id"] for t in doc["turns"]] == ["t1", "t2", "t3"]
    _never_a_target(doc, "t1")
    assert [t["trainable"] for t in doc["turns"]] == [False, True, True]
    assert doc["stats"]["trainable_sequences"] == 1
    (seq,) = [s for s in doc["sequences"] if s["trainable"]]
    spans = {s["node_id"]: s for s in seq["turn_spans"]}
    assert spans["t3"]["trainable"] and spans["t2"]["trainable"]
    if fault == "missing_prompt_ids":
        assert "t1" not in spans  # unlinked: no ids to put in a sequence
    else:
        assert spans["t1"]["trainable"] is False  # its ids are context, at mask 0


@pytest.fixture(scope="module")
def token_in_rig(rig: Rig) -> Iterator[Rig]:
    """A second proxy on the same faulty upstream, with token-in continuation on (and bad data
    passed on masked, so that a later call can try to splice onto it)."""
    cap, server = start_proxy(
        f"{rig.upstream_url}/v1", token_in="auto", timeout_s=TIMEOUT_S, on_bad_data="mask"
    )
    with server as url:
        yield dataclasses.replace(rig, proxy=cap, url=url)


@pytest.mark.parametrize(
    "fault", ["ids_shorter_than_logprobs", "logprobs_for_other_ids", "other_model"]
)
def test_token_in_never_splices_onto_a_turn_whose_ids_are_suspect(
    faulty: Rig, token_in_rig: Rig, fault: str
):
    """With token-in on, a later call carries an earlier call's sampled ids verbatim. Ids that
    disagree with their logprobs (or come from another model) are not carried: the next call is
    rendered by the engine, and the session's turn-close token is not learnt from them (ids cut
    short end on a word, not on the model's end-of-turn token)."""
    sid = token_in_rig.open_session()
    _converse(token_in_rig, sid, fault)
    session = token_in_rig.proxy.sessions.get(sid)
    assert session is not None and session.close_id == EOS_ID
    assert [c.node_id for c in session.calls] == ["t2", "t3"]
    doc = token_in_rig.rollout(sid)
    modes = {t["node_id"]: (t["token_in_mode"], t["parent_call_id"]) for t in doc["turns"]}
    assert modes["t2"] == ("fallback:assistant_not_sampled", None)
    assert modes["t3"] == ("spliced", "t2")
    _never_a_target(doc, "t1")
    assert [t["trainable"] for t in doc["turns"]] == [False, True, True]


@pytest.mark.parametrize(
    ("answered", "mismatch"),
    [
        ("smol", False),
        ("smol-2024-08-06", False),  # gpt-4o answers as gpt-4o-2024-08-06
        ("smol-20250514", False),  # claude-sonnet-4 as claude-sonnet-4-20250514
        (None, False),  # a reply that names no model is not another model's
        ("smol-mini", True),
        ("Qwen/Qwen3-8B", True),
    ],
)
def test_reply_model_check_accepts_only_the_sent_model_or_a_dated_alias(
    answered: str | None, mismatch: bool
):
    turn = Turn(
        node_id="t1",
        prompt_ids=ids_array([1, 2]),
        sampled_ids=ids_array([3]),
        sampled_logprobs=np.array([-0.5]),
    )
    _check_reply_model(turn, "smol", {"model": answered})
    assert ("model_mismatch" in {f.code for f in turn.findings}) is mismatch
    assert (turn.sampled_logprobs is None) is mismatch


VALID = {
    "model": "smol",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "reasoning": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            "finish_reason": "tool_calls",
        }
    ],
}


def _with(path: str, value: Any) -> dict[str, Any]:
    reply = copy.deepcopy(VALID)
    *keys, last = path.split(".")
    node: Any = reply
    for key in keys:
        node = node[int(key)] if key.isdigit() else node[key]
    node[int(last) if last.isdigit() else last] = value
    return reply


@pytest.mark.parametrize(
    ("reply", "problem"),
    [
        (VALID, None),
        (_with("choices.0.message", None), None),  # no message: an empty reply, not a crash
        (_with("choices.0.message.content", [{"type": "text", "text": "a"}]), None),
        (_with("choices.0.message.tool_calls.0.function.arguments", "not json{"), None),
        ([], None),  # not an object, no choices: ingest says so (reply_not_object, no_choices)
        ({"choices": []}, None),
        (_with("choices.0.message", "hi"), "choices[0].message is str, not an object"),
        (_with("choices.0.message.content", 5), "choices[0].message.content is int, not text"),
        (_with("choices.0.message.reasoning", 5), "choices[0].message.reasoning is int, not text"),
        (_with("choices.0.message.tool_calls", "x"), "tool_calls is str, not a list"),
        (_with("choices.0.message.tool_calls.0", None), "tool_calls[0] has no function object"),
        (_with("choices.0.message.tool_calls.0.function.name", None), "name is null, not a name"),
        (
            _with("choices.0.message.tool_calls.0.function.arguments", {"a": 1}),
            "arguments is dict, not a string",
        ),
        ({"choices": [VALID["choices"][0], None]}, "choices[1] is null, not an object"),
    ],
)
def test_malformed_reply_is_named_before_it_can_crash_a_dialect(reply: Any, problem: str | None):
    found = _malformed_reply(reply)
    assert found is None if problem is None else problem in (found or "")
