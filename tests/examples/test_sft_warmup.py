"""``examples/sft_warmup.py --quick`` for real, on a smaller budget (4 held-out episodes, not 12,
and the session's converted base model): the scripted teacher collected
through a ``rollwire serve --http`` process, ``export --format sft``, TRL's SFTTrainer on CPU,
``rollwire engine --model`` before and after (certified and parity-checked), held-out
evaluation through MCP, and two GRPO steps of ``examples/trl_grpo.py`` from the warmed model
with its weights pushed into the engine between them. No mocks: torch, TRL, the engine and the
MCP server all run (a few minutes)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EVAL_EPISODES = 4


@pytest.fixture(scope="module")
def warmup(tmp_path_factory, converted_dir: Path) -> tuple[subprocess.CompletedProcess, dict]:
    tmp = tmp_path_factory.mktemp("warmup")
    results = tmp / "results.json"
    # The base folder is the session's converted one (the script converts only where its work
    # folder has none: `rollwire convert` itself is tested by the fixture that made it), and
    # the held-out evals are EVAL_EPISODES episodes rather than --quick's 12: CI time. (GRPO's
    # groups stay 8: the quick student leaves some samples unscored, and a smaller group is
    # likelier to have no scored sample at all.)
    (tmp / "work").mkdir()
    (tmp / "work" / "base").symlink_to(converted_dir, target_is_directory=True)
    argv = [sys.executable, str(ROOT / "examples" / "sft_warmup.py"), "--quick"]
    argv += ["--eval-episodes", str(EVAL_EPISODES)]
    argv += ["--work", str(tmp / "work"), "--results", str(results)]
    # A session of its own: on a timeout the whole group goes (the engines and the server the
    # script started would outlive it otherwise).
    proc = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=2400)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"sft_warmup.py --quick did not finish in 2400 s:\n{stderr[-6000:]}")
    done = subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
    assert done.returncode == 0, done.stderr[-6000:]
    (run,) = json.loads(results.read_text())["runs"]
    assert run["quick"] is True
    return done, run


def test_the_table_compares_held_out_seeds_before_and_after(warmup):
    done, results = warmup
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["held-out", "seeds", "before", "after", "delta"]
    assert [line.split()[0] for line in lines[1:4]] == ["tool-call", "accuracy", "mean"]
    before, after = results["before"], results["after"]
    assert before["seeds"] == after["seeds"] and before["seeds"][0] >= 1_000_000
    teacher_seeds = results["teacher"]["seeds"]
    assert teacher_seeds[1] < before["seeds"][0]  # the held-out instances were never taught
    assert before["episodes"] == after["episodes"] == EVAL_EPISODES


def test_held_out_numbers_come_from_rollwire_eval_with_standard_errors(warmup):
    """accuracy is the metrics block's pass@1 (with its standard error over the held-out
    problems), and the before/after comparison is `rollwire eval --compare`'s, paired by seed."""
    done, results = warmup
    before, after = results["before"], results["after"]
    for side in (before, after):
        assert 0.0 <= side["accuracy"] <= 1.0 and side["accuracy_se"] is not None
    overall = results["compare"]["overall"]
    assert overall["problems"] == EVAL_EPISODES
    assert overall["wins"] + overall["losses"] + overall["ties"] == EVAL_EPISODES
    pass1 = next(d for d in overall["differences"] if d["metric"] == "pass@1")
    assert (pass1["a"], pass1["b"]) == pytest.approx((before["accuracy"], after["accuracy"]))
    assert pass1["ci_low"] <= pass1["diff"] <= pass1["ci_high"]
    assert "paired by problem: 4 problems" in done.stdout


def test_warm_up_teaches_the_tool_call(warmup):
    _, results = warmup
    before, after = results["before"], results["after"]
    assert before["tool_call_compliance"] == 0.0  # the base model answers in prose
    assert after["tool_call_compliance"] > before["tool_call_compliance"]
    assert results["sft"]["steps"] > 0 and results["sft"]["train_rows"] > 0


def test_the_teacher_data_and_both_engines_are_what_they_claim(warmup):
    _, results = warmup
    teacher = results["teacher"]
    assert (
        teacher["engine_tier"] == "text" and teacher["kept"] == 32
    )  # the scripted teacher is right
    assert results["sft_export"]["token_columns"] is False  # a text-tier teacher: messages only
    for name in ("base_engine", "student_engine"):
        engine = results[name]
        assert engine["verdict"] == "TRAIN" and "vllm_chat" in engine["token_in_paths"]
        assert engine["parity"] == "PASS" and engine["parity_honest_max_abs"] <= 1e-3


def test_grpo_rows_name_the_weights_being_trained(warmup):
    """The trainer pushed its weights into the engine before each batch: every row of step k
    was sampled by version ``step-k``, and TRL's own logprobs of the captured completions equal
    the engine's at every step, the second (after a sync) included."""
    _, results = warmup
    grpo = results["grpo"]
    assert grpo["sync"] is True
    steps = grpo["steps"]
    assert [s["weight_versions"] for s in steps] == [["step-0"], ["step-1"]]
    assert grpo["rollout_stats"]["pushes"] == 2
    for step in steps:
        assert len(step["rewards"]) == 8 and any(r is not None for r in step["rewards"])
        assert math.isfinite(step["loss"]) and math.isfinite(step["grad_norm"])
        assert step["agreement_tokens"] > 0
        assert step["agreement_max"] <= 1e-3  # the trainer and the engine agree on the samples


def test_the_first_steps_samples_are_off_policy_for_the_updated_weights(warmup):
    """Step 0's completions scored by the weights after step 0's update: they differ exactly when
    the update moved the weights (a group with signal); without the sync these are the numbers a
    trainer would take for its policy's at step 1."""
    _, results = warmup
    first, second = results["grpo"]["steps"]
    assert second["previous_step_max"] is not None
    if first["grad_norm"] > 0:
        assert second["previous_step_max"] > 1e-3
    else:  # every group's rewards were equal: zero advantage, the weights did not move
        assert first["groups_with_signal"] == 0.0 and second["previous_step_max"] <= 1e-3
