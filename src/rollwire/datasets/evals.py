"""Eval metrics of a collection: mean reward and pass@k with standard errors, per task family,
and the paired comparison of two evals (bootstrap interval and permutation p-value).

The pure core of ``rollwire eval`` and of ``collect_episodes``' metrics block. Its unit is the
*attempt*: one planned episode's outcome, read from a collection folder (:func:`read_attempts`).
Counting is honest: an attempt that failed (``failures.jsonl``, never settled) or ran but was
never scored (reward ``null``) is a failed attempt with its cause, never dropped; in the mean
reward it scores ``failed_reward`` (0.0 unless told).

A *problem* is one task instance: the task reference and its task seed (a Harbor task, which
has no seed, is one problem). A problem's ``n`` samples, ``c`` of them passing (reward at least
``pass_threshold``), give the unbiased pass@k estimate of Chen et al. 2021,
``1 - C(n-c, k) / C(n, k)``; a metric is the mean over problems, and its standard error the
sample standard deviation over problems divided by sqrt(problems): samples of one problem are
not independent, problems are. A *task family* is the task reference for env tasks (its
problems are its seeds) and ``harbor:<dataset>`` for Harbor tasks (each task one problem).

:func:`compare` pairs two evals by problem. B minus A, per metric: the mean difference, its 95%
interval from a paired bootstrap over problems (``resamples``, a fixed seed: the same inputs
give the same interval) and a two-sided paired permutation p-value (sign flips; exact when
2**problems <= resamples). Evals that do not pair are refused with what differs.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from pydantic import BaseModel, Field

from rollwire.datasets.store import iter_committed_lines

PASS_THRESHOLD = 1.0
FAILED_REWARD = 0.0
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95
#: the causes a summary names one by one; the rest are counted together
MAX_CAUSES = 8
#: a failure's message is grouped by this many characters (ids and ports vary after that)
CAUSE_CHARS = 160
NEVER_SCORED = "ran but never scored: the verifier gave no reward (e.g. the agent never answered)"
_EPISODES, _FAILURES, _FILTERED = "episodes.jsonl", "failures.jsonl", "filtered.jsonl"
_HARBOR = "harbor:"
_CHUNK = 500  # resamples per numpy batch: memory stays ~chunk x problems


class EvalMismatch(ValueError):
    """Two evals that do not pair by problem; the message says what differs."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """One planned episode's outcome: its reward, or (failed or never scored) its cause."""

    task: str
    seed: int | None
    sample_index: int
    reward: float | None
    cause: str | None = None  # set when the attempt failed (then reward is None)

    @property
    def problem(self) -> tuple[str, int | None]:
        return (self.task, self.seed)


def family_of(task: str) -> str:
    """The task family a task reference belongs to (see the module docstring)."""
    if task.startswith(_HARBOR):
        return task.partition("#")[0]
    return task


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate for one problem: n samples, c passing (Chen et al. 2021,
    in their numerically stable product form)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def parse_ks(text: str | Iterable[int]) -> list[int]:
    """``"1,4,8"`` (or ints) as sorted distinct ks, each >= 1; a ValueError names a bad one."""
    items = text.split(",") if isinstance(text, str) else list(text)
    ks: set[int] = set()
    for item in items:
        try:
            k = int(str(item).strip())
        except ValueError:
            raise ValueError(f"k: {item!r} is not a whole number (e.g. --k 1,4,8)") from None
        if k < 1:
            raise ValueError(f"k: {k} is not at least 1")
        ks.add(k)
    if not ks:
        raise ValueError("k: give at least one k (e.g. --k 1,4,8)")
    return sorted(ks)


# -- reading a collection folder ---------------------------------------------------------------


def _records(path: Path) -> Iterable[dict[str, Any]]:
    """The committed records of a JSONL file, read-only (a torn last line is what a crash
    leaves and is not a record); a bad line before the end is damage and raises."""
    if not path.exists():
        return
    for number, raw in iter_committed_lines(path):
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"{path}, line {number}: not JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{path}, line {number}: not a JSON object")
        yield obj


def _reward(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"reward {value!r} is not a finite number")
    return float(value)


def read_attempts(out_dir: str | Path) -> list[Attempt]:
    """Every attempt a collection folder holds: its episodes and filtered episodes (they ran,
    with their reward), and each episode whose every attempt failed (its latest failure's
    message). Reads only; a resume may still add to the folder."""
    out = Path(out_dir)
    attempts: list[Attempt] = []
    settled: set[str] = set()
    for name in (_EPISODES, _FILTERED):
        for r in _records(out / name):
            settled.add(r["episode_id"])
            reward = _reward(r.get("reward"))
            cause = NEVER_SCORED if reward is None else None
            attempts.append(Attempt(r["task"], r.get("seed"), r["sample_index"], reward, cause))
    failed: dict[str, dict[str, Any]] = {}
    for r in _records(out / _FAILURES):
        if r["episode_id"] not in settled:
            failed[r["episode_id"]] = r  # the latest attempt's failure
    for r in failed.values():
        cause = (r.get("error") or r.get("exception_type") or "failed")[:CAUSE_CHARS]
        attempts.append(Attempt(r["task"], r.get("seed"), r["sample_index"], None, cause))
    return attempts


# -- the summary -------------------------------------------------------------------------------


class Scoring(BaseModel):
    """How an eval's samples are scored: which pass@k, when a sample passes, what a failed one
    scores in the mean reward."""

    ks: list[int] = Field(default_factory=lambda: [1], description="pass@k for these k")
    pass_threshold: float = PASS_THRESHOLD
    failed_reward: float = FAILED_REWARD


class PassAtK(BaseModel):
    k: int
    estimate: float | None = Field(description="mean over problems with at least k samples")
    se: float | None = Field(description="standard error over problems (None for one problem)")
    problems: int = Field(description="problems it averages over (those with >= k samples)")


class FamilyMetrics(BaseModel):
    """One task family's numbers (or, as ``overall``, every family's problems together)."""

    family: str
    problems: int
    samples: int
    passed: int = Field(description="samples with reward >= pass_threshold")
    failed: int = Field(description="samples that failed or were never scored (failed attempts)")
    reward_mean: float | None = Field(description="mean over problems of their mean reward")
    reward_se: float | None = Field(description="its standard error over problems")
    pass_at: list[PassAtK] = Field(default_factory=list)


class EvalMetrics(BaseModel):
    """An eval's summary, per task family and overall."""

    pass_threshold: float = Field(description="a sample passes when its reward is at least this")
    failed_reward: float = Field(description="what a failed or never-scored sample scores")
    ks: list[int]
    overall: FamilyMetrics
    families: list[FamilyMetrics]
    causes: dict[str, int] = Field(
        default_factory=dict, description="failed attempts by cause, most common first"
    )


class ProblemScore(BaseModel):
    """One problem's tally: what a comparison pairs."""

    task: str
    seed: int | None
    n: int
    c: int
    reward_mean: float


def _se(values: np.ndarray) -> float | None:
    if values.size < 2:
        return None
    return float(values.std(ddof=1) / math.sqrt(values.size))


def problem_scores(
    attempts: Sequence[Attempt],
    *,
    pass_threshold: float = PASS_THRESHOLD,
    failed_reward: float = FAILED_REWARD,
) -> list[ProblemScore]:
    """Each problem's n, c and mean reward, in a stable order (task, then seed)."""
    n: Counter[tuple[str, int | None]] = Counter()
    c: Counter[tuple[str, int | None]] = Counter()
    total: defaultdict[tuple[str, int | None], float] = defaultdict(float)
    for a in attempts:
        key = a.problem
        n[key] += 1
        if a.reward is None:
            total[key] += failed_reward
        else:
            total[key] += a.reward
            if a.reward >= pass_threshold:
                c[key] += 1
    keys = sorted(n, key=lambda k: (k[0], -1 if k[1] is None else k[1]))
    return [
        ProblemScore(task=k[0], seed=k[1], n=n[k], c=c[k], reward_mean=total[k] / n[k])
        for k in keys
    ]


def _family_metrics(
    family: str, scores: Sequence[ProblemScore], ks: Sequence[int], failed: int
) -> FamilyMetrics:
    means = np.fromiter((s.reward_mean for s in scores), float, len(scores))
    pass_at = []
    for k in ks:
        values = np.fromiter((pass_at_k(s.n, s.c, k) for s in scores if s.n >= k), float)
        pass_at.append(
            PassAtK(
                k=k,
                estimate=float(values.mean()) if values.size else None,
                se=_se(values),
                problems=int(values.size),
            )
        )
    return FamilyMetrics(
        family=family,
        problems=len(scores),
        samples=sum(s.n for s in scores),
        passed=sum(s.c for s in scores),
        failed=failed,
        reward_mean=float(means.mean()) if means.size else None,
        reward_se=_se(means),
        pass_at=pass_at,
    )


def summarise(
    attempts: Sequence[Attempt],
    *,
    ks: Sequence[int] = (1,),
    pass_threshold: float = PASS_THRESHOLD,
    failed_reward: float = FAILED_REWARD,
) -> tuple[EvalMetrics, list[ProblemScore]]:
    """The metrics of ``attempts`` and the per-problem scores they come from."""
    ks = parse_ks(ks)
    scores = problem_scores(attempts, pass_threshold=pass_threshold, failed_reward=failed_reward)
    failed: Counter[str] = Counter()
    causes: Counter[str] = Counter()
    for a in attempts:
        if a.reward is None:
            failed[family_of(a.task)] += 1
            causes[a.cause or "failed"] += 1
    by_family: defaultdict[str, list[ProblemScore]] = defaultdict(list)
    for s in scores:
        by_family[family_of(s.task)].append(s)
    named = dict(causes.most_common(MAX_CAUSES))
    rest = sum(causes.values()) - sum(named.values())
    if rest:
        named[f"{len(causes) - MAX_CAUSES} other causes"] = rest
    metrics = EvalMetrics(
        pass_threshold=pass_threshold,
        failed_reward=failed_reward,
        ks=ks,
        overall=_family_metrics("overall", scores, ks, sum(failed.values())),
        families=[_family_metrics(f, s, ks, failed[f]) for f, s in sorted(by_family.items())],
        causes=named,
    )
    return metrics, scores


def summarise_dir(
    out_dir: str | Path, scoring: Scoring | None = None
) -> tuple[EvalMetrics, list[ProblemScore]]:
    """The metrics of every attempt a collection folder holds (blocking: reads the folder)."""
    s = scoring or Scoring()
    return summarise(
        read_attempts(out_dir),
        ks=s.ks,
        pass_threshold=s.pass_threshold,
        failed_reward=s.failed_reward,
    )


# -- comparing two evals -----------------------------------------------------------------------


class Difference(BaseModel):
    """B minus A for one metric, paired by problem."""

    metric: str = Field(description="reward_mean or pass@k")
    a: float
    b: float
    diff: float
    ci_low: float
    ci_high: float
    p_value: float = Field(description="two-sided paired permutation test (sign flips)")
    problems: int


class FamilyComparison(BaseModel):
    family: str
    problems: int
    wins: int = Field(description="problems whose mean reward is higher in B")
    losses: int = Field(description="problems whose mean reward is lower in B")
    ties: int
    permutation: str = Field(description="exact (every sign flip) or monte-carlo")
    differences: list[Difference]


class Comparison(BaseModel):
    a: str
    b: str
    ks: list[int] = Field(description="the pass@k compared")
    confidence: float = CONFIDENCE
    resamples: int
    seed: int
    overall: FamilyComparison
    families: list[FamilyComparison]


def _pairing(a: Sequence[ProblemScore], b: Sequence[ProblemScore]) -> None:
    tasks_a, tasks_b = {s.task for s in a}, {s.task for s in b}
    if tasks_a != tasks_b:
        raise EvalMismatch(
            f"the evals ran different tasks: only in A {sorted(tasks_a - tasks_b)}, "
            f"only in B {sorted(tasks_b - tasks_a)}"
        )
    keys_a = {(s.task, s.seed) for s in a}
    keys_b = {(s.task, s.seed) for s in b}
    if keys_a != keys_b:
        only_a, only_b = sorted(keys_a - keys_b, key=str), sorted(keys_b - keys_a, key=str)
        raise EvalMismatch(
            f"the evals saw different problems: {len(only_a)} only in A (e.g. {only_a[:3]}), "
            f"{len(only_b)} only in B (e.g. {only_b[:3]}); run both with the same --seed and "
            "--problems"
        )
    n_b = {(s.task, s.seed): s.n for s in b}
    unequal = [
        (s.task, s.seed, s.n, n_b[(s.task, s.seed)]) for s in a if s.n != n_b[(s.task, s.seed)]
    ]
    if unequal:
        task, seed, na, nb = unequal[0]
        raise EvalMismatch(
            f"the evals took different samples per problem: {len(unequal)} problems differ, "
            f"e.g. {task} seed {seed}: {na} in A, {nb} in B; run both with the same --samples"
        )


def _metric_matrix(scores: Sequence[ProblemScore], ks: Sequence[int]) -> np.ndarray:
    """problems x metrics: mean reward, then pass@k for each k."""
    rows = [[s.reward_mean, *(pass_at_k(s.n, s.c, k) for k in ks)] for s in scores]
    return np.asarray(rows, dtype=float).reshape(len(scores), 1 + len(ks))


def _resample_counts(rng: np.random.Generator, rows: int, p: int) -> np.ndarray:
    """``rows`` bootstrap resamples of ``p`` problems, as how often each problem is drawn."""
    idx = rng.integers(0, p, size=(rows, p)) + (np.arange(rows) * p)[:, None]
    return np.bincount(idx.ravel(), minlength=rows * p).reshape(rows, p).astype(float)


def _bootstrap(d: np.ndarray, resamples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The (low, high) percentile interval of the mean of d's rows, per column."""
    rng = np.random.default_rng(seed)
    p = d.shape[0]
    means = np.empty((resamples, d.shape[1]))
    for start in range(0, resamples, _CHUNK):
        stop = min(start + _CHUNK, resamples)
        means[start:stop] = _resample_counts(rng, stop - start, p) @ d / p
    tail = (1.0 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail], axis=0)
    return low, high


def _permutation(d: np.ndarray, resamples: int, seed: int) -> tuple[np.ndarray, str]:
    """Two-sided paired permutation p-values of the mean of d's rows, per column."""
    p = d.shape[0]
    observed = np.abs(d.mean(axis=0)) - 1e-12  # ties count as at least as extreme
    if 2**p <= resamples:  # every sign flip
        signs = 1 - 2 * ((np.arange(2**p)[:, None] >> np.arange(p)) & 1)
        stats = np.abs(signs @ d / p)
        return (stats >= observed).mean(axis=0), "exact"
    rng = np.random.default_rng(seed)
    extreme = np.zeros(d.shape[1])
    for start in range(0, resamples, _CHUNK):
        stop = min(start + _CHUNK, resamples)
        signs = rng.integers(0, 2, size=(stop - start, p)).astype(float) * 2 - 1
        extreme += (np.abs(signs @ d / p) >= observed).sum(axis=0)
    return (1 + extreme) / (1 + resamples), "monte-carlo"


def _compare_family(
    family: str,
    a: Sequence[ProblemScore],
    b: Sequence[ProblemScore],
    ks: Sequence[int],
    resamples: int,
    seed: int,
) -> FamilyComparison:
    ma, mb = _metric_matrix(a, ks), _metric_matrix(b, ks)
    d = mb - ma
    low, high = _bootstrap(d, resamples, seed)
    pvalues, how = _permutation(d, resamples, seed)
    names = ["reward_mean", *(f"pass@{k}" for k in ks)]
    diffs = [
        Difference(
            metric=name,
            a=float(ma[:, j].mean()),
            b=float(mb[:, j].mean()),
            diff=float(d[:, j].mean()),
            ci_low=float(low[j]),
            ci_high=float(high[j]),
            p_value=float(pvalues[j]),
            problems=len(a),
        )
        for j, name in enumerate(names)
    ]
    reward_d = d[:, 0]
    return FamilyComparison(
        family=family,
        problems=len(a),
        wins=int((reward_d > 1e-12).sum()),
        losses=int((reward_d < -1e-12).sum()),
        ties=int((np.abs(reward_d) <= 1e-12).sum()),
        permutation=how,
        differences=diffs,
    )


def compare(
    a: Sequence[ProblemScore],
    b: Sequence[ProblemScore],
    *,
    ks: Sequence[int] = (1,),
    names: tuple[str, str] = ("A", "B"),
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> Comparison:
    """B against A, paired by problem (see the module docstring). Raises :class:`EvalMismatch`
    when they do not pair, or a ValueError for a k above the samples per problem."""
    if not a or not b:
        raise EvalMismatch("an eval with no problems cannot be compared")
    _pairing(a, b)
    ks = parse_ks(ks)
    fewest = min(s.n for s in a)
    if ks[-1] > fewest:
        raise ValueError(f"k: {ks[-1]} is more than the {fewest} samples of some problem")
    order = {(s.task, s.seed): i for i, s in enumerate(a)}
    b = sorted(b, key=lambda s: order[(s.task, s.seed)])
    overall = _compare_family("overall", a, b, ks, resamples, seed)
    groups: defaultdict[str, list[int]] = defaultdict(list)
    for i, s in enumerate(a):
        groups[family_of(s.task)].append(i)
    if len(groups) == 1:  # one family: its numbers are the overall ones
        (family,) = groups
        families = [overall.model_copy(update={"family": family})]
    else:
        families = [
            _compare_family(f, [a[i] for i in idx], [b[i] for i in idx], ks, resamples, seed)
            for f, idx in sorted(groups.items())
        ]
    return Comparison(
        a=names[0],
        b=names[1],
        ks=ks,
        resamples=resamples,
        seed=seed,
        overall=overall,
        families=families,
    )


__all__ = [
    "BOOTSTRAP_RESAMPLES",
    "Attempt",
    "Comparison",
    "Difference",
    "EvalMetrics",
    "EvalMismatch",
    "FamilyComparison",
    "FamilyMetrics",
    "PassAtK",
    "ProblemScore",
    "Scoring",
    "compare",
    "family_of",
    "parse_ks",
    "pass_at_k",
    "problem_scores",
    "read_attempts",
    "summarise",
    "summarise_dir",
]
