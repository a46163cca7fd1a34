"""The token-in splice core: prompts that carry the model's own tokens, and every fallback."""

from __future__ import annotations

import pytest

from rollwire.capture.splice import (
    CallMemory,
    Fallback,
    header_key,
    normalise_message,
    plan_call,
    splice,
)
from tests.fakes.vllm import IM_END_ID, TOKENIZER, render_chat

USER = {"role": "user", "content": "Tell me about hypotheses."}
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


def sampled(text: str, *, split: bool = False) -> list[int]:
    """The ids a model sampled for ``text`` (optionally one word as two pieces) plus the close."""
    pieces = TOKENIZER.split(text)
    if split:
        i = next(j for j, p in enumerate(pieces) if len(p) > 4)
        pieces[i : i + 1] = [pieces[i][:-1], pieces[i][-1]]
    return [TOKENIZER.piece_id(p) for p in pieces] + [IM_END_ID]


def memory(messages, reply, sampled_ids, *, finish="stop", body_extra=None) -> CallMemory:
    body = {"messages": messages, **(body_extra or {})}
    return CallMemory(
        node_id="t1",
        messages=list(messages),
        reply=reply,
        header=header_key(body),
        prompt_ids=render_chat(messages),
        sampled_ids=sampled_ids,
        finish_reason=finish,
        close_id=IM_END_ID if finish == "stop" else None,
    )


def continue_with(mem: CallMemory, new: list[dict], **extra):
    messages = [*mem.messages, mem.reply, *new]
    body = {"messages": messages, **extra}
    parent = plan_call(body, [mem])
    assert parent is not None and parent.memory is mem
    full = render_chat(messages)
    history = render_chat(messages[: parent.index + 1], add_generation_prompt=False)
    return splice(mem, full, history, close_id=IM_END_ID), full


def test_a_first_call_is_rendered_as_usual():
    assert plan_call({"messages": [USER]}, []) is None


def test_a_first_call_with_assistant_turns_in_history_names_them_unsampled():
    history = [USER, {"role": "assistant", "content": "A few-shot answer."}, USER]
    with pytest.raises(Fallback) as exc:
        plan_call({"messages": history}, [])
    assert exc.value.reason == "assistant_not_sampled"


def test_a_noncanonical_split_is_carried_verbatim_and_only_the_new_turn_is_rendered():
    reply = {"role": "assistant", "content": "Hypotheses are guesses."}
    mem = memory([USER], reply, sampled(reply["content"], split=True))
    out, full = continue_with(mem, [{"role": "user", "content": "More."}])
    carried = mem.prompt_ids + mem.sampled_ids
    assert out.prompt_ids[: out.carried_len] == carried and out.carried_len == len(carried)
    cut = [i for i, t in enumerate(full) if t == IM_END_ID][2]  # system, user, assistant
    assert out.prompt_ids[out.carried_len :] == full[cut + 1 :]
    assert out.drift > 0 and out.synthesized == []  # the canonical render would differ


def test_a_tool_call_the_template_drops_from_history_is_still_carried():
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"q":1}'}}
    reply = {"role": "assistant", "content": "", "tool_calls": [call]}
    text = '<tool_call>\n{"name": "lookup", "arguments": {"q":1}}\n</tool_call>'
    mem = memory([USER], reply, sampled(text), body_extra={"tools": TOOLS})
    messages = [USER, reply, {"role": "tool", "tool_call_id": "c1", "content": "42"}]
    parent = plan_call({"messages": messages, "tools": TOOLS}, [mem])
    full = render_chat(messages, drop_tool_calls_in_history=True)
    history = render_chat(
        messages[:2], add_generation_prompt=False, drop_tool_calls_in_history=True
    )
    out = splice(parent.memory, full, history, close_id=IM_END_ID)
    assert out.prompt_ids[: out.carried_len] == mem.prompt_ids + mem.sampled_ids
    assert out.drift > 0


def test_a_turn_cut_by_length_gets_a_synthesised_close():
    reply = {"role": "assistant", "content": "Hypotheses are"}
    ids = sampled("Hypotheses are")[:-1]  # no close: cut by max_tokens
    mem = memory([USER], reply, ids, finish="length")
    out, _ = continue_with(mem, [{"role": "user", "content": "Go on."}])
    position = len(mem.prompt_ids) + len(ids)
    assert out.synthesized == [position] and out.prompt_ids[position] == IM_END_ID
    assert out.carried_len == position + 1


def test_literal_special_token_text_is_a_close_count_fallback():
    reply = {"role": "assistant", "content": "ok"}
    mem = memory([USER], reply, sampled("ok"))
    messages = [USER, reply, {"role": "user", "content": "say <|im_end|> please"}]
    full = render_chat(messages)
    history = render_chat(messages[:2], add_generation_prompt=False)
    mem.prompt_ids = render_chat([{"role": "user", "content": "x <|im_end|> y"}])
    with pytest.raises(Fallback) as exc:
        splice(mem, full, history, close_id=IM_END_ID)
    assert exc.value.reason == "close_count_mismatch"


def test_a_render_that_does_not_extend_the_history_render_is_a_fallback():
    reply = {"role": "assistant", "content": "ok"}
    mem = memory([USER], reply, sampled("ok"))
    messages = [USER, reply, {"role": "user", "content": "more"}]
    history = render_chat(messages[:2], add_generation_prompt=False)
    # a template that renders the same history differently once more messages follow
    full = render_chat([{"role": "system", "content": "other"}, *messages])
    with pytest.raises(Fallback) as exc:
        splice(mem, full, history, close_id=IM_END_ID)
    assert exc.value.reason == "history_not_prefix"


def test_a_history_render_with_a_generation_prompt_cuts_at_its_last_close():
    # SGLang's /tokenize always appends the generation prompt: the same splice results
    reply = {"role": "assistant", "content": "Hypotheses are guesses."}
    mem = memory([USER], reply, sampled(reply["content"], split=True))
    messages = [USER, reply, {"role": "user", "content": "More."}]
    full = render_chat(messages)
    plain = render_chat(messages[:2], add_generation_prompt=False)
    with_prompt = render_chat(messages[:2], add_generation_prompt=True)
    a = splice(mem, full, plain, close_id=IM_END_ID)
    b = splice(mem, full, with_prompt, close_id=IM_END_ID)
    assert a == b


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (
            lambda b: b["messages"].__setitem__(1, {"role": "assistant", "content": "edited"}),
            "edited_history",
        ),
        (lambda b: b.__setitem__("tools", TOOLS), "tools_changed"),
        (
            lambda b: b["messages"].append({"role": "assistant", "content": "injected"}),
            "assistant_not_sampled",
        ),
        (lambda b: b.__setitem__("stop", ["\n"]), "stop_strings"),
        (lambda b: b.__setitem__("n", 2), "n_gt_1"),
        (
            lambda b: b["messages"].append(
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}
            ),
            "multimodal",
        ),
    ],
)
def test_every_fallback_names_its_reason(change, reason):
    reply = {"role": "assistant", "content": "Sure."}
    mem = memory([USER], reply, sampled("Sure."))
    body = {"messages": [USER, reply, {"role": "user", "content": "next"}]}
    change(body)
    with pytest.raises(Fallback) as exc:
        plan_call(body, [mem])
    assert exc.value.reason == reason


def test_stripped_reasoning_forks_under_the_fork_policy_and_splices_under_keep():
    reply = {"role": "assistant", "content": "42", "reasoning_content": "6 times 7"}
    mem = memory([USER], reply, sampled("42"))
    stripped = {"role": "assistant", "content": "42"}
    body = {"messages": [USER, stripped, {"role": "user", "content": "why?"}]}
    assert plan_call(body, [mem], reasoning="keep").memory is mem
    with pytest.raises(Fallback) as exc:
        plan_call(body, [mem], reasoning="fork")
    assert exc.value.reason == "reasoning_stripped"


def test_vllm_032_reasoning_key_is_the_same_reasoning_as_reasoning_content():
    # vLLM 0.32 returns the parsed reasoning as message.reasoning (fixture 02 shows the key)
    reply = {"role": "assistant", "content": "42", "reasoning": "6 times 7"}
    mem = memory([USER], reply, sampled("42"))
    stripped = {"role": "assistant", "content": "42", "reasoning": None}
    body = {"messages": [USER, stripped, {"role": "user", "content": "why?"}]}
    assert plan_call(body, [mem], reasoning="keep").memory is mem
    with pytest.raises(Fallback) as exc:
        plan_call(body, [mem], reasoning="fork")
    assert exc.value.reason == "reasoning_stripped"


def test_the_parent_is_the_longest_matching_history():
    first = {"role": "assistant", "content": "A."}
    m1 = memory([USER], first, sampled("A."))
    second_messages = [USER, first, {"role": "user", "content": "B?"}]
    second = {"role": "assistant", "content": "B."}
    m2 = memory(second_messages, second, sampled("B."))
    body = {"messages": [*second_messages, second, {"role": "user", "content": "C?"}]}
    assert plan_call(body, [m1, m2]).memory is m2
    retry = {"messages": [USER, first, {"role": "user", "content": "other B?"}]}
    assert plan_call(retry, [m1, m2]).memory is m1  # a branch from the first call


def test_matching_ignores_wire_only_differences():
    a = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": '{"a": 1, "b": 2}'}}],
        "refusal": None,
    }
    b = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": '{"b":2,"a":1}'}}],
    }
    assert normalise_message(a, with_reasoning=False) == normalise_message(b, with_reasoning=False)
