"""OpenSpiel games as tools: scripted games, opponents, the capture path, and edge cases."""

from __future__ import annotations

import random
from typing import Any

import pytest

from rollwire.harnesses.envs import openspiel as osx
from rollwire.harnesses.envs.registry import TaskError, list_tasks
from rollwire.harnesses.envs.run import run_env_rollout
from rollwire.sessions.stepenv import StepEnvSession
from rollwire.sessions.toolloop import LoopLimits, run_tool_loop

pytestmark = pytest.mark.anyio

ADAPTER = osx.OpenSpielAdapter()


def session(name: str = "tic_tac_toe", seed: int | None = 1, **config: Any) -> StepEnvSession:
    made = ADAPTER.make_session(name, config, seed=seed, episode_id="t")
    assert isinstance(made, StepEnvSession)
    return made


async def play_random(s: StepEnvSession, seed: int, cap: int = 1000) -> list[str]:
    """Play uniformly random legal moves (by id) until the game ends or ``cap`` moves."""
    rng = random.Random(seed)
    seen = [(await s.initial_messages())[-1]["content"]]
    for _ in range(cap):
        if s.done:
            break
        legal = s.env.legal_moves()  # type: ignore[attr-defined]
        result = await s.call_tool("play_move", {"move": str(rng.choice(sorted(legal)))})
        assert result.error is None, result.content
        seen.append(result.content)
    return seen


# --------------------------------------------------------------------------- scripted, no model


async def test_scripted_winning_line_against_first_legal_scores_one():
    s = session(opponent="first_legal")
    first = (await s.initial_messages())[-1]["content"]
    assert "Board:\n...\n...\n..." in first and "4: x(1,1)" in first
    # x: 2, o (first legal): 0, x: 4, o: 1, x: 6 -> the anti-diagonal 2-4-6.
    r1 = await s.call_tool("play_move", {"move": "2"})  # by id, as a string
    assert "Player 1 played: o(0,0)" in r1.content and not r1.done
    r2 = await s.call_tool("play_move", {"move": "X(1,1)"})  # by name, any case
    assert "Player 1 played: o(0,1)" in r2.content
    r3 = await s.call_tool("play_move", {"move": 6})  # by id, as a number
    assert r3.done and r3.reward == 1.0 and "Game over" in r3.content
    verdict = await s.verify()
    assert verdict.reward == 1.0 and verdict.rewards == {"return": 1.0}
    await s.close()


async def test_illegal_move_is_a_tool_error_and_the_game_goes_on():
    s = session(opponent="first_legal")
    await s.initial_messages()
    await s.call_tool("play_move", {"move": "4"})  # o replies in cell 0
    for bad in ("0", "4", "99", "o(2,2)", "Paris", ""):
        result = await s.call_tool("play_move", {"move": bad})
        assert result.error is not None and not result.done, bad
        assert "legal moves" in result.error or "move" in result.error
    assert not s.done and s.steps == 1
    ok = await s.call_tool("play_move", {"move": "8"})
    assert ok.error is None and s.steps == 2
    assert (await s.verify()).reward is None  # not over yet: no verdict


async def test_agent_as_second_player_sees_the_opponents_first_move():
    s = session(agent_player=1, opponent="first_legal")
    text = (await s.initial_messages())[-1]["content"]
    assert "You are player 1" in text and "Player 0 played: x(0,0)" in text
    assert "1: o(0,1)" in text and "0: " not in text.split("legal moves")[1]


@pytest.mark.parametrize("opponent", ["random", "mcts"])
async def test_seeded_opponents_are_reproducible(opponent):
    games = []
    for _ in range(2):
        s = session("tic_tac_toe", seed=11, opponent=opponent, mcts_simulations=16)
        games.append(await play_random(s, seed=5))
        assert (await s.verify()).reward in (-1.0, 0.0, 1.0)
    assert games[0] == games[1]


async def test_chance_nodes_are_sampled_from_the_seed():
    transcripts = []
    for seed in (4, 4, 5):
        s = session("pig", seed=seed)
        transcripts.append(await play_random(s, seed=1, cap=30))
    assert transcripts[0] == transcripts[1] != transcripts[2]
    assert any("Chance:" in line for line in transcripts[0])


async def test_imperfect_information_shows_only_the_agents_view():
    s = session("kuhn_poker", seed=2)
    text = (await s.initial_messages())[-1]["content"]
    assert "Chance:" not in text  # the deal is hidden; the agent's observation string is shown
    assert "Pass" in text and "Bet" in text


@pytest.mark.parametrize("name", osx.LISTED_GAMES)
async def test_every_listed_game_plays_random_moves(name):
    s = session(name, seed=3)
    await play_random(s, seed=3, cap=25)
    verdict = await s.verify()
    assert (verdict.reward is None) == (not s.done)


def test_listing_and_game_parameters():
    listing = list_tasks(["openspiel"])
    assert not listing.unavailable
    assert {t.task for t in listing.tasks} == {f"openspiel:{g}" for g in osx.LISTED_GAMES}
    s = session("go", board_size=9)
    assert s.env.game.num_distinct_actions() == 82  # type: ignore[attr-defined]


def test_unknown_game_and_bad_config_are_task_errors_naming_them():
    cases = [
        ("no_such_game", {}, "no_such_game"),
        ("tic_tac_toe", {"opponent": "grandmaster"}, "grandmaster"),
        ("tic_tac_toe", {"agent_player": 2}, "agent_player 2"),
        ("tic_tac_toe", {"agent_player": "0"}, "agent_player"),
        ("tic_tac_toe", {"board_size": 9}, "board_size"),
        ("go", {"board_size": "big"}, "board_size"),
        ("tic_tac_toe", {"mcts_simulations": 0}, "mcts_simulations"),
        ("matrix_rps", {}, "simultaneous"),
    ]
    for name, config, needle in cases:
        with pytest.raises(TaskError, match=needle):
            ADAPTER.make_session(name, config, seed=1, episode_id="x")


# --------------------------------------------------------------------------- through the proxy


async def test_rollout_through_the_capture_proxy_masks_tool_results(tool_proxy, harness_checks):
    out = await run_env_rollout("openspiel:tic_tac_toe", proxy=tool_proxy, seed=2)
    r = out.result
    assert r.ok, (r.error, r.findings)
    assert r.n_trainable_tokens > 0 and r.n_tool_calls == 1
    # The fake plays a city name: refused, so the game is not over and there is no verdict.
    assert r.stop_reason == "no_tool_call" and r.reward is None
    harness_checks.trainable(out.document, tool_outputs_expected=True)


async def test_unknown_game_is_a_failed_result_naming_it(tool_proxy):
    out = await run_env_rollout("openspiel:no_such_game", proxy=tool_proxy, seed=1)
    assert not out.result.ok and "no_such_game" in (out.result.error or "")


async def test_env_exception_mid_episode_is_no_reward_with_a_reason(monkeypatch):
    s = session(opponent="first_legal")
    await s.initial_messages()
    calls = {"n": 0}
    real = osx.OpenSpielEnv.step

    def flaky(self: osx.OpenSpielEnv, action: int) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("engine crashed")
        return real(self, action)

    monkeypatch.setattr(osx.OpenSpielEnv, "step", flaky)
    assert (await s.call_tool("play_move", {"move": "4"})).error is None
    broken = await s.call_tool("play_move", {"move": "8"})
    assert broken.done and "engine crashed" in (broken.error or "")
    after = await s.call_tool("play_move", {"move": "7"})
    assert after.error and "over" in after.error and calls["n"] == 2
    verdict = await s.verify()
    assert verdict.reward is None and "engine crashed" in (verdict.reason or "")


async def test_model_that_never_calls_a_tool_gets_no_reward(text_proxy):
    out = await run_env_rollout("openspiel:tic_tac_toe", proxy=text_proxy, seed=2)
    r = out.result
    assert r.ok and r.stop_reason == "no_tool_call" and r.reward is None
    assert r.n_tool_calls == 0 and r.n_trainable_tokens > 0


async def test_fifty_tool_calls_in_one_turn_run_only_the_limit(harness_checks):
    s = session(opponent="first_legal")
    app = harness_checks.many_calls_app(50, lambda i: {"move": str(i % 9)})
    chat = harness_checks.asgi_upstream(app)
    limits = LoopLimits(max_tool_calls_per_turn=4)
    try:
        outcome = await run_tool_loop(s, chat, limits)
    finally:
        await chat.aclose()
    assert outcome.tool_calls == 4 and outcome.stop_reason == "no_tool_call"
    harness_checks.every_call_answered(outcome.messages, executed=4, n=50)
    # moves 0..3 were tried in order: 0 legal, o took 1, 2 legal, o took 3 -> 2 moves applied
    assert s.steps == 2


# --------------------------------------------------------------------------- real engine


@pytest.mark.slow
async def test_rollout_against_the_reference_engine(engine_proxy, harness_checks):
    limits = LoopLimits(max_turns=2, max_tokens=48, temperature=0.7, seed=3)
    out = await run_env_rollout(
        "openspiel:tic_tac_toe",
        proxy=engine_proxy,
        config={"opponent": "random"},
        seed=3,
        limits=limits,
    )
    r = out.result
    assert r.ok, (r.error, r.findings)
    assert r.n_trainable_tokens > 0
    harness_checks.ones_in_spans(out.document)
