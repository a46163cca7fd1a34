"""``examples/trl_grpo.py`` and ``examples/curate.py`` as shipped, against a real ``rollwire serve
--http`` process on the fake vLLM: the rollout_func checked against TRL's contract, the
curation loop's push / drop / stop plans, and one real GRPO step (torch and trl come with the
`train` extra, which the development environment installs).

The training test also runs from a separate trainer environment while the server runs from
rollwire's own environment:

    ROLLWIRE_SERVER_PYTHON=$PWD/.venv/bin/python PYTHONPATH=src:. trainer/bin/python \\
        -m pytest --noconftest tests/examples/test_trl_examples.py -k trains
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.examples.conftest import ServeProcess
from tests.fakes.tiny_model import tiny_model

ROOT = Path(__file__).resolve().parents[2]
TRL_GRPO = ROOT / "examples" / "trl_grpo.py"
CURATE = ROOT / "examples" / "curate.py"
TOKEN = "trl-token"
SERVER_PYTHON = os.environ.get("ROLLWIRE_SERVER_PYTHON", sys.executable)
TICTACTOE = "openspiel:tic_tac_toe"  # a tool result inside the completion: env_mask 0s
CHAIN = "reasoning_gym:chain_sum"


@pytest.fixture(scope="module")
def server(fake, tmp_path_factory) -> Iterator[ServeProcess]:
    tmp = tmp_path_factory.mktemp("serve")
    served = ServeProcess(tmp, fake[1], TOKEN, data_dir=tmp / "collections", python=SERVER_PYTHON)
    try:
        yield served
    finally:
        served.stop()


def run(script: Path, server: ServeProcess, *args: str, timeout: float = 120):
    env = {k: v for k, v in os.environ.items() if k != "ROLLWIRE_TOKEN"}
    env["TRL_EXPERIMENTAL_SILENCE"] = "1"
    return subprocess.run(
        [sys.executable, str(script), "--server", server.url, "--token", TOKEN, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def check_rows(stdout: str) -> list[list[str]]:
    """--check's table: [task, ok, reward, prompt, completion, env=1, env=0, error...]."""
    lines = stdout.splitlines()
    assert lines[0].split() == ["task", "ok", "reward", "prompt", "compl", "env=1", "env=0"]
    return [
        line.split(maxsplit=7)
        for line in lines[1:]
        if not line.startswith(("rows ", "contract:", "VIOLATION "))
    ]


# --- trl_grpo.py --check ------------------------------------------------------------------------


def test_trl_grpo_check_holds_trls_contract_on_a_live_server(server):
    done = run(
        TRL_GRPO, server, "--check", "--task", TICTACTOE, "--task", CHAIN, "--group-size", "2"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.rstrip().endswith("contract: OK"), done.stdout
    assert "VIOLATION" not in done.stdout
    rows = check_rows(done.stdout)
    assert [r[:2] for r in rows] == [[TICTACTOE, "yes"]] * 2 + [[CHAIN, "yes"]] * 2
    for task, _, reward, prompt, completion, ones, zeros in rows:
        assert int(prompt) > 0 and int(ones) > 0 and int(ones) + int(zeros) == int(completion)
        assert (int(zeros) > 0) == (task == TICTACTOE)  # the move's result is environment
        assert reward == ("-" if task == TICTACTOE else "0.000")  # the game never finished
    assert (
        "extra keys forwarded: env_mask, reward, rewards, ok, rollout_id, sequences_total, "
        "seed, weight_version, weight_versions, error, stale" in done.stdout
    )
    assert "4 rollouts: 2 tasks x 2" in done.stderr


def test_trl_grpo_check_lists_tasks_and_keeps_failed_rows_well_formed(server):
    listed = run(
        TRL_GRPO, server, "--check", "--tasks", "reasoning_gym", "--query", "chain_sum",
        "--limit", "1", "--group-size", "3", "--max-turns", "1",
    )  # fmt: skip
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert [r[:2] for r in check_rows(listed.stdout)] == [[CHAIN, "yes"]] * 3
    mixed = run(
        TRL_GRPO, server, "--check", "--task", "reasoning_gym:nope", "--task", CHAIN,
        "--group-size", "2", "--max-turns", "1",
    )  # fmt: skip
    assert mixed.returncode == 0, mixed.stdout  # a failed rollout is a row, not a broken batch
    rows = check_rows(mixed.stdout)
    assert len(rows) == 4 and "contract: OK" in mixed.stdout
    for row in rows[:2]:  # all-zero env_mask, no reward, the error says why
        assert row[1:7] == ["NO", "-", "1", "1", "0", "1"] and "unknown task" in row[7]
    assert [r[:2] for r in rows[2:]] == [[CHAIN, "yes"]] * 2
    assert "rows 4, failed 2," in mixed.stdout


def test_trl_grpo_check_fails_when_no_row_can_train(server):
    done = run(TRL_GRPO, server, "--check", "--task", CHAIN, "--llm-url", "http://127.0.0.1:9/v1")
    assert done.returncode == 1
    assert "VIOLATION no row has a trainable token" in done.stdout
    assert done.stdout.rstrip().endswith("contract: FAILED")
    assert all(r[1] == "NO" and "endpoint not usable" in r[7] for r in check_rows(done.stdout))


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_trl_grpo_check_catches_every_kind_of_violation():
    violations = _load(TRL_GRPO).violations

    def good() -> dict:
        row = {
            "prompt_ids": [1, 2],
            "completion_ids": [3, 4, 5],
            "logprobs": [-0.5, 0.0, -0.1],
            "env_mask": [1, 0, 1],
            "reward": 1.0,
            "rewards": {},
            "ok": True,
            "rollout_id": "r",
            "sequences_total": 1,
            "seed": 0,
            "weight_version": "step-0",
            "weight_versions": ["step-0"],
            "error": None,
            "stale": False,
        }
        return {k: [v, v] for k, v in row.items()}

    assert violations(good(), 2, 2) == []
    breaks = {
        "missing key 'env_mask'": lambda o: o.pop("env_mask"),
        "rows, expected 2": lambda o: o["reward"].pop(),
        "lengths differ": lambda o: o.__setitem__("logprobs", [[-0.5, 0.0]] * 2),
        "env_mask holds [2]": lambda o: o.__setitem__("env_mask", [[1, 2, 1]] * 2),
        "not 0.0 where env_mask is 0": lambda o: o.__setitem__("logprobs", [[-0.5, -1.0, 0]] * 2),
        "> 0 or not finite": lambda o: o.__setitem__("logprobs", [[0.5, 0.0, math.nan]] * 2),
        "failed, yet env_mask has 1s": lambda o: o.__setitem__("ok", [False, False]),
        "different task seeds": lambda o: o.__setitem__("seed", [0, 1]),
        "empty prompt_ids": lambda o: o.__setitem__("prompt_ids", [[], [1]]),
    }
    for expected, corrupt in breaks.items():
        out = good()
        corrupt(out)
        found = violations(out, 2, 2)
        assert any(expected in v for v in found), (expected, found)


# --- curate.py ----------------------------------------------------------------------------------


def curate(server: ServeProcess, fake, *args: str):
    return run(
        CURATE, server, "--llm-url", fake[1], "--tasks", "reasoning_gym", "--query", "chain_sum",
        "--limit", "2", "--group-size", "2", "--max-turns", "2", *args,
    )  # fmt: skip


def test_curate_collects_inspects_and_plans_a_dry_run_push(server, fake):
    done = curate(server, fake, "--out-dir", "kept", "--repo-id", "you/chain-sum")
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout.splitlines()
    assert out[0].startswith("collection kept: 4 kept, 0 filtered, 0 failed, 0 already there;")
    assert "4 new episode ids" in out[0]
    assert re.match(r"probe [0-9a-f]{32}: ok True, \d+ turns, 1 roots, 0 of \d+ calls", out[1])
    assert "plan: PUSH 4 episodes to https://huggingface.co/datasets/you/chain-sum" in out
    assert "data/train-00000-of-00001.parquet" in done.stdout and "NOT FOUND" in done.stdout
    assert "validate_llm: TRAIN (tier tokens, model smol)" in done.stderr
    assert "collect_episodes: 4/4 kept 4" in done.stderr  # progress, as it went
    episodes = (server.data_dir / "kept" / "episodes.jsonl").read_text().splitlines()
    assert len(episodes) == 4  # collected on the server; the dry run sent nothing
    again = curate(server, fake, "--out-dir", "kept", "--repo-id", "you/chain-sum")
    assert again.returncode == 0 and "0 kept, 0 filtered, 0 failed, 4 already there" in again.stdout


def test_curate_drops_a_collection_that_kept_nothing(server, fake):
    done = curate(server, fake, "--out-dir", "dropped", "--min-reward", "0.5")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "collection dropped: 0 kept, 4 filtered, 0 failed" in done.stdout
    assert "plan: DROP dropped: no episode kept" in done.stdout
    assert "plan: PUSH" not in done.stdout


def test_curate_stops_before_collecting_on_an_engine_that_cannot_train(server):
    done = run(CURATE, server, "--llm-url", "http://127.0.0.1:9/v1", "--tasks", "reasoning_gym",
               "--query", "chain_sum", "--out-dir", "never")  # fmt: skip
    assert done.returncode == 1 and done.stdout == ""
    assert "validate_llm: NOT USABLE" in done.stderr and "stopped: not_reachable" in done.stderr
    assert not (server.data_dir / "never").exists()


# --- one real GRPO step ---------------------------------------------------------------------------


@pytest.mark.slow
def test_trl_grpo_trains_one_step_on_rollwire_rollouts(server, fake, tmp_path):
    before = len(fake[0].requests)
    out_dir = tmp_path / "run"
    done = run(
        TRL_GRPO, server, "--model", str(tiny_model(tmp_path / "tiny")), "--task", TICTACTOE,
        "--task", CHAIN, "--group-size", "2", "--batch-size", "4", "--max-steps", "1",
        "--learning-rate", "1e-3", "--output-dir", str(out_dir), timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert "trained 1 steps" in done.stderr
    # the script's own account of the batch rollwire returned ...
    m = re.search(
        r"step 0: 4 rollouts, 0 failed, mean reward (\S+), prompt tokens (\d+), "
        r"completion tokens (\d+), trainable tokens (\d+)",
        done.stderr,
    )
    assert m, done.stderr[-4000:]
    prompt, completion, trainable = (int(g) for g in m.groups()[1:])
    assert 0 < trainable < completion  # tic-tac-toe's move results are inside the completion
    # ... and what TRL logged for the step: it trained on those rows, counting env_mask
    state = json.loads((out_dir / "trainer_state.json").read_text())
    assert state["global_step"] == 1
    (log,) = [e for e in state["log_history"] if "loss" in e]
    assert log["completions/mean_length"] == pytest.approx(trainable / 4)
    assert log["num_tokens"] == prompt + trainable
    assert log["reward"] == pytest.approx(0.0)  # chain_sum's verified 0.0; the game's None skipped
    assert math.isfinite(log["loss"]) and "grad_norm" in log
    assert (out_dir / "model.safetensors").exists()
    assert len(fake[0].requests) >= before + 4  # every sample was a rollout on the engine
