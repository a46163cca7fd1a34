"""Engine ids on ingest: a list of plain non-negative ints or nothing, however long the list.

The conversion takes a one-pass fast path (marshal's records) for plain lists; these tests pin
that it refuses exactly what the per-element check refuses, wherever the odd element sits.
"""

from __future__ import annotations

import enum
import marshal
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollwire.capture.graph import plain_int_ids
from rollwire.capture.ingest import engine_ids
from rollwire.capture.rollout import ids_array


class Color(enum.IntEnum):
    RED = 7


class MyInt(int):
    pass


def _reference(value: Any) -> list[int] | None:
    """The rule, spelled out: a list whose every element is a plain int >= 0."""
    if not isinstance(value, list) or any(type(v) is not int or v < 0 for v in value):
        return None
    return value


def test_marshal_writes_plain_ints_as_the_records_the_fast_path_reads():
    # The fast path's one assumption about the format: b"[" + count, then b"i" + int32 LE each.
    assert (
        marshal.dumps([1, 2**31 - 1], 2) == b"[\x02\x00\x00\x00i\x01\x00\x00\x00i\xff\xff\xff\x7f"
    )


BIG = list(range(100, 100 + 131_072))
ODD: list[Any] = [True, False, 1.0, 0.0, Color.RED, MyInt(3), np.int64(5), "5", None, [1], {}]


@pytest.mark.parametrize("odd", ODD, ids=repr)
@pytest.mark.parametrize("where", [0, 65_536, len(BIG) - 1])
def test_one_non_int_anywhere_in_a_128k_prompt_refuses_it(odd: Any, where: int):
    value = list(BIG)
    value[where] = odd
    assert plain_int_ids(value) is None
    assert engine_ids(value) is None
    assert ids_array(value) is None


@pytest.mark.parametrize("bad", [-1, -(2**31), -(2**40)])
@pytest.mark.parametrize("where", [0, len(BIG) - 1])
def test_a_negative_id_anywhere_refuses_it(bad: int, where: int):
    value = list(BIG)
    value[where] = bad
    assert engine_ids(value) is None


def test_plain_ints_convert_exactly_including_ids_beyond_int32():
    value = [*BIG, 2**31, 2**40, 0]
    arr = engine_ids(value)
    assert arr is not None and arr.dtype == np.int64 and not arr.flags.writeable
    assert arr.tolist() == value
    fast = engine_ids(list(BIG))
    assert fast is not None and fast.tolist() == BIG


def test_empty_list_is_an_empty_array_and_non_lists_are_refused():
    empty = engine_ids([])
    assert empty is not None and len(empty) == 0
    for value in (None, (1, 2), "12", {"0": 1}, 3):
        assert engine_ids(value) is None


def test_a_self_containing_list_is_refused_not_crashed():
    value: list[Any] = [1, 2]
    value.append(value)
    assert engine_ids(value) is None


elements = st.one_of(
    st.integers(0, 2**31 - 1),
    st.integers(-(2**63), 2**63 - 1),
    st.booleans(),
    st.floats(allow_nan=False),
    st.sampled_from([Color.RED, MyInt(1), np.int64(1), None, "1"]),
)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_fast_path_agrees_with_the_rule(data: st.DataObject):
    ids = data.draw(st.lists(st.integers(0, 50_000), max_size=40))
    value = data.draw(st.permutations(ids + data.draw(st.lists(elements, max_size=5))))
    got = engine_ids(value)
    want = _reference(value)
    if want is None:
        assert got is None
    else:
        assert got is not None and got.tolist() == want
