"""A collection as files a trainer or ``datasets`` loads: Parquet shards and one JSONL file.

Both use one flat schema (``arrow_schema``): scalars as they are; ``sequences`` as a list of
structs whose ``input_ids``/``loss_mask``/``logprobs`` are nested lists (int64, int64, float64);
``rewards``, ``findings``, ``messages``, ``tools`` and ``timings`` as JSON strings (sorted keys), because
their keys vary from episode to episode and a struct type would be inferred differently from file
to file. ``datasets.load_dataset("parquet", ...)`` reads the Parquet shards to
``episode_features()``; ``load_dataset("json", ...)`` infers the same features when no column is
null throughout, and reads them exactly with ``features=episode_features()`` in any case.

Export streams: one record at a time from ``episodes.jsonl``, Parquet written in row groups of
``batch_rows`` and shards of at most ``rows_per_shard`` rows / ``max_shard_bytes`` of source
JSONL. Only committed lines are read (an unterminated last line is a write in progress).

``pyarrow`` (and ``datasets`` for ``episode_features``) come with the ``rollwire[datasets]``
extra and are imported only when called.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from pydantic import BaseModel, ValidationError

from rollwire.datasets.records import SCHEMA, EpisodeRecord
from rollwire.datasets.store import EPISODES_FILE, CorruptCollectionError, iter_committed_lines
from rollwire.writes import writing

if TYPE_CHECKING:
    import datasets
    import pyarrow as pa

PARQUET_PREFIX = "train"
JSONL_NAME = "train.jsonl"
DEFAULT_DATA_DIR = "data"

# Column -> (arrow type name for the card, description). The order is the export's column order.
COLUMNS: dict[str, tuple[str, str]] = {
    "schema": ("string", f"record schema version ({SCHEMA})"),
    "episode_id": ("string", "sha256 of (task, sample_index, seed), 24 hex digits"),
    "group_id": ("string", "shared by the samples of one task instance in one group (GRPO)"),
    "task": ("string", "task name"),
    "sample_index": ("int64", "sample number of this task instance"),
    "seed": ("int64", "task seed (null when unseeded)"),
    "reward": ("float64", "the verifier's reward; null when the verifier never ran (not 0.0)"),
    "rewards": ("string", "JSON object: the verifier's rewards, verbatim"),
    "reward_key": ("string", "the key of `rewards` that `reward` is (null: a single reward)"),
    "ok": ("bool", "the rollout is usable"),
    "rollout_type": ("string", "`train` (token ids + logprobs) or `eval` (text only)"),
    "capture_level": ("string", "`tokens` or `text`: what the endpoint was certified for"),
    "model": ("string", "the model that acted"),
    "harness": ("string", "the agent harness"),
    "sandbox": ("string", "the sandbox (null for in-process environments)"),
    "findings": ("string", "JSON list of findings: {level, code, message, node_id}"),
    "sequences": (
        "list<struct>",
        "training sequences: sequence_id, role, trainable, input_ids, loss_mask, logprobs "
        "(aligned; loss_mask 1 only on sampled tokens with trustworthy logprobs), "
        "weight_versions (per turn)",
    ),
    "messages": ("string", "JSON list of chat messages (null when not recorded)"),
    "tools": ("string", "JSON list of the tools offered (null when none or not recorded)"),
    "n_turns": ("int64", "model calls in the rollout"),
    "n_trainable_tokens": ("int64", "tokens with loss_mask 1 over the trainable sequences"),
    "stop_reason": ("string", "why the agent stopped"),
    "timings": ("string", "JSON object of phase durations in seconds"),
    "weight_versions": (
        "list<string>",
        "the engine weight versions that sampled the agent's calls, in order (each sequence's "
        "weight_versions: one per turn, null where unknown)",
    ),
    "created_at": ("string", "ISO 8601 UTC time the episode was recorded"),
    "rollwire_version": ("string", "rollwire version that recorded it"),
}


class ExportError(Exception):
    """The collection cannot be exported (missing, damaged, or of another schema)."""


class ExportResult(BaseModel):
    """What an export wrote, as paths relative to ``out_dir``."""

    out_dir: str
    parquet_files: list[str]
    jsonl_file: str | None
    n_rows: int


def arrow_schema() -> pa.Schema:
    """The export's Arrow schema (one for Parquet and JSONL)."""
    import pyarrow as pa

    sequence = pa.struct(
        [
            ("sequence_id", pa.string()),
            ("role", pa.string()),
            ("trainable", pa.bool_()),
            ("input_ids", pa.list_(pa.int64())),
            ("loss_mask", pa.list_(pa.int64())),
            ("logprobs", pa.list_(pa.float64())),
            ("weight_versions", pa.list_(pa.string())),
        ]
    )
    types = {
        "list<string>": pa.list_(pa.string()),
        "string": pa.string(),
        "int64": pa.int64(),
        "float64": pa.float64(),
        "bool": pa.bool_(),
        "list<struct>": pa.list_(sequence),
    }
    return pa.schema([(name, types[kind]) for name, (kind, _) in COLUMNS.items()])


def episode_features() -> datasets.Features:
    """The ``datasets`` features of an exported collection (pass to ``load_dataset("json", ...)``
    to read JSONL exactly as the Parquet shards read)."""
    import datasets

    return datasets.Features.from_arrow_schema(arrow_schema())


def _json_text(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def export_row(record: EpisodeRecord) -> dict[str, Any]:
    """One record as an export row (the ``COLUMNS`` order; nested JSON fields as text)."""
    data = record.model_dump(mode="json", by_alias=True)
    row: dict[str, Any] = {}
    for name in COLUMNS:
        value = data[name]
        if name in ("rewards", "findings", "timings"):
            value = _json_text(value)
        elif name in ("messages", "tools") and value is not None:
            value = _json_text(value)
        row[name] = value
    return row


def iter_episodes(collection_dir: str | os.PathLike[str]) -> Iterator[EpisodeRecord]:
    """The committed episodes of a collection, one at a time."""
    path = Path(collection_dir) / EPISODES_FILE
    if not path.exists():
        raise ExportError(f"{collection_dir} holds no {EPISODES_FILE}: it is not a collection")
    for number, raw in iter_committed_lines(path):
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise CorruptCollectionError(path, number, f"not JSON ({exc})") from None
        schema = obj.get("schema") if isinstance(obj, dict) else None
        if schema != SCHEMA:
            raise ExportError(
                f"{path}, line {number}: record schema {schema!r}, this rollwire reads {SCHEMA!r}"
            )
        try:
            yield EpisodeRecord.model_validate(obj)
        except ValidationError as exc:
            raise CorruptCollectionError(path, number, f"not an episode record: {exc}") from None


def export_collection(
    collection_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str] | None = None,
    *,
    parquet: bool = True,
    jsonl: bool = True,
    rows_per_shard: int = 50_000,
    max_shard_bytes: int = 400 * 1024 * 1024,
    batch_rows: int = 256,
) -> ExportResult:
    """Export a collection to ``out_dir`` (default ``<collection_dir>/data``).

    Writes ``train-NNNNN-of-MMMMM.parquet`` shards (zstd) and/or ``train.jsonl``, replacing the
    files of an earlier export there (so no stale shard matches ``train-*.parquet``). Files are
    written in a temporary folder beside them and moved in at the end: an export that fails
    leaves the earlier one as it was. An empty collection gives one empty shard (its schema is
    still there to load).
    """
    if not (parquet or jsonl):
        raise ValueError("export nothing? ask for parquet, jsonl or both")
    if rows_per_shard < 1 or batch_rows < 1:
        raise ValueError("rows_per_shard and batch_rows must be at least 1")
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = Path(collection_dir)
    dest = Path(out_dir) if out_dir is not None else src / DEFAULT_DATA_DIR
    with writing(dest):  # a full or read-only disk: the error names the export's folder
        dest.mkdir(parents=True, exist_ok=True)
        schema = arrow_schema()
        for stale in dest.glob(".export-*"):  # left by an export the disk stopped (read-only)
            shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=".export-", dir=dest))
        try:
            shards: list[Path] = []
            writer: pq.ParquetWriter | None = None
            shard_rows = shard_bytes = n_rows = 0
            batch: list[dict[str, Any]] = []
            jsonl_file = (staging / JSONL_NAME).open("wb") if jsonl else None

            def flush_batch() -> None:
                if writer is not None and batch:
                    writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                batch.clear()

            def open_shard() -> pq.ParquetWriter:
                path = staging / f"{PARQUET_PREFIX}-{len(shards):05d}.parquet"
                shards.append(path)
                return pq.ParquetWriter(path, schema, compression="zstd")

            try:
                for record in iter_episodes(src):
                    row = export_row(record)
                    line = orjson.dumps(row)
                    n_rows += 1
                    if jsonl_file is not None:
                        jsonl_file.write(line + b"\n")
                    if not parquet:
                        continue
                    size = len(line)
                    if writer is not None and (
                        shard_rows >= rows_per_shard or shard_bytes + size > max_shard_bytes
                    ):
                        flush_batch()
                        writer.close()
                        writer = None
                    if writer is None:
                        writer = open_shard()
                        shard_rows = shard_bytes = 0
                    batch.append(row)
                    shard_rows += 1
                    shard_bytes += size
                    if len(batch) >= batch_rows:
                        flush_batch()
                if parquet:
                    if writer is None:
                        writer = open_shard()  # an empty collection: one empty shard
                    flush_batch()
                    writer.close()
                    writer = None
            finally:
                if writer is not None:
                    writer.close()
                if jsonl_file is not None:
                    jsonl_file.close()

            # Move in: drop the earlier export's files, then rename the new ones into place.
            for old in dest.glob(f"{PARQUET_PREFIX}-*.parquet"):
                old.unlink()
            parquet_names: list[str] = []
            for i, shard in enumerate(shards):
                name = f"{PARQUET_PREFIX}-{i:05d}-of-{len(shards):05d}.parquet"
                os.replace(shard, dest / name)
                parquet_names.append(name)
            if jsonl:
                os.replace(staging / JSONL_NAME, dest / JSONL_NAME)
            elif (dest / JSONL_NAME).exists():
                (dest / JSONL_NAME).unlink()
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # a read-only disk keeps it: see above
        return ExportResult(
            out_dir=str(dest),
            parquet_files=parquet_names,
            jsonl_file=JSONL_NAME if jsonl else None,
            n_rows=n_rows,
        )
