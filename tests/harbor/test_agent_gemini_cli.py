"""gemini-cli (npm ``@google/gemini-cli``) in the ``local`` sandbox, through the capture proxy.

rollwire installs it from npm (on the Node from PyPI) and mounts it read-only into the trial;
Harbor's ``GeminiCli.run()`` then points it at the proxy with ``GOOGLE_GEMINI_BASE_URL`` and
``GEMINI_API_KEY`` (the capture session id) and writes ``~/.gemini/settings.json`` itself (auth
``gemini-api-key``), so nothing of Harbor's ``install()`` beyond the package is needed. gemini-cli
speaks the Gemini API (``:generateContent``); the proxy's google dialect translates each call to
chat-completions for the fake engine.

The scripted policy: one ``run_shell_command`` call that counts the ERROR lines, then a text
answer. The fake parses the scripted ``<tool_call>`` block into ``tool_calls`` as vLLM's hermes
parser does; gemini-cli runs the command in the sandbox and the verifier reads its result.
"""

from __future__ import annotations

import pytest

from rollwire.capture.proxy import CaptureProxy
from tests.fakes.vllm import FakeVLLM, tool_call_text
from tests.harbor.helpers import run_count_errors

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

COUNT = 'grep -c ERROR "$LOG_FILE" > /app/error_count.txt'
POLICY = [
    tool_call_text(
        "run_shell_command",
        {"command": COUNT, "description": "Count the ERROR lines of the log."},
    ),
    "The count of ERROR lines is in /app/error_count.txt.",
]


async def test_gemini_cli_solves_count_errors_through_the_google_dialect(
    proxy: CaptureProxy, fake: FakeVLLM, tmp_path
):
    """gemini-cli (0.61) runs count-errors against the fake engine through the proxy's google
    dialect: its shell tool call and the answer after the tool result are both captured, link
    into one trainable sequence, and the task is solved; Harbor converts its session file to an
    ATIF trajectory that matches the capture."""
    fake.behavior.scripted_replies = list(POLICY)
    out = await run_count_errors("gemini-cli", proxy, tmp_path)
    result = out.result
    assert "YOLO mode is enabled" in (out.agent_log_tail or "")  # the real agent's own log
    assert fake.stats["ok"] == len(POLICY) and fake.behavior.scripted_replies == []
    assert result.ok, (result.error, result.findings)
    assert result.n_turns == 2 and result.n_tool_calls == 1
    doc = out.document
    assert doc is not None and {t.dialect for t in doc.turns} == {"google"}
    assert doc.stats.roots == 1 and doc.stats.trainable_sequences == 1
    assert doc.stats.retokenized == 0
    assert result.atif == "match"
    assert result.reward == 1.0
