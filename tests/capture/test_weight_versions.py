"""Policy versions in the capture: every turn records the engine weights that sampled it.

The fake vLLM serves ``GET /weight_info`` as vLLM 0.32 does (``"default"`` before any update);
the proxy reads it around each call, so a swap between calls gives each turn its own version
(and the rollout a finding), and a swap during a call masks that call. Engines without the
route record what a trainer announces (``POST /weight_version``)."""

from __future__ import annotations

import httpx
import pytest

from rollwire.capture.certify import validate_llm
from tests.capture.conftest import Proxy, start_proxy

IDS = {"return_token_ids": True}


def codes(findings: list[dict]) -> set[str]:
    return {f["code"] for f in findings}


def converse(proxy: Proxy, sid: str, turns: int, between=None) -> list:
    """``turns`` calls of one conversation; ``between(k)`` runs after call k."""
    client = proxy.client(sid)
    messages = [{"role": "user", "content": "tell me about the sea"}]
    replies = []
    for k in range(turns):
        r = client.chat.completions.create(model="m", messages=messages, extra_body=IDS)
        replies.append(r)
        messages += [
            {"role": "assistant", "content": r.choices[0].message.content},
            {"role": "user", "content": "go on"},
        ]
        if between is not None:
            between(k)
    return replies


def weight_info_proxy(upstream) -> tuple:
    return start_proxy(f"{upstream.url}/v1", weight_info=True)


def test_each_turn_records_the_engine_version_that_sampled_it(upstream):
    upstream.fake.behavior.update(weight_version="step-7")
    _, server = weight_info_proxy(upstream)
    with server as url:
        proxy = Proxy(_, url, upstream)
        sid = proxy.open_session()
        converse(proxy, sid, 2)
        doc = proxy.rollout(sid)
    assert [t["weight_version"] for t in doc["turns"]] == ["step-7", "step-7"]
    (seq,) = doc["sequences"]
    assert [s["weight_version"] for s in seq["turn_spans"]] == ["step-7", "step-7"]
    assert doc["stats"]["weight_versions"] == ["step-7"]
    assert "weight_versions_mixed" not in codes(doc["findings"])


def test_a_rollout_spanning_a_sync_is_flagged_and_each_turn_keeps_its_version(upstream):
    _, server = weight_info_proxy(upstream)

    def sync_after_first(k: int) -> None:
        if k == 0:
            upstream.fake.behavior.update(weight_version="step-1")

    with server as url:
        proxy = Proxy(_, url, upstream)
        sid = proxy.open_session()
        converse(proxy, sid, 3, between=sync_after_first)
        doc = proxy.rollout(sid)
    assert [t["weight_version"] for t in doc["turns"]] == ["default", "step-1", "step-1"]
    assert doc["stats"]["weight_versions"] == ["default", "step-1"]
    (mixed,) = [f for f in doc["findings"] if f["code"] == "weight_versions_mixed"]
    assert mixed["level"] == "WARN" and "'default', 'step-1'" in mixed["message"]
    # both versions' turns are real samples of their own policy: still trainable
    assert all(t["trainable"] for t in doc["turns"])


def test_a_swap_during_a_call_masks_that_call(upstream):
    _, server = weight_info_proxy(upstream)
    with server as url:
        proxy = Proxy(_, url, upstream)
        sid = proxy.open_session()

        def swap_during_the_next(k: int) -> None:
            if k == 0:
                upstream.fake.behavior.update(swap_weight_version_during_call="step-1")

        converse(proxy, sid, 2, between=swap_during_the_next)
        doc = proxy.rollout(sid)
    first, second = doc["turns"]
    assert first["weight_version"] == "default" and first["trainable"]
    assert second["weight_version"] is None and not second["trainable"]
    assert second["logprobs"] is None and second["completion_token_ids"]  # ids kept as context
    assert "weight_version_changed" in codes(second["findings"])


def test_without_weight_info_a_turn_records_the_announced_version(upstream):
    upstream.fake.behavior.update(weight_version=None)  # the route answers 404
    cap, server = start_proxy(f"{upstream.url}/v1")
    with server as url:
        proxy = Proxy(cap, url, upstream)
        sid = proxy.open_session()

        def announce_after_first(k: int) -> None:
            if k == 0:
                announce = httpx.post(
                    f"{url}/weight_version", json={"weight_version": "step-4"}, headers=proxy.admin
                )
                assert announce.json() == {
                    "weight_version": "step-4",
                    "engine_reports_version": False,
                }

        converse(proxy, sid, 2, between=announce_after_first)
        doc = proxy.rollout(sid)
    assert [t["weight_version"] for t in doc["turns"]] == [None, "step-4"]
    assert doc["stats"]["weight_versions"] == ["step-4"]


def test_announcing_a_version_needs_the_admin_key_and_a_string(proxy: Proxy):
    url = f"{proxy.url}/weight_version"
    assert httpx.post(url, json={"weight_version": "x"}).status_code == 401
    bad = httpx.post(url, json={"weight_version": 3}, headers=proxy.admin)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "weight_version"
    assert httpx.get(url, headers=proxy.admin).json()["weight_version"] is None


@pytest.mark.anyio
async def test_certification_says_whether_the_engine_reports_its_version(upstream):
    cert = await validate_llm(f"{upstream.url}/v1")
    assert cert.weight_info and cert.weight_version == "default"
    upstream.fake.behavior.update(weight_version=None)
    cert = await validate_llm(f"{upstream.url}/v1")
    assert not cert.weight_info and cert.weight_version is None
    assert "weight_version" in {f.code for f in cert.findings}
