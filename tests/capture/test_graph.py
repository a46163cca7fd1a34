"""The prefix linker: longest exact token prefix, whatever the arrival order."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollwire.capture.graph import PrefixGraph, _PrefixKeys, prefix_hashes, tie_key


def _links(graph: PrefixGraph) -> dict[str, tuple[str | None, str | None]]:
    return {
        n.node_id: (
            n.prefix_parent.node_id if n.prefix_parent else None,
            n.anchor.node_id if n.anchor else None,
        )
        for n in graph
    }


def test_turn_links_to_node_whose_sequence_prefixes_its_prompt():
    g = PrefixGraph()
    g.add("a", [1, 2, 3], [4, 5])
    b = g.add("b", [1, 2, 3, 4, 5, 9], [7])
    assert b.parent is not None and b.parent.node_id == "a"


def test_longest_prefix_wins_over_shorter_ancestor():
    g = PrefixGraph()
    g.add("a", [1], [2])
    g.add("b", [1, 2, 3], [4])
    c = g.add("c", [1, 2, 3, 4, 5], [6])
    assert c.parent is not None and c.parent.node_id == "b"


def test_prompt_equal_to_parent_sequence_links():
    g = PrefixGraph()
    g.add("a", [1, 2], [3])
    b = g.add("b", [1, 2, 3], [4])
    assert b.parent is not None and b.parent.node_id == "a"


def test_late_ancestor_adopts_orphan():
    g = PrefixGraph()
    late = g.add("t3", [1, 2, 3, 4, 5, 6], [7])
    assert late.parent is None
    g.add("t2", [1, 2, 3], [4, 5])
    assert late.parent is not None and late.parent.node_id == "t2"


def test_late_middle_turn_is_inserted_between_parent_and_child():
    g = PrefixGraph()
    g.add("t1", [1], [2])
    t3 = g.add("t3", [1, 2, 3, 4, 5], [6])
    assert t3.parent is not None and t3.parent.node_id == "t1"
    g.add("t2", [1, 2, 3], [4])
    assert t3.parent is not None and t3.parent.node_id == "t2"


def test_same_prompt_calls_are_siblings_not_parent_and_child():
    g = PrefixGraph()
    a = g.add("a", [1, 2], [])
    b = g.add("b", [1, 2], [])
    assert a.parent is None and b.parent is None


def test_retokenized_reply_starts_new_root_and_records_source():
    g = PrefixGraph()
    g.add("t1", [1, 2, 3], [40, 95, 2])  # sampled 'hyp' + 'o'
    t2 = g.add("t2", [1, 2, 3, 4015, 2, 198, 1, 7], [5])  # re-rendered as 'hypo'
    assert t2.parent is None
    assert t2.anchor is not None and t2.anchor.node_id == "t1"


def test_retokenized_detection_is_order_independent():
    g = PrefixGraph()
    t2 = g.add("t2", [1, 2, 3, 4015, 2, 198, 1, 7], [5])
    assert t2.anchor is None
    g.add("t1", [1, 2, 3], [40, 95, 2])
    assert t2.anchor is not None and t2.anchor.node_id == "t1"


def test_duplicate_sequences_break_ties_by_smallest_id():
    g = PrefixGraph()
    g.add("t2", [1], [2])
    child = g.add("t9", [1, 2, 3], [4])
    g.add("t10", [1], [2])
    g.add("t1", [1], [2])
    assert child.parent is not None and child.parent.node_id == "t1"


def test_tie_key_orders_numbered_ids_naturally():
    assert tie_key("t9") < tie_key("t10")


def test_prefix_hashes_differ_for_permuted_ids():
    a = prefix_hashes(np.array([1, 2, 3]))
    b = prefix_hashes(np.array([3, 2, 1]))
    assert a[-1] != b[-1]


def test_adding_same_node_id_twice_is_refused():
    g = PrefixGraph()
    g.add("a", [1], [2])
    with pytest.raises(ValueError, match="'a'"):
        g.add("a", [1], [2])


def test_many_roots_with_shared_prefix_are_adopted_by_late_common_ancestor():
    g = PrefixGraph()
    head = list(range(100, 140))
    kids = [g.add(f"k{i}", [*head, 7, i], [9]) for i in range(5)]
    g.add("p", head[:-1], [head[-1], 7])
    assert all(k.parent is not None and k.parent.node_id == "p" for k in kids)


# ---- property tests: a brute-force reference of the declared rule ------------------------------


def _reference(
    turns: list[tuple[str, list[int], list[int]]],
) -> dict[str, tuple[str | None, str | None]]:
    out: dict[str, tuple[str | None, str | None]] = {}
    for nid, prompt, _ in turns:
        best, best_len = None, 0
        for oid, op, os_ in turns:
            seq = op + os_
            if oid == nid or len(op) >= len(prompt) or prompt[: len(seq)] != seq:
                continue
            if (
                best is None
                or len(seq) > best_len
                or (len(seq) == best_len and tie_key(oid) < tie_key(best))
            ):
                best, best_len = oid, len(seq)
        anchor, anchor_len = None, 0
        for oid, op, _ in turns:
            if oid == nid or not (best_len < len(op) < len(prompt)) or prompt[: len(op)] != op:
                continue
            if (
                anchor is None
                or len(op) > anchor_len
                or (len(op) == anchor_len and tie_key(oid) < tie_key(anchor))
            ):
                anchor, anchor_len = oid, len(op)
        out[nid] = (best, anchor)
    return out


@st.composite
def rollouts(draw: st.DrawFn) -> list[tuple[str, list[int], list[int]]]:
    tokens = st.integers(0, 3)  # a tiny alphabet forces coincidental prefixes and ties
    turns: list[tuple[str, list[int], list[int]]] = []
    for i in range(draw(st.integers(1, 9))):
        kind = draw(st.sampled_from(["root", "extend", "retry", "retokenize"]))
        if kind == "root" or not turns:
            prompt = draw(st.lists(tokens, min_size=1, max_size=5))
        else:
            _, bp, bs = draw(st.sampled_from(turns))
            if kind == "extend":
                prompt = bp + bs + draw(st.lists(tokens, max_size=3))
            elif kind == "retry":
                prompt = list(bp)
            else:
                prompt = bp + draw(st.lists(tokens, min_size=1, max_size=4))
        turns.append((f"t{i}", prompt, draw(st.lists(tokens, min_size=1, max_size=3))))
    return turns


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_links_match_reference_in_any_arrival_order(data: st.DataObject):
    turns = data.draw(rollouts())
    order = data.draw(st.permutations(turns))
    g = PrefixGraph()
    for nid, prompt, sampled in order:
        g.add(nid, prompt, sampled)
    assert _links(g) == _reference(turns)


@settings(max_examples=100, deadline=None)
@given(turns=rollouts())
def test_effective_parents_form_a_forest(turns):
    g = PrefixGraph()
    for nid, prompt, sampled in turns:
        g.add(nid, prompt, sampled)
    for node in g:
        seen = set()
        cur = node
        while cur is not None:
            assert cur.node_id not in seen
            seen.add(cur.node_id)
            cur = cur.parent


# ---- the hint: hashing starts at the latest node or an ancestor known to prefix the prompt ------


def test_prompt_diverging_at_the_last_token_of_the_latest_sequence_is_not_its_child():
    rng = np.random.default_rng(0)
    head = rng.integers(100, 49_152, 131_072).tolist()
    g = PrefixGraph()
    g.add("a", head[:1000], head[1000:1064])
    b = g.add("b", head[:-64], head[-64:])
    diverged = [*head[:-1], head[-1] + 1, 5, 6]
    c = g.add("c", diverged, [7])
    assert c.prefix_parent is not None and c.prefix_parent.node_id == "a"
    assert c.anchor is b  # it starts with b's prompt: b's reply re-tokenised, a fresh root
    d = g.add("d", [*head, 5, 6], [7])
    assert d.parent is b


def test_a_longer_parent_off_the_latest_nodes_ancestry_still_wins():
    g = PrefixGraph()
    g.add("a", [1, 2], [3])
    g.add("b", [1, 2, 3, 4], [5])
    g.add("x", [1, 2, 3, 7], [8])  # latest: its ancestor "a" is the hint, "b" is longer
    d = g.add("d", [1, 2, 3, 4, 5, 6], [9])
    assert d.parent is not None and d.parent.node_id == "b"


def test_keys_equal_the_full_prefix_hashes_whatever_the_hint():
    rng = np.random.default_rng(1)
    seq = rng.integers(0, 50, 400).tolist()
    g = PrefixGraph()
    for i, n_p in enumerate([10, 60, 61, 200, 150, 390, 30]):
        node = g.add(f"t{i}", seq[:n_p], seq[n_p : n_p + 5])
        full = prefix_hashes(node.sequence())
        assert node.seq_key == int(full[-1])
        assert node.prompt_key == int(full[n_p - 1])


@st.composite
def long_rollouts(draw: st.DrawFn) -> list[tuple[str, list[int], list[int]]]:
    """Branching chains with long shared prefixes, so hints are found, wrong, or too short."""
    tokens = st.integers(0, 2)
    turns: list[tuple[str, list[int], list[int]]] = []
    for i in range(draw(st.integers(1, 14))):
        if not turns or draw(st.integers(0, 5)) == 0:
            prompt = draw(st.lists(tokens, min_size=1, max_size=30))
        else:
            _, bp, bs = turns[draw(st.integers(max(0, len(turns) - 3), len(turns) - 1))]
            base = bp + bs
            cut = draw(st.integers(max(1, len(base) - 3), len(base)))
            prompt = base[:cut] + draw(st.lists(tokens, max_size=4))
        turns.append((f"t{i}", prompt, draw(st.lists(tokens, min_size=1, max_size=3))))
    return turns


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_long_rollouts_link_as_the_reference_in_any_arrival_order(data: st.DataObject):
    turns = data.draw(long_rollouts())
    for order in (turns, data.draw(st.permutations(turns))):  # in order, hints are found most
        g = PrefixGraph()
        for nid, prompt, sampled in order:
            g.add(nid, prompt, sampled)
        assert _links(g) == _reference(turns)
        for node in g:
            full = prefix_hashes(node.sequence())
            assert node.seq_key == int(full[-1])
            assert node.prompt_key == int(full[len(node.prompt) - 1])


def test_prefix_keys_below_the_hint_are_hashed_when_asked_for():
    g = PrefixGraph()
    hint = g.add("h", [5, 6, 7], [8])
    node = g.add("n", [5, 6, 7, 8, 9, 5], [6])
    full = [0, *prefix_hashes(node.sequence()).tolist()]
    keys = _PrefixKeys(node, hint)
    index = {full[n]: [] for n in (2, 4, 6)}
    assert list(keys.lengths_in(index, 1, 7)) == [6, 4, 2]  # crosses the hint at 4
    assert [keys(n) for n in range(8)] == full
