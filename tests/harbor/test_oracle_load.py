"""Oracle trials under load score 1.0 every time, and a reward that cannot be read says why.

200 oracle trials of count-errors in the local sandbox at concurrency 8, one core kept busy,
must all score 1.0. A trial with no reward must name what was missing (never a silent None).
And the docker sandbox's exec must not end before its command has: dockerd answers the start
request (the exec's stream) *before* it starts the process, so an exec inspected in that gap
reads "not running" with no exit code yet. Taking that for "exited" let a silent command (a
verifier whose output Harbor redirects to a file) be abandoned while it still ran, its reward
file read before it was written. A stand-in daemon keeps exactly that order, no Docker needed.
"""

from __future__ import annotations

import collections
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from harbor.models.trial.config import (
    AgentConfig,
    EnvironmentConfig,
    TaskConfig,
    TrialConfig,
    VerifierConfig,
)
from harbor.trial.trial import Trial

from rollwire.harnesses.harbor import docker
from rollwire.harnesses.harbor.datasets import resolve_dataset
from rollwire.harnesses.harbor.local import INSTALL_HINT, sandbox_problem
from rollwire.harnesses.harbor.rollout import HarborRollout, run_harbor_rollout
from rollwire.harnesses.harbor.trial import LOCAL_IMPORT_PATH, NO_REWARD, _outcome
from tests.harbor.helpers import EXAMPLES

pytestmark = pytest.mark.anyio

TASK = resolve_dataset(EXAMPLES / "registry.json").task("count-errors")
TRIALS = 200
CONCURRENCY = 8
WALL_LIMIT_S = 180.0


class SlowStartDaemon:
    """dockerd's exec as the client sees it: the stream at once, the process ``start_s`` later
    (until then: not running, no exit code, no pid), running ``run_s`` with no output, then the
    exit code, then the end of the stream."""

    def __init__(self, start_s: float, run_s: float, code: int = 0) -> None:
        self.start_s, self.run_s, self.code = start_s, run_s, code
        self.state: dict[str, Any] = {"Running": False, "ExitCode": None, "Pid": 0}
        self.lock = threading.Lock()
        self.exited_at: float | None = None

    def exec_start(self, exec_id: str, **kwargs: Any) -> socket.socket:
        ours, theirs = socket.socketpair()

        def run() -> None:
            time.sleep(self.start_s)
            with self.lock:
                self.state.update(Running=True, Pid=4242)
            time.sleep(self.run_s)
            with self.lock:  # the exit is recorded before the stream closes, as dockerd does
                self.state.update(Running=False, ExitCode=self.code)
                self.exited_at = time.monotonic()
            theirs.close()

        threading.Thread(target=run, daemon=True).start()
        return ours

    def exec_inspect(self, exec_id: str) -> dict[str, Any]:
        with self.lock:
            return dict(self.state)


class SilentDaemon(SlowStartDaemon):
    """A daemon that ends the stream of an exec it never reports as ended."""

    def exec_start(self, exec_id: str, **kwargs: Any) -> socket.socket:
        ours, theirs = socket.socketpair()
        with self.lock:
            self.state.update(Running=True, Pid=4242)
        theirs.close()
        return ours


def test_an_exec_not_yet_started_by_the_daemon_is_waited_for_not_taken_as_exited() -> None:
    daemon = SlowStartDaemon(start_s=0.4, run_s=1.5, code=3)
    start = time.monotonic()
    code, started = docker._pump(daemon, "exec-id", lambda *_: None, threading.Event())
    returned = time.monotonic()
    assert daemon.exited_at is not None, (
        f"_pump returned after {returned - start:.2f} s while the command still ran"
    )
    assert returned >= daemon.exited_at
    assert (code, started) == (3, True)  # its own exit code, not -1


def test_an_exec_whose_exit_the_daemon_never_reports_is_a_named_error(monkeypatch) -> None:
    monkeypatch.setattr(docker, "_EXIT_RECORD_SEC", 0.3)
    with pytest.raises(docker.ExecExitUnknownError, match="no exit code"):
        docker._pump(SilentDaemon(0, 0), "exec-id", lambda *_: None, threading.Event())


async def test_a_trial_with_no_reward_and_no_exception_names_the_missing_reward_file(
    tmp_path: Path,
) -> None:
    # Harbor's own way to a trial with no verifier result and no exception: verification off.
    config = TrialConfig(
        task=TaskConfig(path=TASK.path),
        trials_dir=tmp_path,
        agent=AgentConfig(name="oracle"),
        environment=EnvironmentConfig(import_path=LOCAL_IMPORT_PATH, kwargs={"network": False}),
        verifier=VerifierConfig(disable=True),
    )
    result = await (await Trial.create(config)).run()
    assert result.exception_info is None and result.verifier_result is None
    outcome = _outcome(result, TASK.id, "oracle", None, tmp_path / config.trial_name, 1.0)
    assert outcome.reward is None and not outcome.ok
    assert outcome.exception_type == NO_REWARD
    assert outcome.error is not None and NO_REWARD in outcome.error
    assert str(tmp_path / config.trial_name / "verifier" / "reward.txt") in outcome.error


@pytest.fixture
def busy_core() -> Iterator[None]:
    """A process spinning on one core for the test's duration (the machine has two)."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        busy.kill()
        busy.wait()


@pytest.mark.slow
async def test_200_oracle_trials_at_concurrency_8_beside_a_busy_core_all_score_1(
    tmp_path: Path, busy_core: None
) -> None:
    assert sandbox_problem() is None, "this test needs bubblewrap: " + INSTALL_HINT
    outs: list[HarborRollout] = []
    limiter = anyio.Semaphore(CONCURRENCY)

    async def one() -> None:
        async with limiter:
            outs.append(
                await run_harbor_rollout(TASK, harness="oracle", trials_dir=tmp_path / "trials")
            )

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(TRIALS):
            tg.start_soon(one)
    wall = time.perf_counter() - start
    rewards = collections.Counter(out.result.reward for out in outs)
    failed = [
        (out.result.reward, out.result.error, out.trial_dir)
        for out in outs
        if not out.result.ok or out.result.reward != 1.0
    ]
    assert rewards == {1.0: TRIALS}, (dict(rewards), failed[:5])
    assert not failed, failed[:5]
    assert wall < WALL_LIMIT_S, f"{TRIALS} trials took {wall:.0f} s"
