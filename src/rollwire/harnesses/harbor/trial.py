"""One Harbor trial in a rollwire sandbox, run programmatically, as a small typed result.

``run_trial`` builds Harbor's ``TrialConfig`` (the task directory, the ``oracle`` or ``nop``
agent, the sandbox by import path: the local one unless ``import_path`` names another), runs
``Trial.create(config)`` then ``trial.run()``, and turns Harbor's ``TrialResult`` into a
:class:`TrialOutcome`. It never raises for a task, sandbox or verifier problem: those are results
(cancellation still propagates, after Harbor has torn the sandbox down). ``reward`` is None when
the verifier never ran, which is not 0.0.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from harbor.models.trial.config import (
    AgentConfig,
    EnvironmentConfig,
    TaskConfig,
    TrialConfig,
    VerifierConfig,
)
from harbor.models.trial.result import TimingInfo, TrialResult
from harbor.trial.trial import Trial
from harbor.utils.import_path import import_symbol
from pydantic import BaseModel, ConfigDict, Field

from rollwire.harnesses.harbor.datasets import TaskEntry
from rollwire.harnesses.harbor.local import TYPE, probed, sandbox_problem
from rollwire.result import coerce_reward, pick_reward
from rollwire.sessions.base import EnvVerdict

LOCAL_IMPORT_PATH = "rollwire.harnesses.harbor.local:LocalEnvironment"
AGENTS = ("oracle", "nop")  # agents that need no model; the LLM harnesses come separately
TRIALS_DIR_ENV = "ROLLWIRE_TRIALS_DIR"
_TAIL_CHARS = 4000
_PHASES = ("environment_setup", "agent_setup", "agent_execution", "verifier")
NO_REWARD = "NoRewardError"  # a trial with no reward and no exception from Harbor to say why


class TrialOutcome(BaseModel):
    """What one Harbor trial came to. ``ok``: no error and a reward (0.0 counts as a reward)."""

    model_config = ConfigDict(frozen=True)

    task: str
    agent: str
    sandbox: str = TYPE
    reward: float | None = None
    rewards: dict[str, float] = Field(default_factory=dict)  # every valid reward, verbatim
    reward_key: str | None = None
    error: str | None = None
    exception_type: str | None = None
    timings: dict[str, float] = Field(default_factory=dict)  # seconds per phase (and step), total
    trial_dir: Path | None = None
    trial_name: str | None = None
    agent_log_tail: str | None = None
    verifier_log_tail: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.reward is not None


async def run_trial(
    task: TaskEntry | str | Path,
    *,
    agent: str = "oracle",
    reward_key: str | None = None,
    trials_dir: str | Path | None = None,
    trial_name: str | None = None,
    network: bool = False,
    environment_kwargs: dict[str, Any] | None = None,
    agent_timeout_sec: float | None = None,
    verifier_timeout_sec: float | None = None,
    import_path: str = LOCAL_IMPORT_PATH,
) -> TrialOutcome:
    """Run one trial of ``task`` (an entry or a task directory) with ``oracle`` or ``nop``.

    ``import_path`` is the sandbox's ``module:Class`` (default: the local sandbox; e.g.
    ``rollwire.harnesses.harbor.docker:DockerEnvironment``); its preflight runs first with the
    ``environment_kwargs`` it takes, and a failing one is the outcome's error.

    ``trials_dir`` (default ``$ROLLWIRE_TRIALS_DIR`` or ``<tmp>/rollwire-trials``) keeps Harbor's
    trial directory: ``result.json``, ``agent/``, ``verifier/`` (reward.txt / reward.json).
    A multi-key reward needs ``reward_key``; without it the outcome is an error naming the keys.
    """
    start = time.perf_counter()
    label = task.id if isinstance(task, TaskEntry) else str(task)
    path = Path(task.path if isinstance(task, TaskEntry) else task)
    sandbox = TYPE  # the sandbox's type name, once its preflight has named it

    def failed(error: str, exception_type: str | None, **fields: Any) -> TrialOutcome:
        return TrialOutcome(
            task=label,
            agent=agent,
            sandbox=sandbox,
            reward_key=reward_key,
            error=error,
            exception_type=exception_type,
            timings={"total": round(time.perf_counter() - start, 4)},
            **fields,
        )

    if agent not in AGENTS:
        return failed(f"agent {agent!r} is not one run_trial can drive; use one of {AGENTS}", None)
    kwargs = {"network": network, **(environment_kwargs or {})}
    trial_dir: Path | None = None
    try:
        if import_path == LOCAL_IMPORT_PATH and probed(kwargs.get("bwrap")):
            problem, sandbox = None, TYPE  # its probe passed already: no look-ups, no thread
        else:
            problem, sandbox = await asyncio.to_thread(_preflight, import_path, kwargs)
        if problem is not None:
            return failed(problem, "SandboxUnavailableError")
        root = Path(trials_dir or os.environ.get(TRIALS_DIR_ENV) or _default_trials_dir())
        config = TrialConfig(
            task=TaskConfig(path=path),
            trials_dir=root,
            trial_name=trial_name or "",
            agent=AgentConfig(name=agent, override_timeout_sec=agent_timeout_sec),
            environment=EnvironmentConfig(import_path=import_path, kwargs=kwargs),
            verifier=VerifierConfig(override_timeout_sec=verifier_timeout_sec),
        )
        trial_dir = root / config.trial_name
        trial = await Trial.create(config)
        result = await trial.run()
        outcome = _outcome(result, label, agent, reward_key, trial_dir, time.perf_counter() - start)
        return outcome.model_copy(update={"sandbox": sandbox})
    except Exception as exc:  # cancellation is not an Exception: it propagates
        return failed(
            f"{type(exc).__name__}: {exc}",
            type(exc).__name__,
            trial_dir=trial_dir if trial_dir is not None and trial_dir.exists() else None,
            trial_name=trial_dir.name if trial_dir is not None else None,
        )


def _preflight(import_path: str, kwargs: dict[str, Any]) -> tuple[str | None, str]:
    """(why the sandbox cannot run here or None, its type name), by its preflight."""
    if import_path == LOCAL_IMPORT_PATH:
        return sandbox_problem(kwargs.get("bwrap")), TYPE
    cls = import_symbol(import_path)
    name = str(getattr(cls.type(), "value", cls.type()))
    accepted = inspect.signature(cls.preflight).parameters
    try:
        cls.preflight(**{k: v for k, v in kwargs.items() if k in accepted})
    except SystemExit as exc:
        return str(exc.code), name
    return None, name


def rewards_to_reward(
    rewards: Any, reward_key: str | None
) -> tuple[float | None, dict[str, float], str | None]:
    """Harbor's rewards as (reward, every valid reward, what was wrong); never an average.

    None (no verdict) gives no reward and no error; a value that is not a finite number (None,
    a string, a nested dict, inf, nan) is an error naming its key; several keys need ``reward_key``.
    """
    if rewards is None:
        return None, {}, None
    if not isinstance(rewards, dict):
        return None, {}, f"verifier rewards {rewards!r} are not a mapping of name to number"
    valid: dict[str, float] = {}
    problems: list[str] = []
    for key, value in rewards.items():
        number, problem = coerce_reward(value)
        if problem is not None or number is None:
            problems.append(f"{key}: {problem or 'no value'}")
        else:
            valid[str(key)] = number
    if problems:
        return None, valid, f"verifier rewards are not all numbers ({'; '.join(problems)})"
    reward, problem = pick_reward(EnvVerdict(reward=None, rewards=valid), reward_key)
    return reward, valid, problem


def _outcome(
    result: TrialResult,
    label: str,
    agent: str,
    reward_key: str | None,
    trial_dir: Path,
    wall: float,
) -> TrialOutcome:
    rewards = result.verifier_result.rewards if result.verifier_result is not None else None
    reward, valid, problem = rewards_to_reward(rewards, reward_key)
    info = result.exception_info
    errors = [f"{info.exception_type}: {info.exception_message}"] if info is not None else []
    timings = {
        name: seconds
        for name in _PHASES
        if (seconds := _seconds(getattr(result, name))) is not None
    }
    for step in result.step_results or []:  # a multi-step task: each step's phases and errors
        if step.exception_info is not None:
            step_info = step.exception_info
            errors.append(
                f"step {step.step_name}: {step_info.exception_type}: {step_info.exception_message}"
            )
            info = info or step_info
        for name in ("agent_execution", "verifier"):
            if (seconds := _seconds(getattr(step, name))) is not None:
                timings[f"step.{step.step_name}.{name}"] = seconds
    if problem is not None:
        errors.append(problem)
    exception_type = info.exception_type if info is not None else None
    if reward is None and not errors:  # never a silent None: say which file was not there
        errors.append(_no_reward_error(trial_dir, result))
        exception_type = NO_REWARD
    if result.started_at is not None and result.finished_at is not None:
        timings["trial"] = _span(result.started_at, result.finished_at)
    timings["total"] = round(wall, 4)
    return TrialOutcome(
        task=label,
        agent=agent,
        reward=reward,
        rewards=valid,
        reward_key=reward_key,
        error="; ".join(errors) or None,
        exception_type=exception_type,
        timings=timings,
        trial_dir=trial_dir,
        trial_name=result.trial_name,
        agent_log_tail=_agent_log_tail(trial_dir / "agent"),
        verifier_log_tail=_tail(trial_dir / "verifier" / "test-stdout.txt"),
    )


def _no_reward_error(trial_dir: Path, result: TrialResult) -> str:
    """Why a trial that recorded no exception still has no reward, naming the files looked for."""
    verifier = trial_dir / "verifier"
    if result.verifier_result is None:
        why = "the verifier gave no result"
    else:
        why = "the verifier's result holds no rewards"
    present: list[str] | None = None
    with contextlib.suppress(OSError):
        present = sorted(p.name for p in verifier.iterdir())
    seen = "absent" if present is None else f"holding {present or 'nothing'}"
    return (
        f"{NO_REWARD}: {why} and Harbor recorded no exception; the reward file "
        f"({verifier / 'reward.txt'} or reward.json) was not read (the verifier directory is "
        f"{seen})"
    )


def _seconds(timing: TimingInfo | None) -> float | None:
    if timing is None or timing.started_at is None or timing.finished_at is None:
        return None
    return _span(timing.started_at, timing.finished_at)


def _span(start: datetime, end: datetime) -> float:
    return round((end - start).total_seconds(), 4)


def _agent_log_tail(agent_dir: Path) -> str | None:
    """The tail of the agent's own log: oracle.txt, else its newest text log."""
    oracle = agent_dir / "oracle.txt"
    if oracle.is_file() and not oracle.is_symlink():
        return _tail(oracle)
    logs = [
        p
        for p in agent_dir.rglob("*")
        if p.is_file() and not p.is_symlink() and p.suffix in (".txt", ".log")
    ]
    if not logs:
        return None
    return _tail(max(logs, key=lambda p: p.stat().st_mtime))


def _tail(path: Path) -> str | None:
    if path.is_symlink():  # a link the sandbox made must not read host files into the result
        return None
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - _TAIL_CHARS))
            return f.read().decode(errors="replace")
    except OSError:
        return None


def _default_trials_dir() -> Path:
    return Path(tempfile.gettempdir()) / "rollwire-trials"
