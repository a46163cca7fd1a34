"""Real Harbor trials in the local sandbox: oracle passes, nop fails, every failure is a result."""

from __future__ import annotations

import asyncio
import math
import os
import socket
import uuid
from pathlib import Path

import pytest

from rollwire.harnesses.harbor.datasets import resolve_dataset
from rollwire.harnesses.harbor.trial import TrialOutcome, rewards_to_reward, run_trial
from tests.harbor.helpers import EXAMPLES, make_task

pytestmark = pytest.mark.anyio

BUNDLED = resolve_dataset(EXAMPLES / "registry.json").tasks
MULTI_KEY = {"sales-report": "correct"}  # the bundled task that writes several rewards
PHASES = ("agent_execution", "verifier")


def assert_verified(outcome: TrialOutcome, reward: float) -> None:
    assert outcome.error is None, (outcome.error, outcome.verifier_log_tail)
    assert outcome.reward == reward
    assert outcome.ok
    assert outcome.trial_dir is not None and (outcome.trial_dir / "result.json").is_file()


@pytest.mark.parametrize("task", BUNDLED, ids=lambda t: t.name)
async def test_every_bundled_task_passes_with_the_oracle(task, tmp_path: Path) -> None:
    key = MULTI_KEY.get(task.name)
    outcome = await run_trial(task, agent="oracle", reward_key=key, trials_dir=tmp_path)
    assert_verified(outcome, 1.0)
    assert outcome.task == task.id
    if key is not None:
        assert outcome.rewards == {"format": 1.0, "correct": 1.0, "partial": 1.0}
    else:
        assert outcome.rewards == {"reward": 1.0}
    if task.n_steps:  # a Harbor multi-step task: phases per step
        phases = {f"step.{step}.{phase}" for step in ("collect", "total") for phase in PHASES}
    else:
        phases = set(PHASES)
    assert set(outcome.timings) >= {"environment_setup", "total", *phases}
    assert outcome.timings["total"] < 10


@pytest.mark.parametrize("task", BUNDLED, ids=lambda t: t.name)
async def test_every_bundled_task_fails_with_nop(task, tmp_path: Path) -> None:
    outcome = await run_trial(
        task, agent="nop", reward_key=MULTI_KEY.get(task.name), trials_dir=tmp_path
    )
    assert_verified(outcome, 0.0)  # a wrong answer: 0.0, not None


async def test_multi_key_reward_without_reward_key_is_refused_naming_the_keys(
    tmp_path: Path,
) -> None:
    task = resolve_dataset(EXAMPLES).task("sales-report")
    outcome = await run_trial(task, agent="oracle", trials_dir=tmp_path)
    assert outcome.reward is None
    assert not outcome.ok
    assert outcome.error is not None
    assert all(key in outcome.error for key in ("correct", "format", "partial"))
    assert outcome.rewards == {"format": 1.0, "correct": 1.0, "partial": 1.0}  # kept verbatim


async def test_a_dead_verifier_gives_no_reward(tmp_path: Path) -> None:
    task = make_task(tmp_path / "tasks", "dead-verifier", test="echo crashed >&2; exit 1\n")
    outcome = await run_trial(task, agent="oracle", trials_dir=tmp_path / "trials")
    assert outcome.reward is None  # never ran to a verdict: not 0.0
    assert outcome.exception_type == "RewardFileNotFoundError"
    assert outcome.error is not None and "RewardFileNotFoundError" in outcome.error


async def test_a_non_finite_reward_is_an_error_not_a_reward(tmp_path: Path) -> None:
    task = make_task(
        tmp_path / "tasks",
        "nan-reward",
        test="echo '{\"reward\": NaN}' > /logs/verifier/reward.json\n",
    )
    outcome = await run_trial(task, agent="oracle", trials_dir=tmp_path / "trials")
    assert outcome.reward is None
    assert outcome.error is not None and "Non-finite" in outcome.error


async def test_a_run_step_fails_the_trial_naming_the_line(tmp_path: Path) -> None:
    task = make_task(
        tmp_path / "tasks",
        "needs-docker",
        dockerfile="FROM ubuntu:24.04\nWORKDIR /app\nRUN apt-get install -y jq\n",
    )
    outcome = await run_trial(task, agent="oracle", trials_dir=tmp_path / "trials")
    assert outcome.reward is None
    assert outcome.exception_type == "UnsupportedDockerfileError"
    assert outcome.error is not None and "Dockerfile:3: RUN apt-get install -y jq" in outcome.error


async def test_escape_attempts_from_a_task_do_not_reach_the_host(tmp_path: Path) -> None:
    name = f"rollwire-escape-{uuid.uuid4().hex}"
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    solve = (
        f"echo x > /etc/{name}; echo x > /tmp/{name}; echo x > /usr/{name} 2>/dev/null\n"
        "python3 - <<'PY' > /app/network.txt\n"
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
        "    print('reached')\n"
        "except OSError:\n"
        "    print('blocked')\n"
        "PY\n"
    )
    test = (
        f"if [ -f /etc/{name} ] && [ -f /tmp/{name} ] && grep -qx blocked /app/network.txt; "
        "then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n"
    )
    task = make_task(tmp_path / "tasks", "escape", solve=solve, test=test)
    try:
        outcome = await run_trial(task, agent="oracle", trials_dir=tmp_path / "trials")
    finally:
        listener.close()
    # Inside, the writes landed in the sandbox's own /etc and /tmp and the network was blocked.
    assert_verified(outcome, 1.0)
    for host in (Path("/etc") / name, Path("/tmp") / name, Path("/usr") / name):
        assert not host.exists(), host


async def test_preflight_failure_is_a_result_with_the_install_hint(tmp_path: Path) -> None:
    outcome = await run_trial(
        EXAMPLES / "count-errors",
        trials_dir=tmp_path,
        environment_kwargs={"bwrap": "/nonexistent/bwrap"},
    )
    assert outcome.reward is None
    assert outcome.exception_type == "SandboxUnavailableError"
    assert outcome.error is not None and "apt-get install bubblewrap" in outcome.error
    assert os.listdir(tmp_path) == []  # nothing was started


async def test_unknown_agent_and_missing_task_are_results(tmp_path: Path) -> None:
    unknown = await run_trial(EXAMPLES / "count-errors", agent="claude-code", trials_dir=tmp_path)
    assert unknown.error is not None and "oracle" in unknown.error
    missing = await run_trial(tmp_path / "no-such-task", trials_dir=tmp_path)
    assert missing.reward is None and missing.error is not None


async def test_agent_log_tail_and_verifier_log_tail_are_returned(tmp_path: Path) -> None:
    task = make_task(
        tmp_path / "tasks",
        "logs",
        solve="echo solving the task\n",
        test="echo checking; echo 1 > /logs/verifier/reward.txt\n",
    )
    outcome = await run_trial(task, agent="oracle", trials_dir=tmp_path / "trials")
    assert_verified(outcome, 1.0)
    assert outcome.agent_log_tail is not None and "solving the task" in outcome.agent_log_tail
    assert outcome.verifier_log_tail is not None and "checking" in outcome.verifier_log_tail


@pytest.mark.parametrize(
    ("rewards", "key", "expected"),
    [
        (None, None, (None, {}, None)),
        ({"reward": 1}, None, (1.0, {"reward": 1.0}, None)),
        ({"reward": True}, None, (1.0, {"reward": 1.0}, None)),
        ({"a": 0.5, "b": 1.0}, "b", (1.0, {"a": 0.5, "b": 1.0}, None)),
    ],
)
def test_rewards_become_one_reward(rewards, key, expected) -> None:
    assert rewards_to_reward(rewards, key) == expected


@pytest.mark.parametrize(
    ("rewards", "key", "needle"),
    [
        ({"a": 0.5, "b": 1.0}, None, "['a', 'b']"),
        ({"a": 0.5}, "b", "'b' is not among"),
        ({"reward": None}, None, "reward: no value"),
        ({"reward": "N/A"}, None, "'N/A' is not a number"),
        ({"reward": {"nested": 1}}, None, "dict is not a number"),
        ({"reward": math.inf}, None, "not finite"),
        ({"reward": math.nan}, None, "not finite"),
        (["not", "a", "dict"], None, "not a mapping"),
    ],
)
def test_bad_rewards_are_errors_never_guesses(rewards, key, needle) -> None:
    reward, _, problem = rewards_to_reward(rewards, key)
    assert reward is None
    assert problem is not None and needle in problem


async def test_a_cancelled_trial_leaves_no_process_and_no_sandbox(tmp_path: Path) -> None:
    arg = f"300.{uuid.uuid4().int % 10**6}"  # marks this test's sleepers among the host's
    task = make_task(tmp_path / "tasks", "slow", solve=f"setsid sleep {arg} & sleep {arg}\n")
    sandboxes = tmp_path / "sandboxes"
    running = asyncio.create_task(
        run_trial(
            task,
            trials_dir=tmp_path / "trials",
            environment_kwargs={"sandbox_dir": str(sandboxes)},
        )
    )
    for _ in range(200):  # until the solution is running in the sandbox
        await asyncio.sleep(0.05)
        if len(sleepers(arg)) == 2:
            break
    assert len(sleepers(arg)) == 2
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert os.listdir(sandboxes) == []
    assert sleepers(arg) == []


def sleepers(arg: str) -> list[int]:
    """Host pids of live ``sleep <arg>`` processes."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if cmdline[:2] == [b"sleep", arg.encode()] and state != "Z":
            found.append(int(entry))
    return found
