"""reasoning-gym as a one-question episode: scripted answers, the capture path, and edge cases."""

from __future__ import annotations

from typing import Any

import pytest

from rollwire.harnesses.envs import reasoning_gym as rgx
from rollwire.harnesses.envs.registry import TaskError, list_tasks
from rollwire.harnesses.envs.run import run_env_rollout
from rollwire.sessions.stepenv import StepEnvSession
from rollwire.sessions.toolloop import LoopLimits, run_tool_loop

pytestmark = pytest.mark.anyio

TASK = "reasoning_gym:chain_sum"
CONFIG = {"min_terms": 2, "max_terms": 3}


@pytest.fixture(scope="module")
def adapter() -> rgx.ReasoningGymAdapter:
    """The adapter, with reasoning-gym imported once for the whole module."""
    rgx._rg()
    return rgx.ReasoningGymAdapter()


def session(adapter: rgx.ReasoningGymAdapter, seed: int = 3) -> StepEnvSession:
    made = adapter.make_session("chain_sum", dict(CONFIG), seed=seed, episode_id="t")
    assert isinstance(made, StepEnvSession)
    return made


# --------------------------------------------------------------------------- scripted, no model


async def test_correct_answer_from_the_entry_scores_one(adapter):
    s = session(adapter)
    messages = await s.initial_messages()
    entry: dict[str, Any] = s.env.entry  # type: ignore[attr-defined]
    assert entry["question"] in messages[-1]["content"]
    assert [t.name for t in s.list_tools()] == ["answer"]
    result = await s.call_tool("answer", {"answer": entry["answer"]})
    assert result.done and result.error is None and result.reward == 1.0
    verdict = await s.verify()
    assert verdict.reward == 1.0 and verdict.rewards == {"score": 1.0}
    assert verdict.metrics["dataset"] == "chain_sum"
    await s.close()


async def test_wrong_answer_scores_zero_and_ends_the_episode(adapter):
    s = session(adapter)
    await s.initial_messages()
    result = await s.call_tool("answer", {"answer": "definitely not a number"})
    assert result.done and result.reward == 0.0
    assert (await s.verify()).reward == 0.0
    again = await s.call_tool("answer", {"answer": s.env.entry["answer"]})  # type: ignore[attr-defined]
    assert again.error and "over" in again.error
    assert (await s.verify()).reward == 0.0  # the first answer stands


async def test_no_answer_is_no_verdict_with_a_reason(adapter):
    s = session(adapter)
    await s.initial_messages()
    verdict = await s.verify()
    assert verdict.reward is None and "no answer" in (verdict.reason or "")


async def test_the_seed_picks_the_item_and_is_reproducible(adapter):
    questions = []
    for seed in (1, 1, 2):
        s = session(adapter, seed)
        questions.append((await s.initial_messages())[-1]["content"])
    assert questions[0] == questions[1] != questions[2]
    default = adapter.make_session("chain_sum", {}, seed=None, episode_id="d")
    assert (await default.initial_messages())[-1]["content"]


async def test_missing_or_non_string_answer_is_a_tool_error(adapter):
    s = session(adapter)
    await s.initial_messages()
    missing = await s.call_tool("answer", {})
    assert missing.error and "answer" in missing.error and not missing.done
    bad = await s.call_tool("answer", {"answer": ["3"]})
    assert bad.error and not bad.done
    number = await s.call_tool("answer", {"answer": int(s.env.entry["answer"])})  # type: ignore[attr-defined]
    assert number.reward == 1.0  # an integer answer is scored as its text


def test_every_registered_dataset_is_listed_with_a_description(adapter):
    from reasoning_gym.factory import DATASETS

    listing = list_tasks(["reasoning_gym"])
    assert not listing.unavailable
    names = {t.task for t in listing.tasks}
    assert names == {f"reasoning_gym:{n}" for n in DATASETS}
    assert all(t.description for t in listing.tasks)


def test_unknown_dataset_and_bad_config_are_task_errors_naming_them(adapter):
    with pytest.raises(TaskError, match="no_such_dataset"):
        adapter.make_session("no_such_dataset", {}, seed=1, episode_id="x")
    with pytest.raises(TaskError, match="bogus_key"):
        adapter.make_session("chain_sum", {"bogus_key": 1}, seed=1, episode_id="x")
    with pytest.raises(TaskError, match="min_terms"):
        adapter.make_session("chain_sum", {"min_terms": 5, "max_terms": 2}, seed=1, episode_id="x")
    with pytest.raises(TaskError, match="seed"):
        adapter.make_session("chain_sum", {"seed": 4}, seed=1, episode_id="x")


# --------------------------------------------------------------------------- through the proxy


async def test_rollout_through_the_capture_proxy_is_trainable(adapter, tool_proxy, harness_checks):
    out = await run_env_rollout(TASK, proxy=tool_proxy, config=CONFIG, seed=5)
    r = out.result
    assert r.ok, (r.error, r.findings)
    assert r.n_trainable_tokens > 0 and r.n_tool_calls == 1
    assert r.stop_reason == "done"
    assert r.reward == 0.0  # the fake answers with a city name: the dataset scores it 0
    # The answer ends the episode, so its tool result never reaches a later prompt.
    harness_checks.trainable(out.document, tool_outputs_expected=False)


async def test_unknown_dataset_is_a_failed_result_naming_it(adapter, tool_proxy):
    out = await run_env_rollout("reasoning_gym:no_such_dataset", proxy=tool_proxy, seed=1)
    assert not out.result.ok and out.document is None
    assert "no_such_dataset" in (out.result.error or "")


async def test_env_exception_mid_episode_is_no_reward_with_a_reason(
    adapter, tool_proxy, monkeypatch
):
    calls = {"n": 0}

    def boom(self: rgx.QuestionEnv, action: str) -> Any:
        calls["n"] += 1
        raise RuntimeError("scorer exploded")

    monkeypatch.setattr(rgx.QuestionEnv, "step", boom)
    out = await run_env_rollout(TASK, proxy=tool_proxy, config=CONFIG, seed=5)
    r = out.result
    assert calls["n"] == 1
    assert r.reward is None and r.stop_reason == "done"
    reasons = [f.message for f in r.findings]
    assert any("failed mid-episode" in m and "scorer exploded" in m for m in reasons), reasons
    assert r.n_trainable_tokens > 0


async def test_model_that_never_calls_a_tool_gets_no_reward(adapter, text_proxy):
    out = await run_env_rollout(TASK, proxy=text_proxy, config=CONFIG, seed=5)
    r = out.result
    assert r.ok and r.stop_reason == "no_tool_call" and r.reward is None
    assert r.n_tool_calls == 0 and r.n_trainable_tokens > 0
    assert any("no answer" in f.message for f in r.findings)


async def test_fifty_tool_calls_in_one_turn_run_only_the_limit(adapter, harness_checks):
    s = session(adapter)
    answer = s.env.entry["answer"]  # type: ignore[attr-defined]
    app = harness_checks.many_calls_app(50, lambda i: {"answer": answer})
    chat = harness_checks.asgi_upstream(app)
    limits = LoopLimits(max_tool_calls_per_turn=4)
    try:
        outcome = await run_tool_loop(s, chat, limits)
    finally:
        await chat.aclose()
    assert outcome.tool_calls == limits.max_tool_calls_per_turn
    assert outcome.stop_reason == "done"
    harness_checks.every_call_answered(outcome.messages, executed=4, n=50)
    assert (await s.verify()).reward == 1.0  # the first answer counted; the others were refused


# --------------------------------------------------------------------------- real engine


@pytest.mark.slow
async def test_rollout_against_the_reference_engine(adapter, engine_proxy, harness_checks):
    limits = LoopLimits(max_turns=2, max_tokens=48, temperature=0.7, seed=3)
    out = await run_env_rollout(TASK, proxy=engine_proxy, config=CONFIG, seed=3, limits=limits)
    r = out.result
    assert r.ok, (r.error, r.findings)
    assert r.n_trainable_tokens > 0
    if r.stop_reason == "no_tool_call":
        assert r.reward is None
    harness_checks.ones_in_spans(out.document)
