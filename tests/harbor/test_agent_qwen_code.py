"""qwen-code (npm ``@qwen-code/qwen-code``, seam ``qwen-coder``) in the ``local`` sandbox, through
the capture proxy's chat dialect, against the scripted fake vLLM engine.

rollwire installs the agent from npm (on the Node from PyPI) and mounts it in place of Harbor's
installer (``rollwire.harnesses.harbor.installs``); Harbor's ``QwenCode.run()`` then calls
``qwen --yolo --auth-type openai --openai-base-url $OPENAI_BASE_URL --chat-recording
--prompt=...`` and copies ``~/.qwen/projects/`` (the chat recording) to the trial's logs, from
which Harbor writes its ATIF trajectory.

The scripted policy is the one a capable model would follow: one ``run_shell_command`` call (as
hermes ``<tool_call>`` text, which the fake's hermes parser turns into ``tool_calls``, as vLLM's
does), then a plain answer. Unscripted, the fake's "first tool" is qwen-code's ``agent`` tool:
background subagents that loop until the agent times out.
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


def _recording(trial_dir: Path) -> list[dict]:
    """qwen-code's own chat recording (``--chat-recording``), as Harbor copied it."""
    chats = sorted((trial_dir / "agent" / "qwen-sessions").glob("*/chats/*.jsonl"))
    assert len(chats) == 1, chats
    return [json.loads(line) for line in chats[0].read_text().splitlines() if line.strip()]


async def test_qwen_code_solves_count_errors_through_the_chat_dialect(
    proxy: CaptureProxy, fake: FakeVLLM, tmp_path: Path
):
    fake.behavior.scripted_replies = [
        tool_call_text("run_shell_command", {"command": COMMAND}),
        ANSWER,
    ]
    out = await run_count_errors("qwen-coder", proxy, tmp_path)
    result = out.result
    assert result.ok, (result.error, out.agent_log_tail)

    # the real agent ran: its chat recording, stamped with its version, holds the shell call
    assert out.trial_dir is not None
    events = _recording(out.trial_dir)
    version = PACKAGES["qwen-coder"].version
    assert {e.get("version") for e in events} == {version}
    calls = [
        part["functionCall"]
        for e in events
        if e.get("type") == "assistant"
        for part in e["message"]["parts"]
        if "functionCall" in part
    ]
    assert [(c["name"], c["args"]) for c in calls] == [("run_shell_command", {"command": COMMAND})]

    assert fake.stats["ok"] == 2 and not fake.behavior.scripted_replies  # both replies served
    assert result.reward == 1.0
    doc = out.document
    assert doc is not None and {t.dialect for t in doc.turns} == {"chat"}
    stats = doc.stats
    assert stats.turns == 2 and result.n_turns == 2
    assert stats.roots == 1 and stats.trainable_sequences == 1 and stats.retokenized == 0
    assert result.atif == "match"  # Harbor's trajectory.json (from the recording) vs the capture
