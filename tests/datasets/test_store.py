"""The collection directory is append-only and resumable: a crash loses no committed episode,
a resume duplicates none, damage is an error that names the line (Invariant 7)."""

from __future__ import annotations

import errno
import json
import os

import anyio
import numpy as np
import pytest

from rollwire.capture.findings import Level
from rollwire.datasets import store as store_module
from rollwire.datasets.records import FailureRecord, FilteredRecord
from rollwire.datasets.store import (
    EPISODES_FILE,
    MANIFEST_FILE,
    CollectionLockedError,
    CollectionMismatchError,
    CorruptCollectionError,
    DuplicateEpisodeError,
    EpisodeStore,
    fingerprint,
    read_manifest,
)
from tests.datasets.samples import make_record

CONFIG = {"tasks": ["chain_sum"], "samples": 8, "model": "smollm2-135m"}


def _open(path, **kw) -> EpisodeStore:
    kw.setdefault("config", CONFIG)
    kw.setdefault("manifest_interval_s", 0)
    return EpisodeStore(path, **kw)


def _lines(path) -> list[bytes]:
    return (path / EPISODES_FILE).read_bytes().splitlines(keepends=True)


def _fill(path, n: int, **kw) -> list:
    records = [make_record(i, reward=float(i % 2), **kw) for i in range(n)]
    with _open(path) as store:
        for r in records:
            store.write_episode(r)
    return records


def test_each_episode_is_one_committed_line_and_a_resume_knows_them(tmp_path):
    records = _fill(tmp_path, 3)
    lines = _lines(tmp_path)
    assert len(lines) == 3 and all(line.endswith(b"\n") for line in lines)
    assert [json.loads(line)["episode_id"] for line in lines] == [r.episode_id for r in records]
    with _open(tmp_path) as store:
        assert store.recovery == []
        assert store.done_ids == {r.episode_id for r in records}
        assert store.is_settled(records[0].episode_id)


@pytest.mark.parametrize(
    "tail",
    [
        b'{"schema":"rollwire.episode/1","episode_id":"abc","rew',  # cut mid-record
        b"\x00" * 64,  # zero-filled tail after power loss
        b"{not json}\n",  # a terminated but unparsable last line
    ],
)
def test_torn_last_line_is_reported_truncated_and_resume_appends_cleanly(tmp_path, tail):
    records = _fill(tmp_path, 3)
    with (tmp_path / EPISODES_FILE).open("ab") as f:
        f.write(tail)
    with _open(tmp_path) as store:
        [finding] = store.recovery
        assert finding.level is Level.WARN and finding.code == "torn_tail"
        assert "line 4" in finding.message
        assert store.counts.collected == 3
        extra = make_record(3)
        store.write_episode(extra)
    lines = _lines(tmp_path)
    assert [json.loads(line)["episode_id"] for line in lines] == [
        *(r.episode_id for r in records),
        extra.episode_id,
    ]
    with _open(tmp_path) as store:
        assert store.recovery == [] and store.counts.collected == 4


def test_a_complete_record_without_its_newline_was_not_committed_and_is_named(tmp_path):
    _fill(tmp_path, 2)
    uncommitted = make_record(2)
    with (tmp_path / EPISODES_FILE).open("ab") as f:
        f.write(uncommitted.to_line()[:-1])
    with _open(tmp_path) as store:
        [finding] = store.recovery
        assert uncommitted.episode_id in finding.message
        assert not store.is_done(uncommitted.episode_id)
        store.write_episode(uncommitted)  # collected again, once
    assert len(_lines(tmp_path)) == 3


def test_corrupt_middle_line_is_an_error_naming_the_line_and_nothing_is_changed(tmp_path):
    _fill(tmp_path, 4)
    lines = _lines(tmp_path)
    lines[1] = b'{"episode_id": "x", broken\n'
    damaged = b"".join(lines) + b'{"torn'
    (tmp_path / EPISODES_FILE).write_bytes(damaged)
    with pytest.raises(CorruptCollectionError, match=r"line 2\b") as info:
        _open(tmp_path)
    assert info.value.line == 2
    assert (tmp_path / EPISODES_FILE).read_bytes() == damaged  # not repaired, not truncated
    with pytest.raises(CorruptCollectionError):  # the same error again: the lock was released
        _open(tmp_path)


def test_a_record_repeated_in_the_file_is_corruption(tmp_path):
    _fill(tmp_path, 2)
    lines = _lines(tmp_path)
    (tmp_path / EPISODES_FILE).write_bytes(lines[0] + lines[1] + lines[0])
    with pytest.raises(CorruptCollectionError, match=r"line 3.*appears twice"):
        _open(tmp_path)


def test_the_same_episode_is_never_written_twice_even_across_a_resume(tmp_path):
    record = make_record(0)
    with _open(tmp_path) as store:
        store.write_episode(record)
        with pytest.raises(DuplicateEpisodeError, match=record.episode_id):
            store.write_episode(record)
    with _open(tmp_path) as store:
        with pytest.raises(DuplicateEpisodeError):
            store.write_episode(record)
        with pytest.raises(DuplicateEpisodeError):
            store.write_failure(
                FailureRecord.from_exception(
                    RuntimeError("x"), task=record.task, sample_index=0, seed=record.seed
                )
            )
    assert len(_lines(tmp_path)) == 1


def test_filtered_and_failed_episodes_count_and_only_failed_ones_are_retried(tmp_path):
    kept, dropped, broken = make_record(0), make_record(1, reward=0.0), make_record(2)
    failure = FailureRecord.from_exception(
        TimeoutError("slow"), task=broken.task, sample_index=2, seed=broken.seed
    )
    with _open(tmp_path) as store:
        store.write_episode(kept)
        store.write_filtered(FilteredRecord.of(dropped, "reward 0"))
        store.write_failure(failure)
        store.write_failure(failure)
    planned = [kept.episode_id, dropped.episode_id, broken.episode_id]
    with _open(tmp_path) as store:
        assert store.pending(planned) == [broken.episode_id]
        with pytest.raises(DuplicateEpisodeError, match="filtered"):
            store.write_episode(dropped)
        store.write_episode(broken)  # the retry succeeds
        counts = store.counts
    assert (counts.collected, counts.filtered, counts.failed) == (2, 1, 0)
    assert (counts.failure_records, counts.skipped_done) == (2, 2)
    assert read_manifest(tmp_path).counts == counts
    with _open(tmp_path) as store:  # recounted from the files: the same, bar this run's skips
        assert store.counts == counts.model_copy(update={"skipped_done": 0})


@pytest.mark.anyio
async def test_concurrent_appends_are_serialised_and_a_duplicate_race_writes_once(tmp_path):
    records = [make_record(i) for i in range(40)]
    store = await EpisodeStore.aopen(tmp_path, config=CONFIG, manifest_interval_s=0)
    async with store:
        async with anyio.create_task_group() as tg:
            for r in records:
                tg.start_soon(store.append_episode, r)
        outcomes: list[str] = []

        async def racer() -> None:
            try:
                await store.append_episode(make_record(99))
                outcomes.append("written")
            except DuplicateEpisodeError:
                outcomes.append("refused")

        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(racer)
    assert sorted(outcomes) == ["refused"] * 7 + ["written"]
    ids = [json.loads(line)["episode_id"] for line in _lines(tmp_path)]
    assert sorted(ids) == sorted([r.episode_id for r in records] + [make_record(99).episode_id])


def test_a_write_that_fails_part_way_leaves_no_partial_line(tmp_path, monkeypatch):
    real_write = os.write
    calls = {"n": 0}

    def half_then_disk_full(fd, data):
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    with _open(tmp_path) as store:
        store.write_episode(make_record(0))
        monkeypatch.setattr(store_module.os, "write", half_then_disk_full)
        with pytest.raises(OSError, match="No space"):
            store.write_episode(make_record(1))
        monkeypatch.setattr(store_module.os, "write", real_write)
        store.write_episode(make_record(1))
    assert [json.loads(line)["sample_index"] for line in _lines(tmp_path)] == [0, 1]


def test_manifest_is_replaced_atomically_and_a_failed_update_leaves_the_old_one(
    tmp_path, monkeypatch
):
    store = _open(tmp_path)
    store.write_episode(make_record(0))
    before = (tmp_path / MANIFEST_FILE).read_bytes()
    assert json.loads(before)["counts"]["collected"] == 1

    def crash(*args, **kwargs):
        raise OSError("crash before the rename")

    monkeypatch.setattr(store_module.os, "replace", crash)
    store.write_episode(make_record(1))  # committed: a manifest failure does not undo it
    assert store.manifest_error is not None
    with pytest.raises(OSError, match="crash before the rename"):
        store.flush()
    assert (tmp_path / MANIFEST_FILE).read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    monkeypatch.undo()
    store.close()
    assert read_manifest(tmp_path).counts.collected == 2


def test_an_out_dir_holding_another_collection_is_refused(tmp_path):
    _fill(tmp_path, 1)
    reordered = dict(reversed(list(CONFIG.items())))
    _open(tmp_path, config=reordered).close()  # same config, other key order: same collection
    other = {**CONFIG, "samples": 16}
    with pytest.raises(CollectionMismatchError) as info:
        _open(tmp_path, config=other)
    assert fingerprint(other) in str(info.value) and fingerprint(CONFIG) in str(info.value)
    (tmp_path / MANIFEST_FILE).unlink()
    with pytest.raises(CollectionMismatchError, match="no manifest"):
        _open(tmp_path)


def test_a_second_store_on_the_same_directory_is_refused(tmp_path):
    with _open(tmp_path):
        with pytest.raises(CollectionLockedError):
            _open(tmp_path)
    _open(tmp_path).close()


def test_manifest_of_a_resumed_collection_covers_every_episode(tmp_path):
    rewards = [0.0, 1.0, 0.5, 0.25, 1.0, 0.75]
    first = [make_record(i, reward=r) for i, r in enumerate(rewards[:4])]
    second = [make_record(i + 4, reward=r) for i, r in enumerate(rewards[4:])]
    none = make_record(10, reward=None)
    with _open(tmp_path, model="smollm2-135m", engine_tier="tokens") as store:
        for r in first:
            store.write_episode(r)
    with _open(tmp_path) as store:  # resumed without repeating model/tier
        for r in [*second, none]:
            store.write_episode(r)
    manifest = read_manifest(tmp_path)
    assert (manifest.model, manifest.engine_tier) == ("smollm2-135m", "tokens")
    assert manifest.fingerprint == fingerprint(CONFIG) and manifest.config == CONFIG
    assert manifest.counts.collected == 7 and manifest.reward_none == 1
    assert manifest.reward.count == 6
    assert manifest.reward.mean == pytest.approx(np.mean(rewards))
    assert manifest.reward.std == pytest.approx(np.std(rewards))
    assert (manifest.reward.min, manifest.reward.max) == (0.0, 1.0)
    all_records = [*first, *second, none]
    assert manifest.trainable_tokens == sum(r.n_trainable_tokens for r in all_records)
    assert manifest.created_at <= manifest.updated_at
