"""The published GRPO run is what its results file says: ``examples/grpo_cpu.py --summary``
over ``bench/results/grpo_cpu.json`` prints the table the trainers guide shows, and the file's
per-step numbers hold the claims the guide makes of them (the run itself takes an hour on these
cores: ``examples/grpo_cpu.py``; CI runs its two-step ``--quick`` sibling,
``tests/examples/test_sft_warmup.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results" / "grpo_cpu.json"
GUIDE = ROOT / "docs" / "guides" / "trainers.md"


def runs() -> list[dict]:
    return json.loads(RESULTS.read_text())["runs"]


def test_the_guides_table_is_the_summary_of_the_published_runs(tmp_path: Path) -> None:
    script, plot = ROOT / "examples" / "grpo_cpu.py", tmp_path / "plot.png"
    done = subprocess.run(
        [sys.executable, str(script), "--summary", "--results", str(RESULTS), "--plot", str(plot)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    table = done.stdout.strip()
    assert table.startswith("| | synced every step | no sync (control) |")
    assert table in GUIDE.read_text()
    assert plot.stat().st_size > 10_000


def test_the_synced_run_agrees_at_every_step_and_every_row_names_its_step() -> None:
    synced = next(r for r in runs() if r["sync"] and not r["quick"])
    assert len(synced["steps"]) >= 20
    for step in synced["steps"]:
        assert step["weight_versions"] == [f"step-{step['step']}"]
        assert step["agreement_max"] <= 1e-3
    assert synced["rollout_stats"]["stale"] == 0 and synced["rollout_stats"]["unknown_version"] == 0


def test_the_control_agrees_only_before_its_first_optimizer_step() -> None:
    control = next(r for r in runs() if not r["sync"])
    first, *later = control["steps"]
    assert first["agreement_max"] <= 1e-3
    assert later and all(s["agreement_max"] > 1e-1 for s in later)
    assert {v for s in control["steps"] for v in s["weight_versions"]} == {"default"}
