"""Export: sequences a trainer can use as-is, per-turn records, roles and findings."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollwire.capture.export import Role, export_rollout
from rollwire.capture.findings import Level
from rollwire.capture.rollout import CaptureLevel, RolloutGraph, Turn


def turn(
    node_id: str, prompt: list[int], sampled: list[int], *, logprobs: bool = True, aux: bool = False
) -> Turn:
    lps = np.linspace(-0.1, -2.0, len(sampled)) if logprobs else None
    return Turn(
        node_id=node_id,
        prompt_ids=np.array(prompt),
        sampled_ids=np.array(sampled),
        sampled_logprobs=lps,
        auxiliary=aux,
    )


def build(*turns: Turn, level: CaptureLevel = CaptureLevel.TOKENS) -> RolloutGraph:
    g = RolloutGraph(level)
    for t in turns:
        g.add(t)
    return g


def records(doc):
    return {r.node_id: r for r in doc.turns}


def test_linear_rollout_is_one_trainable_sequence_with_sampled_tokens_unmasked():
    doc = export_rollout(build(turn("t1", [1, 2], [3, 4]), turn("t2", [1, 2, 3, 4, 5], [6])))
    (seq,) = doc.sequences
    assert seq.trainable and seq.role is Role.AGENT
    assert seq.input_ids == [1, 2, 3, 4, 5, 6]
    assert seq.loss_mask == [0, 0, 1, 1, 0, 1]
    assert [(s.start, s.end) for s in seq.turn_spans] == [(2, 4), (5, 6)]
    assert doc.stats.trainable_tokens == 3


def test_sequence_logprobs_align_with_the_engine_values():
    t1 = turn("t1", [1, 2], [3, 4])
    doc = export_rollout(build(t1))
    (seq,) = doc.sequences
    assert seq.logprobs[2:] == t1.sampled_logprobs.tolist()
    assert seq.logprobs[:2] == [0.0, 0.0]


def test_every_turn_record_carries_its_full_prompt_ids():
    doc = export_rollout(
        build(
            turn("t1", [1, 2], [3]),
            turn("t2", [1, 2, 3, 9], [4]),
            turn("t3", [1, 2, 3, 9, 4, 8], [5]),
        )
    )
    recs = records(doc)
    assert recs["t2"].prompt_token_ids == [1, 2, 3, 9]
    assert recs["t3"].prompt_token_ids == [1, 2, 3, 9, 4, 8]


def test_masked_turn_record_is_untrainable_not_zero_filled():
    doc = export_rollout(
        build(turn("t1", [1], [2, 3], logprobs=False), turn("t2", [1, 2, 3, 4], [5]))
    )
    rec = records(doc)["t1"]
    assert rec.trainable is False and rec.logprobs is None
    assert rec.completion_token_ids == [2, 3]  # ids stay: they are context
    (seq,) = doc.sequences
    assert seq.loss_mask == [0, 0, 0, 0, 1]


def test_retried_first_call_leaves_abandoned_root_discarded():
    doc = export_rollout(
        build(turn("t1", [1, 2], [7]), turn("t2", [1, 2], [3]), turn("t3", [1, 2, 3, 4], [5]))
    )
    recs = records(doc)
    assert recs["t1"].role is Role.DISCARDED and not recs["t1"].trainable
    assert recs["t2"].role is Role.AGENT
    assert doc.stats.discarded == 1 and doc.stats.trainable_sequences == 1
    discarded = next(s for s in doc.sequences if s.sequence_id == "t1")
    assert not discarded.trainable and set(discarded.loss_mask) == {0}


def test_childless_sibling_of_branch_that_went_on_is_discarded():
    doc = export_rollout(
        build(
            turn("t1", [1], [2]),
            turn("t2", [1, 2, 3], [4]),
            turn("t3", [1, 2, 3], [5]),
            turn("t4", [1, 2, 3, 5, 6], [7]),
        )
    )
    assert records(doc)["t2"].role is Role.DISCARDED
    assert records(doc)["t3"].role is Role.AGENT


def test_retry_at_last_turn_keeps_the_later_attempt():
    doc = export_rollout(
        build(turn("t1", [1], [2]), turn("t2", [1, 2, 3], [4]), turn("t3", [1, 2, 3], [5]))
    )
    assert records(doc)["t2"].role is Role.DISCARDED
    assert records(doc)["t3"].role is Role.AGENT


def test_roots_with_different_prompts_are_all_agent_work():
    # A harness that rewrites its system prompt starts a second root: both are agent work.
    doc = export_rollout(
        build(turn("t1", [1, 2], [3]), turn("t2", [9, 2], [3]), turn("t3", [9, 2, 3, 4], [5]))
    )
    assert {s.sequence_id: s.role for s in doc.sequences} == {"t1": Role.AGENT, "t3": Role.AGENT}
    assert doc.stats.trainable_sequences == 2 and doc.stats.roots == 2


@pytest.mark.parametrize("aux_position", [0, 1])
def test_auxiliary_call_inside_agent_path_is_masked_at_token_level(aux_position):
    turns = [turn("t1", [1], [2]), turn("t2", [1, 2, 3], [4]), turn("t3", [1, 2, 3, 4, 5], [6])]
    turns[aux_position].auxiliary = True
    doc = export_rollout(build(*turns))
    (seq,) = doc.sequences
    aux_span = seq.turn_spans[aux_position]
    assert seq.role is Role.AGENT and seq.trainable
    assert seq.loss_mask[aux_span.start : aux_span.end] == [0] * (aux_span.end - aux_span.start)
    assert not aux_span.trainable
    assert records(doc)[f"t{aux_position + 1}"].role is Role.AUXILIARY


def test_path_of_only_auxiliary_calls_is_auxiliary():
    doc = export_rollout(build(turn("t1", [1], [2]), turn("a1", [8], [9], aux=True)))
    roles = {s.sequence_id: s.role for s in doc.sequences}
    assert roles == {"t1": Role.AGENT, "a1": Role.AUXILIARY}


def test_retokenized_turn_starts_new_sequence_and_is_counted():
    doc = export_rollout(
        build(turn("t1", [1, 2, 3], [40, 95, 2]), turn("t2", [1, 2, 3, 4015, 2, 198, 7], [5]))
    )
    assert doc.stats.retokenized == 1 and doc.stats.trainable_sequences == 2
    assert records(doc)["t2"].retokenized_from == "t1"
    assert records(doc)["t1"].role is Role.AGENT  # its sampled tokens are still trained
    assert any(f.code == "retokenized" and f.level is Level.WARN for f in doc.findings)


def test_rollout_with_no_calls_is_fatal():
    doc = export_rollout(build())
    assert any(f.code == "no_model_calls" and f.level is Level.FATAL for f in doc.findings)


def test_train_rollout_with_nothing_trainable_is_fatal():
    doc = export_rollout(build(turn("t1", [1], [2], logprobs=False)))
    assert any(f.code == "nothing_trainable" and f.level is Level.FATAL for f in doc.findings)


def test_text_tier_is_eval_and_never_trainable():
    g = RolloutGraph(CaptureLevel.TEXT)
    g.add(
        Turn(
            "t1",
            None,
            None,
            None,
            messages=[{"role": "user", "content": "hi"}],
            reply={"role": "assistant", "content": "yo"},
        )
    )
    doc = export_rollout(g)
    assert doc.rollout_type == "eval" and doc.stats.trainable_sequences == 0
    assert all(not s.trainable and s.input_ids == [] for s in doc.sequences)
    assert doc.sequences[0].messages[-1] == {"role": "assistant", "content": "yo"}


def _text_turn(node_id: str, messages: list[dict], reply: dict) -> Turn:
    return Turn(node_id, None, None, None, messages=messages, reply=reply)


def test_text_tier_links_by_message_prefix_with_system_prompt_aside():
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "f", "arguments": '{"a": 1, "b": 2}'},
    }
    first = [{"role": "system", "content": "v1"}, {"role": "user", "content": "go"}]
    reply = {"role": "assistant", "content": None, "tool_calls": [call]}
    resent = {
        **call,
        "function": {"name": "f", "arguments": '{"b":2,"a":1}'},
    }  # same args, other spelling
    second = [
        {"role": "system", "content": "v2, rewritten"},
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [resent]},
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
    ]
    g = RolloutGraph(CaptureLevel.TEXT)
    g.add(_text_turn("t1", first, reply))
    g.add(_text_turn("t2", second, {"role": "assistant", "content": "3"}))
    assert records(export_rollout(g))["t2"].parent_id == "t1"


# ---- properties ------------------------------------------------------------------------------


@st.composite
def trees(draw: st.DrawFn) -> list[Turn]:
    tokens = st.integers(0, 4)
    made: list[tuple[list[int], list[int]]] = []
    out: list[Turn] = []
    for i in range(draw(st.integers(1, 8))):
        if made and draw(st.booleans()):
            bp, bs = draw(st.sampled_from(made))
            prompt = bp + bs + draw(st.lists(tokens, max_size=3))
        else:
            prompt = draw(st.lists(tokens, min_size=1, max_size=4))
        sampled = draw(st.lists(tokens, min_size=1, max_size=3))
        made.append((prompt, sampled))
        out.append(
            turn(f"t{i}", prompt, sampled, logprobs=draw(st.booleans()), aux=draw(st.booleans()))
        )
    return out


def _fresh(t: Turn) -> Turn:
    return Turn(t.node_id, t.prompt_ids, t.sampled_ids, t.sampled_logprobs, auxiliary=t.auxiliary)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_any_arrival_order_yields_the_same_document(data):
    turns = data.draw(trees())
    order = data.draw(st.permutations(turns))
    a = export_rollout(build(*[_fresh(t) for t in turns])).model_dump(
        exclude={"turns": {"__all__": {"created_at"}}}
    )
    b = export_rollout(build(*[_fresh(t) for t in order])).model_dump(
        exclude={"turns": {"__all__": {"created_at"}}}
    )
    a["turns"].sort(key=lambda r: r["node_id"])
    b["turns"].sort(key=lambda r: r["node_id"])
    a["findings"].sort(key=str)
    b["findings"].sort(key=str)
    assert a == b


@settings(max_examples=150, deadline=None)
@given(turns=trees())
def test_sequences_are_aligned_and_masked_positions_carry_zero(turns):
    doc = export_rollout(build(*turns))
    for seq in doc.sequences:
        assert len(seq.input_ids) == len(seq.loss_mask) == len(seq.logprobs)
        for m, lp in zip(seq.loss_mask, seq.logprobs, strict=True):
            assert lp <= 0.0
            if m == 0:
                assert lp == 0.0
        assert sum(seq.loss_mask) == seq.n_trainable_tokens


def test_forced_positions_are_masked_and_listed():
    t = turn("t1", [1, 2], [3, 4, 5])
    t.sampled_logprobs = np.array([0.0, -0.5, 0.0])
    t.certain = t.sampled_logprobs == 0.0
    doc = export_rollout(build(t))
    (seq,) = doc.sequences
    assert seq.loss_mask == [0, 0, 0, 1, 0] and seq.n_trainable_tokens == 1
    assert records(doc)["t1"].constrained_positions == [0, 2]
