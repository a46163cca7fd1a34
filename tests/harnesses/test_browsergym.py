"""BrowserGym / MiniWoB as tools: action encoding, task listing, and real browser episodes.

The browser tests need Debian's chromium (CI installs it); without it they skip and say so.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator

import anyio
import pytest
from browsergym.core.action.highlevel import HighLevelActionSet
from browsergym.core.action.parsers import highlevel_action_parser
from hypothesis import given
from hypothesis import strategies as st

from rollwire.capture.proxy import CaptureProxy, ProxyConfig
from rollwire.capture.rollout import CaptureLevel
from rollwire.capture.upstream import Upstream
from rollwire.harnesses.envs import browsergym as bg
from rollwire.harnesses.envs.registry import TaskError, list_tasks, resolve
from rollwire.harnesses.envs.run import run_env_rollout
from rollwire.sessions.stepenv import ToolArgumentError
from rollwire.sessions.toolloop import LoopLimits
from tests.fakes.serve import serve_in_thread
from tests.fakes.vllm import DEFAULT_MODEL, FakeVLLM

needs_chromium = pytest.mark.skipif(
    bg.chromium_missing() is not None, reason=bg.chromium_missing() or ""
)

BUTTON = re.compile(r"\[(\w+)\] button 'Click Me!'")


# ----------------------------------------------------------------------------- no browser


def _parsed(action: str) -> list:
    """What BrowserGym's strict parser reads back from one action string."""
    ((name, args),) = highlevel_action_parser.parse_string(action, parse_all=True).as_list()
    return [name, args]


@given(bid=st.from_regex(r"[a-z]{0,2}[0-9]{1,4}", fullmatch=True), value=st.text(max_size=200))
def test_fill_round_trips_any_text_through_browsergyms_parser(bid, value):
    action = bg.encode_action("fill", {"bid": bid, "value": value})
    assert _parsed(action) == ["fill", [bid, value]]


@given(keys=st.text(min_size=1, max_size=50))
def test_send_keys_round_trips_any_text(keys):
    assert _parsed(bg.encode_action("send_keys", {"keys": keys})) == ["keyboard_press", [keys]]


def test_actions_are_single_strict_calls_browsergym_accepts():
    actions = HighLevelActionSet(subsets=["bid", "coord"], strict=True, multiaction=False)
    for name, args, call in [
        ("click", {"bid": "13"}, "click('13')"),
        ("click", {"bid": 13}, "click('13')"),
        ("fill", {"bid": "a7", "value": "x'); boom('"}, "fill('a7', \"x'); boom('\")"),
        ("fill", {"bid": "a7", "value": "')\nx("}, "fill('a7', \"')\\nx(\")"),
        ("send_keys", {"keys": "Control+a"}, "keyboard_press('Control+a')"),
        ("scroll", {"delta_x": 0, "delta_y": -120.5}, "scroll(0.0, -120.5)"),
        ("noop", {}, "noop()"),
    ]:
        code = actions.to_python_code(bg.encode_action(name, args))
        assert code.splitlines()[-1] == call


@pytest.mark.parametrize(
    ("name", "args", "problem"),
    [
        ("click", {}, "'bid'"),
        ("click", {"bid": "13'); noop("}, "'bid'"),
        ("click", {"bid": True}, "'bid'"),
        ("click", {"bid": "13", "force": True}, "unexpected argument"),
        ("fill", {"bid": "13"}, "'value'"),
        ("fill", {"bid": "13", "value": "x" * 10_001}, "too long"),
        ("send_keys", {"keys": ""}, "must not be empty"),
        ("scroll", {"delta_x": 0}, "'delta_y'"),
        ("scroll", {"delta_x": float("nan"), "delta_y": 1}, "'delta_x'"),
        ("scroll", {"delta_x": 0, "delta_y": 1e9}, "within"),
        ("noop", {"wait": 1}, "unexpected argument"),
    ],
)
def test_invalid_arguments_are_refused_with_a_reason(name, args, problem):
    with pytest.raises(ToolArgumentError, match=re.escape(problem)):
        bg.encode_action(name, args)


def test_tools_are_the_five_actions_and_never_a_reserved_verb():
    names = [t.spec.name for t in bg.TOOLS]
    assert names == ["click", "fill", "send_keys", "scroll", "noop"]
    assert not {"reset", "step", "state", "close"} & set(names)


def test_miniwob_tasks_are_listed_without_a_browser():
    listing = list_tasks(["browsergym"])
    assert listing.unavailable == {}
    tasks = {t.task: t for t in listing.tasks}
    assert len(tasks) > 100
    click = tasks["browsergym:miniwob.click-test"]
    assert click.family == "browsergym" and click.description
    assert all(t.startswith("browsergym:miniwob.") for t in tasks)
    assert list(tasks) == sorted(tasks)  # stable order


def test_unknown_task_and_bad_config_are_task_errors():
    adapter, _ = resolve("browsergym:miniwob.click-test")
    with pytest.raises(TaskError, match=r"'miniwob\.clik-test'.*miniwob\.click-test"):
        adapter.make_session("miniwob.clik-test", {}, seed=0, episode_id="e")
    with pytest.raises(TaskError, match="unknown browsergym config"):
        adapter.make_session("miniwob.click-test", {"zoom": 2}, seed=0, episode_id="e")


def test_missing_chromium_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(bg, "CHROMIUM", str(tmp_path / "chromium"))
    adapter, _ = resolve("browsergym:miniwob.click-test")
    with pytest.raises(TaskError, match="apt-get install chromium"):
        adapter.make_session("miniwob.click-test", {}, seed=0, episode_id="e")


def test_miniwob_pages_come_from_the_package_over_file_urls(monkeypatch):
    monkeypatch.delenv("MINIWOB_URL", raising=False)
    url = bg.miniwob_base_url()
    assert url.startswith("file://") and url.endswith("/miniwob/")


@pytest.mark.anyio
async def test_unknown_task_is_a_failed_result_naming_it():
    proxy = CaptureProxy(ProxyConfig(llm_url="http://127.0.0.1:9/v1"))
    out = await run_env_rollout("browsergym:miniwob.no-such-task", proxy=proxy, seed=0)
    assert not out.result.ok
    assert "miniwob.no-such-task" in (out.result.error or "")


# ----------------------------------------------------------------------------- with a browser


def _browser_pids() -> set[int]:
    """Live (non-zombie) chromium and Playwright driver processes descended from this one."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields[0] == "Z":
            continue
        parents[int(entry)] = int(fields[1])
        names[int(entry)] = cmd
    me = os.getpid()

    def mine(pid: int) -> bool:
        for _ in range(64):
            pid = parents.get(pid, 0)
            if pid == me:
                return True
            if pid <= 1:
                return False
        return False

    return {
        pid
        for pid, cmd in names.items()
        if ("chromium" in cmd or "run-driver" in cmd) and mine(pid)
    }


@pytest.fixture
def no_leaks() -> Iterator[set[int]]:
    """Fails the test if it leaves a browser process behind; yields the ones there before."""
    before = _browser_pids()
    yield before
    deadline = time.monotonic() + 10
    while (left := _browser_pids() - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"browser processes left running: {sorted(left)}"


def _session(task: str = "miniwob.click-test", seed: int = 0) -> bg.BrowserGymSession:
    adapter, _ = resolve(f"browsergym:{task}")
    session = adapter.make_session(task, {}, seed=seed, episode_id="test")
    assert isinstance(session, bg.BrowserGymSession)
    return session


@pytest.mark.slow
@needs_chromium
@pytest.mark.anyio
async def test_scripted_policy_solves_click_test(no_leaks):
    session = _session()
    try:
        (first,) = await session.initial_messages()
        text = first["content"]
        assert "Goal: Click the button." in text
        assert _browser_pids() - no_leaks, "the leak check must see this episode's browser"
        bid = BUTTON.search(text).group(1)
        result = await session.call_tool("click", {"bid": bid})
        assert result.error is None, result.content
        assert result.done and result.reward == 1.0
        verdict = await session.verify()
        assert verdict.reward == 1.0
        assert verdict.rewards["reward"] == 1.0 and verdict.rewards["miniwob_raw"] == 1.0
        after = await session.call_tool("click", {"bid": bid})
        assert after.error and after.done
    finally:
        await session.close()
    await session.close()  # idempotent


@pytest.mark.slow
@needs_chromium
@pytest.mark.anyio
async def test_invalid_bid_is_a_tool_error_and_the_episode_goes_on(no_leaks):
    session = _session()
    try:
        (first,) = await session.initial_messages()
        missing = await session.call_tool("click", {"bid": "999"})
        assert missing.error and "999" in missing.error and not missing.done
        assert "Last action error" in missing.content
        malformed = await session.call_tool("click", {"bid": "Paris"})
        assert malformed.error and "'bid'" in malformed.error and not malformed.done
        assert (await session.verify()).reward is None  # not over yet: no verdict
        typed = await session.call_tool("send_keys", {"keys": "Tab"})
        assert typed.error is None, typed.content
        scrolled = await session.call_tool("scroll", {"delta_x": 0, "delta_y": 50})
        assert scrolled.error is None, scrolled.content
        bid = BUTTON.search(first["content"]).group(1)
        done = await session.call_tool("click", {"bid": bid})
        assert done.done and done.reward == 1.0
        assert session.steps == 4  # the malformed call never reached the browser
    finally:
        await session.close()


@pytest.mark.slow
@needs_chromium
@pytest.mark.anyio
async def test_fill_types_into_a_field(no_leaks):
    session = _session("miniwob.enter-text", seed=3)
    try:
        (first,) = await session.initial_messages()
        text = first["content"]
        wanted = re.search(r'Enter "([^"]+)"', text).group(1)
        field = re.search(r"\[(\w+)\] textbox", text).group(1)
        submit = re.search(r"\[(\w+)\] button 'Submit'", text).group(1)
        filled = await session.call_tool("fill", {"bid": field, "value": wanted})
        assert filled.error is None and wanted in filled.content
        result = await session.call_tool("click", {"bid": submit})
        assert result.done and result.reward == 1.0
    finally:
        await session.close()


@pytest.fixture(scope="module")
def fake_upstream() -> Iterator[str]:
    with serve_in_thread(FakeVLLM(tool_call_every_turn=True).app) as url:
        yield url


@pytest.mark.slow
@needs_chromium
@pytest.mark.anyio
async def test_rollout_through_the_capture_proxy_is_trainable(fake_upstream, no_leaks):
    proxy = CaptureProxy(
        ProxyConfig(
            llm_url=f"{fake_upstream}/v1", model=DEFAULT_MODEL, capture_level=CaptureLevel.TOKENS
        ),
        upstream=Upstream(f"{fake_upstream}/v1"),
    )
    out = await run_env_rollout("browsergym:miniwob.click-test", proxy=proxy, seed=0)
    result = out.result
    assert result.ok, (result.error, result.findings)
    assert result.n_trainable_tokens > 0 and result.n_tool_calls > 0
    assert out.document is not None


@pytest.mark.slow
@needs_chromium
@pytest.mark.anyio
async def test_concurrent_episodes_each_get_their_own_browser_thread(no_leaks):
    rewards: list[float | None] = []

    async def solve(seed: int) -> None:
        session = _session(seed=seed)
        try:
            (first,) = await session.initial_messages()
            bid = BUTTON.search(first["content"]).group(1)
            await session.call_tool("click", {"bid": bid})
            rewards.append((await session.verify()).reward)
        finally:
            await session.close()

    async with anyio.create_task_group() as tg:
        for seed in range(3):
            tg.start_soon(solve, seed)
    assert rewards == [1.0, 1.0, 1.0]


@pytest.mark.slow
@needs_chromium
@pytest.mark.anyio
async def test_a_cancelled_step_still_closes_the_browser(no_leaks):
    session = _session()
    try:
        await session.initial_messages()
        with anyio.move_on_after(0.05) as scope:
            await session.call_tool("noop", {})
        assert scope.cancelled_caught
    finally:
        with anyio.CancelScope(shield=True):
            await session.close()


@pytest.mark.slow
@needs_chromium
@pytest.mark.anyio
async def test_a_browser_that_cannot_start_is_a_failed_result(monkeypatch, fake_upstream, no_leaks):
    proxy = CaptureProxy(
        ProxyConfig(llm_url=f"{fake_upstream}/v1", model=DEFAULT_MODEL),
        upstream=Upstream(f"{fake_upstream}/v1"),
    )
    adapter = bg.BrowserGymAdapter()
    session = adapter.make_session("miniwob.click-test", {}, seed=0, episode_id="e")
    monkeypatch.setattr(bg, "CHROMIUM", "/bin/false")  # passes the check, fails to launch
    with pytest.raises(Exception, match="false"):
        await session.initial_messages()
    await session.close()
    out = await run_env_rollout("browsergym:miniwob.click-test", proxy=proxy, seed=0)
    assert not out.result.ok and out.result.error


@pytest.mark.anyio
async def test_closing_an_unstarted_session_starts_nothing(monkeypatch, no_leaks):
    monkeypatch.setattr(bg, "CHROMIUM", "/bin/true")  # never launched: any executable passes
    session = bg.BrowserGymAdapter().make_session("miniwob.click-test", {}, seed=0, episode_id="e")
    await session.close()
    result = await session.call_tool("click", {"bid": "1"})
    assert result.error and result.done


@pytest.mark.slow
@needs_chromium
@pytest.mark.anyio
async def test_rollout_against_the_real_reference_engine_is_ok_and_trainable(engine_url, no_leaks):
    upstream = Upstream(engine_url)
    proxy = CaptureProxy(
        ProxyConfig(
            llm_url=engine_url, model="SmolLM2-135M-Instruct", capture_level=CaptureLevel.TOKENS
        ),
        upstream=upstream,
    )
    try:
        out = await run_env_rollout(
            "browsergym:miniwob.click-test",
            proxy=proxy,
            seed=0,
            limits=LoopLimits(seed=0, max_turns=2, max_tokens=32, temperature=0.7),
        )
    finally:
        await upstream.aclose()
    assert out.result.ok, (out.result.error, out.result.findings)
    assert out.result.n_trainable_tokens > 0  # whatever the reward
