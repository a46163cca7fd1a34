"""The web UI in a real browser: Debian's Chromium driven by Playwright against a real
``rollwire serve --http`` (tests/ui/conftest.py), looking at what a user sees. Every page load
records its requests: none may leave the server (no CDN, no font, no beacon). Screenshots go to
``test-artifacts/ui/``."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from playwright.sync_api import expect

from tests.fakes.vllm import TOKENIZER
from tests.ui.conftest import ROOT, TOKEN, _mcp, authed

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = ROOT / "test-artifacts" / "ui"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


class Tab:
    """A logged-in page that records every request and any page error."""

    def __init__(self, browser: Any, root: str, *, login: bool = True) -> None:
        self.root = root
        self.context = browser.new_context(viewport={"width": 1400, "height": 1000})
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.context.on("request", lambda r: self.requests.append(r.url))
        self.context.on(
            "response",
            lambda r: self.errors.append(f"{r.status} {r.url}") if r.status >= 400 else None,
        )
        self.page = self.context.new_page()
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        if login:
            response = self.page.goto(f"{root}/ui?token={TOKEN}")
            assert response is not None and response.ok
            assert "token=" not in self.page.url

    def goto(self, path: str) -> None:
        response = self.page.goto(self.root + path)
        assert response is not None and response.status == 200, path

    def shot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=False)
        return path

    def close(self) -> None:
        self.context.close()
        outside = [u for u in self.requests if not u.startswith(self.root + "/")]
        assert outside == [], f"requests left the server: {outside}"
        assert self.errors == [], self.errors


@pytest.fixture
def tab(browser, ui_server) -> Iterator[Tab]:
    t = Tab(browser, ui_server.root)
    yield t
    t.close()


def document_of(ui_server, name: str) -> dict[str, Any]:
    rollout_id = ui_server.rollouts[name]["rollout_id"]
    with authed() as client:
        return client.get(f"{ui_server.root}/ui/api/rollouts/{rollout_id}/document").json()


def test_without_the_token_the_browser_gets_no_page(browser, ui_server):
    t = Tab(browser, ui_server.root, login=False)
    response = t.page.goto(ui_server.root + "/ui/rollouts")
    assert response is not None and response.status == 401
    assert "unauthorized" in t.page.content()
    assert t.page.query_selector("[data-testid=rollouts]") is None
    assert all(u == ui_server.root + "/ui/rollouts" for u in t.requests)  # not even app.js
    t.context.close()


def test_rollouts_page_lists_every_rollout_with_its_outcome(tab, ui_server):
    tab.goto("/ui/rollouts")
    ids = {k: v["rollout_id"] for k, v in ui_server.rollouts.items()}
    page = tab.page
    for rollout_id in ids.values():
        page.wait_for_selector(f"tr[data-rollout-id='{rollout_id}']")
    failed = page.locator(f"tr[data-rollout-id='{ids['failed']}']")
    assert failed.locator("td[data-field=status]").inner_text().strip() == "failed"
    assert failed.locator("td[data-field=reward]").inner_text().strip() == "—"
    ok = page.locator(f"tr[data-rollout-id='{ids['token_in']}']")
    assert ok.locator("td[data-field=reward]").inner_text().strip() in ("0", "0.0")
    assert ok.locator("td[data-field=tier]").inner_text().strip() == "tokens"
    page.select_option("select[data-testid=status-filter]", "failed")
    expect(page.locator("tr[data-rollout-id]")).to_have_count(1, timeout=10_000)
    assert page.locator(f"tr[data-rollout-id='{ids['failed']}']").count() == 1
    tab.shot("rollouts-filtered")


def test_a_rollout_started_elsewhere_appears_and_finishes_without_a_reload(tab, ui_server):
    tab.goto("/ui/rollouts")
    page = tab.page
    page.wait_for_selector("tr[data-rollout-id]")
    ui_server.fake_b.behavior.update(delay_s=3.0)
    try:
        call = (
            "start_rollout",
            {
                "task": "reasoning_gym:chain_sum",
                "answer_mode": "text",
                "llm_url": ui_server.engine_b,
            },
        )
        with ThreadPoolExecutor(1) as pool:  # sync Playwright holds this thread's event loop
            (started,) = pool.submit(anyio.run, _mcp, ui_server.root, [call]).result()
        rollout_id = started.structured_content["rollout_id"]
        row = f"tr[data-rollout-id='{rollout_id}']"
        status = page.locator(f"{row} td[data-field=status]")
        expect(status).to_have_text(re.compile("running"), timeout=10_000)
        expect(status).to_have_text(re.compile(r"^\s*done\s*$"), timeout=30_000)
    finally:
        ui_server.fake_b.behavior.update(delay_s=0.0)


def test_fragmented_rollout_shows_two_roots_the_retokenisation_and_its_finding(tab, ui_server):
    document = document_of(ui_server, "fragmented")
    rollout_id = ui_server.rollouts["fragmented"]["rollout_id"]
    tab.goto(f"/ui/rollouts/{rollout_id}")
    page = tab.page
    page.wait_for_selector("[data-testid=strip][data-trained]")
    assert rollout_id in page.locator("[data-testid=rollout-header]").inner_text()
    nodes = page.locator("svg[data-testid=graph] g[data-node-id]")
    assert sorted(nodes.evaluate_all("els => els.map(e => e.dataset.nodeId)")) == ["t1", "t2"]
    edge = page.locator("svg[data-testid=graph] path[data-edge-kind=retokenized]")
    assert edge.count() == 1 and edge.get_attribute("data-target") == "t2"
    assert page.locator("svg[data-testid=graph] path[data-edge-kind=parent]").count() == 0
    finding = page.locator(
        "[data-testid=turn][data-node-id=t2] [data-testid=finding][data-code=retokenized]"
    )
    assert finding.count() == 1 and "new training sequence" in finding.inner_text()
    options = page.locator("select[data-testid=sequence-select] option")
    assert options.count() == len(document["sequences"]) == 2
    for seq in document["sequences"]:
        page.select_option("select[data-testid=sequence-select]", seq["sequence_id"])
        strip = page.locator(f"[data-testid=strip][data-sequence-id='{seq['sequence_id']}']")
        strip.wait_for()
        assert int(strip.get_attribute("data-trained")) == sum(seq["loss_mask"])
        assert int(strip.get_attribute("data-length")) == len(seq["input_ids"])
    tab.shot("rollout-fragmented")


def test_token_in_rollout_strip_counts_trained_tokens_and_shows_each_tokens_numbers(tab, ui_server):
    document = document_of(ui_server, "token_in")
    (seq,) = document["sequences"]
    rollout_id = ui_server.rollouts["token_in"]["rollout_id"]
    tab.goto(f"/ui/rollouts/{rollout_id}")
    page = tab.page
    strip = page.locator("[data-testid=strip][data-trained]")
    strip.wait_for()
    assert int(strip.get_attribute("data-trained")) == sum(seq["loss_mask"]) > 0
    assert f"{sum(seq['loss_mask'])} trained" in page.locator("body").inner_text()
    assert "spliced" in page.locator("[data-testid=turn][data-node-id=t2]").inner_text()
    graph_node = page.locator("svg[data-testid=graph] g[data-node-id=t2]")
    assert "spliced" in (graph_node.text_content() or "")  # the token-in mode, drawn
    # the first trained position: its cell, then its tooltip
    pos = seq["loss_mask"].index(1)
    token_id = seq["input_ids"][pos]
    cell = page.locator(f"[data-testid=token][data-pos='{pos}']")
    cell.wait_for()
    assert "trained" in (cell.get_attribute("class") or "")
    context = page.locator(f"[data-testid=token][data-pos='{pos - 1}']")
    assert "context" in (context.get_attribute("class") or "")
    piece = TOKENIZER.decode([token_id])
    shown = piece.replace(" ", "·").replace("\n", "⏎")
    expect(cell).to_contain_text(shown.strip() or shown, timeout=10_000)  # the engine's text
    cell.hover()
    tip = page.locator("[data-testid=token-tip]")
    tip.wait_for(state="visible")
    text = tip.inner_text()
    assert str(token_id) in text and repr(seq["logprobs"][pos])[:6] in text
    assert piece.strip() in text
    turn = next(t for t in document["turns"] if t["node_id"] == "t1")
    first_candidate = turn["top_logprobs"][pos - seq["turn_spans"][0]["start"]][0][0]
    assert str(first_candidate) in text and "not captured" not in text
    tab.shot("rollout-token-in")
    page.set_viewport_size({"width": 1400, "height": 1330})  # the whole page, for the README
    page.mouse.move(0, 0)
    page.evaluate("window.scrollTo(0, 0)")
    cell.hover()
    page.screenshot(path=str(ARTIFACTS / "readme-rollout.png"))


def test_failed_rollout_page_shows_its_error_and_no_document(tab, ui_server):
    rollout_id = ui_server.rollouts["failed"]["rollout_id"]
    tab.goto(f"/ui/rollouts/{rollout_id}")
    page = tab.page
    error = page.locator("[data-testid=rollout-header] [data-field=error]")
    error.wait_for()
    assert "not reachable" in error.inner_text()
    assert page.locator(
        "[data-testid=rollout-header] [data-field=status]"
    ).inner_text().strip() == ("failed")
    assert page.locator("a[data-testid=raw-document]").count() == 0
    tab.shot("rollout-failed")


def test_collection_page_shows_progress_rewards_tasks_and_failures(tab, ui_server):
    tab.goto("/ui/collections")
    page = tab.page
    page.locator(f"tr[data-collection='{ui_server.collection}'] a").first.click()
    page.wait_for_selector("[data-testid=reward-histogram] [data-bin]")
    assert re.search(r"6\s*/\s*6", page.locator("[data-testid=collection-progress]").inner_text())
    row = page.locator("table[data-testid=task-success] tr[data-task='reasoning_gym:chain_sum']")
    assert "4" in row.inner_text()
    errors = page.locator("table[data-testid=failures] td[data-field=error]")
    assert errors.count() == 2 and "500" in errors.first.inner_text()
    tab.shot("collection")


def test_sessions_page_shows_a_live_capture_session_and_its_end(tab, ui_server):
    tab.goto("/ui/sessions")
    page = tab.page
    headers = {"Authorization": f"Bearer {TOKEN}"}
    opened = httpx.post(
        ui_server.root + "/capture/sessions", json={"metadata": {"who": "browser"}}, headers=headers
    ).json()
    from rollwire.server.ui import masked_session

    row = f"tr[data-session='{masked_session(opened['session_id'])}']"
    page.wait_for_selector(row, timeout=10_000)
    assert opened["session_id"] not in page.content()
    httpx.delete(f"{ui_server.root}/capture/sessions/{opened['session_id']}", headers=headers)
    page.wait_for_selector(row, state="detached", timeout=10_000)
