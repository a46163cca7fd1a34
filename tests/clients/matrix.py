"""The MCP clients people use, as a table: how each is installed, configured and started.

Each row takes the config block the docs show (``examples/mcp_clients/<client>.<transport>``,
placeholders filled in), puts it where that client reads its MCP servers, and points the
client's model at the capture proxy (the dialect the client speaks, the capture session id as
its API key) in front of a scripted model (:mod:`tests.clients.policy`). The docs table in
``docs/guides/mcp-clients.md`` is checked against this one.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollwire.harnesses.harbor.installs import PACKAGES, AgentPackage

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "examples" / "mcp_clients"
PLACEHOLDER_DIR = "/path/to/rollwire"
PLACEHOLDER_URL = "http://127.0.0.1:8400/mcp"
PLACEHOLDER_TOKEN = "YOUR_TOKEN"
CODEX_TOKEN_ENV = "ROLLWIRE_MCP_TOKEN"

INSPECTOR = AgentPackage(
    "mcp-inspector", "npm", "@modelcontextprotocol/inspector", "2.12.0", ("mcp-inspector",)
)


@dataclass(frozen=True)
class Launch:
    """One client run: where it runs, the rollwire server it is given, its model."""

    work: Path  # the client's working directory
    home: Path  # its $HOME (configs go here; nothing of the real home is read)
    transport: str  # "stdio" or "http"
    extra_args: tuple[str, ...]  # appended to the stdio server's args (--data-dir, --call-log)
    mcp_url: str | None  # the HTTP server's /mcp URL
    token: str | None  # its bearer token
    model_url: str  # the capture proxy's root URL
    key: str  # the capture session id (the client's model API key)
    prompt: str
    tools: tuple[str, ...]  # rollwire tools the client may call without asking


def template_text(client: str, transport: str) -> str:
    suffix = "toml" if client == "codex" else "json"
    return (TEMPLATES / f"{client}.{transport}.{suffix}").read_text()


def filled(client: str, launch: Launch) -> str:
    """The docs' config block for this client and transport, placeholders filled in."""
    text = template_text(client, launch.transport).replace(PLACEHOLDER_DIR, str(ROOT))
    if launch.mcp_url is not None:
        text = text.replace(PLACEHOLDER_URL, launch.mcp_url)
    if launch.token is not None:
        text = text.replace(PLACEHOLDER_TOKEN, launch.token)
    return text


def _servers(client: str, launch: Launch, key: str = "mcpServers") -> dict[str, Any]:
    """The filled JSON block's server entries, the stdio command given the test's extra args."""
    servers = json.loads(filled(client, launch))[key]
    entry = servers["rollwire"]
    if launch.transport == "stdio":
        if isinstance(entry.get("command"), list):  # opencode: one argv list
            entry["command"] = [*entry["command"], *launch.extra_args]
        else:
            entry["args"] = [*entry["args"], *launch.extra_args]
    return servers


def _base_env(launch: Launch) -> dict[str, str]:
    """This process's environment with a HOME of the client's own, but uv's cache where it
    was: a user's ``uv run`` finds its cache, and a new one would make every stdio server
    start by rebuilding rollwire (long enough for a client to send its first turn without
    rollwire's tools)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "OPENAI_"))}
    env.setdefault("UV_CACHE_DIR", str(Path.home() / ".cache" / "uv"))
    env.update(HOME=str(launch.home), NO_COLOR="1", CI="true")
    return env


def _claude(launch: Launch) -> tuple[list[str], dict[str, str]]:
    config = launch.work / "rollwire.mcp.json"
    config.write_text(json.dumps({"mcpServers": _servers("claude-code", launch)}))
    env = _base_env(launch)
    env.update(
        ANTHROPIC_BASE_URL=launch.model_url,
        ANTHROPIC_API_KEY=launch.key,
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
    )
    argv = [
        "claude", "-p", launch.prompt,
        "--mcp-config", str(config), "--strict-mcp-config",
        "--allowedTools", ",".join(f"mcp__rollwire__{t}" for t in launch.tools),
        "--output-format", "json", "--model", "claude-sonnet-4-5",
    ]  # fmt: skip
    return argv, env


def _gemini_settings(client: str, launch: Launch, folder: str) -> None:
    settings = launch.home / folder / "settings.json"
    settings.parent.mkdir(parents=True, exist_ok=True)
    body: dict[str, Any] = {"mcpServers": _servers(client, launch)}
    if client == "gemini-cli":
        # Headless gemini cannot ask which auth to use; with a custom base URL its own guess
        # is "gateway", which it then refuses. Harbor's wrapper pins it the same way.
        body["security"] = {"auth": {"selectedType": "gemini-api-key"}}
    settings.write_text(json.dumps(body))


def _gemini(launch: Launch) -> tuple[list[str], dict[str, str]]:
    _gemini_settings("gemini-cli", launch, ".gemini")
    env = _base_env(launch)
    env.update(
        GEMINI_API_KEY=launch.key,
        GOOGLE_GEMINI_BASE_URL=launch.model_url,
        GEMINI_CLI_TRUST_WORKSPACE="true",  # else --yolo is overridden in a new folder
    )
    return ["gemini", "-p", launch.prompt, "--yolo", "-m", "gemini-2.5-pro"], env


def _qwen(launch: Launch) -> tuple[list[str], dict[str, str]]:
    _gemini_settings("qwen-code", launch, ".qwen")
    env = _base_env(launch)
    env.update(OPENAI_BASE_URL=f"{launch.model_url}/v1", OPENAI_API_KEY=launch.key)
    argv = ["qwen", launch.prompt, "--approval-mode", "yolo", "--auth-type", "openai", "-m", "smol"]
    return argv, env


def _opencode(launch: Launch) -> tuple[list[str], dict[str, str]]:
    config = launch.home / ".config" / "opencode" / "opencode.json"
    config.parent.mkdir(parents=True, exist_ok=True)
    body = json.loads(filled("opencode", launch))
    body["mcp"] = _servers("opencode", launch, "mcp")
    # Its "openai" provider speaks the Responses API; its title agent is a second conversation.
    body["provider"] = {"openai": {"options": {"baseURL": f"{launch.model_url}/v1"}}}
    body["agent"] = {"title": {"disable": True}}
    config.write_text(json.dumps(body))
    env = _base_env(launch)
    env.update(OPENAI_API_KEY=launch.key, OPENCODE_DISABLE_MODELS_FETCH="1")
    return ["opencode", "run", "-m", "openai/gpt-4.1", launch.prompt], env


def _toml_value(value: Any) -> str:
    return json.dumps(value)  # strings, numbers, booleans and lists of them: TOML == JSON here


def _codex(launch: Launch) -> tuple[list[str], dict[str, str]]:
    home = launch.home / ".codex"
    home.mkdir(parents=True, exist_ok=True)
    entry = tomllib.loads(filled("codex", launch))["mcp_servers"]["rollwire"]
    if launch.transport == "stdio":
        entry["args"] = [*entry["args"], *launch.extra_args]
    lines = [
        'model = "gpt-5"',
        'model_provider = "scripted"',
        "[model_providers.scripted]",
        'name = "scripted"',
        f"base_url = {_toml_value(launch.model_url + '/v1')}",
        'env_key = "SCRIPTED_KEY"',
        'wire_api = "responses"',
        "[mcp_servers.rollwire]",
        *(f"{k} = {_toml_value(v)}" for k, v in entry.items()),
    ]
    (home / "config.toml").write_text("\n".join(lines) + "\n")
    env = _base_env(launch)
    env.update(SCRIPTED_KEY=launch.key, CODEX_HOME=str(home))
    if launch.token is not None:
        env[CODEX_TOKEN_ENV] = launch.token
    argv = [
        "codex", "exec", "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox", launch.prompt,
    ]  # fmt: skip
    return argv, env


@dataclass(frozen=True)
class McpClient:
    """One MCP client: its package, the model wire it speaks, how it names a server's tools."""

    name: str
    package: AgentPackage
    dialect: str  # the capture proxy's dialect its model calls arrive in
    tool_names: str  # how the model sees rollwire's list_tasks
    calls_tools: bool  # False: the model is never offered the server's tools
    launch: Callable[[Launch], tuple[list[str], dict[str, str]]]
    client_info: str  # the name it gives in MCP initialize
    notes: str = ""

    @property
    def version(self) -> str:
        return self.package.version


CLIENTS: dict[str, McpClient] = {
    c.name: c
    for c in (
        McpClient(
            "claude-code",
            PACKAGES["claude-code"],
            "anthropic",
            "mcp__rollwire__list_tasks",
            True,
            _claude,
            "claude-code",
        ),
        McpClient(
            "gemini-cli",
            PACKAGES["gemini-cli"],
            "google",
            "mcp_rollwire_list_tasks",
            True,
            _gemini,
            "gemini-cli-mcp-client",
        ),
        McpClient(
            "qwen-code",
            PACKAGES["qwen-coder"],
            "chat",
            "mcp__rollwire__list_tasks",
            True,
            _qwen,
            "qwen-cli-mcp-client-rollwire",
        ),
        McpClient(
            "opencode",
            PACKAGES["opencode"],
            "responses",
            "rollwire_list_tasks",
            True,
            _opencode,
            "opencode",
        ),
        McpClient(
            "codex",
            PACKAGES["codex"],
            "responses",
            "list_tasks",
            True,
            _codex,
            "codex-mcp-client",
            notes="its first model request can go out before the MCP server has listed its "
            "tools; they are offered from the next request on",
        ),
    )
}


def transcript_results(requests: list[Mapping[str, Any]]) -> list[str]:
    """Every tool result's text in the last model request: what the model had read."""
    last = requests[-1] if requests else {}
    out = []
    for message in last.get("messages") or []:
        if isinstance(message, Mapping) and message.get("role") == "tool":
            content = message.get("content")
            out.append(content if isinstance(content, str) else json.dumps(content))
    return out
