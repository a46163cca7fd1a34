"""The maximum of every argument that sizes work, in one table.

rollwire serves clients it does not trust to be careful (LLM agents drive it). Every number a
client gives that sizes work (episodes, group size, concurrency, turns, model calls, tokens,
timeouts, pages, payloads) is bounded here, and the MCP tools, the CLI and the collection
config all read these constants, so a bound is the same wherever the argument comes in, and the
docs' table (docs/reliability.md) is generated from TABLE. Work that is not bounded by a number
is consumed lazily (a collection's episode list is a generator, a resume's skip scan
yields to other clients as it goes).

A base module (the bottom layer): imports nothing of rollwire; any layer may import it.
"""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from pydantic import Field

#: episodes of one collection in all (a resume may extend up to it)
MAX_EPISODES = 1_000_000
#: samples per task instance (a GRPO group)
MAX_GROUP_SIZE = 1024
MAX_KS = 16  # pass@k values one eval reports
#: rollouts of one collection running at once
MAX_CONCURRENCY = 256
#: distinct task references of one collection (each is checked before anything runs)
MAX_TASKS = 1000
MAX_ENGINES = 64  # engine URLs behind one collection
#: agent turns of one rollout
MAX_TURNS = 256
#: model calls one rollout's capture session allows
MAX_MODEL_CALLS = 1024
#: output tokens per model call (the proxy also clamps to what the engine's context leaves)
MAX_TOKENS = 131_072
#: top candidates kept per sampled token (sampling.top_logprobs; OpenAI's own maximum)
MAX_TOP_LOGPROBS = 20
#: token ids one web UI request may ask the text of
MAX_UI_PIECES = 4096
#: wall clock of one rollout, seconds
MAX_TIMEOUT_S = 86_400.0
#: a seed (task or sampling): a signed 64-bit integer, as engines take it
MAX_SEED = 2**63 - 1
MIN_SEED = -(2**63)
#: a page of list_tasks, and how far it may start
MAX_PAGE = 500
MAX_OFFSET = 10_000_000
#: any free-text argument (task references, URLs, queries, globs, keys, messages)
MAX_TEXT = 4096
#: task_config serialised as JSON
MAX_TASK_CONFIG_BYTES = 16 * 1024
#: one HTTP request to the MCP endpoint (tool arguments are small)
MAX_MCP_BODY_BYTES = 1024 * 1024
#: one request to a capture proxy (the default of --max-body-mb)
MAX_PROXY_BODY_BYTES = 8 * 1024 * 1024
#: an env task's generator building one episode, seconds (it runs off the event loop)
ENV_BUILD_TIMEOUT_S = 30.0
#: ids listed in a collection's result (the store holds every id; the rest are counted)
MAX_IDS_IN_RESULT = 10_000

Text = Annotated[str, Field(max_length=MAX_TEXT)]
Seed = Annotated[int, Field(ge=MIN_SEED, le=MAX_SEED)]
Episodes = Annotated[int, Field(ge=1, le=MAX_EPISODES)]
GroupSize = Annotated[int, Field(ge=1, le=MAX_GROUP_SIZE)]
#: pass@k for these k (each at most a group's size)
Ks = Annotated[list[GroupSize], Field(min_length=1, max_length=MAX_KS)]
Concurrency = Annotated[int, Field(ge=1, le=MAX_CONCURRENCY)]
TaskList = Annotated[list[Text], Field(min_length=1, max_length=MAX_TASKS)]

TABLE: tuple[tuple[str, str], ...] = (
    ("episodes", f"1 .. {MAX_EPISODES:,}"),
    ("group_size", f"1 .. {MAX_GROUP_SIZE:,}"),
    ("concurrency", f"1 .. {MAX_CONCURRENCY}"),
    ("tasks (one collection)", f"1 .. {MAX_TASKS:,}"),
    ("engines (one collection)", f"1 .. {MAX_ENGINES}"),
    ("limits.max_turns", f"1 .. {MAX_TURNS}"),
    ("limits.max_model_calls", f"1 .. {MAX_MODEL_CALLS:,}"),
    ("limits.timeout_s", f"> 0 .. {MAX_TIMEOUT_S:,.0f}"),
    ("sampling.max_tokens", f"1 .. {MAX_TOKENS:,} (then clamped to the engine's context)"),
    ("sampling.top_logprobs", f"0 .. {MAX_TOP_LOGPROBS}"),
    ("token ids per web UI /pieces request", f"1 .. {MAX_UI_PIECES:,}"),
    ("seed, sampling.seed", "a signed 64-bit integer"),
    ("list_tasks limit / offset", f"1 .. {MAX_PAGE} / 0 .. {MAX_OFFSET:,}"),
    ("text arguments", f"{MAX_TEXT:,} characters"),
    ("task_config", f"{MAX_TASK_CONFIG_BYTES // 1024} KiB of JSON"),
    ("one MCP HTTP request", f"{MAX_MCP_BODY_BYTES // (1024 * 1024)} MiB"),
    ("one capture proxy request", f"{MAX_PROXY_BODY_BYTES // (1024 * 1024)} MiB (--max-body-mb)"),
    ("building one env episode", f"{ENV_BUILD_TIMEOUT_S:g} s"),
)


def check_task_config(config: dict[str, Any] | None) -> None:
    """Raise ``ValueError`` naming ``task_config`` when it is larger than the bound."""
    if not config:
        return
    size = len(orjson.dumps(config, option=orjson.OPT_NON_STR_KEYS))
    if size > MAX_TASK_CONFIG_BYTES:
        raise ValueError(
            f"task_config: {size:,} bytes of JSON; at most {MAX_TASK_CONFIG_BYTES:,} are accepted"
        )
