"""Every ``tools/call`` the MCP server answers, one JSON line each (``serve --call-log FILE``).

MCP clients differ in what they send: argument shapes after their schema handling, whether they
ask for progress, who they say they are. The log is what arrived, from rollwire's side: the
client (its ``initialize`` name and version), the tool, the arguments as received, whether the
call asked for progress, how long it took, and whether it failed (with the message the client
was sent). Lines are appended and flushed one at a time under a lock, so a reader never sees a
torn line and concurrent calls do not interleave.
"""

from __future__ import annotations

import functools
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent

from rollwire.engine.process import EngineDied, EngineProcess
from rollwire.server.surface import CompactMCPServer


class CallLog:
    """An append-only JSONL file of tool calls."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()

    def write(self, entry: dict[str, Any]) -> None:
        line = orjson.dumps(entry, default=str) + b"\n"
        with self._lock, self.path.open("ab") as f:
            f.write(line)
            f.flush()


def _client(context: Context | None) -> dict[str, Any] | None:
    try:
        params = context.request_context.session.client_params  # type: ignore[union-attr]
    except (AttributeError, ValueError):
        return None
    info = getattr(params, "client_info", None)
    return {"name": info.name, "version": info.version} if info is not None else None


def _asked_progress(context: Context | None) -> bool:
    """Whether the call carries a progress token (the SDK hands ``_meta`` over as a dict with
    the token under ``progress_token``)."""
    try:
        meta = context.request_context.meta  # type: ignore[union-attr]
    except (AttributeError, ValueError):
        return False
    return bool(meta) and meta.get("progress_token") is not None


def _error_text(result: Any) -> str | None:
    if not isinstance(result, CallToolResult) or not result.is_error:
        return None
    return " ".join(c.text for c in result.content if isinstance(c, TextContent)) or "error"


class LoggedMCPServer(CompactMCPServer):
    """A :class:`CompactMCPServer` that writes each tool call to ``call_log`` (when set), and
    answers a call in flight when its embedded ``engine`` (when set) dies with a tool error
    that says so (the server itself goes on serving)."""

    call_log: CallLog | None = None
    engine: EngineProcess | None = None

    async def _call(self, name: str, arguments: dict[str, Any], context: Context | None) -> Any:
        engine = self.engine
        if engine is None:
            return await super().call_tool(name, arguments, context)
        try:
            return await engine.guarded(
                functools.partial(super().call_tool, name, arguments, context)
            )
        except EngineDied as exc:
            raise ToolError(f"{name}: {exc}") from None

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context | None = None
    ) -> Any:
        log = self.call_log
        if log is None:
            return await self._call(name, arguments, context)
        started = time.monotonic()
        entry: dict[str, Any] = {
            "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "client": _client(context),
            "tool": name,
            "arguments": arguments,
            "progress": _asked_progress(context),
        }
        try:
            result = await self._call(name, arguments, context)
        except BaseException as exc:
            entry.update(ok=False, error=f"{type(exc).__name__}: {exc}", elapsed_s=_since(started))
            log.write(entry)
            raise
        error = _error_text(result)
        entry.update(ok=error is None, elapsed_s=_since(started))
        if error is not None:
            entry["error"] = error
        log.write(entry)
        return result


def _since(started: float) -> float:
    return round(time.monotonic() - started, 3)
