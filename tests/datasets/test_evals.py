"""The eval core (rollwire.datasets.evals): pass@k and standard errors against direct computation,
failures counted as failed attempts, the paired comparison's interval and p-value."""

from __future__ import annotations

import json
import math
import statistics
from math import comb
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollwire.datasets.evals import (
    NEVER_SCORED,
    Attempt,
    EvalMismatch,
    ProblemScore,
    compare,
    family_of,
    parse_ks,
    pass_at_k,
    read_attempts,
    summarise,
)


def direct_pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al. 2021 as written: 1 - C(n-c, k) / C(n, k)."""
    return 1.0 - comb(n - c, k) / comb(n, k)


@given(
    st.integers(1, 40).flatmap(
        lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))
    )
)
def test_pass_at_k_equals_the_binomial_formula(nck):
    n, c, k = nck
    assert pass_at_k(n, c, k) == pytest.approx(direct_pass_at_k(n, c, k), abs=1e-12)


def test_pass_at_k_hand_cases():
    assert pass_at_k(8, 0, 1) == 0.0 and pass_at_k(8, 0, 8) == 0.0  # c = 0: never
    assert pass_at_k(8, 8, 1) == 1.0 and pass_at_k(8, 8, 4) == 1.0  # c = n: always
    assert pass_at_k(8, 1, 8) == 1.0  # k = n: one pass among all of them is enough
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)  # k = 1: the pass rate
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)  # 1 - C(2,2)/C(4,2)


def test_pass_at_k_refuses_k_above_n():
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(4, 1, 5)


def test_parse_ks_names_the_bad_value():
    assert parse_ks("8,1,4,4") == [1, 4, 8]
    with pytest.raises(ValueError, match="'x' is not a whole number"):
        parse_ks("1,x")
    with pytest.raises(ValueError, match="0 is not at least 1"):
        parse_ks("0")


def attempts(table: dict[tuple[str, int | None], list[float | None]]) -> list[Attempt]:
    return [
        Attempt(task, seed, j, r, None if r is not None else "boom")
        for (task, seed), rewards in table.items()
        for j, r in enumerate(rewards)
    ]


def test_pass_at_1_is_the_mean_pass_rate_and_its_se_is_over_problems():
    table = {
        ("rg:a", 0): [1.0, 0.0, 0.0, 1.0],
        ("rg:a", 1): [0.0, 0.0, 0.0, 0.0],
        ("rg:a", 2): [1.0, 1.0, 1.0, 0.5],
    }
    metrics, scores = summarise(attempts(table), ks=[1, 2, 4])
    p1, p2, p4 = metrics.overall.pass_at
    rates = [2 / 4, 0 / 4, 3 / 4]
    assert p1.estimate == pytest.approx(statistics.mean(rates))
    assert p1.se == pytest.approx(statistics.stdev(rates) / math.sqrt(3))
    expected_p2 = [direct_pass_at_k(4, c, 2) for c in (2, 0, 3)]
    assert p2.estimate == pytest.approx(statistics.mean(expected_p2))
    assert p2.se == pytest.approx(statistics.stdev(expected_p2) / math.sqrt(3))
    assert p4.estimate == pytest.approx(2 / 3) and p4.problems == 3
    means = [0.5, 0.0, 0.875]
    assert metrics.overall.reward_mean == pytest.approx(statistics.mean(means))
    assert metrics.overall.reward_se == pytest.approx(statistics.stdev(means) / math.sqrt(3))
    assert [(s.n, s.c) for s in scores] == [(4, 2), (4, 0), (4, 3)]


def test_one_problem_has_no_standard_error():
    metrics, _ = summarise(attempts({("rg:a", 0): [1.0, 0.0]}), ks=[1])
    assert metrics.overall.reward_se is None and metrics.overall.pass_at[0].se is None


def test_failed_and_unscored_samples_are_failed_attempts_scoring_failed_reward():
    table = {("rg:a", 0): [1.0, None, None, 1.0]}
    metrics, scores = summarise(attempts(table), ks=[1], failed_reward=-1.0)
    assert scores[0].n == 4 and scores[0].c == 2  # never dropped: n counts them
    assert metrics.overall.failed == 2 and metrics.causes == {"boom": 2}
    assert metrics.overall.reward_mean == pytest.approx((1 - 1 - 1 + 1) / 4)
    assert metrics.overall.pass_at[0].estimate == pytest.approx(0.5)


def test_families_split_env_tasks_by_reference_and_harbor_tasks_by_dataset():
    assert family_of("reasoning_gym:chain_sum") == "reasoning_gym:chain_sum"
    assert family_of("harbor:examples/tasks#fix-median") == "harbor:examples/tasks"
    table = {
        ("rg:a", 0): [1.0],
        ("rg:b", 0): [0.0],
        ("harbor:d#x", None): [1.0, 1.0],
        ("harbor:d#y", None): [0.0, 1.0],
    }
    metrics, _ = summarise(attempts(table), ks=[1])
    assert [(f.family, f.problems, f.samples) for f in metrics.families] == [
        ("harbor:d", 2, 4),
        ("rg:a", 1, 1),
        ("rg:b", 1, 1),
    ]
    assert metrics.overall.problems == 4 and metrics.overall.samples == 6


def _write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_read_attempts_counts_each_planned_episode_once_with_its_latest_outcome(tmp_path):
    ep = {"task": "rg:a", "seed": 0}
    _write(
        tmp_path / "episodes.jsonl",
        [
            {**ep, "episode_id": "e0", "sample_index": 0, "reward": 1.0},
            {**ep, "episode_id": "e1", "sample_index": 1, "reward": None},
            {**ep, "episode_id": "e3", "sample_index": 3, "reward": 0.0},
        ],
    )
    _write(
        tmp_path / "filtered.jsonl", [{**ep, "episode_id": "e2", "sample_index": 2, "reward": 0.5}]
    )
    _write(
        tmp_path / "failures.jsonl",
        [
            {**ep, "episode_id": "e3", "sample_index": 3, "error": "first try failed"},
            {**ep, "episode_id": "e4", "sample_index": 4, "error": "engine gone"},
            {**ep, "episode_id": "e4", "sample_index": 4, "error": "engine still gone"},
        ],
    )
    with (tmp_path / "episodes.jsonl").open("a") as f:
        f.write('{"task": "rg:a", "episode_id": "torn"')  # a crash's torn last line: not a record
    got = sorted(read_attempts(tmp_path), key=lambda a: a.sample_index)
    assert [(a.sample_index, a.reward, a.cause) for a in got] == [
        (0, 1.0, None),
        (1, None, NEVER_SCORED),
        (2, 0.5, None),  # filtered episodes ran: they are samples
        (3, 0.0, None),  # failed once, then ran: its outcome is the run
        (4, None, "engine still gone"),  # the latest failure is its cause
    ]


def test_read_attempts_refuses_damage_before_the_last_line(tmp_path):
    (tmp_path / "episodes.jsonl").write_text("not json\n{}\n")
    with pytest.raises(ValueError, match="line 1: not JSON"):
        read_attempts(tmp_path)


def scores_of(rewards: np.ndarray, task: str = "rg:a") -> list[ProblemScore]:
    return [
        ProblemScore(task=task, seed=i, n=4, c=int((r >= 1.0).sum()), reward_mean=float(r.mean()))
        for i, r in enumerate(rewards)
    ]


def test_the_bootstrap_interval_is_reproducible_and_covers_a_known_shift():
    rng = np.random.default_rng(7)
    base = rng.uniform(0, 0.5, size=(200, 4))
    shifted = base + 0.2 + rng.normal(0, 0.05, size=base.shape)  # B = A + 0.2, with noise
    a, b = scores_of(base), scores_of(shifted)
    first = compare(a, b)
    again = compare(a, b)
    reward = first.overall.differences[0]
    assert reward.metric == "reward_mean"
    assert first.model_dump() == again.model_dump()  # same inputs, same interval
    assert reward.ci_low < 0.2 < reward.ci_high
    assert reward.ci_high - reward.ci_low < 0.05
    assert reward.p_value == pytest.approx(1 / 10_001)  # no sign flip comes near
    assert first.overall.wins == 200 - first.overall.losses - first.overall.ties


def test_no_difference_gives_p_one_and_an_interval_of_zero():
    a = scores_of(np.random.default_rng(1).uniform(0, 1, size=(30, 4)))
    result = compare(a, a)
    d = result.overall.differences[0]
    assert (d.diff, d.ci_low, d.ci_high, d.p_value) == (0.0, 0.0, 0.0, 1.0)
    assert result.overall.ties == 30


def test_a_few_problems_get_the_exact_permutation_test():
    a = [ProblemScore(task="rg:a", seed=i, n=1, c=0, reward_mean=0.0) for i in range(4)]
    b = [ProblemScore(task="rg:a", seed=i, n=1, c=1, reward_mean=1.0) for i in range(4)]
    result = compare(a, b)
    assert result.overall.permutation == "exact"
    assert result.overall.differences[0].p_value == pytest.approx(2 / 16)  # all +, or all -


def test_evals_that_do_not_pair_are_refused_with_what_differs():
    a = [ProblemScore(task="rg:a", seed=i, n=4, c=1, reward_mean=0.25) for i in range(3)]
    with pytest.raises(EvalMismatch, match=r"different problems: 1 only in A .*1 only in B"):
        compare(a, [*a[:2], a[2].model_copy(update={"seed": 9})])
    with pytest.raises(EvalMismatch, match=r"different samples per problem.*4 in A, 8 in B"):
        compare(a, [s.model_copy(update={"n": 8}) for s in a])
    with pytest.raises(EvalMismatch, match=r"different tasks: only in A \['rg:a'\]"):
        compare(a, [s.model_copy(update={"task": "rg:b"}) for s in a])
    with pytest.raises(ValueError, match="k: 8 is more than the 4 samples"):
        compare(a, a, ks=[8])
