"""Collections: crash-safe episode storage, Parquet/JSONL export and Hub publishing.

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
