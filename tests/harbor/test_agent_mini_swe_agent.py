"""mini-swe-agent (PyPI, 2.4.x) in the ``local`` sandbox, through the capture proxy's chat dialect.

rollwire installs it from PyPI into a venv of the host's ``python3`` (Harbor's ``install()``
fetches uv from astral.sh and a Python through it, unreachable here) and mounts it read-only;
Harbor's ``run()`` then calls ``mini-swe-agent --yolo --model=openai/<model> -c mini ...`` with
litellm pointed at the proxy (``model.model_kwargs.api_base``). mini-swe-agent 2.x offers one
``bash`` tool and ends when a command's output starts with
``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``, so the fake engine is scripted with two hermes tool
calls (parsed into ``tool_calls`` as vLLM's hermes parser does): the solution, then the submit.
"""

from __future__ import annotations

import json

import pytest

from rollwire.capture.proxy import CaptureProxy
from tests.fakes.vllm import FakeVLLM, tool_call_text
from tests.harbor.helpers import run_count_errors

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SOLVE = "grep -c 'ERROR' \"$LOG_FILE\" > /app/error_count.txt"
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


async def test_mini_swe_agent_solves_count_errors_through_the_chat_dialect(
    proxy: CaptureProxy, fake: FakeVLLM, tmp_path
):
    fake.behavior.scripted_replies = [
        tool_call_text("bash", {"command": SOLVE}),
        tool_call_text("bash", {"command": SUBMIT}),
    ]
    out = await run_count_errors("mini-swe-agent", proxy, tmp_path)
    result = out.result
    assert out.trial_dir is not None, result.error
    agent_dir = out.trial_dir / "agent"
    log = (agent_dir / "mini-swe-agent.txt").read_text()  # its own console, tee'd by Harbor
    assert "This is mini-swe-agent version 2.4.6" in log, log  # the real agent ran
    assert "model cost map fetch" not in log  # LITELLM_LOCAL_MODEL_COST_MAP: no remote fetch
    assert fake.stats["ok"] == 2, (result.error, log)  # both scripted calls served, no more
    assert result.ok, (result.error, result.findings, log)
    assert result.reward == 1.0, (result.findings, out.verifier_log_tail)

    # Its own trajectory: both commands ran, the submit ended it.
    traj = json.loads((agent_dir / "mini-swe-agent.trajectory.json").read_text())
    assert traj["info"]["exit_status"] == "Submitted", traj["info"]
    commands = [
        json.loads(call["function"]["arguments"])["command"]
        for m in traj["messages"]
        if m.get("role") == "assistant"
        for call in m.get("tool_calls") or []
    ]
    assert commands == [SOLVE, SUBMIT]

    doc = out.document
    assert doc is not None and {t.dialect for t in doc.turns} == {"chat"}
    assert len(doc.turns) == 2 and result.n_turns == 2
    assert doc.stats.roots == 1 and doc.stats.trainable_sequences == 1
    assert result.atif == "match", result.findings  # Harbor converts its trajectory to ATIF
