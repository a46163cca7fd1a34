"""StepEnvSession: actions as tools; reset/step/state/close never offered."""

from __future__ import annotations

import pytest

from rollwire.sessions.base import ReservedToolName, ToolSpec
from rollwire.sessions.stepenv import ActionTool, StepEnvSession, StepOutcome
from tests.sessions.conftest import CounterEnv, counter_session

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("name", ["reset", "step", "state", "close"])
def test_reserved_tool_name_is_refused_at_construction(name):
    with pytest.raises(ReservedToolName, match=name):
        StepEnvSession(
            env=CounterEnv(), tools=[ActionTool(ToolSpec(name=name, description="x"), lambda a: a)]
        )


@pytest.mark.parametrize("name", ["reset", "step", "state", "close"])
async def test_reserved_tool_name_is_refused_at_call_time(name):
    session = counter_session()
    await session.initial_messages()
    result = await session.call_tool(name, {})
    assert result.error and "reserved" in result.error
    assert session.env.steps == 0


async def test_only_action_tools_are_listed():
    assert [t.name for t in counter_session().list_tools()] == ["add"]


async def test_scripted_episode_reaches_the_envs_reward():
    session = counter_session(system_prompt="Play.")
    messages = await session.initial_messages()
    assert (
        messages[0] == {"role": "system", "content": "Play."}
        and "counter = 0" in messages[1]["content"]
    )
    assert not (await session.call_tool("add", {"n": 2})).done
    last = await session.call_tool("add", {"n": 1})
    assert last.done and last.reward == 1.0
    assert (await session.verify()).reward == 1.0


async def test_unfinished_episode_has_no_verdict():
    session = counter_session()
    await session.initial_messages()
    await session.call_tool("add", {"n": 1})
    verdict = await session.verify()
    assert verdict.reward is None and "did not reach its end" in verdict.reason


async def test_illegal_move_is_a_tool_error_and_the_episode_goes_on():
    session = counter_session()
    await session.initial_messages()
    bad = await session.call_tool("add", {"n": -1})
    assert bad.error and "illegal" in bad.error and not bad.done
    assert (await session.call_tool("add", {"n": 3})).done


async def test_bad_arguments_are_a_tool_error():
    session = counter_session()
    await session.initial_messages()
    result = await session.call_tool("add", {"n": "two"})
    assert result.error and "'n' must be an integer" in result.content


async def test_unknown_tool_names_the_available_ones():
    session = counter_session()
    await session.initial_messages()
    assert "['add']" in (await session.call_tool("jump", {})).content


async def test_env_exception_mid_episode_ends_it_visibly_without_a_verdict():
    session = counter_session(CounterEnv(fail_on_step=1))
    await session.initial_messages()
    result = await session.call_tool("add", {"n": 1})
    assert result.done and "environment error" in result.content
    verdict = await session.verify()
    assert verdict.reward is None and "crashed" in verdict.reason


async def test_actions_after_the_end_are_refused():
    session = counter_session()
    await session.initial_messages()
    await session.call_tool("add", {"n": 3})
    assert "over" in (await session.call_tool("add", {"n": 1})).content


async def test_close_closes_the_env_once():
    env = CounterEnv()
    session = counter_session(env)
    await session.close()
    await session.close()
    assert env.closed


async def test_episode_that_ends_during_reset_accepts_no_action_and_keeps_its_reward():
    env = CounterEnv()
    env.reset = lambda seed: StepOutcome(observation="over already", reward=1.0, done=True)  # type: ignore[method-assign]
    session = counter_session(env)
    await session.initial_messages()
    assert "over" in (await session.call_tool("add", {"n": 1})).content
    assert (await session.verify()).reward == 1.0
