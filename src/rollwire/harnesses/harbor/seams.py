"""The seam table: how each Harbor agent harness is pointed at the capture proxy.

One :class:`Seam` per agent says which wire dialect it speaks, whether it runs host-side (in this
process: terminus-2) or is installed inside the sandbox, how its base URL and API key reach it
(the proxy's URL, and the capture session id as the key), whether it reads ``os.environ`` while it
runs, and how to build its Harbor ``AgentConfig``. ``--harness module:Class`` reaches any other
Harbor agent through an import-path seam.

The variable names below are the ones Harbor 0.25's own wrappers read (each class's
``MODEL_CONNECTION``); the seams hand Harbor the proxy through its common connection override
(``AgentConfig.base_url`` plus the key in ``AgentConfig.env``), so Harbor's resolver delivers both
to whatever the agent reads. Agents whose dialect the proxy does not serve yet (only
chat-completions exists) are listed, unavailable, with that reason.

Nothing here imports an agent at module import: a seam's class is imported when it is checked or
used, and an import failure is reported for that seam only.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import threading
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
from harbor.models.trial.config import AgentConfig

Dialect = Literal["chat", "responses", "anthropic", "google"]
Kind = Literal["none", "host", "installed", "import"]


def served_dialects() -> frozenset[str]:
    """Wire dialects the capture proxy serves: chat, and every dialect module it has."""
    from rollwire.capture.dialects import load_dialects

    return frozenset({"chat", *(d.name for d in load_dialects())})


#: Guards ``os.environ`` while a harness that reads it at run time is running. A threading lock:
#: rollouts arrive on many event loops, and the environment is global to the process.
ENVIRON_LOCK = threading.Lock()
_LOCK_POLL_S = 0.02

_MODEL_PREFIX: dict[str, str] = {
    "chat": "openai",
    "responses": "openai",
    "anthropic": "anthropic",
    "google": "gemini",
}
# litellm needs a cost entry for a model it has never heard of, or it warns on every call.
_ZERO_COST: dict[str, Any] = {
    "input_cost_per_token": 0.0,
    "output_cost_per_token": 0.0,
    "cache_creation_input_token_cost": 0.0,
    "cache_read_input_token_cost": 0.0,
    "litellm_provider": "openai",
    "mode": "chat",
}


class UnknownHarness(ValueError):
    """No seam has this name; the message lists the names that exist."""


@dataclass(frozen=True)
class Endpoint:
    """Where a seam points its agent: the proxy's root URL, the session key, the model name."""

    url: str  # e.g. http://127.0.0.1:43125 (no /v1)
    api_key: str  # the capture session id
    model: str  # what the agent asks for; the proxy substitutes the served model

    def base(self, suffix: str = "/v1") -> str:
        """The URL an agent is given: the root plus the seam's suffix."""
        return self.url.rstrip("/") + suffix


@dataclass(frozen=True)
class Seam:
    """One agent harness and how it reaches the proxy."""

    name: str
    kind: Kind  # none: no model; host: runs in this process; installed: inside the sandbox
    harbor_class: str  # "module:Class" (imported on use)
    dialect: Dialect | None = None
    base_url_env: tuple[str, ...] = ()  # variables that receive the base URL
    api_key_env: tuple[str, ...] = ()  # variables the agent may read its key from
    config_file: str | None = None  # a config file carries the base URL instead
    config_fields: tuple[str, ...] = ()  # AgentConfig fields that carry the URL and key instead
    base_url_suffix: str = "/v1"  # what follows the proxy root in the agent's base URL
    reads_environ: bool = False  # reads os.environ at run time: rollouts are serialised
    # Calls the model from inside the sandbox: it gets a gate (rollwire.harnesses.harbor.gate),
    # its session's data plane in the sandbox's own network, and no other way out.
    sandbox_network: bool = False
    host_tools: tuple[str, ...] = ()  # executables the sandbox needs (it mounts the host's /usr)
    validated: bool = False  # run end to end by rollwire's tests
    unavailable: str | None = None  # a reason that holds whatever is installed
    notes: str = ""
    agent_kwargs: Mapping[str, Any] = field(default_factory=dict)  # AgentConfig.kwargs defaults
    # Fixed settings the agent runs with (AgentConfig.env), besides its base URL and key.
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def needs_llm(self) -> bool:
        """Whether the harness calls a model (and so needs a proxy and a session)."""
        return self.kind != "none"

    @property
    def host_side(self) -> bool:
        """Runs in this process: the proxy must be served over real HTTP on loopback."""
        return self.kind == "host"

    def check(self) -> str | None:
        """Why this seam cannot run here, or None: a static reason, an import, a host tool."""
        if self.unavailable is not None:
            return self.unavailable
        if self.dialect is not None and self.dialect not in served_dialects():
            return _UNSERVED.format(dialect=self.dialect)
        try:
            cls = import_agent_class(self.harbor_class)
        except Exception as exc:
            return f"cannot import {self.harbor_class}: {type(exc).__name__}: {exc}"
        if self.kind == "import":
            from harbor.agents.base import BaseAgent

            if not (isinstance(cls, type) and issubclass(cls, BaseAgent)):
                return f"{self.harbor_class} is not a Harbor agent (a BaseAgent subclass)"
        for tool in self.host_tools:
            if shutil.which(tool) is None:
                return (
                    f"{tool} is not installed on this host (the local sandbox mounts the host's "
                    f"/usr): apt-get install {tool}"
                )
        return None

    def environ(self, endpoint: Endpoint) -> dict[str, str]:
        """What the agent must find in its environment: the base URL and the session key."""
        out = dict(self.env)
        out.update(dict.fromkeys(self.base_url_env, endpoint.base(self.base_url_suffix)))
        out.update(dict.fromkeys(self.api_key_env, endpoint.api_key))
        return out

    def agent_config(
        self,
        endpoint: Endpoint | None,
        *,
        kwargs: Mapping[str, Any] | None = None,
        timeout_sec: float | None = None,
        import_path: str | None = None,
    ) -> AgentConfig:
        """Harbor's ``AgentConfig`` for this harness pointed at ``endpoint``.

        ``kwargs`` override the seam's defaults (``llm_kwargs`` and ``model_info`` are merged).
        ``import_path`` replaces an installed agent's Harbor class (rollwire's install of it:
        :func:`rollwire.harnesses.harbor.installs.import_path`).
        """
        merged = _merge(self.agent_kwargs, kwargs or {})
        common: dict[str, Any] = {"override_timeout_sec": timeout_sec}
        if self.kind == "none":
            return AgentConfig(name=self.name, kwargs=merged, **common)
        if endpoint is None:
            raise ValueError(f"harness {self.name!r} calls a model: it needs an endpoint")
        model = f"{_MODEL_PREFIX[self.dialect or 'chat']}/{endpoint.model}"
        base = endpoint.base(self.base_url_suffix)
        if self.kind == "host":
            # terminus-2: litellm in this process gets the key and base explicitly, so neither
            # comes from os.environ, and the key stays out of the sandbox's shell environment.
            merged = _merge(merged, {"llm_kwargs": {"api_key": endpoint.api_key}})
            return AgentConfig(
                name=self.name, model_name=model, base_url=base, kwargs=merged, **common
            )
        env = self.environ(endpoint)
        if self.kind == "installed":
            named: dict[str, Any] = (
                {"import_path": import_path} if import_path is not None else {"name": self.name}
            )
            # A class that refuses the base_url override (cline-cli) gets the URL from env alone.
            capabilities = getattr(import_agent_class(self.harbor_class), "capabilities", None)
            accepts_base_url = getattr(capabilities, "base_url", True)
            return AgentConfig(
                **named,
                model_name=model,
                base_url=base if accepts_base_url else None,
                env=env,
                kwargs=merged,
                **common,
            )
        cls = import_agent_class(self.harbor_class)
        overridable = getattr(cls, "MODEL_CONNECTION", None) is not None
        return AgentConfig(
            import_path=self.harbor_class,
            model_name=model,
            base_url=base if overridable else None,
            env=env,
            kwargs=merged,
            **common,
        )


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if key in ("llm_kwargs", "model_info", "llm_call_kwargs") and isinstance(value, Mapping):
            out[key] = {**(out.get(key) or {}), **value}
        else:
            out[key] = value
    return out


_IMPORTS: dict[str, type | BaseException] = {}
_IMPORTS_LOCK = threading.Lock()


def import_agent_class(path: str) -> type:
    """Import ``module:Class`` once per process; a failure is remembered and raised again."""
    with _IMPORTS_LOCK:
        cached = _IMPORTS.get(path)
    if cached is None:
        module_name, sep, attr = path.partition(":")
        try:
            if not sep or not module_name or not attr:
                raise ValueError(f"an agent import path is module:Class, got {path!r}")
            cached = getattr(importlib.import_module(module_name), attr)
        except Exception as exc:
            cached = exc
        with _IMPORTS_LOCK:
            _IMPORTS[path] = cached
    if isinstance(cached, BaseException):
        raise cached
    return cached


_UNSERVED = "speaks the {dialect} dialect, which rollwire's proxy does not serve"
_HARBOR_INSTALL_ONLY = (
    "not installed by rollwire (no npm or PyPI package in its table): Harbor's own installer "
    "fetches it from the internet, so it runs in a cloud sandbox and is refused in local and docker"
)
_INSTALLED_NOTE = (
    "installed inside the sandbox at setup and reaches the proxy through the sandbox's gate "
    "(its capture session's data plane on the sandbox's loopback; no other network)"
)


def _installed(
    name: str,
    harbor_class: str,
    dialect: Dialect,
    *,
    base_url_env: tuple[str, ...] = (),
    api_key_env: tuple[str, ...],
    config_file: str | None = None,
    base_url_suffix: str = "/v1",
    notes: str = "",
    env: Mapping[str, str] | None = None,
    validated: bool = False,
    agent_kwargs: Mapping[str, Any] | None = None,
) -> Seam:
    return Seam(
        name=name,
        kind="installed",
        harbor_class=harbor_class,
        dialect=dialect,
        base_url_env=base_url_env,
        api_key_env=api_key_env,
        config_file=config_file,
        base_url_suffix=base_url_suffix,
        # BaseInstalledAgent resolves its variables from AgentConfig.env, then os.environ, while
        # it runs: serialise, and make os.environ say the same as the config for the whole run.
        reads_environ=True,
        sandbox_network=True,
        validated=validated,
        notes=f"{notes}; {_INSTALLED_NOTE}" if notes else _INSTALLED_NOTE,
        env=dict(env or {}),
        agent_kwargs=dict(agent_kwargs or {}),
    )


TERMINUS_2 = Seam(
    name="terminus-2",
    kind="host",
    harbor_class="harbor.agents.terminus_2:Terminus2",
    dialect="chat",
    config_fields=("base_url", "kwargs.llm_kwargs.api_key"),
    host_tools=("tmux",),
    validated=True,
    notes=(
        "runs in this process through litellm (openai/<model>, api_base = proxy, api_key = "
        "session id passed as llm_kwargs); drives tmux inside the sandbox through exec; parses "
        "JSON commands out of plain text (no tool manifest); summarisation is off because its "
        "summary subagents cannot be attributed to the task's reward"
    ),
    agent_kwargs={
        "collect_rollout_details": True,
        "record_terminal_session": False,  # asciinema is not installed; no network to fetch it
        "enable_summarize": False,
        "model_info": _ZERO_COST,
    },
)

SEAMS: dict[str, Seam] = {
    seam.name: seam
    for seam in (
        TERMINUS_2,
        Seam(
            name="oracle",
            kind="none",
            harbor_class="harbor.agents.oracle:OracleAgent",
            validated=True,
            notes="runs the task's solution/solve.sh; no model",
        ),
        Seam(
            name="nop",
            kind="none",
            harbor_class="harbor.agents.nop:NopAgent",
            validated=True,
            notes="does nothing; no model",
        ),
        _installed(
            "codex",
            "harbor.agents.installed.codex:Codex",
            "responses",
            base_url_env=("OPENAI_BASE_URL",),
            api_key_env=("OPENAI_API_KEY", "CODEX_API_KEY"),
            validated=True,
            notes=(
                "measured (tests/harbor/test_real_agents.py): Harbor's install() needs "
                "raw.githubusercontent.com (nvm) and nodejs.org, unreachable here; @openai/codex "
                "0.171.0 from npm on the Node from PyPI, mounted read-only (~/.nvm/nvm.sh puts it "
                "on PATH); codex tries the Responses WebSocket (refused at once), falls back to "
                "HTTPS and runs count-errors against the fake engine through the Responses dialect "
                "(its namespace tools flattened, web_search dropped): 2 calls captured, one "
                "linked sequence"
            ),
        ),
        _installed(
            "claude-code",
            "harbor.agents.installed.claude_code:ClaudeCode",
            "anthropic",
            base_url_env=("ANTHROPIC_BASE_URL",),
            api_key_env=("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"),
            base_url_suffix="",  # the Anthropic SDK appends /v1/messages itself
            validated=True,
            notes=(
                "measured (tests/harbor/test_real_agents.py): Harbor's install() pipes "
                "downloads.claude.ai's bootstrap.sh into bash, unreachable here; "
                "@anthropic-ai/claude-code 2.1.197 from npm on the Node from PyPI, mounted "
                "read-only (~/.local/bin/claude, where Harbor's check looks); it completes "
                "count-errors against the fake engine through the Anthropic dialect, its calls "
                "captured and linked (its system reminders arrive as role 'system' messages, "
                "kept in place); an output cap beyond the engine's context is clamped by the proxy"
            ),
        ),
        _installed(
            "gemini-cli",
            "harbor.agents.installed.gemini_cli:GeminiCli",
            "google",
            base_url_env=("GOOGLE_GEMINI_BASE_URL",),
            api_key_env=("GEMINI_API_KEY",),
            base_url_suffix="",
            validated=True,
            notes=(
                "measured (tests/harbor/test_agent_gemini_cli.py): @google/gemini-cli (0.61.0) "
                "from npm on the Node from PyPI, mounted read-only; no post-install step (run() "
                "writes ~/.gemini/settings.json itself, auth pinned to gemini-api-key since the "
                "key is set); it asks for topP 0.95 / topK 64 (forced to 1.0 / -1, WARN "
                "findings) and offers 15 function tools, "
                "google_web_search and web_fetch among them (plain declarations, no network to "
                "use them). count-errors against the fake engine: 2 calls captured in the google "
                "dialect (run_shell_command, then the answer), one linked sequence, reward 1.0, "
                "its session file converted to an ATIF trajectory that matches the capture"
            ),
        ),
        _installed(
            "opencode",
            "harbor.agents.installed.opencode:OpenCode",
            # opencode's "openai" provider always calls sdk.responses(model): openai/<model>
            # speaks the Responses API (an @ai-sdk/openai-compatible npm override fails with
            # "Z.responses is not a function").
            "responses",
            api_key_env=("OPENAI_API_KEY",),
            config_file="~/.config/opencode/opencode.json (provider options.baseURL)",
            # No models.dev fetch (no network; opencode falls back to its bundled catalogue).
            env={"OPENCODE_DISABLE_MODELS_FETCH": "1"},
            # Its title agent asks the model for a session title: a second conversation that
            # the task's reward says nothing about.
            agent_kwargs={"opencode_config": {"agent": {"title": {"disable": True}}}},
            validated=True,
            notes=(
                "measured (tests/harbor/test_agent_opencode.py): opencode-ai 1.18.33 from npm "
                "(a ~350 MB native binary, x64 and x64-baseline builds; Harbor's install() needs "
                "nvm and nodejs.org) starts in the local sandbox; Harbor's wrapper writes the "
                "proxy's URL into ~/.config/opencode/opencode.json and passes openai/<model>, "
                "which opencode always sends to the Responses API; with its title agent off it "
                "solves count-errors against the fake engine (reward 1.0): 2 calls captured in "
                "the responses dialect, one root, one trainable sequence, ATIF match"
            ),
        ),
        _installed(
            "goose",
            "harbor.agents.installed.goose:Goose",
            "chat",
            base_url_env=("OPENAI_HOST",),
            api_key_env=("OPENAI_API_KEY",),
            base_url_suffix="",  # goose appends OPENAI_BASE_PATH (v1/chat/completions)
            notes=_HARBOR_INSTALL_ONLY,
        ),
        _installed(
            "mini-swe-agent",
            "harbor.agents.installed.mini_swe_agent:MiniSweAgent",
            "chat",
            base_url_env=("OPENAI_BASE_URL", "OPENAI_API_BASE"),
            api_key_env=("MSWEA_API_KEY", "OPENAI_API_KEY"),
            # litellm's bundled cost map: no fetch from raw.githubusercontent.com (~7 s of retries).
            env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"},
            validated=True,
            notes=(
                "measured (tests/harbor/test_agent_mini_swe_agent.py): mini-swe-agent (2.4.6) from "
                "PyPI in a venv of the host's python3 (3.11), mounted read-only; Harbor's install() "
                "fetches uv from astral.sh (unreachable); it has no --version, so the start check "
                "is --help (Harbor's own); no post-install step. run() passes -c "
                "model.model_kwargs.api_base=<gate>/v1 and model openai/<model>; litellm sends "
                "chat completions with one bash tool. count-errors against the fake engine "
                "(scripted hermes tool calls: the grep, then echo "
                "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT): 2 calls captured in the chat dialect, "
                "one linked sequence, reward 1.0, exit Submitted, its trajectory converted to an "
                "ATIF trajectory that matches the capture"
            ),
        ),
        _installed(
            "openhands",
            "harbor.agents.installed.openhands:OpenHands",
            "chat",
            base_url_env=("LLM_BASE_URL",),
            api_key_env=("LLM_API_KEY",),
            notes=_HARBOR_INSTALL_ONLY,
        ),
        _installed(
            "qwen-coder",
            "harbor.agents.installed.qwen_code:QwenCode",
            "chat",
            base_url_env=("OPENAI_BASE_URL",),
            api_key_env=("OPENAI_API_KEY",),
            validated=True,
            notes=(
                "measured (tests/harbor/test_agent_qwen_code.py): @qwen-code/qwen-code (0.24.4) "
                "from npm on the Node from PyPI, mounted read-only; no post-install step (run() "
                "passes --auth-type openai, the base URL and key as flags and writes no config "
                "unless given settings or MCP servers); its bundled ripgrep ships without the "
                "exec bit (EACCES; it falls back to its built-in grep). It offers 14 function "
                "tools (its `agent` tool starts background subagents) and makes no side calls. "
                "count-errors against the fake engine: 2 calls captured in the chat dialect "
                "(run_shell_command, then the answer), one linked sequence, reward 1.0, its "
                "--chat-recording converted to an ATIF trajectory that matches the capture"
            ),
        ),
        _installed(
            "cline-cli",
            "harbor.agents.installed.cline:ClineCli",
            # -P openai is cline's openai-compatible provider: chat completions, streamed.
            "chat",
            # Harbor's ClineCli refuses base_url and cline reads no URL variable: Harbor's resolver
            # takes OPENAI_BASE_URL as the user-supplied endpoint, and the post-install hook
            # stores it with `cline auth` (rollwire.harnesses.harbor.installs._cline_endpoint).
            base_url_env=("OPENAI_BASE_URL",),
            api_key_env=("OPENAI_API_KEY", "API_KEY"),
            config_file="~/.cline/data/settings/providers.json (openai-compatible baseUrl)",
            # Its npm self-update check at start: no network in the sandbox.
            env={"CLINE_NO_AUTO_UPDATE": "1"},
            validated=True,
            notes=(
                "measured (tests/harbor/test_agent_cline.py): cline 3.0.65 from npm (a Node "
                "launcher and a ~150 MB Bun-compiled linux-x64 binary; Harbor's install() needs "
                "apt, nvm and nodejs.org) on the Node from PyPI, mounted read-only; its class "
                "refuses base_url, so no AgentConfig.base_url: a post-install `cline auth -p "
                "openai -b <gate>/v1` stores the URL for run()'s -P openai (cline's "
                "openai-compatible provider, streamed chat completions). It offers 4 function "
                "tools (read_files, run_commands, editor, submit_and_exit) and ends a run only on "
                "submit_and_exit (a text-only reply is answered by a [SYSTEM] nudge). "
                "count-errors against the fake engine: 2 calls captured in the chat dialect "
                "(run_commands, then submit_and_exit), one linked sequence, reward 1.0, its "
                "session's messages.json converted to an ATIF trajectory that matches the capture"
            ),
        ),
        _installed(
            "aider",
            "harbor.agents.installed.aider:Aider",
            "chat",
            base_url_env=("OPENAI_BASE_URL",),
            api_key_env=("OPENAI_API_KEY",),
            validated=True,
            notes=(
                "measured (tests/harbor/test_agent_aider.py): Harbor's install() pipes "
                "aider.chat's install.sh into sh, unreachable here; aider-chat 0.86.2 (PyPI) in a "
                "venv of /usr/bin/python3 (3.11), mounted; run() needs nothing from install(): "
                "it writes the proxy's URL into a --model-settings-file (litellm api_base) and "
                "the key reaches litellm as OPENAI_API_KEY. `aider --yes --message` talks "
                "openai/<model> through the chat dialect, no tools: it applies the file edits "
                "its reply spells out (whole-file format for an unknown model) and never runs "
                "a shell command (--yes answers no to those). count-errors against the fake "
                "engine: 1 call captured, one linked sequence, reward 1.0 (the scripted reply "
                "writes the count). With auto-commits on, a second call (the commit message) "
                "would be a second root. No ATIF: aider writes only a markdown chat history"
            ),
            # Auto-commits ask the model for each commit message: a second conversation that
            # the task's reward says nothing about. No update check, no analytics (its --yes
            # would opt a fresh home into them one time in ten) and litellm's bundled cost map
            # (its fetch of the remote one costs ~9 s here): the sandbox has no network.
            env={
                "AIDER_AUTO_COMMITS": "false",
                "AIDER_CHECK_UPDATE": "false",
                "AIDER_ANALYTICS": "false",
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            },
        ),
        _installed(
            "pi",
            "harbor.agents.installed.pi:Pi",
            "chat",
            # No URL variable: Harbor's resolver hands the base URL to run(), which writes it into
            # models.json (pi reads no OPENAI_BASE_URL for its custom provider).
            api_key_env=("OPENAI_API_KEY",),
            config_file="$PI_CODING_AGENT_DIR/models.json (provider harbor-endpoint baseUrl)",
            # Harbor's Pi takes a base URL only with an API style: openai-completions is chat.
            agent_kwargs={"model_api": "openai-completions"},
            # No model-catalogue refresh or version check from pi.dev, no install telemetry:
            # the sandbox has no network.
            env={"PI_OFFLINE": "1", "PI_SKIP_VERSION_CHECK": "1", "PI_TELEMETRY": "0"},
            validated=True,
            notes=(
                "measured (tests/harbor/test_agent_pi.py): @earendil-works/pi-coding-agent 1.6.0 "
                "(the package's name since 0.74; @mariozechner/ before; Node >=22.19) from npm "
                "on the Node from PyPI, mounted read-only; Harbor's install() needs nvm and "
                "nodejs.org; no post-install step (run() writes models.json under "
                "/tmp/harbor-pi-agent itself, apiKey $OPENAI_API_KEY). Without model_api Harbor "
                "drops the base URL (can_configure_base_url=False). pi --print --mode json offers "
                "4 function tools (read, bash, edit, write), asks only max_completion_tokens "
                "(no findings) and makes no side calls. count-errors against the fake engine: "
                "2 calls captured in the chat dialect (bash, then the answer), one linked "
                "sequence, reward 1.0, its session file converted to an ATIF trajectory that "
                "matches the capture"
            ),
        ),
    )
}


def import_path_seam(path: str) -> Seam:
    """A seam for any Harbor agent class, ``module:Class`` (checked when used).

    Its dialect is assumed to be chat-completions, and it gets the conventional OpenAI variables.
    Whether it reads os.environ while it runs is unknown, so its rollouts are serialised.
    """
    return Seam(
        name=path,
        kind="import",
        harbor_class=path,
        dialect="chat",
        base_url_env=("OPENAI_BASE_URL",),
        api_key_env=("OPENAI_API_KEY",),
        reads_environ=True,
        notes="an import-path seam: chat dialect assumed, OPENAI_BASE_URL/OPENAI_API_KEY given",
    )


def get_seam(harness: str) -> Seam:
    """The seam for a harness name, or an import-path seam for ``module:Class``."""
    seam = SEAMS.get(harness)
    if seam is not None:
        return seam
    if ":" in harness:
        return import_path_seam(harness)
    raise UnknownHarness(
        f"unknown harness {harness!r}; known: {', '.join(SEAMS)}, or module:Class for any "
        "other Harbor agent"
    )


def available_harnesses(extra: tuple[str, ...] = ()) -> list[tuple[str, bool, str]]:
    """(name, usable here, why or what to know) for every seam, plus any ``module:Class`` asked.

    A failure of one seam (an import error, a missing tool) never hides the others.
    """
    rows: list[tuple[str, bool, str]] = []
    for name in (*SEAMS, *extra):
        try:
            seam = get_seam(name)
            problem = seam.check()
        except Exception as exc:
            rows.append((name, False, f"{type(exc).__name__}: {exc}"))
            continue
        if problem is not None:
            rows.append((name, False, problem))
        else:
            rows.append((name, True, ("validated; " if seam.validated else "") + seam.notes))
    return rows


@contextlib.asynccontextmanager
async def environ_scope(seam: Seam, endpoint: Endpoint | None) -> AsyncIterator[None]:
    """For a harness that reads os.environ at run time: hold :data:`ENVIRON_LOCK` and make
    os.environ carry the proxy's URL and the session key for the whole block, then restore it.

    Other harnesses pass straight through. The lock is polled from the event loop (never a
    blocking acquire on a thread a cancellation could abandon), so any loop may wait on it.
    """
    if not seam.reads_environ or endpoint is None:
        yield
        return
    # An anyio.Event is bound to one loop; waiters here come from many: poll.
    while not ENVIRON_LOCK.acquire(blocking=False):  # noqa: ASYNC110
        await anyio.sleep(_LOCK_POLL_S)
    saved: dict[str, str | None] = {}
    try:
        for key, value in seam.environ(endpoint).items():
            saved[key] = os.environ.get(key)
            os.environ[key] = value
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
        ENVIRON_LOCK.release()
