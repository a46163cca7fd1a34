"""Parquet and JSONL exports have one schema: `datasets` loads both to the same features."""

from __future__ import annotations

import json
import subprocess
import sys

import datasets
import pyarrow.parquet as pq
import pytest

from rollwire.datasets.export import (
    COLUMNS,
    ExportError,
    episode_features,
    export_collection,
)
from rollwire.datasets.store import EPISODES_FILE, EpisodeStore
from tests.datasets.samples import make_record


def _collection(path, records) -> None:
    with EpisodeStore(path, config={"c": 1}) as store:
        for r in records:
            store.write_episode(r)


def _varied() -> list:
    """Every nullable column is non-null somewhere (so JSON type inference has a value)."""
    return [
        make_record(
            0,
            reward=1.0,
            messages=[{"role": "user", "content": "2+2?"}],
            tools=[{"type": "function", "function": {"name": "answer"}}],
            sandbox="local",
        ),
        make_record(1, reward=None, seed=None),
        make_record(2, reward=0.0, reward_key="correct", stop_reason=None),
        make_record(3, reward=0.5, rewards={"correct": 0.5, "format": 1.0}, reward_key="correct"),
    ]


def _load(kind: str, files, cache, **kw):
    return datasets.load_dataset(kind, data_files=files, split="train", cache_dir=str(cache), **kw)


def test_parquet_and_jsonl_load_to_identical_features_and_rows(tmp_path):
    records = _varied()
    _collection(tmp_path / "c", records)
    result = export_collection(tmp_path / "c", tmp_path / "out")
    assert result.n_rows == 4 and result.parquet_files == ["train-00000-of-00001.parquet"]
    from_parquet = _load("parquet", str(tmp_path / "out" / "train-*.parquet"), tmp_path / "hf")
    from_json = _load("json", str(tmp_path / "out" / "train.jsonl"), tmp_path / "hf")
    assert from_parquet.features == from_json.features == episode_features()
    assert list(from_parquet.features) == list(COLUMNS)
    assert from_parquet.to_list() == from_json.to_list()
    row = from_parquet[3]
    assert row["episode_id"] == records[3].episode_id and row["reward"] == 0.5
    assert json.loads(row["rewards"]) == {"correct": 0.5, "format": 1.0}
    agent = row["sequences"][1]
    assert agent["input_ids"] == records[3].sequences[1].input_ids
    assert agent["loss_mask"] == records[3].sequences[1].loss_mask
    assert agent["logprobs"] == records[3].sequences[1].logprobs
    assert json.loads(from_parquet[0]["messages"]) == [{"role": "user", "content": "2+2?"}]
    assert json.loads(from_parquet[0]["tools"])[0]["function"]["name"] == "answer"
    assert from_parquet[1]["reward"] is None and from_parquet[1]["seed"] is None


def test_all_null_columns_read_the_same_with_the_published_features(tmp_path):
    records = [make_record(i, reward=None, seed=None) for i in range(3)]
    _collection(tmp_path / "c", records)
    export_collection(tmp_path / "c", tmp_path / "out")
    from_parquet = _load("parquet", str(tmp_path / "out" / "train-*.parquet"), tmp_path / "hf")
    from_json = _load(
        "json", str(tmp_path / "out" / "train.jsonl"), tmp_path / "hf", features=episode_features()
    )
    assert from_parquet.features == from_json.features == episode_features()
    assert from_parquet.to_list() == from_json.to_list()


def test_export_shards_stream_and_replace_an_earlier_export(tmp_path):
    _collection(tmp_path / "c", [make_record(i) for i in range(7)])
    out = tmp_path / "c" / "data"
    first = export_collection(tmp_path / "c", rows_per_shard=2, batch_rows=1, jsonl=False)
    assert first.out_dir == str(out) and len(first.parquet_files) == 4
    assert [pq.ParquetFile(out / f).metadata.num_rows for f in first.parquet_files] == [2, 2, 2, 1]
    second = export_collection(tmp_path / "c", rows_per_shard=5)
    assert sorted(p.name for p in out.glob("train-*.parquet")) == second.parquet_files
    assert second.parquet_files == ["train-00000-of-00002.parquet", "train-00001-of-00002.parquet"]
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []


def test_export_reads_committed_lines_only(tmp_path):
    _collection(tmp_path / "c", [make_record(i) for i in range(2)])
    with (tmp_path / "c" / EPISODES_FILE).open("ab") as f:
        f.write(make_record(2).to_line()[:-10])  # a write in progress
    assert export_collection(tmp_path / "c", tmp_path / "out").n_rows == 2


def test_an_empty_collection_exports_one_empty_shard_with_the_schema(tmp_path):
    _collection(tmp_path / "c", [])
    result = export_collection(tmp_path / "c", tmp_path / "out")
    table = pq.read_table(tmp_path / "out" / result.parquet_files[0])
    assert result.n_rows == 0 and table.num_rows == 0 and table.column_names == list(COLUMNS)


def test_a_record_of_another_schema_is_refused_by_name(tmp_path):
    _collection(tmp_path / "c", [make_record(0)])
    path = tmp_path / "c" / EPISODES_FILE
    path.write_bytes(path.read_bytes().replace(b"rollwire.episode/1", b"rollwire.episode/9"))
    with pytest.raises(ExportError, match=r"line 1.*rollwire.episode/9"):
        export_collection(tmp_path / "c", tmp_path / "out")


def test_importing_the_datasets_package_pulls_in_no_heavy_library():
    code = (
        "import sys, rollwire.datasets, rollwire.datasets.export, rollwire.datasets.hub\n"
        "print(sorted(m for m in ('datasets', 'pyarrow', 'huggingface_hub', 'pandas') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
