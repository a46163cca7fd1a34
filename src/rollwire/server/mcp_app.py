"""The rollwire MCP server: tasks, endpoint certification, rollouts and their graphs.

``build_server()`` assembles an :class:`MCPServer` over one :class:`ServerState` (the endpoint
pool and the in-memory rollout store). ``serve_stdio`` and ``serve_http`` run it; logs go to
stderr only (stdout is the stdio transport).
"""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import orjson
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceNotFoundError, ToolError
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import BaseModel, Field

from rollwire.capture.certify import Certification
from rollwire.tools.endpoint import EndpointPool
from rollwire.tools.info import info_report
from rollwire.tools.rollouts import (
    PHASES,
    RolloutArgumentError,
    RolloutGraphView,
    RolloutRequest,
    RolloutStore,
    RolloutSummary,
    graph_view,
)
from rollwire.tools.rollouts import run_rollout as execute_rollout
from rollwire.tools.tasks import TaskPage, TaskRefError, list_task_page

log = logging.getLogger("rollwire.mcp")

INSTRUCTIONS = """\
rollwire runs LLM-agent rollouts and captures trainable data (engine token ids, logprobs,
reward). Typical flow: list_tasks -> validate_llm(llm_url) -> run_rollout(task, llm_url) ->
get_rollout_graph(rollout_id) or read rollout://{rollout_id}/document. Task references:
'family:name' for env tasks (e.g. 'reasoning_gym:chain_sum'), 'harbor:<dataset>#<task>' for
Harbor tasks (e.g. 'harbor:examples/tasks#count-errors')."""


@dataclass
class ServerState:
    """What outlives one call: certified endpoints and finished rollouts."""

    pool: EndpointPool = field(default_factory=EndpointPool)
    store: RolloutStore = field(default_factory=RolloutStore)

    async def aclose(self) -> None:
        """Close every upstream client."""
        await self.pool.aclose()


class HarnessStatus(BaseModel):
    """One agent harness."""

    name: str
    available: bool
    reason: str | None = None


class InfoReport(BaseModel):
    """What this machine can run."""

    sandboxes: list[dict[str, Any]]
    harnesses: list[HarnessStatus]
    datasets: list[dict[str, Any]]
    env_families: dict[str, dict[str, Any]]


def build_server(state: ServerState | None = None) -> MCPServer:
    """The MCP server over ``state`` (a fresh one by default)."""
    state = state or ServerState()
    mcp = MCPServer("rollwire", instructions=INSTRUCTIONS, log_level="WARNING")
    mcp.state = state  # type: ignore[attr-defined]

    @mcp.tool()
    async def list_tasks(
        source: str | None = None,
        offset: Annotated[int, Field(ge=0)] = 0,
        limit: Annotated[int, Field(ge=1, le=500)] = 50,
        query: str | None = None,
    ) -> TaskPage:
        """List runnable tasks, a page at a time.

        source: omit for every env task; an env family name (reasoning_gym, openspiel,
        textarena, browsergym) for that family only; or a Harbor dataset path on the server
        (a directory of task directories, one task directory, or a registry .json), e.g.
        "examples/tasks". query: keep tasks whose reference or description contains it
        (case-insensitive). Each task's `ref` is exactly what run_rollout's `task` accepts:
        env tasks are 'family:name' (e.g. 'reasoning_gym:chain_sum'); Harbor tasks are
        'harbor:<dataset>#<task name>' (e.g. 'harbor:examples/tasks#count-errors').
        Page with offset/limit; next_offset is null on the last page.
        """
        try:
            return await list_task_page(source, offset=offset, limit=limit, query=query)
        except TaskRefError as exc:
            raise ToolError(f"source: {exc}") from None

    @mcp.tool()
    async def validate_llm(
        llm_url: str, model: str | None = None, api_key: str | None = None
    ) -> Certification:
        """Certify an OpenAI-spec endpoint (e.g. vLLM at http://host:8000/v1).

        verdict TRAIN: the engine returns token ids and processed logprobs, rollouts are
        trainable; EVAL ONLY: text only, rollouts are for evaluation; NOT USABLE: see findings.
        model: which served model (needed when several are served). A usable result is
        cached for run_rollout on the same (llm_url, model, api_key).
        """
        return await state.pool.certify(llm_url, model=model, api_key=api_key)

    @mcp.tool()
    async def run_rollout(
        task: str,
        ctx: Context,
        llm_url: str | None = None,
        model: str | None = None,
        harness: str = "terminus-2",
        seed: int | None = None,
        task_config: dict[str, Any] | None = None,
        max_turns: Annotated[int | None, Field(ge=1)] = None,
        max_tokens: Annotated[int | None, Field(ge=1)] = None,
        temperature: Annotated[float | None, Field(ge=0)] = None,
        reward_key: str | None = None,
        include_tokens: bool = False,
        api_key: str | None = None,
    ) -> RolloutSummary:
        """Run one rollout to the end and return its reward and capture summary.

        task: a reference from list_tasks: 'family:name' (env task, run by rollwire's tool
        loop; needs llm_url) or 'harbor:<dataset>#<task name>' (Harbor task in the local
        sandbox with `harness`: terminus-2 needs llm_url; oracle and nop need no model).
        llm_url: the engine's OpenAI base URL; certified once per endpoint, every model call
        is captured through a proxy. seed, task_config (a JSON object): env tasks only.
        max_turns/max_tokens/temperature: env defaults 8/256/1.0; for Harbor, the agent's own.
        reward_key: which reward of a multi-reward verifier is the reward.
        include_tokens: also return each sequence's input_ids, loss_mask and logprobs.
        The call stays open until the rollout ends and reports progress per phase. A failed
        rollout is ok=false with `error`, not a tool error. Keep `rollout_id` for
        get_rollout_graph and the resource rollout://{rollout_id}/document.
        """
        request = RolloutRequest(
            task=task,
            llm_url=llm_url,
            model=model,
            api_key=api_key,
            harness=harness,
            seed=seed,
            task_config=task_config,
            max_turns=max_turns,
            max_tokens=max_tokens,
            temperature=temperature,
            reward_key=reward_key,
            include_tokens=include_tokens,
        )

        async def progress(done: float, message: str) -> None:
            await ctx.report_progress(done, PHASES, message)

        try:
            return await execute_rollout(
                request, pool=state.pool, store=state.store, progress=progress
            )
        except RolloutArgumentError as exc:
            raise ToolError(str(exc)) from None

    @mcp.tool()
    async def get_rollout_graph(
        rollout_id: str, format: Literal["json", "mermaid"] = "json"
    ) -> RolloutGraphView:
        """The call graph of a finished rollout: one node per model call with its parent
        (the call whose prompt + reply its prompt extends), role (agent, auxiliary,
        discarded), token counts and findings; which calls re-tokenised an earlier reply
        (a new root) or were discarded. format='mermaid' also fills `mermaid` with a
        flowchart. A rollout with no model call (oracle, nop) has no nodes.
        """
        stored = state.store.get(rollout_id)
        if stored is None:
            raise ToolError(f"rollout_id: no rollout {rollout_id!r} on this server")
        return graph_view(rollout_id, stored.document, format)

    @mcp.tool()
    async def info() -> InfoReport:
        """What this server's machine can run: sandboxes, agent harnesses, the bundled Harbor
        datasets, env families (with the reason when one is unavailable). Read-only."""
        report = await info_report()
        return InfoReport(**report)

    @mcp.resource(
        "rollout://{rollout_id}/document",
        name="rollout_document",
        description="The full rollout document (rollwire.rollout/1 JSON): turns with prompt "
        "and completion token ids, logprobs, sequences with loss masks, stats and findings.",
        mime_type="application/json",
    )
    async def rollout_document(rollout_id: str) -> str:
        stored = state.store.get(rollout_id)
        if stored is None:
            raise ResourceNotFoundError(f"no rollout {rollout_id!r} on this server")
        if stored.document is None:
            raise ResourceNotFoundError(
                f"rollout {rollout_id!r} captured no model call, so it has no document"
            )
        return orjson.dumps(stored.document.model_dump(mode="json")).decode()

    return mcp


# --- transports ---------------------------------------------------------------------------------


async def serve_stdio(state: ServerState | None = None) -> None:
    """Serve over stdin/stdout until the client closes it."""
    state = state or ServerState()
    try:
        await build_server(state).run_stdio_async()
    finally:
        await state.aclose()


def _bearer(app: Any, token: str) -> Any:
    """Reject HTTP requests without ``Authorization: Bearer <token>`` (401)."""
    expected = f"Bearer {token}".encode()

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, expected):
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"www-authenticate", b"Bearer"),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": b'{"error":"unauthorized"}'})
                return
        await app(scope, receive, send)

    return asgi


def http_app(
    server: MCPServer, *, host: str = "127.0.0.1", token: str | None = None, loopback: bool = True
) -> Any:
    """The streamable-HTTP ASGI app at ``/mcp``, behind bearer auth when ``token`` is set.

    Off loopback the SDK's Host-header allow-list (DNS-rebinding protection for local servers)
    does not apply: the bearer token is what guards the server there.
    """
    security = (
        None if loopback else TransportSecuritySettings(enable_dns_rebinding_protection=False)
    )
    app = server.streamable_http_app(transport_security=security, host=host)
    return _bearer(app, token) if token else app
