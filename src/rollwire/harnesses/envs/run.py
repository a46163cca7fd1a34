"""One env episode through the capture proxy, start to finish, as a :class:`RolloutResult`.

The proxy runs in-process (its session id is the loop's API key, no port per rollout); the tool
loop drives the model through it; the environment's verdict is forwarded; the capture becomes
the rollout document. Every failure is a result: nothing raises out of here.
"""

from __future__ import annotations

import asyncio
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import httpx

from rollwire.bounds import ENV_BUILD_TIMEOUT_S
from rollwire.capture.export import RolloutDocument
from rollwire.capture.findings import Finding, fatal, warn
from rollwire.capture.proxy import CaptureProxy
from rollwire.capture.upstream import Upstream
from rollwire.harnesses.envs.registry import TaskError, check_answer_mode, resolve
from rollwire.result import RolloutResult, summarise
from rollwire.sessions.base import DEFAULT_ANSWER_MODE, AnswerMode, EnvVerdict, ReservedToolName
from rollwire.sessions.toolloop import LoopLimits, LoopOutcome, run_tool_loop

HARNESS = "rollwire-toolloop"


@dataclass
class EnvRollout:
    """The result, and the full document when the capture got that far."""

    result: RolloutResult
    document: RolloutDocument | None


async def _play(
    session: Any, proxy: CaptureProxy, session_id: str, limits: LoopLimits
) -> tuple[LoopOutcome | None, EnvVerdict | None, str | None, list[Finding]]:
    """The tool loop and the verdict; the environment is closed however it ends."""
    chat = proxy_client(proxy, session_id)
    outcome: LoopOutcome | None = None
    verdict: EnvVerdict | None = None
    error: str | None = None
    findings: list[Finding] = []
    try:
        outcome = await run_tool_loop(session, chat, limits)
        verdict = await session.verify()
    except Exception as exc:  # an adapter or env bug: a failed result, never a crash upstream
        error = f"{type(exc).__name__}: {exc}"
        findings.append(fatal("rollout_failed", error))
    finally:
        with anyio.CancelScope(shield=True):
            try:
                await session.close()
            except Exception as exc:
                findings.append(warn("close_failed", f"closing the environment failed: {exc}"))
            await chat.aclose()
    return outcome, verdict, error, findings


def proxy_client(proxy: CaptureProxy, session_id: str) -> Upstream:
    """An OpenAI-spec client to an in-process proxy, keyed by a capture session."""
    transport = httpx.ASGITransport(app=proxy.app)
    return Upstream("http://rollwire-proxy/v1", api_key=session_id, transport=transport)


#: env builds running at once, per event loop: they get threads of their own, so a collection
#: at full concurrency never takes every worker thread from other clients' calls
BUILD_THREADS = 4
_limiters: weakref.WeakKeyDictionary[Any, anyio.CapacityLimiter] = weakref.WeakKeyDictionary()


def _build_limiter() -> anyio.CapacityLimiter:
    loop = asyncio.get_running_loop()
    limiter = _limiters.get(loop)
    if limiter is None:
        limiter = _limiters[loop] = anyio.CapacityLimiter(BUILD_THREADS)
    return limiter


async def _build(make: Callable[[], Any], task: str) -> Any:
    """Build an episode off the event loop, within ``ENV_BUILD_TIMEOUT_S``.

    A generator's cost follows its config (a client's ``task_config``), so it never runs on
    the loop; a build that takes too long, or is cancelled, is abandoned (its thread finishes
    on its own; the episode fails naming the config)."""
    try:
        with anyio.fail_after(ENV_BUILD_TIMEOUT_S):
            return await anyio.to_thread.run_sync(
                make, abandon_on_cancel=True, limiter=_build_limiter()
            )
    except TimeoutError:
        raise TaskError(
            f"task_config: building an episode of {task!r} took more than "
            f"{ENV_BUILD_TIMEOUT_S:g} s; choose a smaller config"
        ) from None


async def run_env_rollout(
    task: str,
    *,
    proxy: CaptureProxy,
    config: dict[str, Any] | None = None,
    seed: int | None = None,
    limits: LoopLimits | None = None,
    reward_key: str | None = None,
    episode_id: str | None = None,
    include_sequences: bool = False,
    answer_mode: AnswerMode = "tool",
) -> EnvRollout:
    """Run one episode of ``task`` (``family:name``); never raises for task or model trouble.
    ``answer_mode``: how the answer reaches the environment (see ``sessions.base.AnswerMode``)."""
    start = time.perf_counter()
    rollout_id = episode_id or uuid.uuid4().hex
    limits = limits or LoopLimits(seed=seed)
    if limits.seed is None and seed is not None:
        limits = limits.model_copy(update={"seed": seed})
    common = {
        "rollout_id": rollout_id,
        "task": task,
        "harness": HARNESS,
        "seed": seed,
        "answer_mode": answer_mode,
    }
    try:
        adapter, name = resolve(task)
        check_answer_mode(adapter, answer_mode)
        # An adapter that takes answers only by tool may predate answer modes: not passed then.
        modal = {} if answer_mode == DEFAULT_ANSWER_MODE else {"answer_mode": answer_mode}
        session = await _build(
            lambda: adapter.make_session(
                name, dict(config or {}), seed=seed, episode_id=rollout_id, **modal
            ),
            task,
        )
        offered = [t.openai() for t in session.list_tools()]
    except (TaskError, ReservedToolName) as exc:
        result = summarise(document=None, verdict=None, error=str(exc), **common)
        return EnvRollout(result, None)
    except Exception as exc:  # an adapter bug: still a result, never an exception upstream
        error = f"could not start {task!r}: {type(exc).__name__}: {exc}"
        return EnvRollout(summarise(document=None, verdict=None, error=error, **common), None)

    capture = proxy.sessions.open(metadata={"task": task, "seed": seed, "episode_id": rollout_id})
    try:  # the session closes however the episode ends, cancellation included
        outcome, verdict, error, findings = await _play(session, proxy, capture.session_id, limits)
        loop_s = time.perf_counter() - start
        document = await anyio.to_thread.run_sync(capture.document)
    finally:
        proxy.sessions.close(capture.session_id)
    if outcome is not None:
        for message in outcome.errors:
            findings.append(warn("model_error", message))
        if outcome.model_calls == 0 and error is None:
            error = "the model was never reached: " + (
                "; ".join(outcome.errors) or outcome.stop_reason
            )
    if verdict is not None and verdict.reward is None and verdict.reason:
        findings.append(warn("no_verdict", verdict.reason))
    conversation: dict[str, Any] = {}
    if include_sequences and outcome is not None:
        conversation = {
            "messages": outcome.messages,
            "tools": offered if offered and limits.tool_format == "native" else None,
        }
    result = summarise(
        document=document,
        verdict=verdict,
        reward_key=reward_key,
        error=error,
        extra_findings=findings,
        include_sequences=include_sequences,
        param_fixes=list(proxy.config.param_fixes),
        n_tool_calls=outcome.tool_calls if outcome else 0,
        stop_reason=outcome.stop_reason if outcome else None,
        timings={"loop_s": round(loop_s, 4), "total_s": round(time.perf_counter() - start, 4)},
        **conversation,
        **common,
    )
    return EnvRollout(result, document)
