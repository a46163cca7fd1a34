"""A scripted teacher for reasoning-gym's ``chain_sum``: an OpenAI-spec endpoint that is right.

An SFT warm-up collects with a capable model. Where none is reachable (this project's machines
have no internet and no model larger than 135M parameters), this stands in for one: it reads the
problem from the last user message, works the sum out one operation per line, and answers

- through the ``answer`` tool when the request offers tools (``tool_calls``, as an OpenAI or
  vLLM server with a tool parser answers), or
- inside ``<answer></answer>`` tags when it does not (reasoning-gym's text format).

It is not a model: it returns no token ids and no logprobs, so rollwire certifies it EVAL ONLY
(text tier) and its episodes are conversations, which is what an SFT warm-up needs from a
teacher. Anything that is not a chain_sum problem gets a plain text reply.

    python examples/chain_sum_teacher.py --port 8030   # then --teacher-url http://127.0.0.1:8030/v1
"""

from __future__ import annotations

import argparse
import json
import re
import secrets
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

MODEL = "chain-sum-teacher"
_PROBLEM = re.compile(r"arithmetic problem:\s*([-\d\s+]+?)\s*=", re.IGNORECASE)
_TERM = re.compile(r"([+-])\s*(\d+)")


def work(expression: str) -> tuple[list[str], int] | None:
    """The steps (one operation per line) and the result of ``a + b - c ...``, or None."""
    text = expression.strip()
    first = re.match(r"(-?\d+)", text)
    if first is None:
        return None
    total = int(first.group(1))
    rest = text[first.end() :]
    terms = _TERM.findall(rest)
    if not terms or _TERM.sub("", rest).strip():
        return None
    steps = []
    for op, digits in terms:
        value = int(digits)
        new = total + value if op == "+" else total - value
        steps.append(f"{total} {op} {value} = {new}")
        total = new
    return steps, total


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def reply(body: dict[str, Any]) -> dict[str, Any]:
    """The assistant message for one chat request."""
    messages = body.get("messages") or []
    last_user = next((m for m in reversed(messages) if m.get("role") == "user"), {})
    found = _PROBLEM.search(_text(last_user.get("content")))
    solved = work(found.group(1)) if found else None
    if solved is None:
        return {"role": "assistant", "content": "I only solve chain_sum arithmetic problems."}
    steps, total = solved
    tools = [t.get("function", {}).get("name") for t in body.get("tools") or []]
    if "answer" in tools and body.get("tool_choice") != "none":
        call = {
            "id": f"call_{secrets.token_hex(6)}",
            "type": "function",
            "function": {"name": "answer", "arguments": json.dumps({"answer": str(total)})},
        }
        return {"role": "assistant", "content": "\n".join(steps), "tool_calls": [call]}
    return {"role": "assistant", "content": "\n".join([*steps, f"<answer>{total}</answer>"])}


async def chat(request: Request) -> JSONResponse:
    body = await request.json()
    message = reply(body)
    calls = message.get("tool_calls")
    return JSONResponse(
        {
            "id": f"chatcmpl-{secrets.token_hex(8)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if calls else "stop",
                }
            ],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }
    )


async def models(_request: Request) -> JSONResponse:
    return JSONResponse(
        {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "rollwire"}]}
    )


def create_app() -> Starlette:
    """The teacher as an ASGI app: ``/v1/models`` and ``/v1/chat/completions``."""
    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
        ]
    )


if __name__ == "__main__":
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8030)
    args = parser.parse_args()
    uvicorn.run(create_app(), host=args.host, port=args.port, log_level="warning")
