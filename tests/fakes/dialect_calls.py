"""A trainer's calls in the four wire dialects the capture proxy speaks (chat, Responses,
Anthropic, Google): each dialect's request, its API-key header, and the history a reply extends,
as the caller's SDK keeps it. Shared by the proxy's memory test and its soak benchmark."""

from __future__ import annotations

from typing import Any

DIALECTS = ("chat", "responses", "anthropic", "google")


def request(dialect: str, history: list[Any], stream: bool) -> tuple[str, dict[str, Any]]:
    """The path and body of one call."""
    if dialect == "chat":
        return "/v1/chat/completions", {"messages": history, "max_tokens": 8, "stream": stream}
    if dialect == "responses":
        return "/v1/responses", {"input": history, "max_output_tokens": 8, "stream": stream}
    if dialect == "anthropic":
        return "/v1/messages", {"messages": history, "max_tokens": 8, "stream": stream}
    action = "streamGenerateContent" if stream else "generateContent"
    body = {"contents": history, "generationConfig": {"maxOutputTokens": 8}}
    return f"/v1beta/models/gemini-x:{action}", body


def headers(dialect: str, sid: str) -> dict[str, str]:
    """The session id as the dialect's API key."""
    if dialect == "anthropic":
        return {"x-api-key": sid, "anthropic-version": "2023-06-01"}
    if dialect == "google":
        return {"x-goog-api-key": sid}
    return {"Authorization": f"Bearer {sid}"}


def user(dialect: str, text: str) -> dict[str, Any]:
    if dialect == "google":
        return {"role": "user", "parts": [{"text": text}]}
    return {"role": "user", "content": text}


def extend(dialect: str, history: list[Any], reply: dict[str, Any], turn: int) -> None:
    """Append the reply as the caller's SDK keeps it, then the next user message."""
    if dialect == "chat":
        history.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})
    elif dialect == "responses":
        history.extend(reply["output"])
    elif dialect == "anthropic":
        history.append({"role": "assistant", "content": reply["content"]})
    else:
        history.append(reply["candidates"][0]["content"])
    history.append(user(dialect, f"and step {turn}?"))
