"""A toy reset/step environment and a scripted chat endpoint (the model boundary) for loop tests."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from rollwire.capture.upstream import Upstream
from rollwire.sessions.base import ToolSpec
from rollwire.sessions.stepenv import ActionTool, StepEnvSession, StepOutcome, ToolArgumentError

ADD = ToolSpec(
    name="add",
    description="Add n to the counter.",
    input_schema={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
)


@dataclass
class CounterEnv:
    """Reach 3 to win (reward 1.0); a negative n is an illegal move."""

    total: int = 0
    fail_on_step: int | None = None
    steps: int = 0
    closed: bool = False

    def reset(self, seed: int | None) -> StepOutcome:
        self.total = 0
        return StepOutcome(observation="counter = 0; reach 3")

    def step(self, action: int) -> StepOutcome:
        self.steps += 1
        if self.fail_on_step == self.steps:
            raise RuntimeError("the environment crashed")
        if action < 0:
            raise ToolArgumentError(f"n={action} is illegal: must be >= 0")
        self.total += action
        done = self.total >= 3
        return StepOutcome(
            observation=f"counter = {self.total}", reward=1.0 if done else 0.0, done=done
        )

    def state(self) -> dict[str, Any]:
        return {"total": self.total}

    def close(self) -> None:
        self.closed = True


def _to_action(args: dict[str, Any]) -> int:
    n = args.get("n")
    if not isinstance(n, int) or isinstance(n, bool):
        raise ToolArgumentError(f"'n' must be an integer, got {n!r}")
    return n


def counter_session(env: CounterEnv | None = None, **kw: Any) -> StepEnvSession:
    return StepEnvSession(env=env or CounterEnv(), tools=[ActionTool(ADD, _to_action)], **kw)


def call(name: str, args: dict[str, Any] | str, call_id: str) -> dict[str, Any]:
    arguments = args if isinstance(args, str) else json.dumps(args)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


@dataclass
class ScriptedChat:
    """An OpenAI-shaped chat endpoint that answers with scripted assistant messages in order."""

    replies: list[dict[str, Any]]
    requests: list[dict[str, Any]] = field(default_factory=list)

    def app(self) -> Starlette:
        async def chat(request: Request) -> JSONResponse:
            body = await request.json()
            self.requests.append(body)
            if not self.replies:
                return JSONResponse(
                    {"error": {"message": "script exhausted", "type": "x", "code": 500}}, 500
                )
            message = {"role": "assistant", **self.replies.pop(0)}
            return JSONResponse(
                {
                    "id": "c",
                    "object": "chat.completion",
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                }
            )

        return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])

    def client(self) -> Upstream:
        return Upstream("http://scripted/v1", transport=httpx.ASGITransport(app=self.app()))
