"""Token-in continuation against the real reference engine: at T=1.3, with tool calls, every
conversation is one agent sequence and every spliced turn carries its parent verbatim (slow)."""

from __future__ import annotations

import pytest

from rollwire.capture.certify import validate_llm
from rollwire.capture.parity import run_parity

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def test_the_reference_engine_takes_a_token_prompt(engine_url):
    cert = await validate_llm(engine_url, probe_tools=False)
    assert cert.token_in and cert.token_in_reason is None
    # its chat route takes kv_transfer_params; its completions route a token prompt; it has no
    # SGLang input_ids (it renders the messages instead, which the probe sees in the echo)
    assert cert.token_in_paths == ["vllm_chat", "completions"]
    # its chat route writes hermes tool calls; rollwire's parser reads them as it does
    assert cert.tool_parser == "hermes"


@pytest.mark.parametrize(("path", "seed"), [("vllm_chat", 0), ("vllm_chat", 1), ("completions", 0)])
async def test_tool_conversations_at_t13_stay_one_sequence(engine_url, path, seed):
    report = await run_parity(
        engine_url,
        temperature=1.3,
        turns=4,
        seed=seed,
        rescore_tokens=False,
        token_in_path=path,
    )
    doc = report.document
    assert doc is not None, report.findings
    stats = doc.stats
    assert stats.roots == 1 and stats.retokenized == 0 and stats.trainable_sequences == 1
    # the first call carries a tool exchange nobody sampled; the rest splice
    assert stats.token_in == {"fallback:assistant_not_sampled": 1, "spliced": stats.turns - 1}
    assert {t.token_in_path for t in doc.turns if t.token_in_mode == "spliced"} == {path}
    turns = {t.node_id: t for t in doc.turns}
    for turn in doc.turns:
        if turn.token_in_mode == "spliced":
            parent = turns[turn.parent_call_id]
            carried = parent.prompt_token_ids + parent.completion_token_ids
            assert turn.prompt_token_ids[: len(carried)] == carried
