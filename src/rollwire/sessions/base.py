"""What an agent can touch in one episode: tools, and nothing else.

A :class:`ResourceSession` is one episode of an environment seen from the agent's side: the
messages it starts with, the tools it may call, and (for orchestration only) the environment's
own verdict. ``reset``, ``step``, ``state`` and ``close`` are orchestration verbs and are never
tool names.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from rollwire.result import EnvVerdict

RESERVED_TOOL_NAMES = frozenset({"reset", "step", "state", "close"})

# How an episode's answer (or move) reaches the environment: ``tool``, only through the tools it
# offers (a reply without a tool call ends the episode with no verdict); ``text``, only from the
# model's reply text, read by the environment's own answer extraction (no tools are offered);
# ``either``, a tool call when the reply has one, else the reply text. The default is ``tool``.
AnswerMode = Literal["tool", "text", "either"]
ANSWER_MODES: tuple[str, ...] = get_args(AnswerMode)
DEFAULT_ANSWER_MODE: AnswerMode = "tool"


class ReservedToolName(ValueError):
    """A tool spec used an orchestration verb as its name."""


def refuse_reserved(name: str) -> None:
    """Raise if ``name`` is an orchestration verb (the agent must never see one)."""
    if name in RESERVED_TOOL_NAMES:
        raise ReservedToolName(
            f"tool name {name!r} is reserved for orchestration ({', '.join(sorted(RESERVED_TOOL_NAMES))}) "
            "and is never offered to the agent"
        )


def refused_call(name: str, known: Iterable[str], *, done: bool) -> ToolResult | None:
    """The tool error for a call no session may run (reserved, unknown, after the end), or None."""
    try:
        refuse_reserved(name)
    except ReservedToolName as exc:
        return ToolResult(content=str(exc), error=str(exc))
    if name not in known:
        msg = f"unknown tool {name!r}; available: {sorted(known)}"
        return ToolResult(content=msg, error=msg)
    if done:
        msg = "the episode is over; no more actions are accepted"
        return ToolResult(content=msg, error=msg, done=True)
    return None


class ToolSpec(BaseModel):
    """One tool as MCP describes it: a name, a description an LLM can act on, a JSON schema."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str
    input_schema: dict[str, Any] = Field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )

    def openai(self) -> dict[str, Any]:
        """The OpenAI chat-completions ``tools`` entry."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.input_schema,
            },
        }


class ToolResult(BaseModel):
    """What one tool call returned. ``content`` is what the agent reads; ``error`` is a tool error
    the agent sees (an illegal move, a bad argument), never an exception."""

    content: str
    data: Any = None
    done: bool = False
    reward: float | None = None  # the step's reward, as the environment reported it
    error: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class ResourceSession(abc.ABC):
    """One episode as the agent sees it. Methods are async: some environments are slow."""

    @abc.abstractmethod
    async def initial_messages(self) -> list[dict[str, Any]]:
        """The conversation the agent starts from (starts the episode)."""

    @abc.abstractmethod
    def list_tools(self) -> list[ToolSpec]:
        """The tools offered to the agent (never a reserved name)."""

    @abc.abstractmethod
    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Run one tool call; failures come back as ``ToolResult.error``."""

    def takes_text_answers(self) -> bool:
        """Whether a reply with no tool call is an answer (``answer_mode`` text or either)."""
        return False

    async def answer_text(self, text: str) -> ToolResult:
        """Act on a reply that made no tool call (only when :meth:`takes_text_answers`)."""
        msg = "this episode takes answers through its tools only (answer_mode 'tool')"
        return ToolResult(content=msg, error=msg)

    @abc.abstractmethod
    async def verify(self) -> EnvVerdict:
        """The environment's verdict on the episode so far."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release the environment (idempotent)."""
