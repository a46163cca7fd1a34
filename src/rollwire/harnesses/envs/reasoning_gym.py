"""reasoning-gym datasets as one-question episodes: ``reasoning_gym:chain_sum`` and every other.

The episode is one item, drawn by the rollout's seed, of the named dataset built with the task's
config. The agent reads the question and answers once; that ends the episode, and the reward is
the dataset's own ``score_answer``, forwarded as it is. How the answer arrives is the
``answer_mode``: ``tool`` (the default), a call of the ``answer`` tool, and a reply without one
ends the episode with no verdict (reward None); ``text``, no tool is offered and the reply is
read by reasoning-gym's own ``extract_answer`` (the last ``<answer>...</answer>``) after its own
instruction prompt, so a reply without the tags scores 0.0; ``either``, the tool is offered and a
reply without a call is read as in ``text``. reasoning-gym is imported on first use (it takes
seconds), never when this module is imported.
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass
from typing import Any

from rollwire.extras import install_hint
from rollwire.harnesses.envs.registry import TaskError, TaskInfo, check_answer_mode
from rollwire.sessions.base import AnswerMode, EnvVerdict, ResourceSession, ToolSpec
from rollwire.sessions.stepenv import ActionTool, StepEnvSession, StepOutcome, ToolArgumentError

FAMILY = "reasoning_gym"
DEFAULT_SEED = 0
# The rollout's seed picks the item; these belong to the adapter, not to the task's config.
RESERVED_CONFIG = ("seed", "size")
INSTRUCTIONS = (
    "Solve the problem below. When you know the final answer, call the `answer` tool once with "
    "just the answer, in the format the problem asks for. Calling it ends the episode."
)
EITHER_INSTRUCTIONS = (
    "Solve the problem below. When you know the final answer, call the `answer` tool once with "
    "just the answer, in the format the problem asks for; if you cannot call tools, reply with "
    "the final answer inside <answer></answer> tags instead. Either ends the episode."
)
ANSWER_TOOL = ToolSpec(
    name="answer",
    description="Submit your final answer to the problem. This ends the episode.",
    input_schema={
        "type": "object",
        "properties": {
            "answer": {"type": "string", "description": "the final answer, exactly as asked"}
        },
        "required": ["answer"],
    },
)

_import_lock = threading.Lock()


def _rg() -> Any:
    """The ``reasoning_gym`` module, imported once per process on first use."""
    with _import_lock:
        try:
            return importlib.import_module("reasoning_gym")
        except ImportError as exc:
            raise TaskError(
                f"reasoning-gym is not installed here ({exc}); {install_hint('envs')}"
            ) from exc


def _datasets() -> dict[str, tuple[type, type]]:
    """reasoning-gym's registry: dataset name -> (dataset class, config class)."""
    _rg()
    return importlib.import_module("reasoning_gym.factory").DATASETS


def _summary(cls: type, name: str) -> str:
    """The first line of a dataset class's docstring, or a plain fallback."""
    lines = (cls.__doc__ or "").strip().splitlines()
    return lines[0].strip() if lines else f"reasoning-gym dataset {name}"


def text_instructions() -> str:
    """reasoning-gym's own prompt for answers in text (its ``SYSTEM_PROMPTS["default"]``)."""
    return str(importlib.import_module("reasoning_gym.utils").SYSTEM_PROMPTS["default"]).strip()


def answer_from_text(text: str) -> str | None:
    """The answer in a reply, by reasoning-gym's own ``extract_answer`` (None when the reply has
    no ``<answer>`` tags: the dataset then scores it 0.0)."""
    return importlib.import_module("reasoning_gym.utils").extract_answer(text)


def answer_text(arguments: dict[str, Any]) -> str:
    """The ``answer`` tool's argument as the string the dataset scores."""
    if "answer" not in arguments:
        raise ToolArgumentError("missing required argument 'answer' (a string)")
    value = arguments["answer"]
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ToolArgumentError(f"'answer' must be a string, got {type(value).__name__}")
    return str(value)


@dataclass
class QuestionEnv:
    """One dataset item as a one-step env: the question, then the dataset's score of an answer."""

    dataset: Any
    entry: dict[str, Any]
    score: float | None = None
    submitted: str | None = None

    def reset(self, seed: int | None) -> StepOutcome:
        """Show the question (the item was drawn when the session was made)."""
        self.score, self.submitted = None, None
        return StepOutcome(observation=str(self.entry["question"]))

    def step(self, action: str | None) -> StepOutcome:
        """Score one answer with the dataset's own ``score_answer``; the episode ends. None is a
        reply in which the extraction found no answer (scored as the dataset scores None)."""
        score = float(self.dataset.score_answer(action, self.entry))
        self.score, self.submitted = score, action
        seen = "no answer (no <answer></answer> tags)" if action is None else repr(action)
        return StepOutcome(
            observation=f"Answer recorded: {seen}. The episode is over.",
            reward=score,
            done=True,
        )

    def state(self) -> dict[str, Any]:
        """Orchestration view: the item, the submitted answer and its score."""
        return {"entry": self.entry, "submitted": self.submitted, "score": self.score}

    def close(self) -> None:
        """Nothing to release."""


def _verdict(session: StepEnvSession) -> EnvVerdict:
    """The dataset's score of the submitted answer; None when no answer was submitted."""
    env: QuestionEnv = session.env  # type: ignore[assignment]
    metadata = env.entry.get("metadata") or {}
    metrics = {"dataset": metadata.get("source_dataset"), "index": metadata.get("source_index")}
    if env.score is None:
        return EnvVerdict(
            reward=None,
            metrics=metrics,
            reason="no answer was submitted (the answer tool was never called)",
        )
    return EnvVerdict(reward=env.score, rewards={"score": env.score}, metrics=metrics)


class ReasoningGymAdapter:
    """Every registered reasoning-gym dataset, one item per episode."""

    family = FAMILY
    answer_modes: tuple[AnswerMode, ...] = ("tool", "text", "either")

    def list_tasks(self) -> list[TaskInfo]:
        """Every registered dataset with the first line of its description."""
        return [
            TaskInfo(task=f"{FAMILY}:{name}", family=FAMILY, description=_summary(cls, name))
            for name, (cls, _config) in sorted(_datasets().items())
        ]

    def make_dataset(self, name: str, config: dict[str, Any], seed: int | None) -> Any:
        """Build the dataset of one episode; TaskError names an unknown dataset or a bad config."""
        datasets = _datasets()
        if name not in datasets:
            raise TaskError(
                f"unknown reasoning-gym dataset {name!r}; list them with the reasoning_gym family "
                f"({len(datasets)} registered, e.g. chain_sum, basic_arithmetic)"
            )
        reserved = [k for k in RESERVED_CONFIG if k in config]
        if reserved:
            raise TaskError(
                f"config key(s) {reserved} for reasoning_gym:{name} are set by the adapter "
                "(the rollout seed picks the item); remove them"
            )
        try:
            return _rg().create_dataset(
                name, size=1, seed=DEFAULT_SEED if seed is None else seed, **config
            )
        except TypeError as exc:
            raise TaskError(f"bad config {config!r} for reasoning_gym:{name}: {exc}") from exc
        except (ValueError, AssertionError) as exc:
            raise TaskError(
                f"config {config!r} rejected by reasoning_gym:{name}: {exc or type(exc).__name__}"
            ) from exc

    def make_session(
        self,
        name: str,
        config: dict[str, Any],
        *,
        seed: int | None,
        episode_id: str,
        answer_mode: AnswerMode = "tool",
    ) -> ResourceSession:
        """One question of ``name`` with ``config``, chosen by ``seed``, answered as
        ``answer_mode`` says."""
        check_answer_mode(self, answer_mode)
        dataset = self.make_dataset(name, config, seed)
        try:
            entry = dataset[0]
        except Exception as exc:  # the dataset's own generator failed for this config/seed
            raise TaskError(
                f"reasoning_gym:{name} could not generate an item with config {config!r} and "
                f"seed {seed!r}: {type(exc).__name__}: {exc}"
            ) from exc
        instructions = {
            "tool": INSTRUCTIONS,
            "text": text_instructions(),
            "either": EITHER_INSTRUCTIONS,
        }[answer_mode]
        return StepEnvSession(
            env=QuestionEnv(dataset, entry),
            tools=[] if answer_mode == "text" else [ActionTool(ANSWER_TOOL, answer_text)],
            seed=seed,
            instructions=instructions,
            verdict=_verdict,
            text_action=None if answer_mode == "tool" else answer_from_text,
        )
