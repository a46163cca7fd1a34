"""opencode (npm ``opencode-ai``) in the ``local`` sandbox, through the capture proxy.

Harbor's wrapper hands opencode the model ``openai/<model>`` and writes the proxy's URL into
``~/.config/opencode/opencode.json`` (``provider.openai.options.baseURL``). opencode's ``openai``
provider always calls ``sdk.responses(model)``, so it speaks the Responses API, not chat
completions (an ``@ai-sdk/openai-compatible`` npm override of that provider fails with
``Z.responses is not a function``). The seam turns off its title agent (a second conversation the
reward says nothing about) and its models.dev fetch (no network).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rollwire.harnesses.harbor.installs import PACKAGES
from tests.fakes.vllm import tool_call_text
from tests.harbor.helpers import run_count_errors

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SOLVE = 'grep -c ERROR "$LOG_FILE" > /app/error_count.txt'


async def test_opencode_solves_count_errors_through_the_responses_dialect(proxy, fake, tmp_path):
    """The scripted policy calls opencode's ``bash`` tool once (the fake parses the hermes
    ``<tool_call>`` text into ``tool_calls``, as vLLM does), then answers; both calls are captured
    in the responses dialect, link into one sequence, and match opencode's ATIF trajectory."""
    fake.behavior.scripted_replies = [
        tool_call_text("bash", {"command": SOLVE}),
        "Done.",
    ]
    out = await run_count_errors("opencode", proxy, tmp_path)
    result = out.result
    assert result.ok, result.error
    # the real agent ran: its own log names its version, its JSON stream shows the tool call
    assert result.trial_dir is not None
    agent_dir = Path(result.trial_dir) / "agent"
    (own_log,) = agent_dir.glob("opencode/xdg-data/opencode/log/*.log")
    log = own_log.read_text()
    assert f"version={PACKAGES['opencode'].version}" in log
    assert "Failed to fetch models.dev" not in log  # OPENCODE_DISABLE_MODELS_FETCH reached it
    stream = (agent_dir / "opencode.txt").read_text()
    assert '"type":"tool_use"' in stream and SOLVE.replace('"', '\\"') in stream
    assert fake.stats["ok"] == 2  # no title call: its title agent is off
    assert result.reward == 1.0
    assert result.atif == "match"
    doc = out.document
    assert doc is not None and {t.dialect for t in doc.turns} == {"responses"}
    stats = doc.stats
    assert stats.turns == 2 and stats.roots == 1 and stats.retokenized == 0
    assert stats.trainable_sequences == 1
