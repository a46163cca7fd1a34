"""Token-in continuation behind another dialect: a codex-style Responses conversation whose
template re-renders tool calls differently from what was sampled fragments with token-in off
and stays one sequence, spliced, with it on; the client sees the same shapes either way."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.capture.conftest import ADMIN, start_proxy
from tests.capture.dialects.test_responses import codex_conversation


@pytest.mark.parametrize("token_in", ["off", "auto"])
def test_a_codex_conversation_through_a_rerendering_template(upstream, token_in):
    upstream.fake.behavior.update(tool_call_every_turn=True, drop_tool_calls_in_history=True)
    _, server = start_proxy(f"{upstream.url}/v1", token_in=token_in)
    with server as url:
        sid = httpx.post(f"{url}/sessions", headers=ADMIN).json()["session_id"]
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=sid, max_retries=0)
        kinds = codex_conversation(client)
        doc = httpx.get(f"{url}/sessions/{sid}/rollout", headers=ADMIN).json()
    assert kinds == [["function_call"], ["message"], ["function_call"], ["message"]]
    stats = doc["stats"]
    if token_in == "off":
        assert stats["roots"] > 1  # the re-rendered tool calls broke the prefix
        return
    assert stats["roots"] == 1 and stats["trainable_sequences"] == 1 and stats["retokenized"] == 0
    assert stats["token_in"] == {"rendered": 1, "spliced": 3}
    by_id = {t["node_id"]: t for t in doc["turns"]}
    for turn in doc["turns"][1:]:
        parent = by_id[turn["parent_call_id"]]
        carried = parent["prompt_token_ids"] + parent["completion_token_ids"]
        assert turn["prompt_token_ids"][: turn["carried_len"]] == carried
