"""One rollout's captured calls: turns, the tier they were captured at, and their graph.

At the ``tokens`` tier turns link by exact token prefix (engine ids only). At the ``text`` tier
there are no trustworthy ids, so turns link by message prefix instead: leading system messages
aside, tool-call arguments compared as canonical JSON.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from rollwire.capture.findings import Finding, Level
from rollwire.capture.graph import Node, PrefixGraph, as_ids, plain_int_ids


class CaptureLevel(StrEnum):
    """What an endpoint can give: ``tokens`` trains, ``text`` is eval only."""

    TOKENS = "tokens"
    TEXT = "text"


class RolloutType(StrEnum):
    """Whether a rollout's data may be trained on."""

    TRAIN = "train"
    EVAL = "eval"


def rollout_type_for(level: CaptureLevel) -> RolloutType:
    """Only the tokens tier produces training data."""
    return RolloutType.TRAIN if level is CaptureLevel.TOKENS else RolloutType.EVAL


@dataclass(frozen=True, eq=False)
class TopCandidates:
    """The engine's top candidates of each sampled position, held flat: position ``i``'s
    are ``ids[offsets[i]:offsets[i + 1]]`` with their ``logprobs`` (three arrays per turn, not
    a tuple per candidate). Iterating gives each position's (id, logprob) pairs."""

    offsets: np.ndarray  # int64, one more than the positions
    ids: np.ndarray  # int64
    logprobs: np.ndarray  # float64

    @classmethod
    def from_counts(cls, counts: list[int], ids: Any, logprobs: Any) -> TopCandidates:
        """Flat candidates, ``counts[i]`` of them for position ``i``."""
        offsets = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        return cls(offsets, np.asarray(ids, dtype=np.int64), np.asarray(logprobs, dtype=np.float64))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> list[tuple[int, float]]:
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        return list(zip(self.ids[lo:hi].tolist(), self.logprobs[lo:hi].tolist(), strict=True))

    def __iter__(self) -> Iterator[list[tuple[int, float]]]:
        return iter(self.rows())

    def rows(self) -> list[list[tuple[int, float]]]:
        """Every position's pairs, as the rollout document writes them."""
        pairs = iter(zip(self.ids.tolist(), self.logprobs.tolist(), strict=True))
        return [list(itertools.islice(pairs, n)) for n in np.diff(self.offsets).tolist()]


@dataclass(eq=False)
class Turn:
    """One model call as captured: engine ids, their logprobs, and what was asked and applied."""

    node_id: str
    prompt_ids: np.ndarray | None
    sampled_ids: np.ndarray | None
    # None means "not trustworthy": the ids stay as context, the turn is masked.
    sampled_logprobs: np.ndarray | None
    # Positions of the sampled ids that were forced (logprob exactly 0.0): never loss targets.
    certain: np.ndarray | None = None
    # The engine's top candidates per sampled position (id, logprob), when the agent asked for
    # them: for inspection (the UI), never a training target.
    top_logprobs: TopCandidates | None = None
    finish_reason: str | None = None
    dialect: str = "chat"
    model: str | None = None
    auxiliary: bool = False
    requested_params: dict[str, Any] = field(default_factory=dict)
    applied_params: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    messages: list[dict[str, Any]] | None = None  # the request's messages (text tier)
    reply: dict[str, Any] | None = None  # the assistant message returned
    usage: dict[str, Any] | None = None
    created_at: float = field(default_factory=time.time)
    # Token-in continuation: "rendered" (the engine rendered the prompt), "spliced" (it carries
    # call ``parent_call_id``'s prompt + sampled ids verbatim, ``carried_len`` of them, with the
    # ``synthesized`` prompt positions added by rollwire), or "fallback:<reason>".
    token_in_mode: str = "rendered"
    token_in_path: str | None = None  # how the spliced prompt reached the engine (token_paths)
    parent_call_id: str | None = None
    carried_len: int | None = None
    synthesized: list[int] = field(default_factory=list)
    drift: int | None = None
    # The engine's weight version that sampled this call (read around the call from GET
    # /weight_info, or announced by the trainer); None when unknown, or when it changed during
    # the call (then the turn is masked: its tokens may come from two policies).
    weight_version: str | None = None

    @property
    def logprobs_ok(self) -> bool:
        """Ids and logprobs are present and passed every per-position check."""
        return (
            self.sampled_ids is not None
            and self.sampled_logprobs is not None
            and len(self.sampled_logprobs) == len(self.sampled_ids)
        )

    @property
    def has_fatal(self) -> bool:
        """Any FATAL finding on this turn."""
        return any(f.level is Level.FATAL for f in self.findings)


def message_key(message: dict[str, Any]) -> int:
    """A stable 63-bit key for one chat message, as the text-tier linker compares messages."""
    content = message.get("content")
    if content is None:
        content = ""
    elif isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" for p in content
    ):
        content = "".join(str(p.get("text", "")) for p in content)
    calls = []
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {} if isinstance(call, dict) else {}
        calls.append([fn.get("name"), _canonical_arguments(fn.get("arguments"))])
    canon = [message.get("role"), content, calls, message.get("tool_call_id")]
    blob = json.dumps(canon, sort_keys=True, ensure_ascii=False, default=str).encode()
    return int.from_bytes(hashlib.blake2b(blob, digest_size=8).digest(), "big") >> 1


def _canonical_arguments(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def conversation_keys(messages: Sequence[dict[str, Any]]) -> list[int]:
    """Message keys with leading system messages set aside (harnesses rewrite them)."""
    start = 0
    while start < len(messages) and messages[start].get("role") in ("system", "developer"):
        start += 1
    return [message_key(m) for m in messages[start:]]


class RolloutGraph:
    """All turns of one rollout, linked at the tier they were captured at.

    Thread-safe for concurrent ``add`` calls: rollouts arrive on many event loops and threads.
    """

    def __init__(self, capture_level: CaptureLevel | str = CaptureLevel.TOKENS) -> None:
        self.capture_level = CaptureLevel(capture_level)
        self._graph = PrefixGraph(detect_retokenization=self.capture_level is CaptureLevel.TOKENS)
        self._turns: dict[str, Turn] = {}
        self._unlinked: list[str] = []  # turns the tier cannot link (e.g. no ids at tokens tier)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._turns)

    def __iter__(self) -> Iterator[Turn]:
        return iter(list(self._turns.values()))

    @property
    def rollout_type(self) -> RolloutType:
        """``train`` only at the tokens tier."""
        return rollout_type_for(self.capture_level)

    def turn(self, node_id: str) -> Turn:
        """The turn with this node id."""
        try:
            return self._turns[node_id]
        except KeyError:
            raise KeyError(f"no turn {node_id!r} in this rollout") from None

    def add(self, turn: Turn) -> Turn:
        """Record a turn and link it; a turn the tier cannot link is kept, unlinked."""
        with self._lock:
            if turn.node_id in self._turns:
                raise ValueError(f"turn {turn.node_id!r} is already recorded")
            self._turns[turn.node_id] = turn
            if self.capture_level is CaptureLevel.TOKENS:
                if turn.prompt_ids is None or turn.sampled_ids is None:
                    self._unlinked.append(turn.node_id)
                else:
                    self._graph.add(turn.node_id, turn.prompt_ids, turn.sampled_ids, turn)
            elif turn.messages is None or turn.reply is None:
                self._unlinked.append(turn.node_id)
            else:
                keys = conversation_keys(turn.messages)
                self._graph.add(turn.node_id, keys, [message_key(turn.reply)], turn)
            return turn

    def mark_auxiliary(self, node_id: str, auxiliary: bool = True) -> None:
        """Mark a call as auxiliary (title, summary, ...): its tokens stay context, never targets."""
        self.turn(node_id).auxiliary = auxiliary

    def node(self, node_id: str) -> Node:
        """The linked graph node of a turn (KeyError for unlinked turns)."""
        return self._graph.get(node_id)

    def unlinked(self) -> list[Turn]:
        """Turns kept in the record but outside the graph."""
        return [self._turns[i] for i in self._unlinked]

    def snapshot(self) -> tuple[PrefixGraph, list[Turn], list[Turn]]:
        """The graph, every turn in arrival order, and the unlinked turns, under the lock."""
        with self._lock:
            return self._graph, list(self._turns.values()), self.unlinked()

    def count_roots(self) -> int:
        """Fresh conversations so far (unlinked turns count as their own roots)."""
        with self._lock:
            return len(self._graph.roots()) + len(self._unlinked)


def ids_array(values: Sequence[Any] | np.ndarray | None) -> np.ndarray | None:
    """Engine ids as a read-only int64 array; None stays None (never an empty stand-in), and a
    sequence with anything but plain ints in it (a bool, a float, ...) gives None too."""
    if values is None:
        return None
    return as_ids(values) if isinstance(values, np.ndarray) else plain_int_ids(values)
