"""Any reset/step environment as a :class:`ResourceSession`: its actions become tools.

The environment's reset/step/state/close stay here, in orchestration. The agent gets only the
action tools an adapter declares; each turns validated tool arguments into one ``step`` action.
Where the adapter reads answers from text too (``answer_mode`` text or either), a reply with no
tool call becomes one ``step`` action through the environment's own extraction.
An environment that raises mid-episode ends the episode with a visible tool error and no verdict.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from rollwire.sessions.base import (
    EnvVerdict,
    ResourceSession,
    ToolResult,
    ToolSpec,
    refuse_reserved,
    refused_call,
)


@dataclass
class StepOutcome:
    """What one ``step`` (or ``reset``) produced."""

    observation: str
    reward: float | None = None
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class StepEnv(Protocol):
    """The classic API. Orchestration only: never exposed to the agent."""

    def reset(self, seed: int | None) -> StepOutcome: ...

    def step(self, action: Any) -> StepOutcome: ...

    def state(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


class ToolArgumentError(ValueError):
    """Tool arguments that do not make an action; the message is shown to the agent."""


@dataclass(frozen=True)
class ActionTool:
    """A tool the agent may call, and how its arguments become an environment action."""

    spec: ToolSpec
    to_action: Callable[[dict[str, Any]], Any]


def episode_return(rewards: list[float], done: bool) -> EnvVerdict:
    """Default verdict: the sum of step rewards once the episode is over; None before."""
    if not done:
        return EnvVerdict(reward=None, reason="the episode did not reach its end")
    total = float(sum(rewards))
    return EnvVerdict(reward=total, rewards={"return": total})


@dataclass
class StepEnvSession(ResourceSession):
    """Adapts a :class:`StepEnv` to the tools-only interface."""

    env: StepEnv
    tools: list[ActionTool]
    seed: int | None = None
    system_prompt: str | None = None
    instructions: str = ""
    # How the adapter reads the env's verdict; default: the episode's return once done.
    verdict: Callable[[StepEnvSession], EnvVerdict] | None = None
    # How a reply with no tool call becomes an action (the env's own answer extraction), for
    # answer_mode text or either; None: only tool calls act (answer_mode tool).
    text_action: Callable[[str], Any] | None = None
    rewards: list[float] = field(default_factory=list)
    done: bool = False
    failed: str | None = None
    steps: int = 0
    last_info: dict[str, Any] = field(default_factory=dict)
    _closed: bool = False

    def __post_init__(self) -> None:
        names = [t.spec.name for t in self.tools]
        for name in names:
            refuse_reserved(name)
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate tool names: {names}")
        self._by_name = {t.spec.name: t for t in self.tools}

    async def initial_messages(self) -> list[dict[str, Any]]:
        """Reset the environment and show its first observation."""
        first = self.env.reset(self.seed)
        self.last_info = dict(first.info)
        if first.reward is not None:  # some games score during reset (e.g. the opponent opens)
            self.rewards.append(float(first.reward))
        self.done = bool(first.done)
        text = (
            f"{self.instructions}\n\n{first.observation}".strip()
            if self.instructions
            else first.observation
        )
        messages: list[dict[str, Any]] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": text})
        return messages

    def list_tools(self) -> list[ToolSpec]:
        """The action tools, never a reserved verb."""
        return [t.spec for t in self.tools]

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """One action: validated, stepped, observed. Errors are results the agent reads."""
        refused = refused_call(name, self._by_name, done=self.done)
        if refused is not None:
            return refused
        tool = self._by_name[name]
        if not isinstance(arguments, dict):
            msg = f"arguments must be a JSON object, got {type(arguments).__name__}"
            return ToolResult(content=msg, error=msg)
        try:
            action = tool.to_action(arguments)
        except ToolArgumentError as exc:
            return ToolResult(content=f"invalid arguments: {exc}", error=str(exc))
        return self._step(action)

    def takes_text_answers(self) -> bool:
        """True when the adapter gave a text extraction (answer_mode text or either)."""
        return self.text_action is not None

    async def answer_text(self, text: str) -> ToolResult:
        """A reply with no tool call, read by the environment's own extraction, as one action."""
        if self.text_action is None:
            return await super().answer_text(text)
        if self.done:
            msg = "the episode is over; no more actions are accepted"
            return ToolResult(content=msg, error=msg, done=True)
        try:
            action = self.text_action(text)
        except ToolArgumentError as exc:
            return ToolResult(content=f"invalid answer: {exc}", error=str(exc))
        return self._step(action)

    def _step(self, action: Any) -> ToolResult:
        try:
            outcome = self.env.step(action)
        except ToolArgumentError as exc:  # the env's own rejection of a move (e.g. illegal)
            return ToolResult(content=f"rejected: {exc}", error=str(exc))
        except Exception as exc:  # the environment broke: end the episode, visibly
            self.failed = f"{type(exc).__name__}: {exc}"
            self.done = True
            msg = f"environment error: {self.failed}"
            return ToolResult(content=msg, error=msg, done=True)
        self.steps += 1
        self.last_info = dict(outcome.info)
        if outcome.reward is not None:
            self.rewards.append(float(outcome.reward))
        self.done = bool(outcome.done)
        return ToolResult(
            content=outcome.observation,
            done=self.done,
            reward=outcome.reward,
            metadata=dict(outcome.info),
        )

    async def verify(self) -> EnvVerdict:
        """The environment's verdict (None when it never reached one)."""
        if self.failed is not None:
            return EnvVerdict(
                reward=None, reason=f"the environment failed mid-episode: {self.failed}"
            )
        if self.verdict is not None:
            return self.verdict(self)
        return episode_return(self.rewards, self.done)

    async def close(self) -> None:
        """Close the environment once."""
        if not self._closed:
            self._closed = True
            self.env.close()
