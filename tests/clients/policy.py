"""A scripted model that drives an MCP client through rollwire's tools.

Every MCP client names a server's tools its own way (``mcp__rollwire__list_tasks``,
``mcp_rollwire_list_tasks``, ``rollwire_list_tasks``), some hide them behind a search tool until
the model asks (Claude Code's ``ToolSearch``, Qwen Code's ``tool_search``), and some call them
through a generic tool (Qwen Code's ``tool_call``). The policy reads each request as the fake
engine receives it (OpenAI chat, after the capture proxy's dialect translation), finds the next
step of its plan, and answers with the hermes ``<tool_call>`` block the fake vLLM parses, naming
the tool as this client offered it. A request without tools (a title, a summary) gets a line of
text; once the plan is done, the final answer.

A step's arguments may depend on what the model has read so far: a callable gets the texts of
every tool result in the conversation, in order (e.g. the ``rollout_id`` that ``run_rollout``
returned), which is how the matrix shows that results are readable.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.vllm import content_text, tool_call_text

Arguments = Mapping[str, Any] | Callable[[list[str]], Mapping[str, Any]]

#: Tools a client offers so the model can load deferred tools.
SEARCH_TOOLS = ("ToolSearch", "tool_search")
#: A client's generic "call this named tool" tool.
GENERIC_CALL_TOOLS = ("tool_call",)
#: What a model calls when its first request went out before the server's tools were listed
#: (both clients start MCP servers while the first turn is sent): Claude Code offers a tool
#: that waits for them, Codex a look at a server's resources. The tool, and its arguments.
WAIT_TOOLS: dict[str, Callable[[str], dict[str, Any]]] = {
    "WaitForMcpServers": lambda server: {"servers": [server]},
    "list_mcp_resources": lambda server: {"server": server},
}


@dataclass(frozen=True)
class Step:
    tool: str  # rollwire's own name, e.g. "list_tasks"
    arguments: Arguments = field(default_factory=dict)
    until: Callable[[str], bool] | None = None
    """Call again until the result's text satisfies this (polling); None: once."""

    def resolve(self, results: list[str]) -> dict[str, Any]:
        args = self.arguments(results) if callable(self.arguments) else self.arguments
        return dict(args)


def _function(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    fn = tool.get("function")
    return fn if isinstance(fn, Mapping) else {}


def offered_name(server: str, tool: str, names: Sequence[str]) -> str | None:
    """The name under which a client offers ``server``'s ``tool`` (None: not offered)."""
    for name in names:
        if name == tool or (name.endswith(tool) and server in name[: -len(tool)]):
            return name
    return None


def bare_tool(server: str, name: str, arguments: Any) -> str:
    """The tool a call made by the model names, without the client's prefix for ``server``
    (``mcp__rollwire__list_tasks`` -> ``list_tasks``), through a generic call tool too."""
    if name in GENERIC_CALL_TOOLS and isinstance(arguments, Mapping):
        name = str(arguments.get("name", ""))
    m = re.fullmatch(rf"(?:mcp)?_*{re.escape(server)}_+(\w+)", name)
    return m.group(1) if m else name


@dataclass
class ScriptedPolicy:
    """The plan: call ``steps`` in order, then answer ``final``."""

    steps: Sequence[Step]
    server: str = "rollwire"
    final: str | Callable[[list[str]], str] = "DONE"
    """The last answer, or a function of every tool result the model read."""
    requests: list[dict[str, Any]] = field(default_factory=list)
    sent: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    """Every plan call the model made: (rollwire's tool name, the arguments), in order."""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def history(self, messages: Sequence[Any]) -> tuple[int, list[str]]:
        """How many steps of the plan are done, and every tool result's text (in order). A
        step is done by a call of its tool, or with ``until``, by one whose result says so."""
        calls: list[tuple[str, str | None]] = []  # (bare tool, its call id)
        results: list[str] = []
        by_id: dict[str, str] = {}
        for message in messages:
            if not isinstance(message, Mapping):
                continue
            if message.get("role") == "tool":
                text = content_text(message.get("content"))
                results.append(text)
                by_id[str(message.get("tool_call_id"))] = text
            for call in message.get("tool_calls") or ():
                fn = call.get("function") or {}
                try:
                    arguments = json.loads(fn.get("arguments") or "{}")
                except ValueError:
                    arguments = {}
                calls.append(
                    (bare_tool(self.server, str(fn.get("name", "")), arguments), call.get("id"))
                )
        done = 0
        for tool, call_id in calls:
            if done >= len(self.steps) or tool != self.steps[done].tool:
                continue
            until = self.steps[done].until
            if until is None or until(by_id.get(str(call_id), "")):
                done += 1
        return done, results

    def __call__(self, body: Mapping[str, Any]) -> str:
        with self._lock:
            self.requests.append(dict(body))
        tools = [t for t in body.get("tools") or () if isinstance(t, Mapping)]
        if not tools:
            return "rollwire session"  # a side call: a title, a summary
        names = [str(_function(t).get("name", "")) for t in tools]
        done, results = self.history(body.get("messages") or [])
        if done >= len(self.steps):
            return self.final(results) if callable(self.final) else self.final
        step = self.steps[done]
        arguments = step.resolve(results)
        name = offered_name(self.server, step.tool, names)
        if name is not None:
            with self._lock:
                self.sent.append((step.tool, arguments))
            return tool_call_text(name, arguments)
        qualified = f"mcp__{self.server}__{step.tool}"
        generic = next((n for n in GENERIC_CALL_TOOLS if n in names), None)
        search = next((n for n in SEARCH_TOOLS if n in names), None)
        searched = any(
            f'"{search}"' in json.dumps(m.get("tool_calls") or [])
            for m in body.get("messages") or []
            if isinstance(m, Mapping)
        )
        if search is not None and not searched:
            return tool_call_text(search, {"query": f"+{self.server}", "max_results": 20})
        if generic is not None:
            with self._lock:
                self.sent.append((step.tool, arguments))
            return tool_call_text(generic, {"name": qualified, "arguments": arguments})
        wait = next((n for n in WAIT_TOOLS if n in names), None)
        if wait is not None:
            return tool_call_text(wait, WAIT_TOOLS[wait](self.server))
        return f"NOT OFFERED: {step.tool} (tools: {', '.join(names)})"


def last_result(results: list[str]) -> Any:
    """The last tool result as JSON (the text block a client passes back), else its text."""
    text = results[-1] if results else ""
    m = re.search(r"\{.*\}", text, re.DOTALL)
    if m is None:
        return text
    try:
        return json.loads(m.group(0))
    except ValueError:
        return text


def field_in_results(key: str) -> Callable[[list[str]], str]:
    """The last value of ``"key": "..."`` in any result the model has read."""

    def find(results: list[str]) -> str:
        for text in reversed(results):
            m = re.findall(rf'\\?"{re.escape(key)}\\?"\s*:\s*\\?"([^"\\]+)', text)
            if m:
                return m[-1]
        raise LookupError(f"no {key!r} in any tool result the model read")

    return find
