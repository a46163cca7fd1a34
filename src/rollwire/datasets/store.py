"""``EpisodeStore``: a collection directory that is append-only, crash-safe and resumable.

Layout of ``out_dir``::

    episodes.jsonl   one EpisodeRecord per line: the kept episodes (the dataset)
    failures.jsonl   one FailureRecord per failed attempt
    filtered.jsonl   one FilteredRecord per episode that ran but was not kept
    manifest.json    what the collection is (config + fingerprint) and what it holds (counts,
                     reward stats, trainable tokens); rewritten atomically
    .lock            held (flock) while a store has the directory open

Commit rule: a record is committed once its whole line, newline included, is in the file and
fsynced. Each line goes to the file in one ``os.write`` on an ``O_APPEND`` descriptor, then
``os.fsync``; writes are serialised by a ``threading.Lock`` (safe from any thread or event loop).
A write that fails part-way is truncated back, so the file never holds a partial line followed by
a good one. A write that fails (a full or read-only disk) raises ``rollwire.writes.WriteFailed``
naming the file and the cause; every record committed before it stays committed.

On open the files are scanned: an unterminated or unparsable *last* line is what a crash leaves
behind (the episode was never committed); it is truncated away and reported in ``recovery``, and
that episode will be collected again. A bad line anywhere else is damage, not a crash, and opening
fails with ``CorruptCollectionError`` naming the file and line. The manifest is derived data: a
resume recomputes counts and stats from the files, so a stale manifest loses nothing.

The async ``append_*`` methods run the blocking write + fsync in a worker thread
(``anyio.to_thread.run_sync``, not abandoned on cancellation: a write that started completes).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import orjson
from pydantic import BaseModel, Field, ValidationError

from rollwire.capture.findings import Finding, warn
from rollwire.datasets.records import (
    ID_HEX_DIGITS,
    EpisodeRecord,
    FailureRecord,
    FilteredRecord,
    canonical_json,
    rollwire_version,
    utc_now,
)
from rollwire.datasets.stats import RunningStats, StatsSummary
from rollwire.writes import WriteFailed, fsync_dir, write_atomic, writing

EPISODES_FILE = "episodes.jsonl"
FAILURES_FILE = "failures.jsonl"
FILTERED_FILE = "filtered.jsonl"
MANIFEST_FILE = "manifest.json"
LOCK_FILE = ".lock"
MANIFEST_SCHEMA = "rollwire.collection/1"

logger = logging.getLogger(__name__)


class CollectionError(Exception):
    """Base of the errors an episode store raises."""


class CorruptCollectionError(CollectionError):
    """A collection file holds a bad line that a crash cannot explain (not the last line)."""

    def __init__(self, path: Path, line: int | None, problem: str) -> None:
        self.path, self.line, self.problem = path, line, problem
        where = f"{path}, line {line}" if line is not None else str(path)
        super().__init__(f"{where}: {problem}")


class CollectionMismatchError(CollectionError):
    """``out_dir`` already holds a different collection (its fingerprint differs)."""

    def __init__(self, out_dir: Path, expected: str, found: str | None, detail: str = "") -> None:
        self.out_dir, self.expected, self.found = out_dir, expected, found
        if found is None:
            msg = f"{out_dir} holds collection files but no {MANIFEST_FILE}: it is not a collection this store can resume"
        else:
            msg = (
                f"{out_dir} holds a different collection (fingerprint {found}, this config is "
                f"{expected}); use another output directory, or the config it was collected with"
            )
        super().__init__(msg + (f" ({detail})" if detail else ""))


class CollectionLockedError(CollectionError):
    """Another store (in this or another process) has ``out_dir`` open."""


class DuplicateEpisodeError(CollectionError):
    """The episode is already settled (written or filtered); it is never written twice."""

    def __init__(self, episode_id: str, where: str) -> None:
        self.episode_id = episode_id
        super().__init__(f"episode {episode_id} is already {where}: refusing to write it twice")


def fingerprint(config: Mapping[str, Any]) -> str:
    """The identity of a collection config: first 24 hex digits of the SHA-256 of its canonical
    JSON (sorted keys, no spaces). Equal configs, however ordered, give equal fingerprints."""
    return hashlib.sha256(canonical_json(dict(config)).encode()).hexdigest()[:ID_HEX_DIGITS]


_config_fingerprint = fingerprint


class Counts(BaseModel):
    """What the collection holds. ``failed`` counts episodes whose every attempt failed so far;
    ``failure_records`` counts attempts. ``skipped_done`` is this run's: planned episodes skipped
    because the directory already held them."""

    collected: int = 0
    filtered: int = 0
    failed: int = 0
    failure_records: int = 0
    skipped_done: int = 0


class Manifest(BaseModel):
    """``manifest.json``: what the collection is and what it holds."""

    schema_: str = Field(default=MANIFEST_SCHEMA, alias="schema")
    fingerprint: str
    config: dict[str, Any]
    engine_tier: str | None = None
    model: str | None = None
    counts: Counts = Field(default_factory=Counts)
    planned: int | None = Field(
        default=None, description="episodes the latest run set out to hold (its `episodes`)"
    )
    reward: StatsSummary
    reward_none: int = 0
    trainable_tokens: int = 0
    rollwire_version: str = Field(default_factory=rollwire_version)
    created_at: str
    updated_at: str
    files: dict[str, str] = Field(
        default_factory=lambda: {
            "episodes": EPISODES_FILE,
            "failures": FAILURES_FILE,
            "filtered": FILTERED_FILE,
        }
    )


# --------------------------------------------------------------------------------------------
# Files: JSONL scan with tail repair (atomic replace and directory fsync: rollwire.writes)


def read_manifest(out_dir: Path) -> Manifest | None:
    """The manifest in ``out_dir``, or None when there is none."""
    path = Path(out_dir) / MANIFEST_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return Manifest.model_validate_json(data)
    except ValidationError as exc:
        raise CorruptCollectionError(path, None, f"not a rollwire manifest: {exc}") from None


def iter_committed_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(line number, line) for each committed line of a JSONL file; an unterminated last line
    (a write in progress, or a crash's leftover) is not yielded."""
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            if raw.endswith(b"\n"):
                yield number, raw


def scan_jsonl(path: Path, visit: Callable[[dict[str, Any]], None]) -> Finding | None:
    """Call ``visit`` on each record of a JSONL file and repair a torn last line.

    The last line is torn when it has no newline, or is not a JSON object: it is truncated away
    (and fsynced) and a WARN finding says so. Any other bad line raises
    ``CorruptCollectionError`` with its 1-based line number; so does a ``ValueError`` from
    ``visit`` (a well-formed line whose content is wrong is damage, not a crash).
    """
    if not path.exists():
        return None
    bad: tuple[int, int, bytes, str] | None = None  # (line number, offset, line, problem)
    offset = 0
    number = 0
    with path.open("rb") as f:
        for raw in f:
            number += 1
            if bad is not None:  # a bad line with more after it: damage in the middle
                raise CorruptCollectionError(path, bad[0], bad[3])
            if not raw.endswith(b"\n"):
                bad = (number, offset, raw, "no newline at its end")
            else:
                try:
                    obj = orjson.loads(raw)
                except orjson.JSONDecodeError as exc:
                    bad = (number, offset, raw, f"not JSON ({exc})")
                else:
                    if not isinstance(obj, dict):
                        bad = (number, offset, raw, "not a JSON object")
                    else:
                        try:
                            visit(obj)
                        except ValueError as exc:
                            raise CorruptCollectionError(path, number, str(exc)) from None
            offset += len(raw)
    if bad is None:
        return None
    line, start, raw, problem = bad
    with path.open("r+b") as f:
        f.truncate(start)
        f.flush()
        os.fsync(f.fileno())
    lost = ""
    with contextlib.suppress(orjson.JSONDecodeError, AttributeError):
        eid = orjson.loads(raw).get("episode_id")
        if eid:
            lost = f"; episode {eid} was not committed and will be collected again"
    return warn(
        "torn_tail",
        f"{path.name}: line {line} ({len(raw)} bytes) was cut short by a crash or a failed "
        f"write ({problem}); "
        f"truncated it away{lost}",
    )


def _episode_id_of(obj: Mapping[str, Any]) -> str:
    eid = obj.get("episode_id")
    if not isinstance(eid, str) or not eid:
        raise ValueError("the record has no episode_id")
    return eid


# --------------------------------------------------------------------------------------------
# The store


class EpisodeStore:
    """An open collection directory. See the module docstring for the layout and guarantees.

    ``config`` is the collection's identity: its ``fingerprint`` (or the one given) is stored in
    the manifest, and reopening a directory whose manifest has another fingerprint raises
    ``CollectionMismatchError``. ``model`` and ``engine_tier`` go to the manifest (kept from the
    existing manifest when not given). The manifest is rewritten at most every
    ``manifest_interval_s`` seconds while appending (0: after every record) and on ``flush``
    and ``close``.

    Use as a context manager (``with`` or ``async with``), or call ``close``.
    """

    def __init__(
        self,
        out_dir: str | os.PathLike[str],
        *,
        config: Mapping[str, Any] | None = None,
        fingerprint: str | None = None,
        model: str | None = None,
        engine_tier: str | None = None,
        manifest_interval_s: float = 2.0,
        planned: int | None = None,
    ) -> None:
        self.out_dir = Path(out_dir)
        self._planned = planned
        with writing(self.out_dir):
            self.out_dir.mkdir(parents=True, exist_ok=True)
        self._config: dict[str, Any] = orjson.loads(canonical_json(dict(config or {})))
        self._fingerprint = fingerprint or _config_fingerprint(self._config)
        self._interval = manifest_interval_s
        self._lock = threading.Lock()
        self._closed = False
        self.manifest_error: OSError | None = None  # the last failed manifest update, if any
        self._fault: WriteFailed | None = None  # a write that failed and could not be undone
        self._fds: dict[str, int] = {}
        with writing(self.out_dir):
            self._lock_fd = self._take_dir_lock()
        try:
            self._open(model, engine_tier)
        except BaseException:
            self._release()
            raise

    def _open(self, model: str | None, engine_tier: str | None) -> None:
        """Read what is there, repair a torn tail, open the files (an ``OSError`` is a
        ``WriteFailed`` naming the directory, or the file when it names one)."""
        with writing(self.out_dir):
            existing = read_manifest(self.out_dir)
            self._check_identity(existing)
            self._model = model if model is not None else (existing.model if existing else None)
            self._tier = (
                engine_tier
                if engine_tier is not None
                else (existing.engine_tier if existing else None)
            )
            self._created_at = existing.created_at if existing else utc_now()
            if self._planned is None and existing is not None:
                self._planned = existing.planned
            self._remove_stale_temp_files()
            self._done: set[str] = set()
            self._filtered: set[str] = set()
            self._failed: set[str] = set()
            self._failure_records = 0
            self._skipped_done = 0
            self._stats = RunningStats()
            self._reward_none = 0
            self._trainable_tokens = 0
            self.recovery: list[Finding] = self._scan()
            # Counted once here, then kept up to date per write (O(1), never a set difference).
            self._n_filtered = len(self._filtered - self._done)
            self._n_failed = len(self._failed - self._done - self._filtered)
            for name in (EPISODES_FILE, FAILURES_FILE, FILTERED_FILE):
                self._fds[name] = os.open(
                    self.out_dir / name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644
                )
            fsync_dir(self.out_dir)
            self._last_manifest = 0.0
            self._write_manifest()

    @classmethod
    async def aopen(cls, out_dir: str | os.PathLike[str], **kwargs: Any) -> EpisodeStore:
        """Open in a worker thread: the resume scan reads every line of the collection."""
        return await anyio.to_thread.run_sync(lambda: cls(out_dir, **kwargs))

    # -- opening ------------------------------------------------------------------------------

    def _take_dir_lock(self) -> int:
        fd = os.open(self.out_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise CollectionLockedError(
                f"{self.out_dir} is open in another episode store (this or another process)"
            ) from None
        return fd

    def _check_identity(self, existing: Manifest | None) -> None:
        if existing is not None:
            if existing.fingerprint != self._fingerprint:
                raise CollectionMismatchError(self.out_dir, self._fingerprint, existing.fingerprint)
            return
        for name in (EPISODES_FILE, FAILURES_FILE, FILTERED_FILE):
            path = self.out_dir / name
            if path.exists() and path.stat().st_size > 0:
                raise CollectionMismatchError(self.out_dir, self._fingerprint, None, name)

    def _remove_stale_temp_files(self) -> None:
        for tmp in self.out_dir.glob(f".{MANIFEST_FILE}.*.tmp"):
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    def _scan(self) -> list[Finding]:
        findings: list[Finding] = []

        def visit_episode(obj: dict[str, Any]) -> None:
            eid = _episode_id_of(obj)
            if eid in self._done:
                raise ValueError(f"episode {eid} appears twice")
            self._done.add(eid)
            self._count_episode(obj.get("reward"), obj.get("n_trainable_tokens"))

        def visit_failure(obj: dict[str, Any]) -> None:
            self._failed.add(_episode_id_of(obj))
            self._failure_records += 1

        def visit_filtered(obj: dict[str, Any]) -> None:
            self._filtered.add(_episode_id_of(obj))

        for name, visit in (
            (EPISODES_FILE, visit_episode),
            (FAILURES_FILE, visit_failure),
            (FILTERED_FILE, visit_filtered),
        ):
            repaired = scan_jsonl(self.out_dir / name, visit)
            if repaired is not None:
                findings.append(repaired)
        return findings

    def _count_episode(self, reward: Any, trainable_tokens: Any) -> None:
        if reward is None:
            self._reward_none += 1
        else:
            if not isinstance(reward, int | float):
                raise ValueError(f"reward {reward!r} is not a number")
            self._stats.update(float(reward))
        if isinstance(trainable_tokens, int):
            self._trainable_tokens += trainable_tokens

    # -- what the store holds ---------------------------------------------------------------

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    @property
    def done_ids(self) -> frozenset[str]:
        """A snapshot of the episode ids written to ``episodes.jsonl``. Use ``is_done`` in loops."""
        with self._lock:
            return frozenset(self._done)

    @property
    def filtered_ids(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._filtered)

    def is_done(self, episode_id: str) -> bool:
        """Is the episode in ``episodes.jsonl``?"""
        with self._lock:
            return episode_id in self._done

    def is_settled(self, episode_id: str) -> bool:
        """Written or filtered: a resume must not run it again. (A failed one is retried.)"""
        with self._lock:
            return episode_id in self._done or episode_id in self._filtered

    def pending(self, episode_ids: Iterable[str]) -> list[str]:
        """The ids of ``episode_ids`` not yet settled, in order; the others count as
        ``skipped_done`` in this run's manifest."""
        out: list[str] = []
        with self._lock:
            for eid in episode_ids:
                if eid in self._done or eid in self._filtered:
                    self._skipped_done += 1
                else:
                    out.append(eid)
        return out

    def note_skipped(self, n: int = 1) -> None:
        """Count ``n`` planned episodes skipped because they are already settled."""
        with self._lock:
            self._skipped_done += n

    @property
    def counts(self) -> Counts:
        with self._lock:
            return self._counts()

    @property
    def reward_stats(self) -> RunningStats:
        with self._lock:
            return self._stats.model_copy()

    def manifest(self) -> Manifest:
        """The manifest as it would be written now."""
        with self._lock:
            return self._manifest()

    def _counts(self) -> Counts:
        return Counts(
            collected=len(self._done),
            filtered=self._n_filtered,
            failed=self._n_failed,
            failure_records=self._failure_records,
            skipped_done=self._skipped_done,
        )

    def _manifest(self) -> Manifest:
        return Manifest(
            fingerprint=self._fingerprint,
            config=self._config,
            engine_tier=self._tier,
            model=self._model,
            counts=self._counts(),
            planned=self._planned,
            reward=self._stats.summary(),
            reward_none=self._reward_none,
            trainable_tokens=self._trainable_tokens,
            created_at=self._created_at,
            updated_at=utc_now(),
        )

    # -- writing ------------------------------------------------------------------------------

    def write_episode(self, record: EpisodeRecord) -> None:
        """Commit one episode (blocking: write + fsync). Refuses an id already settled."""
        line = record.to_line()
        with self._lock:
            self._check_writable()
            self._refuse_settled(record.episode_id)
            self._append(EPISODES_FILE, line)
            self._done.add(record.episode_id)
            if record.episode_id in self._failed:
                self._n_failed -= 1  # a retry succeeded
            self._count_episode(record.reward, record.n_trainable_tokens)
            self._maybe_write_manifest()

    def write_failure(self, record: FailureRecord) -> None:
        """Commit one failed attempt (blocking). Refuses an id already settled."""
        line = record.to_line()
        with self._lock:
            self._check_writable()
            self._refuse_settled(record.episode_id)
            self._append(FAILURES_FILE, line)
            if record.episode_id not in self._failed:
                self._failed.add(record.episode_id)
                self._n_failed += 1
            self._failure_records += 1
            self._maybe_write_manifest()

    def write_filtered(self, record: FilteredRecord) -> None:
        """Commit one not-kept episode (blocking). Refuses an id already settled."""
        line = record.to_line()
        with self._lock:
            self._check_writable()
            self._refuse_settled(record.episode_id)
            self._append(FILTERED_FILE, line)
            self._filtered.add(record.episode_id)
            self._n_filtered += 1
            if record.episode_id in self._failed:
                self._n_failed -= 1
            self._maybe_write_manifest()

    async def append_episode(self, record: EpisodeRecord) -> None:
        """``write_episode`` in a worker thread."""
        await anyio.to_thread.run_sync(self.write_episode, record)

    async def append_failure(self, record: FailureRecord) -> None:
        """``write_failure`` in a worker thread."""
        await anyio.to_thread.run_sync(self.write_failure, record)

    async def append_filtered(self, record: FilteredRecord) -> None:
        """``write_filtered`` in a worker thread."""
        await anyio.to_thread.run_sync(self.write_filtered, record)

    def flush(self) -> None:
        """Write the manifest now."""
        with self._lock:
            self._check_writable()
            self._write_manifest()

    def close(self) -> None:
        """Write the final manifest and release the directory. Idempotent."""
        with self._lock:
            if self._closed:
                return
            try:
                self._write_manifest()
            finally:
                self._closed = True
                self._release()

    async def aclose(self) -> None:
        """Close in a worker thread; shielded, so a cancelled collection still writes its
        manifest and releases the directory lock."""
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self.close)

    def __enter__(self) -> EpisodeStore:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._close_after(exc)

    async def __aenter__(self) -> EpisodeStore:
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self._close_after, exc)

    def _close_after(self, exc: object) -> None:
        """Close; when an error is in flight (a full disk, most likely), a manifest that
        cannot be written is logged, not raised over it: the error says what happened, and
        the manifest is derived data a resume recomputes."""
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except OSError as close_exc:
            self.manifest_error = close_exc
            # debug: the error in flight is the one line the user needs; this is its echo
            logger.debug("%s (derived data: a resume recomputes it)", close_exc)

    # -- internals (called with the lock held) -------------------------------------------------

    def _check_writable(self) -> None:
        if self._fault is not None:  # a failed write left a tail it could not put back
            raise WriteFailed(self._fault.path, self._fault.cause, self._fault.then)
        if self._closed:
            raise CollectionError(f"the episode store for {self.out_dir} is closed")

    def _refuse_settled(self, eid: str) -> None:
        if eid in self._done:
            raise DuplicateEpisodeError(eid, f"in {EPISODES_FILE}")
        if eid in self._filtered:
            raise DuplicateEpisodeError(eid, f"filtered (in {FILTERED_FILE})")

    def _append(self, name: str, line: bytes) -> None:
        """One line, committed; a failure (a full or read-only disk: ``WriteFailed`` naming
        the file) leaves the file as it was."""
        fd = self._fds[name]
        path = self.out_dir / name
        with writing(path):
            size = os.fstat(fd).st_size
            try:
                view = memoryview(line)
                while view:  # one write; more only if the kernel took part of it
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            except BaseException as exc:
                # Never leave a partial line for the next record to follow.
                try:
                    os.ftruncate(fd, size)
                    os.fsync(fd)
                except OSError as undo:
                    # The file's tail is unknown: refuse further writes, each with this cause
                    # (a resume's scan repairs the tail). Not closed: close still releases.
                    cause = exc if isinstance(exc, OSError) else undo
                    self._fault = WriteFailed(path, cause, "the store refuses further writes")
                raise

    def _maybe_write_manifest(self) -> None:
        # The record before this is committed: a manifest that cannot be written now must not
        # make its write look failed (a retry would be a duplicate). It is derived data; the
        # next write, flush or close tries again, and flush/close raise.
        if time.monotonic() - self._last_manifest >= self._interval:
            try:
                self._write_manifest()
            except OSError as exc:
                self.manifest_error = exc
                logger.warning("could not update %s: %s", self.out_dir / MANIFEST_FILE, exc)

    def _write_manifest(self) -> None:
        data = self._manifest().model_dump_json(by_alias=True, indent=2).encode() + b"\n"
        write_atomic(self.out_dir / MANIFEST_FILE, data)
        self._last_manifest = time.monotonic()
        self.manifest_error = None

    def _release(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
        with contextlib.suppress(OSError):
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
