"""The web UI's server side, black-box over HTTP against a real ``rollwire serve --http``:
auth (no token, no page), the JSON each page reads, and what it must not show."""

from __future__ import annotations

import httpx
import pytest

from rollwire.server.ui import cookie_value, masked_session, reward_histogram
from tests.fakes.vllm import TOKENIZER
from tests.ui.conftest import TOKEN, authed

PATHS = (
    "/ui",
    "/ui/",
    "/ui/rollouts/abc",
    "/ui/static/app.js",
    "/ui/static/app.css",
    "/ui/api/rollouts",
    "/ui/api/collections",
    "/ui/api/sessions",
)


@pytest.mark.parametrize("path", PATHS)
def test_without_the_token_nothing_of_the_ui_is_served(ui_server, path):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Cookie": f"rollwire_ui={TOKEN}"}):
        r = httpx.get(ui_server.root + path, headers=headers, follow_redirects=True)
        assert r.status_code == 401, (path, headers)
        assert "<script" not in r.text and "rollouts" not in r.text


def test_the_token_in_the_url_once_becomes_an_httponly_cookie_and_leaves_the_url(ui_server):
    with httpx.Client(base_url=ui_server.root) as client:
        r = client.get(f"/ui/rollouts?token={TOKEN}&status=done")
        assert r.status_code == 303 and r.headers["location"] == "/ui/rollouts?status=done"
        cookie = r.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and TOKEN not in cookie
        assert client.cookies["rollwire_ui"] == cookie_value(TOKEN)
        page = client.get("/ui/rollouts?status=done")
        assert page.status_code == 200 and "/ui/static/app.js" in page.text
        assert client.get("/ui/api/rollouts").status_code == 200


def test_a_wrong_token_in_the_url_sets_no_cookie(ui_server):
    r = httpx.get(f"{ui_server.root}/ui?token=nope")
    assert r.status_code == 401 and "set-cookie" not in r.headers


def test_ui_responses_allow_no_source_but_the_server_itself(ui_server):
    with authed() as client:
        for path in ("/ui", "/ui/static/app.js", "/ui/api/rollouts"):
            r = client.get(ui_server.root + path)
            csp = r.headers["content-security-policy"]
            assert "default-src 'self'" in csp and "connect-src 'self'" in csp, path
            assert r.headers["referrer-policy"] == "no-referrer"


def test_rollout_list_shows_each_rollout_with_its_outcome_and_filters(ui_server):
    ids = {k: v["rollout_id"] for k, v in ui_server.rollouts.items()}
    with authed() as client:
        rows = client.get(ui_server.root + "/ui/api/rollouts").json()
        by_id = {r["rollout_id"]: r for r in rows["rollouts"]}
        assert set(ids.values()) <= set(by_id)
        assert by_id[ids["failed"]]["status"] == "failed"
        assert "not reachable" in by_id[ids["failed"]]["error"]
        assert by_id[ids["token_in"]]["tier"] == "tokens"
        assert by_id[ids["fragmented"]]["counts"]["roots"] == 2
        failed = client.get(ui_server.root + "/ui/api/rollouts?status=failed").json()
        assert [r["rollout_id"] for r in failed["rollouts"]] == [ids["failed"]]
        assert client.get(ui_server.root + "/ui/api/rollouts?status=odd").status_code == 400
        none = client.get(ui_server.root + "/ui/api/rollouts?task=no-such-task").json()
        assert none["rollouts"] == [] and none["counts"]["failed"] == 1


def test_rollout_view_is_the_document_without_its_token_arrays(ui_server):
    rollout_id = ui_server.rollouts["fragmented"]["rollout_id"]
    with authed() as client:
        view = client.get(f"{ui_server.root}/ui/api/rollouts/{rollout_id}").json()
        document = client.get(ui_server.root + view["document_url"]).json()
    assert view["document"]["stats"] == document["stats"]
    assert [t["node_id"] for t in view["document"]["turns"]] == [
        t["node_id"] for t in document["turns"]
    ]
    turn = view["document"]["turns"][1]
    assert turn["retokenized_from"] == "t1" and "prompt_token_ids" not in turn
    assert turn["prompt_len"] == len(document["turns"][1]["prompt_token_ids"])
    assert view["document"]["stats"]["retokenized"] == 1


def test_sequence_arrays_are_the_documents_and_top_candidates_sit_at_sampled_positions(ui_server):
    rollout_id = ui_server.rollouts["token_in"]["rollout_id"]
    with authed() as client:
        document = client.get(f"{ui_server.root}/ui/api/rollouts/{rollout_id}/document").json()
        (seq,) = document["sequences"]
        got = client.get(
            f"{ui_server.root}/ui/api/rollouts/{rollout_id}/sequences/{seq['sequence_id']}"
        ).json()
    assert got["input_ids"] == seq["input_ids"] and got["loss_mask"] == seq["loss_mask"]
    assert got["logprobs"] == seq["logprobs"]
    turns = {t["node_id"]: t for t in document["turns"]}
    expected = {}
    for span in seq["turn_spans"]:
        for offset, cands in enumerate(turns[span["node_id"]]["top_logprobs"]):
            expected[str(span["start"] + offset)] = cands
    assert got["top"] == expected and len(expected) == sum(
        s["end"] - s["start"] for s in seq["turn_spans"]
    )
    for cands in got["top"].values():
        assert len(cands) == 3 and max(lp for _, lp in cands) <= 0


def test_token_pieces_are_the_engines_own_text_of_each_id(ui_server):
    rollout_id = ui_server.rollouts["token_in"]["rollout_id"]
    ids = [TOKENIZER.piece_id(p) for p in ("Hello", " world", ",")]
    url = f"{ui_server.root}/ui/api/rollouts/{rollout_id}/pieces"
    with authed() as client:
        got = client.post(url, json={"ids": ids}).json()
        assert got == {"pieces": {str(i): TOKENIZER.decode([i]) for i in ids}, "error": None}
        assert client.post(url, json={"ids": list(range(4097))}).status_code == 400
        bad = client.post(url, json={"ids": ["x"]})
        assert bad.status_code == 400 and "ids" in bad.json()["error"]
        failed = ui_server.rollouts["failed"]["rollout_id"]
        none = client.post(
            f"{ui_server.root}/ui/api/rollouts/{failed}/pieces", json={"ids": ids}
        ).json()
        assert none["pieces"] == {} and "no engine" in none["error"]


def test_collection_view_counts_what_its_files_hold(ui_server):
    with authed() as client:
        listed = client.get(ui_server.root + "/ui/api/collections").json()
        row = next(r for r in listed["collections"] if r["name"] == "gsm-like")
        assert row["episodes"] == 6 and row["done"] == 6 and row["eval"] is False
        view = client.get(ui_server.root + "/ui/api/collections/gsm-like").json()
        outside = client.get(ui_server.root + "/ui/api/collections/..%2F..%2Fetc")
    assert view["progress"] == {"done": 6, "total": 6}
    histogram = view["reward_histogram"]
    assert sum(b["count"] for b in histogram["bins"]) + histogram["none"] == 4
    (task,) = view["tasks"]
    assert task["task"] == "reasoning_gym:chain_sum" and task["episodes"] == 4
    assert view["failure_count"] == 2 and "500" in view["failures"][0]["error"]
    assert outside.status_code in (400, 404)


def test_capture_sessions_show_a_digest_never_the_agents_key(ui_server):
    with httpx.Client(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as client:
        opened = client.post(
            ui_server.root + "/capture/sessions", json={"metadata": {"who": "ui-test"}}
        )
        assert opened.status_code in (200, 201), opened.text
        key = opened.json()["session_id"]
        try:
            listed = client.get(ui_server.root + "/ui/api/sessions")
            assert key not in listed.text
            row = next(s for s in listed.json()["sessions"] if s["metadata"] == {"who": "ui-test"})
            assert row["session"] == masked_session(key) and row["endpoint"] == ui_server.engine_b
        finally:
            client.delete(f"{ui_server.root}/capture/sessions/{key}")


def test_reward_histogram_counts_missing_rewards_apart():
    h = reward_histogram([0.0, 1.0, None, 0.55, 1.0])
    assert [b["count"] for b in h["bins"]] == [1, 0, 0, 0, 0, 1, 0, 0, 0, 2] and h["none"] == 1
    wide = reward_histogram([-2.0, 3.0])
    assert wide["bins"][0]["lo"] == -2.0 and wide["bins"][-1]["hi"] == 3.0
