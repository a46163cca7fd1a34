"""The built-in tool loop: a white-box harness that drives a model through the capture proxy.

Each model call goes to the proxy (so ids and logprobs come from the engine); each tool call goes
to the session; results are appended; the loop stops on done, on a reply with no tool call, or
on a limit. A session that takes text answers (``answer_mode`` text or either) gets a reply with
no tool call as its answer instead: the episode goes on (its observation appended as a user
message) until the environment says done. Models without native tool calling are read through
the text tool format (``<tool_call>{...}</tool_call>``); with no tools offered (``text``), no
call is read from the text. Every tool call the model made gets a result, executed or not, so
no tool-call id is ever left without one.
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

import anyio
from pydantic import BaseModel, Field

from rollwire import bounds
from rollwire.capture.dialects.hermes import manifest_prompt, parse_calls
from rollwire.capture.upstream import Upstream, UpstreamError
from rollwire.sessions.base import ResourceSession, ToolResult


class LoopLimits(BaseModel):
    """Bounds and sampling for one episode."""

    max_turns: int = Field(default=8, ge=1, le=bounds.MAX_TURNS)
    max_tool_calls_per_turn: int = Field(default=4, ge=1, le=bounds.MAX_MODEL_CALLS)
    max_total_tool_calls: int = Field(default=32, ge=1, le=bounds.MAX_MODEL_CALLS)
    wall_clock_s: float = Field(default=300.0, gt=0, le=bounds.MAX_TIMEOUT_S)
    max_tokens: int = Field(default=256, ge=1, le=bounds.MAX_TOKENS)
    temperature: float = Field(default=1.0, ge=0)
    seed: int | None = None
    # >0: ask for the engine's top candidates per token (kept in the document for inspection)
    top_logprobs: int = Field(default=0, ge=0, le=bounds.MAX_TOP_LOGPROBS)
    # native: send `tools` and read `tool_calls` (text calls in the reply are read too);
    # text: describe the tools in the system prompt and read calls from the reply text only.
    tool_format: Literal["native", "text"] = "native"


class LoopOutcome(BaseModel):
    """How the loop ended and what it saw."""

    messages: list[dict[str, Any]]
    model_calls: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    text_answers: int = 0
    stop_reason: str = "not_started"
    errors: list[str] = Field(default_factory=list)
    elapsed_s: float = 0.0


def _arguments(raw: Any) -> tuple[dict[str, Any] | None, str | None]:
    if isinstance(raw, dict):
        return raw, None
    if raw in (None, ""):
        return {}, None
    try:
        value = json.loads(raw)
    except (TypeError, ValueError) as exc:
        return None, f"arguments are not valid JSON ({exc}): {str(raw)[:200]}"
    if not isinstance(value, dict):
        return None, f"arguments must be a JSON object, got {type(value).__name__}"
    return value, None


def _tool_text(result: ToolResult) -> str:
    return f"error: {result.content}" if result.error else result.content


def _with_manifest(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    section = manifest_prompt(tools)
    if messages and messages[0].get("role") == "system":
        return [
            {"role": "system", "content": f"{messages[0]['content']}\n\n{section}"},
            *messages[1:],
        ]
    return [{"role": "system", "content": section}, *messages]


async def run_tool_loop(
    session: ResourceSession, chat: Upstream, limits: LoopLimits, *, model: str = "rollwire"
) -> LoopOutcome:
    """Run one episode. Model errors end the loop as results; nothing is raised for them."""
    start = time.perf_counter()
    tools = [t.openai() for t in session.list_tools()]
    out = LoopOutcome(messages=[])
    messages: list[dict[str, Any]] = []
    with anyio.move_on_after(limits.wall_clock_s) as scope:  # the reset counts too: it can hang
        messages = await session.initial_messages()
        if limits.tool_format == "text" and tools:
            messages = _with_manifest(messages, tools)
        out.stop_reason = "max_turns"
        for turn in range(limits.max_turns):
            body: dict[str, Any] = {
                "model": model,
                "messages": messages,
                "max_tokens": limits.max_tokens,
                "temperature": limits.temperature,
            }
            if limits.seed is not None:
                body["seed"] = limits.seed + turn
            if limits.top_logprobs:
                body["logprobs"] = True
                body["top_logprobs"] = limits.top_logprobs
            if limits.tool_format == "native" and tools:
                body["tools"] = tools
            try:
                reply = await chat.request_json("POST", "/chat/completions", body)
                message = reply["choices"][0]["message"]
            except UpstreamError as exc:
                out.errors.append(exc.message)
                out.stop_reason = "model_error"
                break
            except (KeyError, IndexError, TypeError) as exc:
                out.errors.append(f"malformed model reply: {type(exc).__name__}: {exc}")
                out.stop_reason = "model_error"
                break
            out.model_calls += 1
            content = message.get("content") or ""
            native = (message.get("tool_calls") or []) if limits.tool_format == "native" else []
            if native:
                calls = native
                messages.append({"role": "assistant", "content": content, "tool_calls": calls})
            else:
                # The reply text is kept verbatim: the next prompt must extend this turn's tokens.
                messages.append({"role": "assistant", "content": content})
                calls = parse_calls(content)[1] if tools else []
            if not calls:
                if not session.takes_text_answers():
                    out.stop_reason = "no_tool_call"
                    break
                result = await session.answer_text(content)
                out.text_answers += 1
                if result.done:
                    out.stop_reason = "text_answer"
                    break
                messages.append({"role": "user", "content": _tool_text(result)})
                continue
            room = min(limits.max_tool_calls_per_turn, limits.max_total_tool_calls - out.tool_calls)
            done = False
            responses: list[dict[str, Any]] = []
            for i, call in enumerate(calls):
                fn = call.get("function") or {}
                name = str(fn.get("name") or "")
                if i >= room:
                    limit = (
                        "max_tool_calls_per_turn"
                        if room == limits.max_tool_calls_per_turn
                        else "max_total_tool_calls"
                    )
                    result = ToolResult(
                        content=f"not executed: {limit} reached", error=f"{limit} reached"
                    )
                else:
                    args, problem = _arguments(fn.get("arguments"))
                    if problem is not None:
                        result = ToolResult(content=problem, error=problem)
                    else:
                        result = await session.call_tool(name, args or {})
                    out.tool_calls += 1
                out.tool_errors += result.error is not None
                done = done or result.done
                if native:
                    messages.append(
                        {
                            "role": "tool",
                            "tool_call_id": call.get("id"),
                            "content": _tool_text(result),
                        }
                    )
                else:
                    responses.append({"name": name, "content": _tool_text(result)})
            if responses:
                # Built with a JSON encoder: tool output may hold quotes, braces, anything.
                text = "\n".join(
                    f"<tool_response>\n{json.dumps(r)}\n</tool_response>" for r in responses
                )
                messages.append({"role": "user", "content": text})
            if done:
                out.stop_reason = "done"
                break
            if out.tool_calls >= limits.max_total_tool_calls:
                out.stop_reason = "max_total_tool_calls"
                break
    if scope.cancelled_caught:
        out.stop_reason = "wall_clock"
    out.messages = messages
    out.elapsed_s = round(time.perf_counter() - start, 4)
    return out
