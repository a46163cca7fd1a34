"""aider (PyPI aider-chat) in the ``local`` sandbox, through the capture proxy, on the fake vLLM.

Harbor runs aider in scripting mode: ``aider --yes --message=<instruction>``, chat-completions
through litellm (``openai/<model>``). aider has no tool calls: its model replies in text, and aider
applies the file edits the reply spells out in its edit format (``whole`` for a model it does not
know: a file name line, then the file's whole content fenced). ``--yes`` answers every prompt but
"Run shell command?", which aider asks with ``explicit_yes_required`` (answered no), so a policy
can act only by editing files. The scripted policy here writes the answer file, its count taken
from the task's log by the test (aider cannot run the grep itself).

The seam turns aider's auto-commits off: each commit asks the model for a commit message, a
second conversation (a second root) the task's reward says nothing about.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rollwire.capture.proxy import CaptureProxy
from tests.fakes.vllm import FakeVLLM
from tests.harbor.helpers import EXAMPLES, run_count_errors

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

LOG = EXAMPLES / "count-errors" / "environment" / "logs" / "service.log"


def _error_lines() -> int:
    return sum("ERROR" in line for line in LOG.read_text().splitlines())


async def test_aider_solves_count_errors_through_the_chat_dialect(
    proxy: CaptureProxy, fake: FakeVLLM, tmp_path: Path
):
    """The scripted model answers aider's one call with a whole-file edit of
    ``error_count.txt`` (aider runs in /app, the workspace it snapshots into git)."""
    fake.behavior.scripted_replies = [f"error_count.txt\n```\n{_error_lines()}\n```\n"]
    out = await run_count_errors("aider", proxy, tmp_path)
    result = out.result
    log = out.agent_log_tail or ""
    assert "Aider v0.86.2" in log and "Applied edit to error_count.txt" in log  # aider ran
    assert "Commit " not in log  # AIDER_AUTO_COMMITS=false: no commit, no commit-message call
    assert "checking pypi" not in log  # AIDER_CHECK_UPDATE=false
    assert fake.stats["ok"] == 1, result.error  # one call: the task's
    assert result.ok and result.reward == 1.0, (result.error, out.verifier_log_tail)
    doc = out.document
    assert doc is not None and {t.dialect for t in doc.turns} == {"chat"}
    assert doc.stats.roots == 1 and doc.stats.trainable_sequences == 1
    # aider writes a chat history (markdown), no trajectory Harbor converts to ATIF
    assert result.atif == "none"
    assert (out.trial_dir / "agent" / "aider.chat.history.md").is_file()
