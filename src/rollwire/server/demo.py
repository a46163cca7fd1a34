"""``rollwire demo``: the main job on the embedded engine, with no GPU and no account.

Starts the reference engine on a loopback port, then drives rollwire's own MCP server through
the real MCP client (in memory): ``validate_llm`` certifies the engine, ``run_rollout`` plays a
reasoning-gym episode through the capture proxy, the rollout document is read from its resource
and written to disk; finally every trainable token is re-scored by the engine (parity).
Everything it prints comes from tool outputs and the engine's own numbers.

With ``http=True`` (``rollwire demo --http``) the MCP server runs as ``serve --http`` does (uvicorn
on a loopback port, the web UI at ``/ui``), the real MCP client drives it over streamable HTTP,
the demo prints the UI's URL of the rollout it ran, and keeps serving until interrupted.

The embedded 135M model answers in prose and does not call tools, so the demo's episode takes
its answer from the reply text (``answer_mode`` ``text``: reasoning-gym's own ``<answer>``
extraction) and the reward printed is the verifier's, 0.0 or 1.0, never None.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

import anyio
import orjson

from rollwire.capture.certify import Certification, render_table
from rollwire.capture.export import RolloutDocument
from rollwire.capture.parity import ParityReport, render_report, score_document
from rollwire.capture.upstream import Upstream
from rollwire.serving import bind, serving, url_of
from rollwire.writes import WriteFailed, write_atomic

DEMO_TASK = "reasoning_gym:chain_sum"


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def run_demo(
    out: Path,
    *,
    task: str = DEMO_TASK,
    turns: int = 3,
    max_tokens: int = 64,
    temperature: float = 1.0,
    seed: int = 0,
    answer_mode: str = "text",
    http: bool = False,
    port: int = 0,
    outcome: list[int] | None = None,
) -> int:
    """Run the demo; 0 when the rollout is usable, trainable and parity passes, else 1.
    With ``http`` the MCP server and its web UI stay up on ``port`` (0: any free port) after
    the run, until the process is interrupted (the verdict is appended to ``outcome`` first)."""
    from rollwire.engine.model import DEFAULT_SERVED_NAME
    from rollwire.engine.process import EngineSpec, exit_for_death, running_engine
    from rollwire.server.mcp_app import ServerState, build_server, http_app

    try:
        async with running_engine(EngineSpec(n_ctx=4096)) as engine:
            url = f"{engine.url}/v1"
            _say(
                f"1/4 reference engine {DEFAULT_SERVED_NAME} (CPU, {engine.backend}, pid "
                f"{engine.pid}) on {url}"
            )
            drive = functools.partial(
                _drive, url=url, out=out, task=task, turns=turns, max_tokens=max_tokens,
                temperature=temperature, seed=seed, answer_mode=answer_mode,
            )  # fmt: skip
            if not http:
                from mcp import Client

                async with ServerState() as state, Client(build_server(state)) as mcp:
                    return await engine.guarded(functools.partial(drive, mcp))
            return await _serve_http(
                engine, drive, port, outcome, ServerState, build_server, http_app
            )
    except BaseException as exc:
        return exit_for_death(exc, _say)


async def _serve_http(
    engine: Any,
    drive: Any,
    port: int,
    outcome: list[int] | None,
    state_cls: Any,
    build_server: Any,
    http_app: Any,
) -> int:
    """``--http``: the MCP server (and its web UI) on a loopback port, driven over HTTP, kept up
    until interrupted; the engine's death is a line and a verdict of 1, not the server's end."""
    from rollwire.engine.process import exit_for_death

    server_sock = bind("127.0.0.1", port)
    root = url_of(server_sock)
    state = state_cls(engine=engine)
    # The block ends when the MCP server stops (stop_on_exit=False; uvicorn takes SIGINT and
    # SIGTERM), not on the SIGINT uvicorn raises again afterwards: in a process started with
    # SIGINT ignored (a `cmd &` job of a non-interactive shell) that one is lost.
    async with serving(http_app(build_server(state)), server_sock, stop_on_exit=False):
        from mcp import Client

        _say(f"   MCP server on {root}/mcp, web UI on {root}/ui")
        try:
            async with Client(f"{root}/mcp") as mcp:
                code = await engine.guarded(functools.partial(drive, mcp, ui_root=f"{root}/ui"))
        except BaseException as exc:
            code = exit_for_death(exc, _say)
        if outcome is not None:
            outcome.append(code)
        _say("serving the web UI until interrupted (Ctrl-C) ...")
    if engine.death is not None and outcome is not None:
        outcome[:] = [1]
    return code


async def _drive(
    mcp: Any,
    *,
    url: str,
    out: Path,
    task: str,
    turns: int,
    max_tokens: int,
    temperature: float,
    seed: int,
    answer_mode: str,
    ui_root: str | None = None,
) -> int:
    """validate_llm, run_rollout, the document, parity: the demo's four steps (1 is the engine)."""
    _say("2/4 MCP validate_llm: certifying the engine ...")
    cert_out = await mcp.call_tool("validate_llm", {"llm_url": url})
    cert = Certification.model_validate(cert_out.structured_content)
    print(render_table(cert), flush=True)
    _say(f"3/4 MCP run_rollout: one {task} episode through the capture proxy ...")
    args = {
        "task": task,
        "llm": url,
        "seed": seed,
        "limits": {"max_turns": turns},
        "sampling": {"temperature": temperature, "max_tokens": max_tokens},
        "answer_mode": answer_mode,
    }
    if ui_root is not None:
        args["sampling"]["top_logprobs"] = 5  # the UI's hover shows the candidates
    result = await mcp.call_tool("run_rollout", args)
    if result.is_error:
        _say(f"run_rollout failed: {result.content[0].text}")
        return 1
    rollout = result.structured_content
    document = None
    if rollout["has_document"]:
        read = await mcp.read_resource(f"rollout://{rollout['rollout_id']}/document")
        data = orjson.loads(read.contents[0].text)
        try:  # whole or not at all; a full or read-only disk is named, not a traceback
            await anyio.to_thread.run_sync(
                write_atomic, Path(out), orjson.dumps(data, option=orjson.OPT_INDENT_2)
            )
        except WriteFailed as exc:
            _say(f"rollwire demo: {exc}")
            return 1
        document = RolloutDocument.model_validate(data)
    counts = rollout["counts"]
    if rollout["reward"] is None and rollout["stop_reason"] == "no_tool_call":
        _say(
            "   reward None: the verifier never ran, because the model answered in text "
            "instead of calling the task's tool (SmolLM2-135M rarely calls tools); "
            "--answer-mode text reads the answer from its reply instead"
        )
    elif rollout["reward"] is not None:
        _say(
            f"   reward {rollout['reward']}: the verifier's score of the model's answer "
            f"(answer mode {rollout['answer_mode']})"
        )
    print(
        f"\nrollout {rollout['rollout_id']} of {task}: reward {rollout['reward']}, "
        f"tier {rollout['tier']}, ok {rollout['ok']}, {counts['turns']} turn(s), "
        f"{counts['trainable_tokens']} trainable tokens, stop {rollout['stop_reason']}, "
        f"answer mode {rollout['answer_mode']}"
        + (f"\nrollout document -> {out}" if document is not None else "")
        + (f"\nerror: {rollout['error']}" if rollout["error"] else "")
        + (f"\nweb UI: {ui_root}/rollouts/{rollout['rollout_id']}" if ui_root else "")
        + "\n",
        flush=True,
    )
    if document is None or cert.model is None:
        return 1
    _say("4/4 re-scoring every trainable token with the engine (parity) ...")
    upstream = Upstream(url)
    try:
        report = ParityReport(llm_url=url, model=cert.model, temperature=temperature)
        report.tolerance = 1e-3
        report = await score_document(report, upstream, cert.model, document)
    finally:
        await upstream.aclose()
    print(render_report(report), flush=True)
    trainable = rollout["ok"] and counts["trainable_tokens"] > 0
    print(_next_steps(out, http=ui_root is not None), flush=True)
    return 0 if trainable and report.verdict == "PASS" else 1


def _next_steps(out: Path, *, http: bool) -> str:
    """Where a newcomer looks next, after the demo's own lines."""
    lines = [
        "",
        "next:",
        f"  {out}: the rollout document a trainer reads (docs/reference/rollout-document.md)",
        "  rollwire serve --stdio: the same tools for Claude Desktop (docs/guides/claude-desktop.md)",
        "  rollwire collect: many rollouts as a dataset (docs/guides/curation.md)",
    ]
    if not http:
        lines.insert(3, "  rollwire demo --http: the same run, then its page in the web UI")
    return "\n".join(lines)
