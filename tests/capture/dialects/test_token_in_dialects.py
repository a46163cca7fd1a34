"""Token-in continuation behind another dialect: a codex-style Responses conversation whose
template re-renders tool calls differently from what was sampled fragments with token-in off
and stays one sequence, spliced, with it on; the client sees the same shapes either way."""

from __future__ import annotations

from typing import Any

import pytest

from tests.capture.conftest import start_proxy
from tests.capture.dialects.test_responses import _codex_turn


def conversation(proxy_url: str, sid: str) -> list[list[str]]:
    import openai

    client = openai.OpenAI(base_url=f"{proxy_url}/v1", api_key=sid, max_retries=0)
    items: list[dict[str, Any]] = [{"role": "user", "content": "weather in two cities?"}]
    kinds = []
    for question in ("and tomorrow?", None):
        while True:
            response = _codex_turn(client, items)
            kinds.append([o.type for o in response.output])
            items += [o.model_dump(exclude_none=True) for o in response.output]
            calls = [o for o in response.output if o.type == "function_call"]
            if not calls:
                break
            for call in calls:
                items.append(
                    {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
                )
        if question:
            items.append({"role": "user", "content": question})
    return kinds


@pytest.mark.parametrize("token_in", ["off", "auto"])
def test_a_codex_conversation_through_a_rerendering_template(upstream, token_in):
    upstream.fake.behavior.update(tool_call_every_turn=True, drop_tool_calls_in_history=True)
    _, server = start_proxy(f"{upstream.url}/v1", token_in=token_in)
    with server as url:
        import httpx

        sid = httpx.post(f"{url}/sessions").json()["session_id"]
        kinds = conversation(url, sid)
        doc = httpx.get(f"{url}/sessions/{sid}/rollout").json()
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
