"""Datasets: collections on disk: the crash-safe episode store, export, Hub publishing.

Owns the lines of a collection (``records``: episode, failure and filtered records with
deterministic ids), the append-only, resumable episode store and its manifest (``store``), running
statistics (``stats``), and what a collection becomes: Parquet/JSONL files (``export``), an SFT
dataset (``sft``), a Hub dataset repository (``hub``).

May import: ``result``, ``capture`` and the base modules. Never ``sessions`` (its sibling in the
layer contract), ``harnesses``, ``tools``, ``collect`` or ``server``: what runs episodes writes
here, never the reverse.

``records`` and ``store`` need only the base install. ``export`` (pyarrow) and ``hub``
(huggingface_hub, pyarrow) import their libraries when called; install ``rollwire[datasets]``.
"""

from rollwire.datasets.records import (
    SCHEMA,
    EpisodeRecord,
    FailureRecord,
    FilteredRecord,
    SequenceRow,
    episode_id,
    group_id,
    group_index,
)
from rollwire.datasets.stats import RunningStats, StatsSummary
from rollwire.datasets.store import (
    CollectionError,
    CollectionLockedError,
    CollectionMismatchError,
    CorruptCollectionError,
    Counts,
    DuplicateEpisodeError,
    EpisodeStore,
    Manifest,
    fingerprint,
    read_manifest,
)

__all__ = [
    "SCHEMA",
    "CollectionError",
    "CollectionLockedError",
    "CollectionMismatchError",
    "CorruptCollectionError",
    "Counts",
    "DuplicateEpisodeError",
    "EpisodeRecord",
    "EpisodeStore",
    "FailureRecord",
    "FilteredRecord",
    "Manifest",
    "RunningStats",
    "SequenceRow",
    "StatsSummary",
    "episode_id",
    "fingerprint",
    "group_id",
    "group_index",
    "read_manifest",
]
