"""``RunningStats``: count, mean, std, min and max in O(1) per value, and mergeable.

Welford's update for one value and Chan et al.'s pairwise merge for two summaries, so a resumed
collection can fold the stats of what it already holds into those of what it adds.
"""

from __future__ import annotations

import math

from pydantic import BaseModel


class StatsSummary(BaseModel):
    """What a manifest shows: population std (ddof=0, as numpy's default); None when empty."""

    count: int
    mean: float | None
    std: float | None
    min: float | None
    max: float | None


class RunningStats(BaseModel):
    """Streaming statistics of finite floats. ``m2`` is the sum of squared deviations."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0
    min: float | None = None
    max: float | None = None

    def update(self, value: float) -> None:
        """Fold in one value (O(1)). Non-finite values are refused: they would poison the mean."""
        x = float(value)
        if not math.isfinite(x):
            raise ValueError(f"RunningStats takes finite values only, got {value!r}")
        self.count += 1
        delta = x - self.mean
        self.mean += delta / self.count
        self.m2 += delta * (x - self.mean)
        self.min = x if self.min is None else min(self.min, x)
        self.max = x if self.max is None else max(self.max, x)

    def merge(self, other: RunningStats) -> RunningStats:
        """The stats of both value sets together (a new object; neither input changes)."""
        if other.count == 0:
            return self.model_copy()
        if self.count == 0:
            return other.model_copy()
        n = self.count + other.count
        delta = other.mean - self.mean
        mean = self.mean + delta * other.count / n
        m2 = self.m2 + other.m2 + delta * delta * self.count * other.count / n
        assert self.min is not None and other.min is not None
        assert self.max is not None and other.max is not None
        return RunningStats(
            count=n,
            mean=mean,
            m2=m2,
            min=min(self.min, other.min),
            max=max(self.max, other.max),
        )

    @property
    def variance(self) -> float | None:
        """Population variance (ddof=0); None when no value was seen."""
        if self.count == 0:
            return None
        return max(self.m2, 0.0) / self.count

    @property
    def std(self) -> float | None:
        var = self.variance
        return None if var is None else math.sqrt(var)

    def summary(self) -> StatsSummary:
        return StatsSummary(
            count=self.count,
            mean=self.mean if self.count else None,
            std=self.std,
            min=self.min,
            max=self.max,
        )
