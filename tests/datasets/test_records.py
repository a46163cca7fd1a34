"""Episode identities are deterministic; a record carries what a trainer needs, verbatim."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest

from rollwire.capture.rollout import RolloutType
from rollwire.datasets.records import (
    SCHEMA,
    EpisodeRecord,
    FailureRecord,
    FilteredRecord,
    episode_id,
    group_id,
    group_index,
)
from tests.datasets.samples import make_record, make_result


def test_episode_id_is_the_documented_hash_of_the_triple():
    expected = hashlib.sha256(b'["episode","chain_sum",3,7]').hexdigest()[:24]
    assert episode_id("chain_sum", 3, 7) == expected
    assert episode_id("chain_sum", 3, None) != episode_id("chain_sum", 3, 0)
    assert len({episode_id("t", i, s) for i in range(5) for s in (None, 0, 1)}) == 15


def test_episode_id_is_stable_across_processes():
    code = "from rollwire.datasets.records import episode_id; print(episode_id('täsk', 2, None))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == episode_id("täsk", 2, None)


def test_samples_of_one_group_share_a_group_id_and_groups_differ():
    ids = [group_id("t", group_index(i, 4), 7) for i in range(8)]
    assert len(set(ids[:4])) == 1 and len(set(ids[4:])) == 1 and ids[0] != ids[4]
    assert group_id("t", 0, 7) != episode_id("t", 0, 7)
    with pytest.raises(ValueError, match="group_size"):
        group_index(3, 0)


def test_record_from_result_keeps_reward_sequences_and_findings_verbatim():
    result = make_result(reward=0.5)
    record = EpisodeRecord.from_result(
        result, task="chain_sum", sample_index=1, seed=7, group_id="g", model="m"
    )
    assert record.episode_id == episode_id("chain_sum", 1, 7)
    assert (record.reward, record.rewards, record.reward_key) == (0.5, {"correct": 0.5}, None)
    assert [s.role for s in record.sequences] == ["discarded", "agent"]
    agent = record.sequences[1]
    assert agent.trainable and agent.input_ids == result.sequences[1].input_ids
    assert agent.loss_mask == result.sequences[1].loss_mask
    assert agent.logprobs == result.sequences[1].logprobs
    assert record.findings == result.findings
    assert record.created_at.endswith("Z") and record.rollwire_version


def test_unverified_reward_stays_none_not_zero():
    assert make_record(reward=None).reward is None


def test_a_train_result_without_sequences_cannot_become_a_record():
    result = make_result().model_copy(update={"sequences": None})
    with pytest.raises(ValueError, match="no sequences"):
        EpisodeRecord.from_result(
            result, task="t", sample_index=0, seed=None, group_id="g", model="m"
        )
    evaluation = result.model_copy(update={"rollout_type": RolloutType.EVAL})
    record = EpisodeRecord.from_result(
        evaluation,
        task="t",
        sample_index=0,
        seed=None,
        group_id="g",
        model="m",
        messages=[{"role": "user", "content": "hi"}],
    )
    assert record.sequences == [] and record.messages == [{"role": "user", "content": "hi"}]


def test_a_record_is_one_line_with_its_schema_and_round_trips():
    record = make_record(messages=[{"role": "user", "content": "a\nb"}])
    line = record.to_line()
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line)["schema"] == SCHEMA
    assert EpisodeRecord.model_validate_json(line) == record


def test_failure_and_filtered_records_name_the_episode():
    result = make_result().model_copy(
        update={"ok": False, "error": "sandbox died", "exception_type": "RuntimeError"}
    )
    failure = FailureRecord.from_result(result, task="t", sample_index=2, seed=None)
    assert failure.episode_id == episode_id("t", 2, None)
    assert (failure.error, failure.exception_type) == ("sandbox died", "RuntimeError")
    raised = FailureRecord.from_exception(TimeoutError(), task="t", sample_index=2, seed=None)
    assert (raised.error, raised.exception_type) == ("TimeoutError", "TimeoutError")
    filtered = FilteredRecord.of(make_record(reward=0.0), "reward below 1.0")
    assert filtered.reward == 0.0 and filtered.reason == "reward below 1.0"
