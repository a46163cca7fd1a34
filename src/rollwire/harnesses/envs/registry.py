"""The env adapter table: ``family:name`` task references -> sessions.

Adapters are imported lazily, one by one, so an adapter whose package is missing or broken
reports itself unavailable without taking the others down.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Protocol

from rollwire.sessions.base import ANSWER_MODES, DEFAULT_ANSWER_MODE, AnswerMode, ResourceSession


class TaskError(ValueError):
    """A task reference or config that cannot become an episode; the message says why."""


@dataclass(frozen=True)
class TaskInfo:
    """One listable task: a stable id that round-trips as a string, and what it is."""

    task: str
    family: str
    description: str
    config_example: dict[str, Any] = field(default_factory=dict)


class EnvAdapter(Protocol):
    """What each env family provides. ``answer_modes``: the ways its episodes take an answer
    (``tool`` always; ``text`` and ``either`` where the environment reads answers from text);
    an adapter without it takes ``tool`` only, and ``make_session`` then never gets
    ``answer_mode``."""

    family: str
    answer_modes: tuple[AnswerMode, ...]

    def list_tasks(self) -> list[TaskInfo]: ...

    def make_session(
        self,
        name: str,
        config: dict[str, Any],
        *,
        seed: int | None,
        episode_id: str,
        answer_mode: AnswerMode = "tool",
    ) -> ResourceSession: ...


# family -> "module:attribute" of a zero-argument factory returning the adapter.
ADAPTERS: dict[str, str] = {
    "reasoning_gym": "rollwire.harnesses.envs.reasoning_gym:ReasoningGymAdapter",
    "openspiel": "rollwire.harnesses.envs.openspiel:OpenSpielAdapter",
    "textarena": "rollwire.harnesses.envs.textarena:TextArenaAdapter",
    "browsergym": "rollwire.harnesses.envs.browsergym:BrowserGymAdapter",
}


def parse_task(ref: str) -> tuple[str, str]:
    """``"reasoning_gym:chain_sum"`` -> ``("reasoning_gym", "chain_sum")``."""
    family, sep, name = ref.partition(":")
    if not sep or not family or not name:
        raise TaskError(
            f"task {ref!r} must look like 'family:name', e.g. 'reasoning_gym:chain_sum'"
        )
    return family, name


def load_adapter(family: str) -> EnvAdapter:
    """The adapter of one family; TaskError names the family or the import that failed."""
    target = ADAPTERS.get(family)
    if target is None:
        raise TaskError(f"unknown env family {family!r}; known: {sorted(ADAPTERS)}")
    module, _, attr = target.partition(":")
    try:
        factory = getattr(importlib.import_module(module), attr)
        return factory()
    except ImportError as exc:
        raise TaskError(f"env family {family!r} is not available here: {exc}") from exc


def check_answer_mode(adapter: EnvAdapter, mode: str) -> None:
    """TaskError (naming ``answer_mode``) unless the family's episodes take answers that way."""
    if mode not in ANSWER_MODES:
        raise TaskError(f"answer_mode: {mode!r} is not one of {list(ANSWER_MODES)}")
    accepted = getattr(adapter, "answer_modes", (DEFAULT_ANSWER_MODE,))
    if mode not in accepted:
        raise TaskError(
            f"answer_mode: {mode!r}: {adapter.family} tasks take answers as tool calls only "
            f"(accepted: {list(accepted)}); text answers are read where the environment has "
            "its own answer extraction (reasoning_gym, textarena)"
        )


def resolve(ref: str) -> tuple[EnvAdapter, str]:
    """The adapter and task name for a reference."""
    family, name = parse_task(ref)
    return load_adapter(family), name


@dataclass
class Listing:
    """Every listable task, and each family that could not be listed, with the reason."""

    tasks: list[TaskInfo]
    unavailable: dict[str, str]


def list_tasks(families: list[str] | None = None) -> Listing:
    """Tasks of the given families (default: all); an unavailable family is reported, not raised."""
    tasks: list[TaskInfo] = []
    unavailable: dict[str, str] = {}
    for family in families or list(ADAPTERS):
        try:
            tasks.extend(load_adapter(family).list_tasks())
        except TaskError as exc:
            unavailable[family] = str(exc)
    return Listing(tasks=tasks, unavailable=unavailable)
