"""pi (npm ``@earendil-works/pi-coding-agent``, seam ``pi``) in the ``local`` sandbox, through the
capture proxy's chat dialect, against the scripted fake vLLM engine.

rollwire installs the agent from npm (on the Node from PyPI) and mounts it in place of Harbor's
installer (``rollwire.harnesses.harbor.installs``); Harbor's ``Pi.run()`` writes the proxy's URL
into ``$PI_CODING_AGENT_DIR/models.json`` as the ``harbor-endpoint`` provider (API style
``openai-completions``, the seam's ``model_api``), then calls ``pi --print --mode json
--session-dir <logs>/pi/sessions --provider harbor-endpoint --model <model> <instruction>``; the
session file it keeps there is what Harbor converts to an ATIF trajectory.

The scripted policy is the one a capable model would follow: one ``bash`` call (as hermes
``<tool_call>`` text, which the fake's hermes parser turns into ``tool_calls``, as vLLM's does),
then a plain answer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollwire.capture.proxy import CaptureProxy
from rollwire.harnesses.harbor.installs import PACKAGES
from tests.fakes.vllm import FakeVLLM, tool_call_text
from tests.harbor.helpers import run_count_errors

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

COMMAND = "grep -c 'ERROR' \"$LOG_FILE\" > /app/error_count.txt"
ANSWER = "I counted the ERROR lines and wrote the count to /app/error_count.txt."


def _session(trial_dir: Path) -> list[dict]:
    """pi's own session file (``--session-dir``), under the trial's agent logs."""
    files = sorted((trial_dir / "agent" / "pi" / "sessions").glob("*.jsonl"))
    assert len(files) == 1, files
    return [json.loads(line) for line in files[0].read_text().splitlines() if line.strip()]


async def test_pi_solves_count_errors_through_the_chat_dialect(
    proxy: CaptureProxy, fake: FakeVLLM, tmp_path: Path
):
    fake.behavior.scripted_replies = [
        tool_call_text("bash", {"command": COMMAND}),
        ANSWER,
    ]
    out = await run_count_errors("pi", proxy, tmp_path)
    result = out.result
    assert result.ok, (result.error, out.agent_log_tail)

    # the real agent ran: its session file holds the bash call, made through Harbor's provider
    assert out.trial_dir is not None
    events = _session(out.trial_dir)
    messages = [e["message"] for e in events if e.get("type") == "message"]
    calls = [
        block
        for m in messages
        if m.get("role") == "assistant"
        for block in m["content"]
        if block.get("type") == "toolCall"
    ]
    assert [(c["name"], c["arguments"]) for c in calls] == [("bash", {"command": COMMAND})]
    assert {m.get("provider") for m in messages if m.get("role") == "assistant"} == {
        "harbor-endpoint"
    }
    # ... and Harbor's trajectory (converted from that session) names pi's own --version
    trajectory = json.loads((out.trial_dir / "agent" / "trajectory.json").read_text())
    assert trajectory["agent"]["version"] == PACKAGES["pi"].version

    assert fake.stats["ok"] == 2 and not fake.behavior.scripted_replies  # both replies served
    assert result.reward == 1.0
    doc = out.document
    assert doc is not None and {t.dialect for t in doc.turns} == {"chat"}
    stats = doc.stats
    assert stats.turns == 2 and result.n_turns == 2
    assert stats.roots == 1 and stats.trainable_sequences == 1 and stats.retokenized == 0
    assert result.findings == []  # it asks for nothing the engine cannot apply (max tokens only)
    assert result.atif == "match"  # Harbor's trajectory.json (from the session) vs the capture
