"""answer_mode: an env episode scored from the model's reply text as well as from its tool call.

``tool`` (the default) keeps today's rule: a reply with no tool call ends the episode with no
verdict (reward None). ``text`` offers no tools and reads the reply with the environment's own
extraction (reasoning-gym's ``<answer>`` tags, TextArena's move parser); ``either`` offers the
tools and reads a reply without a call as in ``text``. Families whose actions are not answers
(OpenSpiel, BrowserGym) refuse the text modes, naming ``answer_mode``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rollwire.harnesses.envs import reasoning_gym as rgx
from rollwire.harnesses.envs import textarena as tax
from rollwire.harnesses.envs.registry import TaskError, load_adapter
from rollwire.harnesses.envs.run import run_env_rollout
from rollwire.sessions.stepenv import StepEnvSession
from tests.fakes.serve import serve_in_thread
from tests.fakes.vllm import FakeVLLM
from tests.harnesses.conftest import _proxy

pytestmark = pytest.mark.anyio

TASK = "reasoning_gym:chain_sum"
CONFIG = {"min_terms": 2, "max_terms": 3}
HANOI = ["[A C]", "[A B]", "[C B]", "[A C]", "[B A]", "[B C]", "[A C]"]


@pytest.fixture(scope="module")
def rg() -> rgx.ReasoningGymAdapter:
    rgx._rg()
    return rgx.ReasoningGymAdapter()


def chain_sum(adapter: rgx.ReasoningGymAdapter, mode: str, seed: int = 3) -> StepEnvSession:
    made = adapter.make_session(
        "chain_sum", dict(CONFIG), seed=seed, episode_id="t", answer_mode=mode
    )  # type: ignore[arg-type]
    assert isinstance(made, StepEnvSession)
    return made


def answer_of(adapter: rgx.ReasoningGymAdapter, seed: int) -> str:
    return str(adapter.make_dataset("chain_sum", dict(CONFIG), seed)[0]["answer"])


# --------------------------------------------------------------------------- reasoning-gym, no model


async def test_text_mode_offers_no_tools_and_asks_in_reasoning_gyms_own_words(rg):
    s = chain_sum(rg, "text")
    assert s.list_tools() == [] and s.takes_text_answers()
    prompt = (await s.initial_messages())[-1]["content"]
    from reasoning_gym.utils import SYSTEM_PROMPTS

    assert prompt.startswith(SYSTEM_PROMPTS["default"].strip())
    assert s.env.entry["question"] in prompt  # type: ignore[attr-defined]


async def test_correct_text_answer_scores_one(rg):
    s = chain_sum(rg, "text")
    await s.initial_messages()
    answer = s.env.entry["answer"]  # type: ignore[attr-defined]
    result = await s.answer_text(f"First I add, then subtract.\n<answer>{answer}</answer>")
    assert result.done and result.error is None and result.reward == 1.0
    assert (await s.verify()).reward == 1.0


async def test_reply_without_answer_tags_scores_zero_not_none(rg):
    s = chain_sum(rg, "text")
    await s.initial_messages()
    answer = s.env.entry["answer"]  # type: ignore[attr-defined]
    result = await s.answer_text(f"The answer is {answer}.")  # right number, no tags
    assert result.done and result.reward == 0.0 and "no answer" in result.content
    verdict = await s.verify()
    assert verdict.reward == 0.0 and verdict.rewards == {"score": 0.0}


async def test_the_last_answer_tag_is_the_one_scored(rg):
    s = chain_sum(rg, "text")
    await s.initial_messages()
    answer = s.env.entry["answer"]  # type: ignore[attr-defined]
    result = await s.answer_text(f"<answer>nope</answer> wait: <answer>{answer}</answer>")
    assert result.reward == 1.0


async def test_either_mode_takes_the_tool_or_the_text(rg):
    by_tool = chain_sum(rg, "either")
    assert [t.name for t in by_tool.list_tools()] == ["answer"] and by_tool.takes_text_answers()
    prompt = (await by_tool.initial_messages())[-1]["content"]
    assert "`answer` tool" in prompt and "<answer></answer>" in prompt
    answer = by_tool.env.entry["answer"]  # type: ignore[attr-defined]
    assert (await by_tool.call_tool("answer", {"answer": answer})).reward == 1.0
    by_text = chain_sum(rg, "either")
    await by_text.initial_messages()
    assert (await by_text.answer_text(f"<answer>{answer}</answer>")).reward == 1.0


async def test_tool_mode_is_the_default_and_takes_no_text(rg):
    s = rg.make_session("chain_sum", dict(CONFIG), seed=3, episode_id="t")
    assert not s.takes_text_answers() and [t.name for t in s.list_tools()] == ["answer"]
    await s.initial_messages()
    refused = await s.answer_text("<answer>1</answer>")
    assert refused.error and "tool" in refused.error and not refused.done
    assert (await s.verify()).reward is None


async def test_a_second_text_answer_after_the_end_is_refused(rg):
    s = chain_sum(rg, "text")
    await s.initial_messages()
    await s.answer_text("<answer>not a number</answer>")
    again = await s.answer_text(f"<answer>{s.env.entry['answer']}</answer>")  # type: ignore[attr-defined]
    assert again.error and "over" in again.error
    assert (await s.verify()).reward == 0.0  # the first answer stands


# --------------------------------------------------------------------------- other families


async def test_textarena_text_mode_plays_each_reply_as_a_move():
    tax._ta()
    s = tax.TextArenaAdapter().make_session(
        "TowerOfHanoi-v0", {}, seed=1, episode_id="t", answer_mode="text"
    )
    assert s.list_tools() == [] and s.takes_text_answers()
    await s.initial_messages()
    for move in HANOI:  # in prose: the game's own parser finds the bracketed move
        result = await s.answer_text(f"I will move the top disk: {move}")
        assert result.error is None, result.content
    assert result.done and result.reward == 1.0
    assert (await s.verify()).reward == 1.0


@pytest.mark.parametrize("mode", ["text", "either"])
@pytest.mark.parametrize(
    ("family", "name"), [("openspiel", "tic_tac_toe"), ("browsergym", "miniwob.click-test")]
)
def test_families_without_answers_refuse_text_modes_naming_the_field(family, name, mode):
    adapter = load_adapter(family)
    with pytest.raises(TaskError, match=rf"answer_mode: '{mode}': {family} tasks take answers"):
        adapter.make_session(name, {}, seed=1, episode_id="x", answer_mode=mode)


def test_an_unknown_answer_mode_is_a_task_error(rg):
    with pytest.raises(TaskError, match="answer_mode: 'voice' is not one of"):
        rg.make_session("chain_sum", {}, seed=1, episode_id="x", answer_mode="voice")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- through the proxy


@pytest.fixture
def scripted() -> Iterator[FakeVLLM]:
    """A fake vLLM whose replies a test scripts (no tool calls unless the text has them)."""
    fake = FakeVLLM()
    with serve_in_thread(fake.app) as url:
        fake.url = url  # type: ignore[attr-defined]
        yield fake


async def test_text_mode_rollout_scores_a_correct_reply_one(rg, scripted, harness_checks):
    answer = answer_of(rg, 5)
    scripted.behavior.scripted_replies = [f"I add the terms. <answer>{answer}</answer>"]
    async for proxy in _proxy(scripted.url):  # type: ignore[attr-defined]
        out = await run_env_rollout(
            TASK, proxy=proxy, config=CONFIG, seed=5, answer_mode="text", include_sequences=True
        )
    r = out.result
    assert r.ok, (r.error, r.findings)
    assert r.reward == 1.0 and r.stop_reason == "text_answer" and r.answer_mode == "text"
    assert r.n_tool_calls == 0 and r.n_trainable_tokens > 0
    assert "tools" not in scripted.requests[-1]  # text mode offers no tools
    assert r.tools is None and [m["role"] for m in r.messages or []] == ["user", "assistant"]
    harness_checks.ones_in_spans(out.document)


async def test_text_mode_rollout_of_a_model_that_never_tags_scores_zero(rg, text_proxy):
    out = await run_env_rollout(TASK, proxy=text_proxy, config=CONFIG, seed=5, answer_mode="text")
    r = out.result
    assert r.ok and r.reward == 0.0 and r.stop_reason == "text_answer"
    assert not any(f.code == "no_verdict" for f in r.findings)


async def test_tool_mode_rollout_of_the_same_model_has_no_reward(rg, text_proxy):
    out = await run_env_rollout(TASK, proxy=text_proxy, config=CONFIG, seed=5)
    assert out.result.reward is None and out.result.stop_reason == "no_tool_call"
    assert out.result.answer_mode == "tool"


async def test_either_mode_rollout_still_takes_the_tool_call(rg, tool_proxy):
    out = await run_env_rollout(
        TASK, proxy=tool_proxy, config=CONFIG, seed=5, answer_mode="either", include_sequences=True
    )
    r = out.result
    assert r.ok and r.stop_reason == "done" and r.n_tool_calls == 1 and r.reward == 0.0
    assert [t["function"]["name"] for t in r.tools or []] == ["answer"]
    assert [m["role"] for m in r.messages or []] == ["user", "assistant", "tool"]


async def test_textarena_text_mode_rollout_continues_after_each_move(scripted):
    scripted.behavior.scripted_replies = [f"Moving {m}." for m in HANOI]
    async for proxy in _proxy(scripted.url):  # type: ignore[attr-defined]
        out = await run_env_rollout(
            "textarena:TowerOfHanoi-v0", proxy=proxy, seed=1, answer_mode="text"
        )
    r = out.result
    assert r.ok, (r.error, r.findings)
    assert r.reward == 1.0 and r.stop_reason == "text_answer" and r.n_turns == len(HANOI)


async def test_a_text_mode_on_a_family_without_answers_is_a_failed_result_naming_it(tool_proxy):
    out = await run_env_rollout("openspiel:tic_tac_toe", proxy=tool_proxy, answer_mode="text")
    assert not out.result.ok and "answer_mode: 'text'" in (out.result.error or "")


async def test_text_mode_reads_no_tool_call_from_the_reply_text(rg, scripted):
    answer = answer_of(rg, 5)
    written_call = '<tool_call>\n{"name": "answer", "arguments": {"answer": "1"}}\n</tool_call>'
    scripted.behavior.scripted_replies = [f"{written_call}\n<answer>{answer}</answer>"]
    async for proxy in _proxy(scripted.url):  # type: ignore[attr-defined]
        out = await run_env_rollout(TASK, proxy=proxy, config=CONFIG, seed=5, answer_mode="text")
    r = out.result  # no tool was offered: the written call is text, and the tags are the answer
    assert r.reward == 1.0 and r.n_tool_calls == 0 and r.stop_reason == "text_answer"
