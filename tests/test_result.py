"""Rewards are forwarded and coerced inside the guard; ok means usable."""

from __future__ import annotations

import math

import pytest

from rollwire.result import coerce_reward, pick_reward, summarise
from rollwire.sessions.base import EnvVerdict


@pytest.mark.parametrize(
    ("value", "expected"), [(1, 1.0), (0.0, 0.0), ("0.5", 0.5), (True, 1.0), (None, None)]
)
def test_reward_values_that_are_numbers_pass(value, expected):
    assert coerce_reward(value) == (expected, None)


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, "N/A", {"a": 1}, [1]])
def test_rewards_that_are_not_finite_numbers_are_errors(value):
    reward, problem = coerce_reward(value)
    assert reward is None and problem


def test_multi_key_rewards_need_an_explicit_key_and_are_never_averaged():
    verdict = EnvVerdict(reward=None, rewards={"a": 1.0, "b": 0.0})
    assert pick_reward(verdict, None)[0] is None and "reward_key" in pick_reward(verdict, None)[1]
    assert pick_reward(verdict, "b") == (0.0, None)


def test_unknown_reward_key_is_named():
    assert "'c'" in pick_reward(EnvVerdict(reward=None, rewards={"a": 1.0}), "c")[1]


def test_no_verdict_is_none_not_zero():
    result = summarise(
        rollout_id="r", task="t", harness="h", document=None, verdict=EnvVerdict(reward=None)
    )
    assert result.reward is None and not result.ok


def test_result_without_a_document_is_not_ok():
    result = summarise(
        rollout_id="r", task="t", harness="h", document=None, verdict=EnvVerdict(reward=1.0)
    )
    assert result.reward == 1.0 and result.ok is False
