"""One Harbor trial, with any agent harness, through the capture proxy, as a :class:`RolloutResult`.

A fresh capture session is opened (its id is the agent's API key); a host-side agent (terminus-2)
reaches the proxy over real HTTP on loopback, served for this rollout or by the caller
(``proxy_url``); one Harbor trial runs in the ``local`` sandbox with the seam's ``AgentConfig``;
the verifier's rewards are forwarded verbatim and the scalar picked by an explicit rule; the
harness's own trajectory (``agent/trajectory.json``, ATIF) is reconciled with the captured calls,
and the calls it does not know are marked auxiliary before the capture is exported.

Every failure is a result (``ok=False``, ``error`` naming the exception type); cancellation still
propagates, after Harbor has torn the sandbox down.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from harbor.models.trial.config import (
    EnvironmentConfig,
    TaskConfig,
    TrialConfig,
    VerifierConfig,
)
from harbor.models.trial.result import TrialResult
from harbor.trial.trial import Trial

from rollwire.capture.export import RolloutDocument
from rollwire.capture.findings import Finding, Level, warn
from rollwire.capture.proxy import CaptureProxy
from rollwire.capture.session import CaptureSession
from rollwire.harnesses.harbor import installs
from rollwire.harnesses.harbor.atif import AtifReport, CapturedCall, reconcile
from rollwire.harnesses.harbor.datasets import TaskEntry
from rollwire.harnesses.harbor.gate import gate_host
from rollwire.harnesses.harbor.local import settled
from rollwire.harnesses.harbor.sandboxes import runnable_sandbox
from rollwire.harnesses.harbor.seams import Endpoint, Seam, environ_scope, get_seam
from rollwire.harnesses.harbor.trial import (
    NO_REWARD,
    TRIALS_DIR_ENV,
    TrialOutcome,
    _default_trials_dir,
    _outcome,
    _tail,
)
from rollwire.result import RolloutResult, summarise
from rollwire.serving import bind, serving, url_of

log = logging.getLogger(__name__)
TIMEOUT = "AgentTimeoutError"  # Harbor's exception type for an agent past its time limit
DEFAULT_MODEL = "rollwire"  # the name an agent asks for when none is given; the proxy substitutes
_MAX_TRAJECTORY_BYTES = 64 * 1024 * 1024


@dataclass
class HarborRollout:
    """The result, the capture document (when a model was involved), and the trial's record."""

    result: RolloutResult
    document: RolloutDocument | None
    trial: TrialOutcome | None = None
    trial_dir: Path | None = None
    agent_log_tail: str | None = None
    verifier_log_tail: str | None = None
    trajectory: dict[str, Any] | None = None


def _without_lifespan(app: Any) -> Callable[..., Awaitable[None]]:
    """The proxy app minus its lifespan: its upstream client belongs to whoever owns the proxy,
    so a server started for one rollout must neither open nor close it."""

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    return asgi


@contextlib.asynccontextmanager
async def serve_proxy(
    proxy: CaptureProxy,
    host: str = "127.0.0.1",
    *,
    port: int = 0,
    shutdown_grace_s: float = 1.0,
) -> AsyncIterator[str]:
    """Serve a running proxy over real HTTP on an ephemeral ``host`` port; yields its root URL.

    Serve once and pass the URL as ``proxy_url`` to reuse one server across many rollouts.
    """
    sock = bind(host, port)
    try:
        async with serving(_without_lifespan(proxy.app), sock, stop_on_exit=True) as server:
            # A call that an agent cut off (a timeout) may still wait on a slow engine: on exit
            # it gets this long, then it is cancelled, so stopping never waits on a generation.
            server.config.timeout_graceful_shutdown = shutdown_grace_s
            yield url_of(sock)
    finally:
        sock.close()


async def run_harbor_rollout(
    task: TaskEntry | str | Path,
    *,
    harness: str = "terminus-2",
    proxy: CaptureProxy | None = None,
    proxy_url: str | None = None,
    llm_model: str | None = None,
    reward_key: str | None = None,
    trials_dir: str | Path | None = None,
    agent_timeout_sec: float | None = None,
    verifier_timeout_sec: float | None = None,
    agent_kwargs: dict[str, Any] | None = None,
    environment_kwargs: dict[str, Any] | None = None,
    max_model_calls: int | None = None,
    rollout_id: str | None = None,
    include_sequences: bool = False,
    sandbox: str = "local",
    install_agent: bool = True,
    public_url: str | None = None,
) -> HarborRollout:
    """Run one trial of ``task`` (an entry or a task directory) with ``harness``; never raises.

    ``proxy`` must be running (built with ``upstream=`` or served by its owner); it is needed
    by every harness that calls a model. ``proxy_url`` is where the caller already serves it;
    otherwise a host-side harness gets a loopback server for this rollout. ``llm_model`` is the
    name the agent asks for (the proxy substitutes the served model). ``agent_kwargs`` override
    the seam's ``AgentConfig.kwargs`` (e.g. ``max_turns``, ``llm_call_kwargs``). ``sandbox``:
    ``local`` (bubblewrap) or ``docker`` (the task's image on a Docker daemon).
    ``install_agent``: an agent rollwire installs from its registry
    (:data:`rollwire.harnesses.harbor.installs.PACKAGES`) is installed on first use and mounted
    into the sandbox in place of Harbor's installer; False leaves the agent to Harbor's
    ``install()`` (and to whatever ``environment_kwargs["mounts"]`` provide).
    ``public_url``: for a cloud sandbox (``daytona``, ``modal``, ``e2b``, ``runloop``), the root
    URL at which that sandbox reaches ``proxy``, served there by the caller; an agent that runs
    inside the sandbox is pointed at it (terminus-2 runs here and needs none).
    """
    start = time.perf_counter()
    rollout_id = rollout_id or uuid.uuid4().hex
    label = task.id if isinstance(task, TaskEntry) else str(task)
    common: dict[str, Any] = {"rollout_id": rollout_id, "task": label, "sandbox": sandbox}

    def refused(error: str, harness_name: str = harness) -> HarborRollout:
        result = summarise(
            document=None,
            verdict=None,
            error=error,
            harness=harness_name,
            timings={"total": round(time.perf_counter() - start, 4)},
            **common,
        )
        return HarborRollout(result, None)

    try:
        seam = get_seam(harness)
        # The first check imports the agent (terminus-2 pulls in litellm: seconds): off the loop.
        problem = await anyio.to_thread.run_sync(seam.check)
    except Exception as exc:
        return refused(f"{type(exc).__name__}: {exc}")
    if problem is not None:
        return refused(f"harness {seam.name!r} is not available: {problem}", seam.name)
    if seam.needs_llm:
        if proxy is None:
            return refused(f"harness {seam.name!r} calls a model: pass a capture proxy", seam.name)
        try:
            proxy.upstream  # noqa: B018 - raises when the proxy is not running
        except RuntimeError as exc:
            return refused(
                f"RuntimeError: {exc}: build the CaptureProxy with upstream=... or serve it",
                seam.name,
            )
    try:
        runnable = runnable_sandbox(sandbox)
    except ValueError as exc:
        return refused(f"ValueError: {exc}", seam.name)
    import_path = runnable.import_path
    if runnable.remote:
        # A cloud sandbox is Harbor's class as it is: no gate, no mounts, the network its
        # service gives it. An agent inside it calls the proxy at the caller's public URL.
        sandbox_kwargs = dict(environment_kwargs or {})
        if seam.needs_llm and seam.sandbox_network and not public_url:
            return refused(
                f"ValueError: harness {seam.name!r} runs inside the {sandbox} sandbox and calls "
                "the model from there: pass public_url (--public-url), the capture proxy's URL "
                "as that sandbox reaches it",
                seam.name,
            )
    else:
        sandbox_kwargs = {
            "network": False,  # an agent in the sandbox reaches its session through a gate only
            "owner": rollout_id,
            **(environment_kwargs or {}),
        }
    problem = await anyio.to_thread.run_sync(runnable.problem, sandbox_kwargs)
    if problem is not None:
        return refused(f"SandboxUnavailableError: {problem}", seam.name)
    agent_import: str | None = None
    if (
        install_agent
        and seam.kind == "installed"
        and not runnable.remote
        and seam.name not in installs.PACKAGES
    ):
        return refused(
            f"ValueError: harness {seam.name!r} has no npm or PyPI install in rollwire's table "
            f"({', '.join(installs.PACKAGES)}), and Harbor's own installer needs the internet, "
            f"which the {sandbox} sandbox does not give an agent: run it in a cloud sandbox, or "
            "mount an install yourself (install_agent=False, environment_kwargs['mounts'])",
            seam.name,
        )
    # A cloud sandbox cannot mount this host's installs: Harbor's own installer runs there.
    if install_agent and not runnable.remote and seam.name in installs.PACKAGES:
        try:
            installed = await installs.ensure_installed(seam.name)
        except installs.AgentInstallError as exc:
            return refused(f"AgentInstallError: {exc}", seam.name)
        sandbox_kwargs["mounts"] = [*sandbox_kwargs.get("mounts", ()), *installed.mounts()]
        agent_import = installs.import_path(seam.name)

    capture: CaptureSession | None = None
    if seam.needs_llm:
        assert proxy is not None
        capture = proxy.sessions.open(
            metadata={"task": label, "harness": seam.name, "rollout_id": rollout_id},
            max_model_calls=max_model_calls,
        )
    trial_outcome: TrialOutcome | None = None
    late: list[Finding] = []
    try:
        async with contextlib.AsyncExitStack() as stack:
            endpoint: Endpoint | None = None
            if capture is not None and seam.sandbox_network and runnable.remote:
                assert public_url is not None
                url = public_url
            elif capture is not None and seam.sandbox_network:
                # The agent calls from inside the sandbox: its one way out is a gate serving its
                # own session's data plane in the sandbox's network namespace.
                assert proxy is not None
                gate = await stack.enter_async_context(
                    gate_host(rollout_id, proxy.session_app(capture.session_id))
                )
                sandbox_kwargs["gate"] = rollout_id
                url = gate.url
            elif capture is not None:
                assert proxy is not None
                url = proxy_url
                if url is None:
                    url = await stack.enter_async_context(serve_proxy(proxy))
            if capture is not None:
                assert proxy is not None
                endpoint = Endpoint(
                    url=url,
                    api_key=capture.session_id,
                    model=llm_model or proxy.config.model or DEFAULT_MODEL,
                )
            trial_outcome = await _run_trial(
                task,
                label,
                seam,
                endpoint,
                reward_key=reward_key,
                trials_dir=trials_dir,
                agent_kwargs=agent_kwargs,
                environment_kwargs=sandbox_kwargs,
                import_path=import_path,
                agent_import=agent_import,
                agent_timeout_sec=agent_timeout_sec,
                verifier_timeout_sec=verifier_timeout_sec,
            )
    except anyio.get_cancelled_exc_class():
        # Harbor stops a cancelled trial's sandbox in a task of its own: wait until it is gone,
        # so a cancelled rollout leaves no process and no root behind when it returns.
        with anyio.CancelScope(shield=True):
            if not await settled(rollout_id):
                log.warning("rollout %s: its sandbox was not torn down within 30 s", rollout_id)
        raise
    except Exception as exc:  # serving failed to start, or to stop after the trial
        if trial_outcome is None:
            return refused(f"{type(exc).__name__}: {exc}", seam.name)
        late.append(warn("proxy_server", f"stopping the loopback proxy server failed: {exc}"))
    finally:  # the agent is done (or cancelled): its key stops working at once
        if capture is not None and proxy is not None:
            proxy.sessions.close(capture.session_id)
    assert trial_outcome is not None
    with anyio.CancelScope(shield=True):
        try:
            return await _finish(
                seam,
                capture,
                proxy,
                trial_outcome,
                late,
                reward_key=reward_key,
                include_sequences=include_sequences,
                start=start,
                common=common,
            )
        except Exception as exc:  # a bug here must still come back as a result
            return refused(f"{type(exc).__name__}: {exc}", seam.name)


def trial_config(
    task_path: Path,
    seam: Seam,
    endpoint: Endpoint | None,
    *,
    trials_dir: Path,
    agent_kwargs: dict[str, Any] | None,
    environment_kwargs: dict[str, Any],
    import_path: str,
    agent_import: str | None = None,
    agent_timeout_sec: float | None = None,
    verifier_timeout_sec: float | None = None,
) -> TrialConfig:
    """Harbor's ``TrialConfig`` for one rollout: pure, so what a sandbox that cannot run here
    (a cloud one) would be given is checkable offline."""
    return TrialConfig(
        task=TaskConfig(path=task_path),
        trials_dir=trials_dir,
        agent=seam.agent_config(
            endpoint,
            kwargs=agent_kwargs,
            timeout_sec=agent_timeout_sec,
            import_path=agent_import,
        ),
        # Harbor hands the sandbox EnvironmentConfig.mounts (a "mounts" kwarg would be
        # overwritten by it), so mounts travel there.
        environment=EnvironmentConfig(
            import_path=import_path,
            kwargs={k: v for k, v in environment_kwargs.items() if k != "mounts"},
            mounts=environment_kwargs.get("mounts") or None,
        ),
        verifier=VerifierConfig(override_timeout_sec=verifier_timeout_sec),
    )


async def _run_trial(
    task: TaskEntry | str | Path,
    label: str,
    seam: Seam,
    endpoint: Endpoint | None,
    *,
    reward_key: str | None,
    trials_dir: str | Path | None,
    agent_kwargs: dict[str, Any] | None,
    environment_kwargs: dict[str, Any],
    import_path: str,
    agent_import: str | None = None,
    agent_timeout_sec: float | None,
    verifier_timeout_sec: float | None,
) -> TrialOutcome:
    """One Harbor trial with the seam's agent; a failure is an outcome, never an exception."""
    start = time.perf_counter()
    path = Path(task.path if isinstance(task, TaskEntry) else task)
    trial_dir: Path | None = None
    try:
        root = Path(trials_dir or os.environ.get(TRIALS_DIR_ENV) or _default_trials_dir())
        config = trial_config(
            path,
            seam,
            endpoint,
            trials_dir=root,
            agent_kwargs=agent_kwargs,
            environment_kwargs=environment_kwargs,
            import_path=import_path,
            agent_import=agent_import,
            agent_timeout_sec=agent_timeout_sec,
            verifier_timeout_sec=verifier_timeout_sec,
        )
        trial_dir = root / config.trial_name
        async with environ_scope(seam, endpoint):
            trial = await Trial.create(config)
            result: TrialResult = await trial.run()
        outcome = _outcome(
            result, label, seam.name, reward_key, trial_dir, time.perf_counter() - start
        )
        return _timeout_is_not_an_error(result, outcome)
    except Exception as exc:  # cancellation is not an Exception: it propagates
        exists = trial_dir is not None and trial_dir.exists()
        return TrialOutcome(
            task=label,
            agent=seam.name,
            reward_key=reward_key,
            error=f"{type(exc).__name__}: {exc}",
            exception_type=type(exc).__name__,
            timings={"total": round(time.perf_counter() - start, 4)},
            trial_dir=trial_dir if exists else None,
            trial_name=trial_dir.name if trial_dir is not None else None,
        )


def _timeout_is_not_an_error(result: TrialResult, outcome: TrialOutcome) -> TrialOutcome:
    """An agent cut off by the task's time limit, then verified, is a rollout like any other:
    its reward is the task's verdict on what it did in the time allowed. The timeout stays
    visible (``exception_type``, the stop reason and a finding), not an error."""
    info = result.exception_info
    if (
        info is None
        or info.exception_type != TIMEOUT
        or outcome.reward is None
        or outcome.error != f"{info.exception_type}: {info.exception_message}"
    ):
        return outcome
    return outcome.model_copy(update={"error": None})


async def _finish(
    seam: Seam,
    capture: CaptureSession | None,
    proxy: CaptureProxy | None,
    outcome: TrialOutcome,
    findings: list[Finding],
    *,
    reward_key: str | None,
    include_sequences: bool,
    start: float,
    common: dict[str, Any],
) -> HarborRollout:
    """Reconcile the trajectory with the capture, mark auxiliary calls, export, summarise."""
    errors = [outcome.error] if outcome.error else []
    trajectory: dict[str, Any] | None = None
    report = AtifReport(atif="none")
    document: RolloutDocument | None = None
    if outcome.trial_dir is not None:
        trajectory, problem = await anyio.to_thread.run_sync(_read_trajectory, outcome.trial_dir)
        if problem is not None:
            findings.append(warn("atif_unreadable", problem))
    n_tool_calls = _count_tool_calls(trajectory)
    if outcome.exception_type == TIMEOUT and outcome.error is None:
        findings.append(
            warn("agent_timeout", "the agent was stopped at its time limit, then verified")
        )
    if capture is not None and proxy is not None:
        captured = [
            CapturedCall(
                node_id=turn.node_id,
                completion_tokens=None if turn.sampled_ids is None else len(turn.sampled_ids),
                completion_ids=None if turn.sampled_ids is None else turn.sampled_ids.tolist(),
            )
            for turn in capture.graph  # arrival order
        ]
        report = reconcile(trajectory, captured, capture.capture_level)
        for node_id in report.auxiliary:  # before the export, so they are never trained
            capture.graph.mark_auxiliary(node_id)
        findings.extend(report.findings)
        if outcome.trial_dir is not None:
            capture.metadata["trial_dir"] = str(outcome.trial_dir)
        document = await anyio.to_thread.run_sync(capture.document)
        if not captured:
            errors.insert(0, _no_calls_error(capture))
    if outcome.reward is None and not errors:
        errors.append(f"{NO_REWARD}: the verifier gave no reward")
    timings = dict(outcome.timings)
    timings["total"] = round(time.perf_counter() - start, 4)
    result = summarise(
        document=document,
        verdict=None,
        error="; ".join(errors) or None,
        extra_findings=findings,
        include_sequences=include_sequences,
        harness=seam.name,
        reward=outcome.reward,
        rewards=outcome.rewards,
        param_fixes=list(proxy.config.param_fixes) if proxy is not None else [],
        n_tool_calls=n_tool_calls,
        stop_reason={None: "agent_finished", TIMEOUT: "agent_timeout"}.get(
            outcome.exception_type, outcome.exception_type
        ),
        atif=report.atif,
        timings=timings,
        **common,
    )
    result.reward_key = reward_key
    if document is None:  # a harness with no model: usable when the trial ran clean
        result.ok = result.error is None and not any(f.level is Level.FATAL for f in findings)
    agent_log = outcome.agent_log_tail
    if agent_log is None and outcome.trial_dir is not None:
        agent_log = await anyio.to_thread.run_sync(_pane_tail, outcome.trial_dir / "agent")
    result.exception_type = outcome.exception_type
    result.trial_dir = str(outcome.trial_dir) if outcome.trial_dir is not None else None
    result.agent_log_tail = agent_log
    return HarborRollout(
        result=result,
        document=document,
        trial=outcome,
        trial_dir=outcome.trial_dir,
        agent_log_tail=agent_log,
        verifier_log_tail=outcome.verifier_log_tail,
        trajectory=trajectory,
    )


def _no_calls_error(capture: CaptureSession) -> str:
    if capture.n_calls == 0:
        return (
            "no model call was captured: the agent never reached the proxy with this rollout's "
            "session key"
        )
    failures = "; ".join(f.message for f in capture.findings[-3:]) or "no detail recorded"
    return (
        f"no model call was captured: the agent made {capture.n_calls} call(s) through the proxy "
        f"and none got a usable reply ({failures})"
    )


def _read_trajectory(trial_dir: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The harness's ATIF trajectory: ``agent/trajectory.json``, or each step's in step order
    (a multi-step trial), merged into one; (None, None) when the harness wrote none."""
    paths = [trial_dir / "agent" / "trajectory.json"]
    steps_dir = trial_dir / "steps"
    if not paths[0].is_file() and steps_dir.is_dir():
        result_file = trial_dir / "result.json"
        order: list[str] = []
        try:
            data = json.loads(result_file.read_text())
            order = [s["step_name"] for s in data.get("step_results") or []]
        except (OSError, ValueError, KeyError, TypeError):
            order = sorted(p.name for p in steps_dir.iterdir())
        paths = [steps_dir / name / "agent" / "trajectory.json" for name in order]
    merged: dict[str, Any] | None = None
    for path in paths:
        if not path.is_file():
            continue
        if path.is_symlink():  # written inside the sandbox: never follow it to a host file
            return None, f"{path} is a symbolic link: not read"
        if path.stat().st_size > _MAX_TRAJECTORY_BYTES:
            return None, f"{path} is larger than {_MAX_TRAJECTORY_BYTES} bytes: not read"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            return None, f"{path} is not readable JSON: {exc}"
        if not isinstance(data, dict):
            return None, f"{path} is not an ATIF trajectory object"
        if merged is None:
            merged = {**data, "steps": list(data.get("steps") or [])}
        else:
            merged["steps"].extend(data.get("steps") or [])
            subs = data.get("subagent_trajectories")
            if subs:
                merged["subagent_trajectories"] = [
                    *(merged.get("subagent_trajectories") or []),
                    *subs,
                ]
    return merged, None


def _count_tool_calls(trajectory: dict[str, Any] | None) -> int:
    if trajectory is None:
        return 0
    return sum(
        len(step.get("tool_calls") or [])
        for step in trajectory.get("steps") or []
        if isinstance(step, dict) and step.get("source") == "agent"
    )


def _pane_tail(agent_dir: Path) -> str | None:
    """The terminal a tmux-driven harness saw (terminus-2 logs ``*.pane``)."""
    if not agent_dir.is_dir():
        return None
    panes = [p for p in agent_dir.glob("*.pane") if p.is_file() and not p.is_symlink()]
    if not panes:
        return None
    return _tail(max(panes, key=lambda p: p.stat().st_mtime))


__all__ = ["HarborRollout", "run_harbor_rollout", "serve_proxy"]
