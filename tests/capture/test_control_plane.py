"""Sessions routes, the admin key, and bad input that must leave every session intact."""

from __future__ import annotations

import httpx
import pytest

from rollwire.capture.proxy import CaptureProxy, ProxyConfig
from tests.capture.conftest import Proxy, start_proxy

MSG = {"messages": [{"role": "user", "content": "x"}]}


def _call(proxy: Proxy, sid: str, **kw) -> httpx.Response:
    if "content" not in kw:
        kw.setdefault("json", MSG)
    headers = {"Authorization": f"Bearer {sid}", **kw.pop("headers", {})}
    return httpx.post(f"{proxy.url}/v1/chat/completions", headers=headers, **kw)


def test_open_session_returns_an_id_and_accepts_metadata(proxy: Proxy):
    resp = httpx.post(
        f"{proxy.url}/sessions",
        json={"metadata": {"task": "t-1"}, "max_model_calls": 5},
        headers=proxy.admin,
    )
    assert resp.status_code == 200
    sid = resp.json()["session_id"]
    summary = httpx.get(f"{proxy.url}/sessions/{sid}", headers=proxy.admin).json()
    assert summary["metadata"] == {"task": "t-1"} and summary["max_model_calls"] == 5


def test_list_sessions_shows_turns_roots_and_idle_time(proxy: Proxy):
    sid = proxy.open_session()
    assert _call(proxy, sid).status_code == 200
    listed = httpx.get(f"{proxy.url}/sessions", headers=proxy.admin).json()["sessions"]
    (row,) = [s for s in listed if s["session_id"] == sid]
    assert row["turns"] == 1 and row["roots"] == 1
    assert 0 <= row["seconds_since_last_call"] < 60


def test_rollout_document_carries_session_id_and_metadata(proxy: Proxy):
    sid = proxy.open_session(metadata={"task": "abc"})
    _call(proxy, sid)
    doc = proxy.rollout(sid)
    assert doc["metadata"] == {"session_id": sid, "task": "abc"}


def test_deleted_session_key_stops_working(proxy: Proxy):
    sid = proxy.open_session()
    assert httpx.delete(f"{proxy.url}/sessions/{sid}", headers=proxy.admin).json() == {
        "session_id": sid,
        "deleted": True,
    }
    assert _call(proxy, sid).status_code == 401
    assert httpx.get(f"{proxy.url}/sessions/{sid}", headers=proxy.admin).status_code == 404


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"metadata": "x"}, "metadata"),
        ({"max_model_calls": 0}, "max_model_calls"),
        ({"frobnicate": 1}, "frobnicate"),
    ],
)
def test_bad_session_options_are_refused_naming_the_field(proxy: Proxy, body, param):
    resp = httpx.post(f"{proxy.url}/sessions", json=body, headers=proxy.admin)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == param


def test_unknown_session_on_control_plane_is_404(proxy: Proxy):
    resp = httpx.get(f"{proxy.url}/sessions/rw-nope/rollout", headers=proxy.admin)
    assert resp.status_code == 404 and "rw-nope" in resp.json()["error"]["message"]


def test_admin_key_guards_every_control_route(upstream):
    _, server = start_proxy(upstream.url, admin_key="s3cret")
    with server as url:
        admin = {"Authorization": "Bearer s3cret"}
        assert httpx.post(f"{url}/sessions").status_code == 401
        assert httpx.get(f"{url}/sessions").status_code == 401
        sid = httpx.post(f"{url}/sessions", headers=admin).json()["session_id"]
        for method, path in [
            ("GET", f"/sessions/{sid}"),
            ("GET", f"/sessions/{sid}/rollout"),
            ("DELETE", f"/sessions/{sid}"),
        ]:
            assert (
                httpx.request(
                    method, url + path, headers={"Authorization": f"Bearer {sid}"}
                ).status_code
                == 401
            )
        assert httpx.get(f"{url}/sessions/{sid}/rollout", headers=admin).status_code == 200
        # the admin key is not a session key
        resp = httpx.post(f"{url}/v1/chat/completions", headers=admin, json=MSG)
        assert resp.status_code == 401


def test_proxy_without_an_admin_key_guards_its_control_plane_with_a_generated_one(upstream):
    cap, server = start_proxy(upstream.url, admin_key=None)
    assert cap.config.admin_key is None and cap.admin_key
    with server as url:
        admin = {"Authorization": f"Bearer {cap.admin_key}"}
        sid = cap.sessions.open().session_id
        routes = [
            ("POST", "/sessions"),
            ("GET", "/sessions"),
            ("GET", f"/sessions/{sid}"),
            ("GET", f"/sessions/{sid}/rollout"),
            ("DELETE", f"/sessions/{sid}"),
        ]
        for method, path in routes:
            resp = httpx.request(method, url + path)
            assert resp.status_code == 401, (method, path)
            assert "Authorization: Bearer <admin key>" in resp.json()["error"]["message"]
        for method, path in routes:
            assert httpx.request(method, url + path, headers=admin).status_code == 200, path
        assert httpx.get(f"{url}/health").status_code == 200


def test_generated_admin_key_differs_between_proxies(upstream):
    config = ProxyConfig(llm_url=upstream.url)
    first, second = CaptureProxy(config), CaptureProxy(config)
    assert first.admin_key != second.admin_key
    assert len(first.admin_key) >= 32 and len(second.admin_key) >= 32


# ---- bad input: a clear 4xx, nothing forwarded, the session untouched ---------------------------


@pytest.mark.parametrize(
    ("kwargs", "status", "needle"),
    [
        (
            {"content": b"{not json", "headers": {"Content-Type": "application/json"}},
            400,
            "not valid JSON",
        ),
        (
            {
                "content": b"messages=1",
                "headers": {"Content-Type": "application/x-www-form-urlencoded"},
            },
            415,
            "content-type",
        ),
        ({"json": {"model": "m"}}, 400, "messages"),
        ({"json": {"messages": []}}, 400, "messages"),
        ({"json": {"messages": ["hi"]}}, 400, "messages[0]"),
        ({"json": [1, 2]}, 400, "JSON object"),
        ({"json": {**MSG, "n": 0}}, 400, "'n'"),
        ({"json": {**MSG, "stream": "yes"}}, 400, "'stream'"),
    ],
)
def test_bad_request_gets_a_clear_4xx_and_leaves_the_session_intact(
    proxy: Proxy, kwargs, status, needle
):
    sid = proxy.open_session()
    assert _call(proxy, sid).status_code == 200
    before = proxy.rollout(sid)["stats"]
    resp = _call(proxy, sid, **kwargs)
    assert resp.status_code == status
    assert needle in resp.json()["error"]["message"]
    assert proxy.rollout(sid)["stats"] == before
    assert len(proxy.upstream.fake.requests) == 1
    assert _call(proxy, sid, json={**MSG, "seed": 2}).status_code == 200


def test_ten_megabyte_body_is_refused_with_413(proxy: Proxy):
    sid = proxy.open_session()
    huge = b'{"messages": [{"role": "user", "content": "' + b"a" * (10 * 1024 * 1024) + b'"}]}'
    resp = _call(proxy, sid, content=huge, headers={"Content-Type": "application/json"})
    assert resp.status_code == 413
    assert proxy.upstream.fake.requests == []
    assert _call(proxy, sid).status_code == 200


def test_missing_model_name_is_resolved_from_the_single_served_model(proxy: Proxy):
    sid = proxy.open_session()
    assert _call(proxy, sid).status_code == 200
    assert proxy.upstream.fake.requests[0]["model"] == "smol"


def test_ambiguous_served_models_without_model_is_a_clear_error(upstream):
    upstream.fake.behavior.update(served_models=["a", "b"])
    cap, server = start_proxy(upstream.url)
    with server as url:
        p = Proxy(cap, url, upstream)
        resp = _call(p, p.open_session())
    assert resp.status_code == 502 and "--model" in resp.json()["error"]["message"]
    assert upstream.fake.requests == []


def test_models_route_lists_the_served_model(proxy: Proxy):
    sid = proxy.open_session()
    models = proxy.client(sid).models.list()
    assert [m.id for m in models.data] == ["smol"]
    assert httpx.get(f"{proxy.url}/v1/models").status_code == 401
