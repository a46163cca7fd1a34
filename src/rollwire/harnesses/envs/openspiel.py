"""OpenSpiel games as tool sessions: ``openspiel:tic_tac_toe`` and any sequential game by name.

The agent plays one seat (``agent_player``, default 0) through the ``play_move`` tool; every
other seat is played by a built-in opponent (``random``, ``first_legal`` or a small seeded
``mcts``), and chance nodes are sampled with the episode's seeded RNG. Each observation shows the
board and the legal moves with their ids; a move is accepted as its id or its name. An illegal
move is a tool error the agent reads, and the episode goes on. The reward is the agent's return
at the terminal state, as OpenSpiel computes it.

Config: ``agent_player``, ``opponent``, ``mcts_simulations``; any other key is a game parameter
(e.g. ``{"board_size": 9}`` for go).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rollwire.extras import install_hint
from rollwire.harnesses.envs.registry import TaskError, TaskInfo, check_answer_mode
from rollwire.sessions.base import AnswerMode, EnvVerdict, ResourceSession, ToolSpec
from rollwire.sessions.stepenv import ActionTool, StepEnvSession, StepOutcome, ToolArgumentError

FAMILY = "openspiel"
DEFAULT_SEED = 0
OPPONENTS = ("random", "first_legal", "mcts")
ADAPTER_KEYS = ("agent_player", "opponent", "mcts_simulations")
DEFAULT_MCTS_SIMULATIONS = 32
MAX_MCTS_SIMULATIONS = 10_000
# Listed tasks: two-player sequential games that load with default parameters and play quickly.
# Any other sequential game can still be asked for by name.
LISTED_GAMES = (
    "tic_tac_toe",
    "connect_four",
    "breakthrough",
    "checkers",
    "chess",
    "clobber",
    "dots_and_boxes",
    "go",
    "hex",
    "othello",
    "amazons",
    "mancala",
    "oware",
    "pentago",
    "nine_mens_morris",
    "lines_of_action",
    "ultimate_tic_tac_toe",
    "mnk",
    "nim",
    "backgammon",
    "pig",
    "kuhn_poker",
    "leduc_poker",
    "liars_dice",
    "phantom_ttt",
    "dark_hex",
    "battleship",
)
CONFIG_EXAMPLES: dict[str, dict[str, Any]] = {
    "tic_tac_toe": {"opponent": "mcts", "agent_player": 1},
    "go": {"board_size": 9, "opponent": "random"},
    "hex": {"board_size": 7},
}
INSTRUCTIONS = (
    "You are playing a board game against a built-in opponent. On your turn, call the "
    "`play_move` tool with one of the legal moves listed below, by its id or by its name. "
    "The opponent replies automatically."
)
MOVE_TOOL = ToolSpec(
    name="play_move",
    description=(
        "Play one move on your turn: a legal move's id (e.g. '4') or its name as listed "
        "(e.g. 'x(1,1)'). Illegal moves are refused and you may try again."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "move": {"type": "string", "description": "a legal move id or name, as listed"}
        },
        "required": ["move"],
    },
)


def _pyspiel() -> Any:
    """The ``pyspiel`` module; TaskError when open-spiel is not installed."""
    try:
        import pyspiel
    except ImportError as exc:
        raise TaskError(
            f"open-spiel is not installed here ({exc}); {install_hint('envs')}"
        ) from exc
    return pyspiel


Policy = Callable[[Any], int]


def _random_policy(rng: np.random.RandomState) -> Policy:
    """Uniform over the legal actions, from the episode's RNG."""
    return lambda state: int(rng.choice(state.legal_actions()))


def _first_legal(state: Any) -> int:
    """The lowest legal action id."""
    return int(state.legal_actions()[0])


def _mcts_policy(game: Any, rng: np.random.RandomState, simulations: int) -> Policy:
    """A small seeded MCTS (random rollouts). It searches the full state, hidden information too."""
    from open_spiel.python.algorithms import mcts

    evaluator = mcts.RandomRolloutEvaluator(n_rollouts=1, random_state=rng)
    bot = mcts.MCTSBot(
        game, uct_c=2.0, max_simulations=simulations, evaluator=evaluator, random_state=rng
    )
    return lambda state: int(bot.step(state))


@dataclass
class OpenSpielEnv:
    """One game from the agent's seat; opponents and chance move in between the agent's turns."""

    game: Any
    agent: int
    opponent: str
    mcts_simulations: int = DEFAULT_MCTS_SIMULATIONS
    state_: Any = None
    moves: int = 0
    _since: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        info = self.game.get_type()
        self.perfect = info.information == _pyspiel().GameType.Information.PERFECT_INFORMATION
        self.observable = info.provides_observation_string
        self.has_info_state = info.provides_information_state_string
        self.long_name = info.long_name

    def reset(self, seed: int | None) -> StepOutcome:
        """A fresh game; play until it is the agent's turn."""
        self.rng = np.random.RandomState(DEFAULT_SEED if seed is None else seed % 2**32)
        if self.opponent == "mcts":
            self.policy = _mcts_policy(self.game, self.rng, self.mcts_simulations)
        elif self.opponent == "random":
            self.policy = _random_policy(self.rng)
        else:
            self.policy = _first_legal
        self.state_ = self.game.new_initial_state()
        self.moves = 0
        self._since = []
        self._advance()
        intro = f"Game: {self.long_name}. You are player {self.agent} of {self.game.num_players()}."
        return self._outcome(intro)

    def legal_moves(self) -> dict[int, str]:
        """The agent's legal actions: id -> name (empty when it is not the agent's turn)."""
        state = self.state_
        if state is None or state.is_terminal() or state.current_player() != self.agent:
            return {}
        return {int(a): state.action_to_string(self.agent, a) for a in state.legal_actions()}

    def parse(self, arguments: dict[str, Any]) -> int:
        """A move argument (an id, or a name as listed) -> an action id, legal or not."""
        if "move" not in arguments:
            raise ToolArgumentError("missing required argument 'move' (a legal move id or name)")
        value = arguments["move"]
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if not isinstance(value, str) or not value.strip():
            raise ToolArgumentError(f"'move' must be a move id or name, got {value!r}")
        text = value.strip()
        legal = self.legal_moves()
        for folded in (False, True):
            for action, name in legal.items():
                if (name.lower() == text.lower()) if folded else (name == text):
                    return action
        try:
            return int(text)
        except ValueError:
            raise ToolArgumentError(
                f"{text!r} is not a legal move; legal moves: {self._listing(legal)}"
            ) from None

    def step(self, action: int) -> StepOutcome:
        """The agent's move, then everyone else's until the agent is to move or the game ends."""
        state = self.state_
        if state.is_terminal():
            raise ToolArgumentError("the game is over")
        legal = self.legal_moves()
        if action not in legal:
            raise ToolArgumentError(
                f"move {action} is not legal now; legal moves: {self._listing(legal)}"
            )
        try:
            state.apply_action(action)
        except _pyspiel().SpielError as exc:
            raise ToolArgumentError(f"move {action} was refused by the game: {exc}") from exc
        self.moves += 1
        self._since = [f"You played: {legal[action]}"]
        self._advance()
        return self._outcome()

    def _advance(self) -> None:
        """Sample chance and play the opponents until it is the agent's turn or the game ends."""
        state = self.state_
        while not state.is_terminal() and state.current_player() != self.agent:
            if state.is_chance_node():
                actions, probs = zip(*state.chance_outcomes(), strict=True)
                action = int(self.rng.choice(actions, p=probs))
                label = f"Chance: {state.action_to_string(state.current_player(), action)}"
            elif state.is_simultaneous_node():
                raise RuntimeError("simultaneous-move nodes are not supported")
            else:
                player = state.current_player()
                action = self.policy(state)
                label = f"Player {player} played: {state.action_to_string(player, action)}"
            state.apply_action(action)
            self.moves += 1
            if self.perfect:  # an imperfect-information game shows only the agent's view
                self._since.append(label)

    def _board(self) -> str:
        """The position as the agent may see it."""
        if self.perfect:
            return str(self.state_)
        if self.observable:
            return self.state_.observation_string(self.agent)
        if self.has_info_state:
            return self.state_.information_state_string(self.agent)
        return "(this game shows no view of its state)"

    @staticmethod
    def _listing(legal: dict[int, str]) -> str:
        """``id: name`` pairs, comma separated."""
        return ", ".join(f"{a}: {n}" for a, n in legal.items())

    def _outcome(self, intro: str = "") -> StepOutcome:
        """The observation after a move: what happened, the board, and the legal moves."""
        parts = [intro] if intro else []
        parts += self._since
        parts.append(f"Board:\n{self._board()}")
        state = self.state_
        if state.is_terminal():
            returns = state.returns()
            reward = float(returns[self.agent])
            parts.append(f"Game over. Your return: {reward:g} (all players: {list(returns)}).")
            info = {"returns": [float(r) for r in returns], "moves": self.moves}
            return StepOutcome("\n".join(parts), reward=reward, done=True, info=info)
        parts.append(f"Your legal moves (id: name): {self._listing(self.legal_moves())}")
        return StepOutcome("\n".join(parts), info={"moves": self.moves})

    def state(self) -> dict[str, Any]:
        """Orchestration view: the full state string, terminal flag and move count."""
        return {
            "state": str(self.state_),
            "terminal": bool(self.state_ is not None and self.state_.is_terminal()),
            "moves": self.moves,
        }

    def close(self) -> None:
        """Drop the state."""
        self.state_ = None


def _verdict(session: StepEnvSession) -> EnvVerdict:
    """The agent's return at the terminal state; None before the game is over."""
    env: OpenSpielEnv = session.env  # type: ignore[assignment]
    state = env.state_
    metrics = {"moves": env.moves, "agent_player": env.agent, "opponent": env.opponent}
    if state is None or not state.is_terminal():
        return EnvVerdict(
            reward=None, metrics=metrics, reason="the game did not reach a terminal state"
        )
    reward = float(state.returns()[env.agent])
    return EnvVerdict(reward=reward, rewards={"return": reward}, metrics=metrics)


def _int_option(config: dict[str, Any], key: str, default: int, name: str) -> int:
    """An integer adapter option, or TaskError naming it."""
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TaskError(f"{key} must be an integer for openspiel:{name}, got {value!r}")
    return value


class OpenSpielAdapter:
    """Any sequential OpenSpiel game, the agent in one seat against a built-in opponent."""

    family = FAMILY
    answer_modes: tuple[AnswerMode, ...] = ("tool",)  # moves and actions, no answers

    def list_tasks(self) -> list[TaskInfo]:
        """The listed two-player games, each described by its OpenSpiel long name."""
        pyspiel = _pyspiel()
        tasks = []
        for name in LISTED_GAMES:
            info = pyspiel.load_game(name).get_type()
            kind = "perfect" if info.information.name == "PERFECT_INFORMATION" else "imperfect"
            chance = "" if info.chance_mode.name == "DETERMINISTIC" else ", with chance"
            tasks.append(
                TaskInfo(
                    task=f"{FAMILY}:{name}",
                    family=FAMILY,
                    description=f"{info.long_name} (2 players, {kind} information{chance})",
                    config_example=CONFIG_EXAMPLES.get(name, {"opponent": "random"}),
                )
            )
        return tasks

    def load(self, name: str, config: dict[str, Any]) -> tuple[Any, int, str, int]:
        """The game and the adapter options; TaskError names what is wrong."""
        pyspiel = _pyspiel()
        if name not in pyspiel.registered_names():
            raise TaskError(
                f"unknown OpenSpiel game {name!r}; e.g. {', '.join(LISTED_GAMES[:6])} "
                "(pyspiel.registered_names() has them all)"
            )
        params = {k: v for k, v in config.items() if k not in ADAPTER_KEYS}
        try:
            game = pyspiel.load_game(name, params) if params else pyspiel.load_game(name)
        except (pyspiel.SpielError, TypeError, ValueError) as exc:
            raise TaskError(
                f"openspiel:{name} cannot load with parameters {params!r}: {exc}"
            ) from exc
        info = game.get_type()
        if info.dynamics != pyspiel.GameType.Dynamics.SEQUENTIAL:
            raise TaskError(
                f"openspiel:{name} is a {info.dynamics.name.lower()}-move game; only sequential "
                "games can be played turn by turn through a tool"
            )
        agent = _int_option(config, "agent_player", 0, name)
        if not 0 <= agent < game.num_players():
            raise TaskError(
                f"agent_player {agent} is out of range for openspiel:{name} "
                f"({game.num_players()} players: 0..{game.num_players() - 1})"
            )
        opponent = config.get("opponent", "random")
        if opponent not in OPPONENTS:
            raise TaskError(f"unknown opponent {opponent!r}; choose one of {list(OPPONENTS)}")
        sims = _int_option(config, "mcts_simulations", DEFAULT_MCTS_SIMULATIONS, name)
        if not 1 <= sims <= MAX_MCTS_SIMULATIONS:
            raise TaskError(f"mcts_simulations must be in 1..{MAX_MCTS_SIMULATIONS}, got {sims}")
        if opponent == "mcts" and info.reward_model != pyspiel.GameType.RewardModel.TERMINAL:
            raise TaskError(f"the mcts opponent needs terminal rewards; openspiel:{name} has none")
        return game, agent, opponent, sims

    def make_session(
        self,
        name: str,
        config: dict[str, Any],
        *,
        seed: int | None,
        episode_id: str,
        answer_mode: AnswerMode = "tool",
    ) -> ResourceSession:
        """One game of ``name``; the seed drives chance and the opponent."""
        check_answer_mode(self, answer_mode)
        game, agent, opponent, sims = self.load(name, config)
        env = OpenSpielEnv(game, agent, opponent, sims)
        return StepEnvSession(
            env=env,
            tools=[ActionTool(MOVE_TOOL, env.parse)],
            seed=seed,
            instructions=INSTRUCTIONS,
            verdict=_verdict,
        )
