"""TextArena games as tool sessions: an allow-list of one- and two-player games verified offline.

Tasks are TextArena env ids (``textarena:TicTacToe-v0``). The agent acts with one tool, ``act``,
whose string goes to the game verbatim (``"[4]"`` in Tic Tac Toe). In a two-player game the other
seat is a seeded random policy over the moves the game offers. The agent sees the game's messages
addressed to it since its last move. The reward is the agent's reward in the game's own result.
With ``answer_mode`` text (no tool offered) or either, a reply with no tool call is the move: the
game's own parser reads it, as TextArena games are played in text.

Only allow-listed games are served: each was run here, offline, through a scripted episode
(``tests/harnesses/test_textarena.py`` keeps doing so). Any other id is refused with the reason:
it needs NLTK data or an API key, is broken upstream, needs 3+ players, or was not verified.
TextArena prints to stdout; every call into it here runs with stdout captured, never printed.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import itertools
import logging
import math
import random
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from rollwire.extras import install_hint
from rollwire.harnesses.envs.registry import TaskError, TaskInfo, check_answer_mode
from rollwire.sessions.base import AnswerMode, EnvVerdict, ResourceSession, ToolSpec
from rollwire.sessions.stepenv import ActionTool, StepEnvSession, StepOutcome, ToolArgumentError

log = logging.getLogger(__name__)

FAMILY = "textarena"
DEFAULT_SEED = 0
GAME_ID = -1  # TextArena's sender id for the game itself
MAX_OTHER_MOVES = 10_000  # opponent moves in a row before the game is declared stuck
MAX_ACTION_CHARS = 4_000

# (env, observation text, rng) -> candidate actions for the player to move.
Policy = Callable[[Any, str, random.Random], list[str]]

_BRACKETED = re.compile(r"\[[^\[\]\n]+\]")


def listed(label: str, otherwise: str | None = None) -> Policy:
    """The bracketed moves on the last line that mentions ``label``; else ``otherwise``."""
    pattern = re.compile(rf"^.*{re.escape(label)}.*$", re.IGNORECASE | re.MULTILINE)

    def moves(env: Any, text: str, rng: random.Random) -> list[str]:
        lines = pattern.findall(text)
        found = _BRACKETED.findall(lines[-1].split(":", 1)[-1]) if lines else []
        return found or ([otherwise] if otherwise else [])

    return moves


def fixed(*actions: str) -> Policy:
    """Always the same moves."""
    return lambda env, text, rng: list(actions)


def _connect_four(env: Any, text: str, rng: random.Random) -> list[str]:
    """Columns that are not full."""
    top = env.state.game_state["board"][0]
    return [f"[col {c}]" for c, cell in enumerate(top) if cell == "."]


def _nim(env: Any, text: str, rng: random.Random) -> list[str]:
    """Every (pile, quantity) that can be taken."""
    piles = env.state.game_state["piles"]
    return [f"[{i} {q}]" for i, n in enumerate(piles) for q in range(1, n + 1)]


def _blotto(env: Any, text: str, rng: random.Random) -> list[str]:
    """One random split of all units over all fields."""
    fields = [f["name"] for f in env.state.game_state["fields"]]
    cuts = sorted(rng.randint(0, env.num_total_units) for _ in fields[1:])
    sizes = [b - a for a, b in itertools.pairwise([0, *cuts, env.num_total_units])]
    return ["[" + " ".join(f"{name}{n}" for name, n in zip(fields, sizes, strict=True)) + "]"]


def _mastermind(env: Any, text: str, rng: random.Random) -> list[str]:
    """One random code of distinct digits."""
    digits = rng.sample(range(1, env.num_numbers + 1), env.code_length)
    return ["[" + " ".join(map(str, digits)) + "]"]


def _cells(rows: int, cols: int) -> Policy:
    """Every ``[row col]`` of a grid."""
    return fixed(*(f"[{r} {c}]" for r in range(rows) for c in range(cols)))


@dataclass(frozen=True)
class Game:
    """One allow-listed game: its seats and a random policy over its move format."""

    players: int
    policy: Policy
    description: str


_DIRECTIONS = fixed("[up]", "[down]", "[left]", "[right]")

# Verified offline here: each runs a scripted episode to a numeric result (see the module doc).
GAMES: dict[str, Game] = {
    # two players: the policy is the opponent
    "TicTacToe-v0": Game(2, listed("Available Moves"), "Tic Tac Toe, three in a row"),
    "ReverseTicTacToe-v0": Game(
        2, listed("Available Moves"), "Tic Tac Toe where three in a row loses"
    ),
    "WildTicTacToe-v0": Game(
        2, listed("Available Moves"), "Tic Tac Toe where either mark may be placed"
    ),
    "SimpleTak-v0": Game(2, listed("Available Moves"), "connect two opposite edges of a 4x4 board"),
    "ConnectFour-v0": Game(2, _connect_four, "Connect Four on a 6x7 board"),
    "Nim-v0": Game(2, _nim, "Nim with piles 3, 4, 5; taking the last object wins"),
    # With no valid move, any action is the forced skip.
    "Othello-v0": Game(2, listed("Valid moves", otherwise="[skip]"), "Othello on an 8x8 board"),
    "Chess-v0": Game(2, listed("Valid moves"), "Chess in UCI notation, up to 100 turns"),
    "KuhnPoker-v0": Game(2, listed("available actions"), "Kuhn poker, 3 rounds"),
    "PigDice-v0": Game(2, fixed("[roll]", "[hold]"), "Pig dice to 100 points"),
    "GameOfPureStrategy-v0": Game(2, listed("remaining hand"), "Game of Pure Strategy, 13 rounds"),
    "ColonelBlotto-v0": Game(2, _blotto, "Colonel Blotto: 20 units over 3 fields, 9 rounds"),
    "IteratedRockPaperScissors-v0": Game(
        2, fixed("[rock]", "[paper]", "[scissors]"), "rock-paper-scissors, 9 rounds"
    ),
    "IteratedMatchingPennies-v0": Game(
        2, fixed("[heads]", "[tails]"), "matching pennies, 10 rounds"
    ),
    "IteratedPrisonersDilemma-v0": Game(
        2, fixed("[Cooperate]", "[Defect]"), "prisoner's dilemma, 10 rounds with talk"
    ),
    "IteratedStagHunt-v0": Game(2, fixed("[Stag]", "[Hare]"), "stag hunt, 5 rounds with talk"),
    # one player: the policy is only the scripted player that verifies the game
    "2048-v0": Game(1, fixed("[Up]", "[Down]", "[Left]", "[Right]"), "2048 on a 4x4 board"),
    "FrozenLake-v0": Game(1, _DIRECTIONS, "walk a 4x4 frozen lake to the goal"),
    "Sokoban-v0": Game(1, _DIRECTIONS, "push the boxes onto the targets"),
    "TowerOfHanoi-v0": Game(
        1, fixed(*(f"[{a} {b}]" for a in "ABC" for b in "ABC" if a != b)), "Tower of Hanoi, 3 disks"
    ),
    "GuessTheNumber-v0": Game(
        1, fixed(*(f"[{n}]" for n in range(1, 21))), "guess 1..20 in 10 turns"
    ),
    "Mastermind-v0": Game(1, _mastermind, "Mastermind, 4 digits from 1..6"),
    "Minesweeper-v0": Game(1, _cells(8, 8), "Minesweeper, 8x8 with 10 mines"),
    "LightsOut-v0": Game(1, _cells(5, 5), "Lights Out on a 5x5 grid"),
    "ThreeCardMonte-v0": Game(1, fixed("[0]", "[1]", "[2]"), "follow the ball under the cups"),
    "Secretary-v0": Game(1, fixed("[accept]", "[continue]"), "the secretary problem, 5 values"),
    "Blackjack-v0": Game(1, fixed("[hit]", "[stand]"), "Blackjack, 5 hands against the dealer"),
    "Bandit-v0": Game(
        1, fixed("[red]", "[blue]", "[green]", "[yellow]", "[purple]"), "a 5-armed bandit, 20 pulls"
    ),
}

# Games seen here that are refused, and why (a game's variants share its reason).
_NLTK = "needs NLTK corpora ('words' and others) that are not installed and cannot be downloaded offline"
_KEY = "needs an OpenRouter API key (an LLM judge or opponent over the network)"
_MANY = "needs 3 or more players; only one- and two-player games are served"
REFUSED: dict[str, str] = {
    **dict.fromkeys(
        [
            "Wordle",
            "Hangman",
            "WordLadder",
            "WordSearch",
            "WordChains",
            "SpellingBee",
            "LetterAuction",
            "DontSayIt",
            "Codenames",
        ],
        _NLTK,
    ),
    **dict.fromkeys(["Debate", "TwentyQuestions", "GuessWho", "ScenarioPlanning"], _KEY),
    **dict.fromkeys(
        [
            "CharacterConclave",
            "SecretMafia",
            "SettlersOfCatan",
            "Taboo",
            "ThreePlayerGOPS",
            "ThreePlayerIPD",
            "ThreePlayerTicTacToe",
        ],
        _MANY,
    ),
    "Klondike": "broken upstream: its env.py has a SyntaxError in textarena 0.7.4",
    "ScorableGames": "broken upstream: its game description files are missing from the package",
    "UsedCarNegotiation": "broken upstream: its instructions/blue_book.txt is missing from the package",
    "Countdown": "broken upstream: an invalid move sets the reward to a string, not a number",
    "Cryptarithm": "broken upstream: an invalid move sets the reward to a string, not a number",
    "Slitherlink": "broken upstream: an invalid move sets the reward to a string, not a number",
    "BabyAiText": "broken upstream: registered without a playable raw env",
    "FifteenPuzzle": (
        "broken upstream: solving the puzzle calls set_winners, which its SinglePlayerState "
        "lacks (AttributeError)"
    ),
}


def _refusal(game_id: str) -> str:
    """Why ``game_id`` is not served."""
    base = game_id.split("-v", 1)[0]
    if base in REFUSED:
        return f"TextArena game {game_id!r} is not served: {REFUSED[base]}"
    known = game_id in _registry()
    what = "is not on the allow-list (not verified to run offline here)" if known else "is unknown"
    return f"TextArena game {game_id!r} {what}; served games: {', '.join(sorted(GAMES))}"


_stdout_lock = threading.RLock()


@contextlib.contextmanager
def quiet() -> Iterator[io.StringIO]:
    """Run TextArena with stdout captured (it prints); what it printed goes to the debug log."""
    buffer = io.StringIO()
    with _stdout_lock, contextlib.redirect_stdout(buffer):
        yield buffer
    if buffer.getvalue():
        log.debug("textarena printed: %s", buffer.getvalue()[:2000])


def _ta() -> Any:
    """The ``textarena`` module, imported quietly on first use."""
    try:
        with quiet():
            return importlib.import_module("textarena")
    except ImportError as exc:
        raise TaskError(f"textarena is not installed here ({exc}); {install_hint('envs')}") from exc


def _registry() -> dict[str, Any]:
    """TextArena's env registry."""
    _ta()
    return importlib.import_module("textarena.envs.registration").ENV_REGISTRY


def render(messages: list[tuple[int, str, Any]], roles: dict[int, str]) -> str:
    """TextArena messages as plain text: ``[GAME] ...`` / ``[Player 1] ...`` lines."""
    out = []
    for sender, message, _kind in messages:
        name = "GAME" if sender == GAME_ID else roles.get(sender, f"Player {sender}")
        out.append(f"[{name}] {str(message).strip()}")
    return "\n".join(out)


def _numeric(value: Any) -> float | None:
    """A finite number as float, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


@dataclass
class TextArenaEnv:
    """One TextArena game from the agent's seat; the other seat, if any, plays itself."""

    game_id: str
    game: Game
    agent: int = 0
    env: Any = None
    rng: random.Random = field(default_factory=random.Random)
    rewards: dict[int, Any] | None = None
    game_info: dict[int, Any] | None = None
    turns: int = 0
    _random_state: Any = None

    @contextlib.contextmanager
    def _inside(self) -> Iterator[None]:
        """Run game code with stdout captured and this episode's own global ``random`` state.

        TextArena games draw from the process-wide ``random`` module (seeded by their reset), so
        each episode keeps its own state, swapped in and out: concurrent episodes stay
        reproducible and the rest of the process keeps its random stream.
        """
        with quiet():
            outer = random.getstate()
            if self._random_state is not None:
                random.setstate(self._random_state)
            try:
                yield
            finally:
                self._random_state = random.getstate()
                random.setstate(outer)

    def reset(self, seed: int | None) -> StepOutcome:
        """A fresh game, played up to the agent's first turn."""
        seed = DEFAULT_SEED if seed is None else seed
        self.rng = random.Random(seed)
        self.rewards, self.game_info, self.turns = None, None, 0
        ta = _ta()
        self._random_state = None
        with self._inside():
            random.seed(seed)
            self.env = ta.make(f"{self.game_id}-raw")
            self.env.reset(num_players=self.game.players, seed=seed)
            return self._outcome(self._others())

    def step(self, action: str) -> StepOutcome:
        """The agent's action, then the other seat's until it is the agent's turn again."""
        if self.env is None or self.rewards is not None:
            raise ToolArgumentError("the game is over")
        with self._inside():
            done, _info = self.env.step(action=action)
            self.turns += 1
            if not done and getattr(self.env.state, "error_count", 0) > 0:
                # The game refused the move and lets the agent try again (its own allowance).
                raise ToolArgumentError(self._drain() or "the game refused the move")
            return self._outcome(done or self._others())

    def _others(self) -> bool:
        """Play the other seat until it is the agent's turn or the game ends; True when it ended."""
        for _ in range(MAX_OTHER_MOVES):
            state = self.env.state
            if state.done:
                return True
            if state.current_player_id == self.agent:
                return False
            _player, messages = self.env.get_observation()
            text = render(messages, state.role_mapping)
            options = self.game.policy(self.env, text, self.rng) or ["[pass]"]
            done, _info = self.env.step(action=self.rng.choice(options))
            if done:
                return True
        raise RuntimeError(f"{self.game_id}: the other seat moved {MAX_OTHER_MOVES} times in a row")

    def _drain(self) -> str:
        """The agent's pending messages as text (then cleared)."""
        state = self.env.state
        messages = state.observations.get(self.agent, [])
        state.observations[self.agent] = []
        return render(messages, state.role_mapping)

    def _outcome(self, done: bool) -> StepOutcome:
        """The agent's new messages; at the end, the result."""
        text = self._drain()
        if not done:
            return StepOutcome(text or "(no new messages)", info={"turns": self.turns})
        rewards, game_info = self.env.close()
        self.rewards, self.game_info = dict(rewards or {}), dict(game_info or {})
        reward = _numeric(self.rewards.get(self.agent))
        reason = (self.game_info.get(self.agent) or {}).get("reason")
        info = {
            "turns": self.turns,
            "rewards": {str(k): v for k, v in self.rewards.items()},
            "reason": reason,
        }
        shown = reward if reward is not None else self.rewards.get(self.agent)
        ending = f"Game over{f' ({reason})' if reason else ''}. Your reward: {shown!r}."
        return StepOutcome(f"{text}\n{ending}".strip(), reward=reward, done=True, info=info)

    def state(self) -> dict[str, Any]:
        """Orchestration view: the game's state dict, rewards and turn count."""
        game_state = getattr(getattr(self.env, "state", None), "game_state", None)
        return {"game_state": game_state, "rewards": self.rewards, "turns": self.turns}

    def close(self) -> None:
        """Drop the game."""
        self.env = None


def _verdict(session: StepEnvSession) -> EnvVerdict:
    """The agent's reward from the game's own result; None before the end or when not a number."""
    env: TextArenaEnv = session.env  # type: ignore[assignment]
    info = (env.game_info or {}).get(env.agent) or {}
    metrics = {
        "turns": env.turns,
        "invalid_move": info.get("invalid_move"),
        "reason": info.get("reason"),
    }
    if env.rewards is None:
        return EnvVerdict(reward=None, metrics=metrics, reason="the game did not reach its end")
    raw = env.rewards.get(env.agent)
    reward = _numeric(raw)
    if reward is None:
        return EnvVerdict(
            reward=None,
            metrics=metrics,
            reason=f"the game's reward for the agent is not a number: {raw!r}",
        )
    return EnvVerdict(reward=reward, rewards={"reward": reward}, metrics=metrics)


ACT_TOOL = ToolSpec(
    name="act",
    description=(
        "Make your move: the text is sent to the game as it is, in the game's own format "
        "(e.g. '[4]' in Tic Tac Toe)."
    ),
    input_schema={
        "type": "object",
        "properties": {"action": {"type": "string", "description": "your move, as the game asks"}},
        "required": ["action"],
    },
)
INSTRUCTIONS = (
    "You are playing a text game. Make each move by calling the `act` tool with your action in "
    "the format the game describes."
)
TEXT_INSTRUCTIONS = (
    "You are playing a text game. Make each move by replying with your action in the format the "
    "game describes; each reply is one move."
)
EITHER_INSTRUCTIONS = (
    "You are playing a text game. Make each move by calling the `act` tool with your action in "
    "the format the game describes, or by replying with the action itself; each is one move."
)


def reply_action(text: str) -> str:
    """A reply with no tool call as the move: the text goes to the game, whose own parser reads
    the move in it (TextArena games are played in text)."""
    return action_text({"action": text})


def action_text(arguments: dict[str, Any]) -> str:
    """The ``act`` tool's argument as the string the game reads."""
    value = arguments.get("action")
    if not isinstance(value, str) or not value.strip():
        raise ToolArgumentError(f"'action' must be a non-empty string, got {value!r}")
    if len(value) > MAX_ACTION_CHARS:
        raise ToolArgumentError(f"'action' is {len(value)} characters; at most {MAX_ACTION_CHARS}")
    return value


class TextArenaAdapter:
    """The allow-listed TextArena games."""

    family = FAMILY
    answer_modes: tuple[AnswerMode, ...] = ("tool", "text", "either")

    def list_tasks(self) -> list[TaskInfo]:
        """Every allow-listed game with its player count; TaskError (the family is unavailable)
        where textarena is not installed, so no task is offered that cannot run."""
        if importlib.util.find_spec("textarena") is None:
            raise TaskError(f"textarena is not installed here; {install_hint('envs')}")
        return [
            TaskInfo(
                task=f"{FAMILY}:{game_id}",
                family=FAMILY,
                description=f"{game.description} ({'1 player' if game.players == 1 else '2 players, vs a random policy'})",
                config_example={"agent_player": 1} if game.players == 2 else {},
            )
            for game_id, game in GAMES.items()
        ]

    def make_session(
        self,
        name: str,
        config: dict[str, Any],
        *,
        seed: int | None,
        episode_id: str,
        answer_mode: AnswerMode = "tool",
    ) -> ResourceSession:
        """One game of an allow-listed id; TaskError says why any other id is refused. With
        ``answer_mode`` text or either, a reply with no tool call is the move."""
        check_answer_mode(self, answer_mode)
        game = GAMES.get(name)
        if game is None:
            raise TaskError(_refusal(name))
        unknown = sorted(set(config) - {"agent_player"})
        if unknown:
            raise TaskError(
                f"unknown config key(s) {unknown} for textarena:{name}; known: ['agent_player']"
            )
        agent = config.get("agent_player", 0)
        if isinstance(agent, bool) or not isinstance(agent, int) or not 0 <= agent < game.players:
            raise TaskError(
                f"agent_player {agent!r} is out of range for textarena:{name} "
                f"({game.players} player{'s' if game.players > 1 else ''})"
            )
        _ta()  # fail here, as a TaskError, when textarena is missing
        instructions = {
            "tool": INSTRUCTIONS,
            "text": TEXT_INSTRUCTIONS,
            "either": EITHER_INSTRUCTIONS,
        }[answer_mode]
        return StepEnvSession(
            env=TextArenaEnv(name, game, agent),
            tools=[] if answer_mode == "text" else [ActionTool(ACT_TOOL, action_text)],
            seed=seed,
            instructions=instructions,
            verdict=_verdict,
            text_action=None if answer_mode == "tool" else reply_action,
        )
