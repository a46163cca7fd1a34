"""What the dialects share with the chat front door: the /v1/models route answers each dialect
in its own shape, and each turn records the dialect it came in."""

from __future__ import annotations

from tests.capture.conftest import Proxy
from tests.capture.dialects.test_google import client as google_client


def test_google_sdk_lists_models_on_the_shared_v1_route(proxy: Proxy):
    sid = proxy.open_session()
    gemini = google_client(proxy, sid, api_version="v1")  # kept: it closes when collected
    models = list(gemini.models.list())
    assert models and models[0].name.startswith("models/")


def test_each_turn_records_its_dialect(proxy: Proxy):
    sid = proxy.open_session()
    gemini = google_client(proxy, sid)
    gemini.models.generate_content(model="gemini-x", contents="Hello there")
    proxy.client(sid).responses.create(model="gpt-x", input="Hello there")
    proxy.client(sid).chat.completions.create(
        model="x", messages=[{"role": "user", "content": "Hello there"}]
    )
    assert [t["dialect"] for t in proxy.rollout(sid)["turns"]] == ["google", "responses", "chat"]


def test_anthropic_sdk_lists_models_on_the_shared_v1_route(proxy: Proxy):
    import anthropic

    sid = proxy.open_session()
    claude = anthropic.Anthropic(base_url=proxy.url, api_key=sid, max_retries=0)
    (model,) = list(claude.models.list())
    assert model.type == "model" and model.id
