"""Running reward stats equal numpy's, one value at a time and merged."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollwire.datasets.stats import RunningStats

values = st.lists(
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False), min_size=1
)


def _stats(xs: list[float]) -> RunningStats:
    stats = RunningStats()
    for x in xs:
        stats.update(x)
    return stats


def _close(a: float, b: float, scale: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9 * max(scale, 1.0))


@given(values)
def test_running_stats_equal_numpy_mean_std_min_max(xs):
    stats = _stats(xs)
    scale = max(abs(x) for x in xs)
    assert stats.count == len(xs)
    assert _close(stats.mean, float(np.mean(xs)), scale)
    assert _close(stats.std, float(np.std(xs)), scale)
    assert (stats.min, stats.max) == (min(xs), max(xs))


@given(values, st.data())
def test_merged_stats_equal_the_stats_of_all_values(xs, data):
    k = data.draw(st.integers(min_value=0, max_value=len(xs)))
    merged = _stats(xs[:k]).merge(_stats(xs[k:]))
    scale = max(abs(x) for x in xs)
    assert merged.count == len(xs)
    assert _close(merged.mean, float(np.mean(xs)), scale)
    assert _close(merged.std, float(np.std(xs)), scale)
    assert (merged.min, merged.max) == (min(xs), max(xs))


def test_empty_stats_summarise_to_none_and_refuse_non_finite_values():
    summary = RunningStats().summary()
    assert summary.count == 0 and summary.mean is None and summary.std is None
    with pytest.raises(ValueError, match="finite"):
        RunningStats().update(math.nan)
