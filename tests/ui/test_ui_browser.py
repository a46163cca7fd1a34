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


# --- evals (tests/ui/conftest.py ``evals``: nop, oracle and mixed under the data dir's evals/) ---

FAMILY = "harbor:examples/tasks"


def cells(row: Any) -> dict[str, str]:
    """A table row's cells by their data-field, as the user reads them."""
    return row.locator("td[data-field]").evaluate_all(
        "tds => Object.fromEntries(tds.map(td => [td.dataset.field, td.innerText.trim()]))"
    )


def test_collections_page_marks_each_eval_and_links_its_eval_page(tab, evals):
    tab.goto("/ui/collections")
    page = tab.page
    page.wait_for_selector(f"tr[data-collection='{evals['nop']}']")
    for name in evals.values():
        assert page.locator(f"tr[data-collection='{name}'] a[data-testid=eval-link]").count() == 1
    assert page.locator("tr[data-collection='gsm-like'] a[data-testid=eval-link]").count() == 0
    page.locator(f"tr[data-collection='{evals['oracle']}'] a[data-testid=eval-link]").click()
    page.wait_for_selector("table[data-testid=eval-families] tr[data-family=overall]")
    assert page.url.endswith(f"/ui/evals/{evals['oracle']}")
    tab.goto(f"/ui/collections/{evals['nop']}")  # the collection page of an eval links it too
    expect(page.locator("a[data-testid=eval-link]")).to_be_visible(timeout=10_000)
    tab.goto("/ui/collections/gsm-like")
    page.wait_for_selector("[data-testid=reward-histogram] [data-bin]")
    assert page.locator("a[data-testid=eval-link]").is_hidden()


def test_eval_page_shows_its_run_and_each_familys_mean_reward_and_pass_at_k(tab, evals):
    for name, value in (("nop", "0.000"), ("oracle", "1.000")):
        tab.goto(f"/ui/evals/{evals[name]}")
        page = tab.page
        page.wait_for_selector("table[data-testid=eval-families] tr[data-family=overall]")
        header = page.locator("[data-testid=eval-header]")
        assert header.locator("[data-field=complete]").inner_text().strip() == "complete"
        command = header.locator("[data-field=command]").inner_text()
        assert f"--harness {name}" in command and "--tasks '[cfio]*'" in command
        assert header.locator("[data-field=rollwire_version]").inner_text().strip() not in ("", "—")
        assert header.locator("[data-field=engine_tier]").inner_text().strip() == "—"  # no engine
        for fam in (FAMILY, "overall"):
            row = cells(page.locator(f"table[data-testid=eval-families] tr[data-family='{fam}']"))
            assert (row["problems"], row["samples"], row["failed"]) == ("4", "8", "0")
            assert row["reward"] == row["pass@1"] == row["pass@2"] == f"{value} ± 0.000"
        assert page.locator("[data-testid=eval-no-causes]").is_visible()
    tab.shot("eval")


def test_eval_page_draws_pass_at_k_against_k_with_standard_error_bars(tab, evals):
    tab.goto(f"/ui/evals/{evals['mixed']}")
    page = tab.page
    chart = page.locator("svg[data-testid=passk-chart]")
    chart.locator("[data-testid=passk-point]").first.wait_for()
    series = chart.locator("g[data-series]")
    assert series.evaluate_all("gs => gs.map(g => g.dataset.series)") == [FAMILY, "overall"]
    points = chart.locator("[data-testid=passk-point]").evaluate_all(
        "ps => ps.map(p => [p.closest('g[data-series]').dataset.series, +p.dataset.k,"
        " +p.dataset.estimate, +p.dataset.se, p.querySelectorAll('circle').length])"
    )
    assert sorted(tuple(p) for p in points) == sorted(
        (fam, k, pytest.approx(0.2), pytest.approx(0.2), 1)
        for fam in (FAMILY, "overall")
        for k in (1, 2)
    )
    bars = chart.locator("[data-testid=passk-errbar]")
    assert bars.count() == 4
    for i in range(4):
        bar = bars.nth(i)
        assert float(bar.get_attribute("data-lo")) == pytest.approx(0.0, abs=1e-12)
        assert float(bar.get_attribute("data-hi")) == pytest.approx(0.4)
        y1, y2 = float(bar.get_attribute("y1")), float(bar.get_attribute("y2"))
        assert y1 - y2 > 20  # drawn: 0.4 of the axis tall, upwards
    ticks = chart.locator("text[data-k]").evaluate_all("ts => ts.map(t => t.textContent)")
    assert ticks == ["1", "2"]
    causes = page.locator("table[data-testid=eval-causes] tr[data-cause]")
    assert causes.count() == 1 and "reward_key 'correct'" in causes.inner_text()
    assert cells(causes)["count"] == "8"
    row = cells(page.locator("table[data-testid=eval-families] tr[data-family=overall]"))
    assert row["failed"] == "8" and row["pass@1"] == "0.200 ± 0.200"
    tab.shot("eval-mixed")


def test_eval_page_compares_with_another_run_each_difference_with_its_interval(tab, evals):
    tab.goto(f"/ui/evals/{evals['nop']}")
    page = tab.page
    select = page.locator("select[data-testid=compare-select]")
    expect(select.locator(f"option[value='{evals['oracle']}']")).to_have_count(1, timeout=10_000)
    options = select.locator("option").evaluate_all("os => os.map(o => o.value)")
    assert options == ["", evals["mixed"], evals["oracle"]]  # the other evals, not itself
    select.select_option(evals["oracle"])
    table = page.locator("table[data-testid=compare-table]")
    table.wait_for()
    for fam in (FAMILY, "overall"):
        for metric in ("reward_mean", "pass@1", "pass@2"):
            row = cells(table.locator(f"tr[data-family='{fam}'][data-metric='{metric}']"))
            assert (row["a"], row["b"], row["diff"]) == ("0.000", "1.000", "+1.000")
            assert row["ci"] == "[+1.000, +1.000]" and row["p"] == "0.1250"
    wins = cells(page.locator("table[data-testid=compare-wins] tr[data-family=overall]"))
    assert (wins["wins"], wins["losses"], wins["ties"]) == ("4", "0", "0")
    assert "4 problems" in page.locator("[data-testid=compare-note]").inner_text()
    chart = page.locator("svg[data-testid=compare-chart]")
    zero = float(chart.locator("[data-testid=compare-zero]").get_attribute("x1"))
    points = chart.locator("[data-testid=compare-point]")
    assert points.count() == 6
    for i in range(6):
        point = points.nth(i)
        assert float(point.get_attribute("data-diff")) == 1.0
        assert float(point.locator("circle").get_attribute("cx")) > zero  # B is better
        interval = point.locator("line.ci")
        assert interval.get_attribute("x1") == interval.get_attribute("x2")  # [1, 1]: no width
    assert page.url.endswith(f"/ui/evals/{evals['nop']}?compare=evals%2Foracle")
    tab.shot("eval-compare")
    page.reload()  # the comparison is in the URL: a link to it opens it
    table.locator("tr[data-family=overall][data-metric='pass@2']").wait_for()


def test_a_pair_of_evals_that_do_not_pair_shows_the_refusal_not_a_crash(tab, evals):
    tab.goto(f"/ui/evals/{evals['nop']}")
    page = tab.page
    select = page.locator("select[data-testid=compare-select]")
    expect(select.locator(f"option[value='{evals['mixed']}']")).to_have_count(1, timeout=10_000)
    select.select_option(evals["mixed"])
    refusal = page.locator("[data-testid=compare-error]")
    expect(refusal).to_be_visible(timeout=10_000)
    text = refusal.inner_text()
    assert "do not pair" in text and "different tasks" in text and "sales-report" in text
    assert page.locator("table[data-testid=compare-table]").count() == 0
    # the page goes on: its own numbers stay, and a pair that pairs still compares
    assert page.locator("table[data-testid=eval-families] tr[data-family=overall]").count() == 1
    select.select_option(evals["oracle"])
    page.locator("table[data-testid=compare-table] tr[data-family=overall]").first.wait_for()
    expect(refusal).to_be_hidden()
    tab.shot("eval-compare-refused")
    # the refusal was the server's 409 (and the browser's console line about it): nothing else
    refused = [e for e in tab.errors if "409" in e]
    assert refused and all("compare" in e or "Failed to load resource" in e for e in refused)
    tab.errors[:] = [e for e in tab.errors if e not in refused]
