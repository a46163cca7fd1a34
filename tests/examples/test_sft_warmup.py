"""``examples/sft_warmup.py --quick`` as shipped, for real: the scripted teacher collected through
a ``rollwire serve --http`` process, ``export --format sft``, ``rollwire convert``, TRL's
SFTTrainer on CPU, ``rollwire engine --model`` before and after (certified and parity-checked),
held-out evaluation through MCP, and one GRPO step of ``examples/trl_grpo.py`` from the warmed
model. No mocks: torch, TRL, the engine and the MCP server all run (a few minutes)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def warmup(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict]:
    tmp = tmp_path_factory.mktemp("warmup")
    results = tmp / "results.json"
    argv = [sys.executable, str(ROOT / "examples" / "sft_warmup.py"), "--quick"]
    done = subprocess.run(
        [*argv, "--work", str(tmp / "work"), "--results", str(results)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
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
    assert before["episodes"] == after["episodes"] == 12


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


def test_one_grpo_step_from_the_warmed_model(warmup):
    _, results = warmup
    grpo = results["grpo"]
    assert len(grpo["rewards"]) == 4
    assert any(r is not None for r in grpo["rewards"])  # the warmed model calls the tool
    assert math.isfinite(grpo["loss"]) and math.isfinite(grpo["grad_norm"])
    numbers = {r for r in grpo["rewards"] if r is not None}
    if len(numbers) > 1:  # GRPO's advantages are zero when every sample scored the same
        assert grpo["grad_norm"] > 0
    agreement = grpo["step0_logprob_agreement"]
    assert agreement["tokens"] > 0
    assert agreement["max_abs_diff"] < 1e-3  # the trainer and the engine agree on the samples
