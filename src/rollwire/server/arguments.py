"""Every argument of the MCP tools, declared once.

An argument is a keyword-only :class:`inspect.Parameter`: its name, its type with the bounds of
:mod:`rollwire.bounds`, and its default. A tool names the arguments it takes with :func:`takes`,
which makes them the tool's signature (the MCP SDK builds the tool's input schema from it), so
an argument several tools share (``task``, ``llm``, ``sampling``, ``out_dir`` ...) has one
type, one set of bounds and one default in every tool. An argument that means something else in
another tool is a declaration of its own, named for what it is (``seed``: the rollout's seed, or
a collection's first seed; ``llm``: one engine, or several).

This module imports nothing of ``rollwire.server``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

from pydantic import Field

from rollwire import bounds
from rollwire.bounds import Seed, Text
from rollwire.sessions.base import AnswerMode
from rollwire.tools.rollouts import Limits, LLMSpec, Sampling

F = TypeVar("F", bound=Callable[..., Any])
REQUIRED = inspect.Parameter.empty


def argument(name: str, annotation: Any, default: Any = REQUIRED) -> inspect.Parameter:
    """A tool argument: required unless it has a default."""
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default
    )


Arguments = inspect.Parameter | tuple[inspect.Parameter, ...]


def flatten(arguments: tuple[Arguments, ...]) -> list[inspect.Parameter]:
    flat: list[inspect.Parameter] = []
    for item in arguments:
        flat.extend(item if isinstance(item, tuple) else (item,))
    return flat


def takes(*arguments: Arguments) -> Callable[[F], F]:
    """The tool's arguments are ``arguments``, in this order: they are its signature (its input
    schema). The function takes them as keywords: named (each one it names must be declared,
    with nothing else to say: no annotation, no default) or as ``**kwargs``; a parameter
    annotated ``Context`` (the SDK's per-call context) is its own."""
    declared = flatten(arguments)
    names = {p.name for p in declared}
    if len(names) != len(declared):
        raise TypeError(f"an argument is declared twice: {[p.name for p in declared]}")

    def apply(fn: F) -> F:
        own = inspect.signature(fn, eval_str=True)
        for p in own.parameters.values():
            if p.kind is p.VAR_KEYWORD or _is_context(p.annotation):
                continue
            if p.name not in names or p.default is not p.empty or p.annotation is not p.empty:
                raise TypeError(f"{fn.__name__}: parameter {p.name!r}: declare it in arguments")
        fn.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            declared, return_annotation=own.return_annotation
        )
        return fn

    return apply


def _is_context(annotation: Any) -> bool:
    from mcp.server.mcpserver import Context

    return inspect.isclass(annotation) and issubclass(annotation, Context)


# --- tasks --------------------------------------------------------------------------------------

SOURCE = argument("source", Text | None, None)
OFFSET = argument("offset", Annotated[int, Field(ge=0, le=bounds.MAX_OFFSET)], 0)
LIMIT = argument("limit", Annotated[int, Field(ge=1, le=bounds.MAX_PAGE)], 50)
QUERY = argument("query", Text | None, None)

# --- the engine ---------------------------------------------------------------------------------

#: several engines serving one model (specs or bare URLs)
EngineList = Annotated[list[LLMSpec | Text], Field(min_length=1, max_length=bounds.MAX_ENGINES)]

ENGINE_URL = argument("llm_url", Text)  # validate_llm: the engine to check
LLM_URL = argument("llm_url", Text | None, None)  # flat form of `llm`
MODEL = argument("model", Text | None, None)
API_KEY = argument("api_key", Text | None, None)
LLM = argument("llm", LLMSpec | Text | None, None)
ENGINES = argument("llm", LLMSpec | Text | EngineList | None, None)  # collect: one or several

# --- rollouts -----------------------------------------------------------------------------------

TASK = argument("task", Text)
HARNESS = argument("harness", Text | None, None)
SANDBOX = argument("sandbox", Text | None, None)
SAMPLING = argument("sampling", Sampling | None, None)
LIMITS = argument("limits", Limits | None, None)
REWARD_KEY = argument("reward_key", Text | None, None)
INCLUDE_TOKENS = argument("include_tokens", bool, False)
SEED = argument("seed", Seed | None, None)
TASK_CONFIG = argument("task_config", dict[str, Any] | None, None)
ANSWER_MODE = argument("answer_mode", AnswerMode | None, None)

#: run_rollout's and start_rollout's arguments (run_rollout's ``ctx`` aside)
ROLLOUT = (
    TASK,
    HARNESS,
    SANDBOX,
    LLM,
    SAMPLING,
    LIMITS,
    REWARD_KEY,
    INCLUDE_TOKENS,
    SEED,
    TASK_CONFIG,
    LLM_URL,
    MODEL,
    API_KEY,
    ANSWER_MODE,
)

ROLLOUT_ID = argument("rollout_id", Text)
STATUS = argument("status", Literal["running", "done", "failed", "cancelled"] | None, None)
GRAPH_FORMAT = argument("format", Literal["json", "mermaid"], "json")

# --- collections --------------------------------------------------------------------------------

OUT_DIR = argument("out_dir", Text)
EPISODES = argument("episodes", bounds.Episodes)
TASKS = argument("tasks", bounds.TaskList | None, None)
DATASET = argument("dataset", Text | None, None)
TASK_GLOB = argument("task_glob", Text | None, None)
GROUP_SIZE = argument("group_size", bounds.GroupSize, 1)
FIRST_SEED = argument("seed", Seed, 0)  # a collection's first task seed
CONCURRENCY = argument("concurrency", bounds.Concurrency, 4)
MIN_REWARD = argument("min_reward", float | None, None)
TRAINABLE_ONLY = argument("trainable_only", bool, False)
KEEP_FAILURES = argument("keep_failures", bool, True)
RESUME = argument("resume", bool, True)
BACKGROUND = argument("background", bool, False)
KS = argument("k", bounds.Ks, [1])  # the metrics block's pass@k
PASS_THRESHOLD = argument("pass_threshold", float, 1.0)
EVAL = argument("eval", bool, False)  # a collection of held-out rollouts (rollwire eval)
REPO_ID = argument("repo_id", Text)
PRIVATE = argument("private", bool, True)
DRY_RUN = argument("dry_run", bool, False)
COMMIT_MESSAGE = argument("commit_message", Text | None, None)
