"""TextArena games as tools: the allow-list verified offline, scripted games, the capture path."""

from __future__ import annotations

import random
from typing import Any

import pytest

from rollwire.harnesses.envs import textarena as tax
from rollwire.harnesses.envs.registry import TaskError, list_tasks
from rollwire.harnesses.envs.run import run_env_rollout
from rollwire.sessions.stepenv import StepEnvSession
from rollwire.sessions.toolloop import LoopLimits, run_tool_loop

pytestmark = pytest.mark.anyio

ADAPTER = tax.TextArenaAdapter()
HANOI = ["[A C]", "[A B]", "[C B]", "[A C]", "[B A]", "[B C]", "[A C]"]


@pytest.fixture(scope="module", autouse=True)
def _textarena_imported() -> None:
    """Import textarena once for the module (about two seconds)."""
    tax._ta()


def session(name: str = "TicTacToe-v0", seed: int | None = 1, **config: Any) -> StepEnvSession:
    made = ADAPTER.make_session(name, config, seed=seed, episode_id="t")
    assert isinstance(made, StepEnvSession)
    return made


# --------------------------------------------------------------------------- the allow-list


@pytest.mark.parametrize(
    ("game_id", "seat"),
    [(g, seat) for g, spec in tax.GAMES.items() for seat in range(spec.players)],
)
async def test_allow_listed_game_runs_offline_to_a_numeric_result(game_id, seat, capsys):
    """The verification behind the allow-list: a scripted episode (the game's own random policy
    in the agent's seat) runs to the end, offline, with a numeric reward and nothing printed."""
    s = session(game_id, seed=7, agent_player=seat)
    text = (await s.initial_messages())[-1]["content"]
    assert text.strip()
    rng = random.Random(1)
    env = s.env  # type: ignore[attr-defined]
    for _ in range(400):
        if s.done:
            break
        options = env.game.policy(env.env, text, rng)
        assert options, f"{game_id}: the policy found no move in:\n{text[-500:]}"
        result = await s.call_tool("act", {"action": rng.choice(options)})
        text = result.content
    assert s.done and s.failed is None, text[-500:]
    verdict = await s.verify()
    assert isinstance(verdict.reward, float), verdict
    if env.game.players == 2:  # the built-in opponent never made an invalid move
        assert not env.game_info[1 - seat].get("invalid_move"), env.game_info
    assert capsys.readouterr().out == ""


def test_listing_is_the_allow_list():
    listing = list_tasks(["textarena"])
    assert not listing.unavailable
    assert [t.task for t in listing.tasks] == [f"textarena:{g}" for g in tax.GAMES]
    assert all(t.description for t in listing.tasks)


@pytest.mark.parametrize(
    ("game_id", "needle"),
    [
        ("Wordle-v0", "NLTK"),
        ("Hangman-v0-hardcore", "NLTK"),
        ("Debate-v0", "API key"),
        ("TwentyQuestions-v0", "API key"),
        ("Klondike-v0", "SyntaxError"),
        ("FifteenPuzzle-v0", "set_winners"),
        ("Countdown-v0", "not a number"),
        ("SecretMafia-v0", "3 or more players"),
        ("QuantumTicTacToe-v0", "not on the allow-list"),
        ("TicTacToe-v0-train", "not on the allow-list"),
        ("NoSuchGame-v0", "is unknown"),
    ],
)
def test_refused_games_say_why(game_id, needle):
    with pytest.raises(TaskError, match=needle) as info:
        ADAPTER.make_session(game_id, {}, seed=1, episode_id="x")
    assert game_id in str(info.value)


def test_bad_config_is_a_task_error_naming_it():
    with pytest.raises(TaskError, match="agent_player 2"):
        ADAPTER.make_session("TicTacToe-v0", {"agent_player": 2}, seed=1, episode_id="x")
    with pytest.raises(TaskError, match="agent_player 1"):
        ADAPTER.make_session("GuessTheNumber-v0", {"agent_player": 1}, seed=1, episode_id="x")
    with pytest.raises(TaskError, match="difficulty"):
        ADAPTER.make_session("TicTacToe-v0", {"difficulty": "hard"}, seed=1, episode_id="x")


# --------------------------------------------------------------------------- scripted, no model


async def test_tower_of_hanoi_solved_scores_one():
    s = session("TowerOfHanoi-v0")
    text = (await s.initial_messages())[-1]["content"]
    assert "Tower of Hanoi" in text and "A: [3, 2, 1]" in text
    for move in HANOI:
        result = await s.call_tool("act", {"action": move})
        assert result.error is None, result.content
    assert result.done and result.reward == 1.0
    assert (await s.verify()).reward == 1.0


async def test_tic_tac_toe_invalid_moves_lose_by_the_games_own_rule():
    s = session("TicTacToe-v0")
    await s.initial_messages()
    first = await s.call_tool("act", {"action": "the middle please"})
    assert first.error and "invalid move" in first.error and not first.done  # one retry allowed
    second = await s.call_tool("act", {"action": "[42]"})
    assert second.done and second.reward == -1.0
    verdict = await s.verify()
    assert verdict.reward == -1.0 and verdict.metrics["invalid_move"] is True


async def test_invalid_move_is_a_tool_error_and_the_game_goes_on():
    s = session("TicTacToe-v0", agent_player=1)
    text = (await s.initial_messages())[-1]["content"]
    assert "[Player 0]" in text  # the opponent moved first
    taken = next(c for c in range(9) if f"'[{c}]'" not in text.rsplit("Available Moves", 1)[1])
    refused = await s.call_tool("act", {"action": f"[{taken}]"})
    assert refused.error and "occupied" in refused.error and not refused.done
    free = next(c for c in range(9) if f"'[{c}]'" in text.rsplit("Available Moves", 1)[1])
    ok = await s.call_tool("act", {"action": f"[{free}]"})
    assert ok.error is None and "[Player 0]" in ok.content  # the opponent replied


async def test_the_seed_makes_the_opponent_reproducible():
    transcripts = []
    for seed in (3, 3, 4):
        s = session("ConnectFour-v0", seed=seed)
        lines = [(await s.initial_messages())[-1]["content"]]
        for col in (3, 3, 3):
            lines.append((await s.call_tool("act", {"action": f"[col {col}]"})).content)
        transcripts.append(lines)
    assert transcripts[0] == transcripts[1] != transcripts[2]


async def test_interleaved_episodes_keep_their_own_dice_and_the_process_its_random():
    """TextArena rolls dice with the global ``random``: each episode keeps its own stream."""

    async def rolls(sessions: list[StepEnvSession]) -> list[list[str]]:
        out: list[list[str]] = [[(await s.initial_messages())[-1]["content"]] for s in sessions]
        for _ in range(6):
            for i, s in enumerate(sessions):  # interleaved, move by move
                out[i].append((await s.call_tool("act", {"action": "[roll]"})).content)
        return out

    random.seed(1234)
    expected_next = random.random()
    random.seed(1234)
    (solo,) = await rolls([session("PigDice-v0", seed=8)])
    assert random.random() == expected_next  # the process's stream was left alone
    together = await rolls([session("PigDice-v0", seed=8), session("PigDice-v0", seed=8)])
    assert together == [solo, solo]


async def test_textarena_output_never_reaches_stdout(capsys):
    with tax.quiet():
        print("textarena chatter")
    s = session("TowerOfHanoi-v0")
    await s.initial_messages()
    for move in HANOI:
        await s.call_tool("act", {"action": move})
    assert capsys.readouterr().out == ""


# --------------------------------------------------------------------------- through the proxy


async def test_rollout_through_the_capture_proxy_masks_tool_results(tool_proxy, harness_checks):
    out = await run_env_rollout("textarena:TicTacToe-v0", proxy=tool_proxy, seed=2)
    r = out.result
    assert r.ok, (r.error, r.findings)
    assert r.n_trainable_tokens > 0 and r.n_tool_calls == 1
    # The fake plays a city name: the game refuses it (one retry), then the fake stops.
    assert r.stop_reason == "no_tool_call" and r.reward is None
    harness_checks.trainable(out.document, tool_outputs_expected=True)


async def test_unknown_game_is_a_failed_result_naming_it(tool_proxy):
    out = await run_env_rollout("textarena:NoSuchGame-v0", proxy=tool_proxy, seed=1)
    assert not out.result.ok and "NoSuchGame-v0" in (out.result.error or "")
    refused = await run_env_rollout("textarena:Wordle-v0", proxy=tool_proxy, seed=1)
    assert not refused.result.ok and "NLTK" in (refused.result.error or "")


async def test_env_exception_mid_episode_is_no_reward_with_a_reason():
    s = session("TowerOfHanoi-v0")
    await s.initial_messages()
    game = s.env.env  # type: ignore[attr-defined]  # the real TextArena env object
    real = game.step
    calls = {"n": 0}

    def flaky(action: str) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyError("tower Z")
        return real(action=action)

    game.step = flaky
    assert (await s.call_tool("act", {"action": HANOI[0]})).error is None
    broken = await s.call_tool("act", {"action": HANOI[1]})
    assert broken.done and "tower Z" in (broken.error or "")
    verdict = await s.verify()
    assert verdict.reward is None and "failed mid-episode" in (verdict.reason or "")


async def test_model_that_never_calls_a_tool_gets_no_reward(text_proxy):
    out = await run_env_rollout("textarena:TicTacToe-v0", proxy=text_proxy, seed=2)
    r = out.result
    assert r.ok and r.stop_reason == "no_tool_call" and r.reward is None
    assert r.n_tool_calls == 0 and r.n_trainable_tokens > 0
    assert any("did not reach its end" in f.message for f in r.findings)


async def test_fifty_tool_calls_in_one_turn_run_only_the_limit(harness_checks):
    s = session("TowerOfHanoi-v0")
    app = harness_checks.many_calls_app(50, lambda i: {"action": HANOI[i % len(HANOI)]})
    chat = harness_checks.asgi_upstream(app)
    limits = LoopLimits(max_tool_calls_per_turn=4)
    try:
        outcome = await run_tool_loop(s, chat, limits)
    finally:
        await chat.aclose()
    assert outcome.tool_calls == 4 and outcome.stop_reason == "no_tool_call"
    harness_checks.every_call_answered(outcome.messages, executed=4, n=50)
    assert s.steps == 4 and not s.done  # the first four moves of the solution, in order


# --------------------------------------------------------------------------- real engine


@pytest.mark.slow
async def test_rollout_against_the_reference_engine(engine_proxy, harness_checks):
    limits = LoopLimits(max_turns=2, max_tokens=48, temperature=0.7, seed=3)
    out = await run_env_rollout("textarena:TicTacToe-v0", proxy=engine_proxy, seed=3, limits=limits)
    r = out.result
    assert r.ok, (r.error, r.findings)
    assert r.n_trainable_tokens > 0
    harness_checks.ones_in_spans(out.document)
