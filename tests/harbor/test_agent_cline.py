"""cline (npm ``cline``, seam ``cline-cli``) in the ``local`` sandbox, through the capture proxy's
chat dialect, against the scripted fake vLLM engine.

rollwire installs the agent from npm (on the Node from PyPI; the package is a Node launcher plus
a ~150 MB Bun-compiled binary) and mounts it in place of Harbor's installer
(``rollwire.harnesses.harbor.installs``). Harbor's ``ClineCli`` takes no base URL and cline reads
none from its environment, so the post-install hook stores the proxy's URL with ``cline auth``;
Harbor's ``run()`` then calls ``cline -P openai -k $API_KEY -m $MODELID --json --yolo -- ...``
(cline's openai-compatible provider: streamed chat completions) and copies the session directory
(``~/.cline/data/sessions/<id>/``) to the trial's logs, from which Harbor writes its ATIF
trajectory.

The scripted policy is the one a capable model would follow: one ``run_commands`` call (as hermes
``<tool_call>`` text, which the fake's hermes parser turns into ``tool_calls``, as vLLM's does),
then ``submit_and_exit``. cline ends a run only on that tool: a plain-text answer is followed by
"[SYSTEM] This run is not complete until you call ... submit_and_exit" and another call.
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
SUMMARY = "Counted the ERROR lines with grep -c and wrote the count to /app/error_count.txt."


def _session(trial_dir: Path) -> dict:
    """cline's own session record (``<id>.messages.json``), as Harbor copied it."""
    found = sorted((trial_dir / "agent" / "sessions").glob("*/*.messages.json"))
    assert len(found) == 1, found
    return json.loads(found[0].read_text())


async def test_cline_solves_count_errors_through_the_chat_dialect(
    proxy: CaptureProxy, fake: FakeVLLM, tmp_path: Path
):
    fake.behavior.scripted_replies = [
        tool_call_text("run_commands", {"commands": [COMMAND]}),
        tool_call_text("submit_and_exit", {"summary": SUMMARY, "verified": True}),
    ]
    out = await run_count_errors("cline-cli", proxy, tmp_path)
    result = out.result
    assert result.ok, (result.error, out.agent_log_tail)

    # the real agent ran: its session record, stamped with its version, holds both tool calls
    assert out.trial_dir is not None
    session = _session(out.trial_dir)
    assert session["origin"]["version"] == PACKAGES["cline-cli"].version
    calls = [
        (part["name"], part["input"])
        for m in session["messages"]
        if m["role"] == "assistant"
        for part in m["content"]
        if part.get("type") == "tool_use"
    ]
    assert calls == [
        ("run_commands", {"commands": [COMMAND]}),
        ("submit_and_exit", {"summary": SUMMARY, "verified": True}),
    ]
    assert "__CLINE_EXIT=0" in (out.trial_dir / "agent" / "cline.txt").read_text()

    assert fake.stats["ok"] == 2 and not fake.behavior.scripted_replies  # both replies served
    assert result.reward == 1.0
    doc = out.document
    assert doc is not None and {t.dialect for t in doc.turns} == {"chat"}
    stats = doc.stats
    assert stats.turns == 2 and result.n_turns == 2
    assert stats.roots == 1 and stats.trainable_sequences == 1 and stats.retokenized == 0
    assert result.atif == "match"  # Harbor's trajectory.json (from the session) vs the capture
