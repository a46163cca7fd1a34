"""HERMES_CHATML through transformers renders exactly what the llama.cpp reference engine renders,
and marks exactly the sampled part of each assistant turn for assistant_only_loss."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollwire.capture.dialects.hermes import call_text
from rollwire.engine.template import HERMES_CHATML, hf_messages

pytestmark = pytest.mark.slow  # the llama.cpp model and the converted folder's tokenizer

TEXT = st.lists(
    st.characters(blacklist_categories=("Cs",), max_codepoint=0x1F600)
    | st.sampled_from(["\n", " ", '"', "\\", "é", "日本", "<tool_call>", "{", "}", "\u2028"]),
    max_size=12,
).map("".join)
JSON_VALUE = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)
ARGUMENTS = st.dictionaries(TEXT, JSON_VALUE, max_size=4)
NAME = st.text(
    st.characters(categories=("L", "N"), include_characters="_-é"), min_size=1, max_size=12
)


def content(text: st.SearchStrategy[str] = TEXT) -> st.SearchStrategy[Any]:
    """A string, or (Hugging Face / OpenAI multimodal shape) a list of text parts."""
    parts = st.lists(st.builds(lambda t: {"type": "text", "text": t}, text), max_size=3)
    return text | parts


@st.composite
def calls(draw: st.DrawFn, *, canonical: bool) -> list[dict[str, Any]]:
    """Tool calls with arguments as a dict (HF) or a JSON string (OpenAI). ``canonical``: the
    string is json.dumps output (the template writes strings verbatim); else any spacing,
    raw non-ASCII, or not JSON at all (what hf_messages normalises)."""
    out = []
    for i in range(draw(st.integers(0, 2))):
        args: Any = draw(ARGUMENTS)
        form = draw(st.sampled_from(["dict", "str"] if canonical else ["dict", "str", "odd"]))
        if form == "str":
            args = json.dumps(args)
        elif form == "odd":
            args = draw(
                st.sampled_from(
                    [
                        json.dumps(args, separators=(",", ":"), ensure_ascii=False),
                        json.dumps(args, indent=1),
                        "not json",
                        "",
                        '"a string"',
                        "42",
                    ]
                )
            )
        out.append(
            {"id": f"c{i}", "type": "function", "function": {"name": draw(NAME), "arguments": args}}
        )
    return out


@st.composite
def conversations(draw: st.DrawFn, *, canonical: bool = True) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(content())})
    for _ in range(draw(st.integers(1, 5))):
        role = draw(st.sampled_from(["user", "assistant", "tool"]))
        if role == "assistant":
            message: dict[str, Any] = {"role": role}
            made = draw(calls(canonical=canonical))
            body = draw(st.none() | content())
            if body is not None or not made or draw(st.booleans()):
                message["content"] = body  # None, "", text or parts
            if made:
                message["tool_calls"] = made
            messages.append(message)
        elif role == "tool":
            messages.append({"role": role, "tool_call_id": "c0", "content": draw(content())})
        else:
            messages.append({"role": role, "content": draw(content())})
    return messages


TOOLS = st.none() | st.lists(
    st.builds(
        lambda name, description, props: {
            "type": "function",
            "function": {
                "name": name,
                "description": description,
                "parameters": {"type": "object", "properties": props},
            },
        },
        NAME,
        TEXT,
        st.dictionaries(NAME, st.fixed_dictionaries({"type": st.sampled_from(["string", "x"])})),
    ),
    min_size=1,
    max_size=2,
)


def reference(model: Any, messages: list[dict[str, Any]], tools: Any, prompt: bool) -> str:
    return model.render(messages, tools, add_generation_prompt=prompt)


@settings(max_examples=300, deadline=None)
@given(messages=conversations(), tools=TOOLS, prompt=st.booleans())
def test_template_renders_what_the_reference_engine_renders(
    hf_tokenizer, reference_model, messages, tools, prompt
):
    assert hf_tokenizer.chat_template == HERMES_CHATML
    ours = hf_tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=prompt, tokenize=False
    )
    assert ours == reference(reference_model, messages, tools, prompt)


@settings(max_examples=150, deadline=None)
@given(messages=conversations(canonical=False), tools=TOOLS, prompt=st.booleans())
def test_any_argument_string_renders_exactly_after_hf_messages(
    hf_tokenizer, reference_model, messages, tools, prompt
):
    ours = hf_tokenizer.apply_chat_template(
        hf_messages(messages), tools=tools, add_generation_prompt=prompt, tokenize=False
    )
    assert ours == reference(reference_model, messages, tools, prompt)


def test_a_non_canonical_string_is_written_verbatim_without_hf_messages(hf_tokenizer):
    # the documented limit: jinja cannot re-serialise JSON text
    messages = [
        {"role": "user", "content": "x"},
        {
            "role": "assistant",
            "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}],
        },
    ]
    raw = hf_tokenizer.apply_chat_template(messages, tokenize=False)
    assert '"arguments": {"a":1}}' in raw
    fixed = hf_tokenizer.apply_chat_template(hf_messages(messages), tokenize=False)
    assert call_text("f", '{"a":1}') in fixed


def test_trl_accepts_the_template_for_assistant_only_loss_and_tools(hf_tokenizer):
    from trl.chat_template_utils import (
        get_training_chat_template,
        has_generation_markers,
        is_chat_template_prefix_preserving,
        is_chat_template_stop_token_trained,
        supports_tool_calling,
    )

    assert has_generation_markers(hf_tokenizer.chat_template)
    assert is_chat_template_stop_token_trained(hf_tokenizer)  # the model learns to stop
    assert is_chat_template_prefix_preserving(hf_tokenizer)
    assert get_training_chat_template(hf_tokenizer) is None  # SFTTrainer keeps it as it is
    assert supports_tool_calling(hf_tokenizer)


def test_mask_covers_content_calls_and_eos_only(hf_tokenizer):
    call = {
        "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Zürich"}},
    }
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [call]},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny."},
    ]
    out = hf_tokenizer.apply_chat_template(
        messages, return_assistant_tokens_mask=True, return_dict=True
    )
    ids, mask = out["input_ids"], out["assistant_masks"]
    spans: list[list[int]] = []
    for k, (i, m) in enumerate(zip(ids, mask, strict=True)):
        if m and (k == 0 or not mask[k - 1]):
            spans.append([])
        if m:
            spans[-1].append(i)
    decode = lambda s: hf_tokenizer.decode(s, skip_special_tokens=False)  # noqa: E731
    assert [decode(s) for s in spans] == [
        "Checking.\n" + call_text("get_weather", {"city": "Zürich"}) + "<|im_end|>",
        "It is sunny.<|im_end|>",
    ]
    # the generation prompt the engine samples after is exactly what precedes each span
    for span in spans:
        start = next(k for k in range(len(ids)) if ids[k : k + len(span)] == span)
        end = start + len(span)
        assert decode(ids[:start]).endswith("<|im_end|>\n<|im_start|>assistant\n")
        assert decode(ids[end : end + 1]) == "\n" and not mask[end] and not mask[start - 1]
