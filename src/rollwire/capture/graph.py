"""The rollout graph: model calls linked by exact token prefix, independent of arrival order.

A node is one model call: the prompt ids the engine saw and the ids it sampled. Its *sequence*
is ``prompt + sampled``. The parent of a node is the node whose sequence is the longest exact
prefix of its prompt. Linking never looks at request ids, timestamps or headers: those are
per-agent, the prefix is not.

Linking is indexed, not scanned: every node's sequence and prompt are keyed by a position-aware
additive hash, and a new node walks its own prompt from the end until it meets an indexed
sequence. The hashes are cumulative, so they are computed only from a node already known to
prefix the new prompt (the latest node or an ancestor of it, checked token by token) onwards:
per call, one vectorised comparison of the prompt plus work in the tokens added since that node,
not in the number of nodes. Candidates are always verified token by token, so a hash collision
can cost time but never a wrong link.

Re-tokenisation: when a node's prompt starts with an earlier node's *prompt* but not with that
node's sequence (the engine re-tokenised the earlier reply differently, or the agent edited it),
the node starts a new root and records ``retokenized_from``. Fragmentation is counted, not hidden.
"""

from __future__ import annotations

import marshal
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import compress
from typing import Any

import numpy as np

_POS = np.uint64(0x9E3779B97F4A7C15)
_OFF = np.uint64(0xD1B54A32D192ED03)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_ROOT_BUCKET = 16  # roots are bucketed by their first 16 ids so adoption never scans all roots
_HINT_TRIES = 16  # how far up the latest node's ancestry to look for a known prefix of a prompt
# marshal format 2 (no back-references) writes a plain int in int32 range as b"i" + int32 LE.
_MARSHAL_INT = np.dtype([("type", "u1"), ("value", "<i4")])

TOKEN_DTYPE = np.int64


def prefix_hashes(ids: np.ndarray, start: int = 0, seed: int = 0) -> np.ndarray:
    """``h[i]`` keys ``ids[: i + 1]``: a sum of per-position splitmix64 mixes (uint64, wrapping).

    With ``start`` and ``seed``, ``ids`` continue a sequence whose first ``start`` ids hash to
    ``seed``, and ``h[i]`` keys that sequence's first ``start + i + 1`` ids.
    """
    x = ids.astype(np.uint64)
    x += np.arange(start, start + len(ids), dtype=np.uint64) * _POS
    x += _OFF
    x ^= x >> _S30
    x *= _M1
    x ^= x >> _S27
    x *= _M2
    x ^= x >> _S31
    h = np.cumsum(x, dtype=np.uint64)
    h += np.uint64(seed)
    return h


def as_ids(values: Sequence[int] | np.ndarray) -> np.ndarray:
    """A read-only int64 array of token ids (copied from a list, shared from an array)."""
    if isinstance(values, np.ndarray):
        arr = values.astype(TOKEN_DTYPE, copy=False)
    else:
        arr = np.fromiter(values, dtype=TOKEN_DTYPE, count=len(values))
    arr.flags.writeable = False
    return arr


def plain_int_ids(values: Sequence[Any]) -> np.ndarray | None:
    """``values`` as :func:`as_ids` does if every element is a plain ``int``, else None.

    bool, float, int subclasses and numpy scalars are refused. A list takes one C pass first:
    marshal writes it as b"[" + count + one record per element, and each plain int in int32
    range as the 5-byte record b"i" + int32; anything else gets another record type (bool
    b"T"/b"F", float b"g", a big int b"l" ...) or is refused. Every element before the first
    other one is a 5-byte record, so that one starts on the 5-byte grid: if every record on the
    grid is b"i" and the length fits, every element is a plain int. Otherwise the element types
    are checked one by one.
    """
    if type(values) is list:
        try:
            blob = marshal.dumps(values, 2)
        except ValueError:  # unmarshallable: an int subclass, an arbitrary object
            blob = b""
        if blob[:1] == b"[" and len(blob) == 5 + 5 * len(values):
            records = np.frombuffer(blob, dtype=_MARSHAL_INT, offset=5)
            if (records["type"] == ord("i")).all():
                return as_ids(records["value"])
    if set(map(type, values)) - {int}:
        return None
    return as_ids(values)


@dataclass(eq=False)
class Node:
    """One model call as the linker sees it. Extra per-call data lives in ``payload``."""

    node_id: str
    prompt: np.ndarray
    sampled: np.ndarray
    payload: object = None
    # Linking state, owned by PrefixGraph.
    prefix_parent: Node | None = field(default=None, repr=False)
    anchor: Node | None = field(default=None, repr=False)
    seq_key: int = field(default=0, repr=False)
    prompt_key: int = field(default=0, repr=False)

    @property
    def seq_len(self) -> int:
        """Length of ``prompt + sampled``."""
        return len(self.prompt) + len(self.sampled)

    @property
    def parent(self) -> Node | None:
        """The effective parent: none when the node re-tokenised an earlier reply."""
        return None if self.anchor is not None else self.prefix_parent

    def sequence(self) -> np.ndarray:
        """``prompt + sampled`` as one array."""
        return np.concatenate([self.prompt, self.sampled])


def tie_key(node_id: str) -> tuple[int, str]:
    """Among equally long candidates the smallest id wins (natural order for numbered ids)."""
    return (len(node_id), node_id)


def _seq_prefix_of(node: Node, ids: np.ndarray, start: int = 0) -> bool:
    """Is ``node.prompt + node.sampled`` a prefix of ``ids``? Positions below ``start`` are known equal."""
    n_p = len(node.prompt)
    end = n_p + len(node.sampled)
    if end > len(ids):
        return False
    if start < n_p and not np.array_equal(ids[start:n_p], node.prompt[start:]):
        return False
    lo = max(start, n_p)
    return bool(np.array_equal(ids[lo:end], node.sampled[lo - n_p :]))


def _prefixes_sequence(cand: Node, node: Node) -> bool:
    """Is ``cand``'s sequence a prefix of ``node``'s? (Joins ``node``'s only when it must.)"""
    if cand.seq_len <= len(node.prompt):
        return _seq_prefix_of(cand, node.prompt)
    return _seq_prefix_of(cand, node.sequence())


def _last_id(node: Node) -> int:
    return int(node.sampled[-1] if len(node.sampled) else node.prompt[-1])


def _prompt_prefix_of(node: Node, ids: np.ndarray, start: int = 0) -> bool:
    """Is ``node.prompt`` a strict prefix of ``ids``?"""
    n_p = len(node.prompt)
    return n_p < len(ids) and bool(np.array_equal(ids[start:n_p], node.prompt[start:]))


def _better(candidate: Node, length: int, current: Node | None, current_len: int) -> bool:
    if current is None or length > current_len:
        return True
    return length == current_len and tie_key(candidate.node_id) < tie_key(current.node_id)


class PrefixGraph:
    """Nodes linked by longest exact prefix; arrival order does not change the result."""

    def __init__(self, *, detect_retokenization: bool = True) -> None:
        self._nodes: dict[str, Node] = {}
        self._by_seq: dict[int, list[Node]] = {}
        self._by_prompt: dict[int, list[Node]] = {}
        self._children: dict[str, set[Node]] = {}  # by prefix parent
        self._roots: dict[int, set[Node]] = {}  # prefix roots, bucketed by their first ids
        self._detect = detect_retokenization
        self._last: Node | None = None  # the latest node added: its ancestry hints at a parent

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._nodes

    def __iter__(self) -> Iterator[Node]:
        return iter(self._nodes.values())

    def get(self, node_id: str) -> Node:
        """The node with this id (KeyError names it when absent)."""
        try:
            return self._nodes[node_id]
        except KeyError:
            raise KeyError(f"no node {node_id!r} in this graph") from None

    def children(self, node: Node) -> list[Node]:
        """Effective children (re-tokenised nodes are roots, not children)."""
        kids = self._children.get(node.node_id, ())
        return sorted((k for k in kids if k.anchor is None), key=lambda k: tie_key(k.node_id))

    def roots(self) -> list[Node]:
        """Nodes with no effective parent, in tie-key order."""
        return sorted(
            (n for n in self._nodes.values() if n.parent is None),
            key=lambda n: tie_key(n.node_id),
        )

    def add(
        self,
        node_id: str,
        prompt: Sequence[int] | np.ndarray,
        sampled: Sequence[int] | np.ndarray,
        payload: object = None,
    ) -> Node:
        """Insert one call and relink whatever it is a better parent or anchor for."""
        if node_id in self._nodes:
            raise ValueError(f"node_id {node_id!r} is already in the graph")
        node = Node(
            node_id=node_id, prompt=as_ids(prompt), sampled=as_ids(sampled), payload=payload
        )
        hint = self._known_prefix(node.prompt)
        keys = _PrefixKeys(node, hint)
        node.seq_key = keys(node.seq_len)
        node.prompt_key = keys(len(node.prompt))

        parent, parent_len = self._find_parent(node, keys, hint)
        self._set_prefix_parent(node, parent)

        # Late arrivals: nodes already here may hang below this one. Their current prefix parent
        # is a node whose sequence is a prefix of ours no shorter than our parent's, or a root.
        for holder, held_len in self._holders(node, keys, parent, parent_len):
            if holder is None:
                pool = self._root_pool(node.prompt)
            else:
                pool = self._children.get(holder.node_id, set())
            for other in list(pool):
                if other is not node:
                    self._maybe_adopt(node, other, held_len)

        self._nodes[node_id] = node
        self._last = node
        self._by_seq.setdefault(node.seq_key, []).append(node)
        if len(node.prompt):
            self._by_prompt.setdefault(node.prompt_key, []).append(node)
        return node

    def _known_prefix(self, prompt: np.ndarray) -> Node | None:
        """The latest node or its nearest ancestor whose sequence is an exact prefix of ``prompt``
        (from a shorter prompt): where hashing can start. A hint only: the longest prefix is
        still found by the walk in ``_find_parent``."""
        cand = self._last
        for _ in range(_HINT_TRIES):
            if cand is None:
                return None
            end = cand.seq_len
            if (
                len(cand.prompt) < len(prompt)
                and 0 < end <= len(prompt)
                and prompt[end - 1] == _last_id(cand)  # cheap first: the last id
                and _seq_prefix_of(cand, prompt)
            ):
                return cand
            cand = cand.prefix_parent
        return None

    def _find_parent(
        self, node: Node, keys: _PrefixKeys, hint: Node | None
    ) -> tuple[Node | None, int]:
        prompt = node.prompt
        n_p = len(prompt)
        parent: Node | None = None
        parent_len = 0
        for length in keys.lengths_in(self._by_seq, 1, n_p):
            for cand in self._by_seq[keys(length)]:
                # A parent's prompt is strictly shorter: same-prompt calls are siblings, never kin.
                if (
                    cand.seq_len == length
                    and len(cand.prompt) < n_p
                    and (cand is hint or _seq_prefix_of(cand, prompt))
                    and _better(cand, length, parent, length)
                ):
                    parent, parent_len = cand, length
            if parent is not None:
                break
        # The anchor: the node with the longest prompt that is a prefix of ours and longer than
        # the parent's sequence (a re-tokenised reply), if any.
        node.anchor = None
        if self._detect and parent_len + 1 < n_p:
            for length in keys.lengths_in(self._by_prompt, parent_len + 1, n_p - 1):
                for cand in self._by_prompt[keys(length)]:
                    if len(cand.prompt) == length and _prompt_prefix_of(cand, prompt):
                        if _better(cand, length, node.anchor, length):
                            node.anchor = cand
                if node.anchor is not None:
                    break
        return parent, parent_len

    def _holders(
        self, node: Node, keys: _PrefixKeys, parent: Node | None, parent_len: int
    ) -> Iterable[tuple[Node | None, int]]:
        """Nodes whose children might now prefer ``node``; ``None`` stands for the roots."""
        if parent_len == 0:
            yield None, 0
        for length in keys.lengths_in(self._by_seq, max(parent_len, 1), node.seq_len):
            for cand in self._by_seq[keys(length)]:
                if cand.seq_len == length and (cand is parent or _prefixes_sequence(cand, node)):
                    yield cand, length

    def _root_pool(self, prompt: np.ndarray) -> set[Node]:
        # A root below us starts with our prompt, so its bucket is our prompt's when that is long enough.
        if len(prompt) >= _ROOT_BUCKET:
            return self._roots.get(_bucket(prompt), set())
        return set().union(*self._roots.values()) if self._roots else set()

    def _maybe_adopt(self, node: Node, other: Node, held_len: int) -> None:
        """Relink ``other`` if ``node`` is a longer (or tie-winning) prefix parent or anchor."""
        ids = other.prompt
        cur = other.prefix_parent
        cur_len = cur.seq_len if cur is not None else 0
        if (
            len(node.prompt) < len(ids)
            and _seq_prefix_of(node, ids, start=held_len)
            and _better(node, node.seq_len, cur, cur_len)
        ):
            self._set_prefix_parent(other, node)
            if other.anchor is not None and len(other.anchor.prompt) <= node.seq_len:
                other.anchor = None
            return
        if not self._detect or len(node.prompt) <= cur_len:
            return
        if _prompt_prefix_of(node, ids, start=min(held_len, len(node.prompt))):
            anchor = other.anchor
            anchor_len = len(anchor.prompt) if anchor is not None else 0
            if _better(node, len(node.prompt), anchor, anchor_len):
                other.anchor = node

    def _set_prefix_parent(self, node: Node, parent: Node | None) -> None:
        old = node.prefix_parent
        if old is not None:
            self._children[old.node_id].discard(node)
        else:
            self._roots.get(_bucket(node.prompt), set()).discard(node)
        node.prefix_parent = parent
        if parent is not None:
            self._children.setdefault(parent.node_id, set()).add(node)
        else:
            self._roots.setdefault(_bucket(node.prompt), set()).add(node)


class _PrefixKeys:
    """``keys(n)``: the prefix hash of ``node``'s first ``n`` ids, computed from a node known to
    prefix it (``hint``) onwards; all of them again if a shorter prefix is ever asked for."""

    def __init__(self, node: Node, hint: Node | None) -> None:
        self._node = node
        start, seed = (hint.seq_len, hint.seq_key) if hint else (0, 0)
        self._hash_from(start, seed)

    def _hash_from(self, start: int, seed: int) -> None:
        prompt, sampled = self._node.prompt, self._node.sampled
        tail = prefix_hashes(np.concatenate([prompt[start:], sampled]), start, seed)
        self._start = start
        self._keys: list[int] = [seed, *tail.tolist()]  # _keys[i] keys the first start + i ids

    def __call__(self, n: int) -> int:
        if n < self._start:
            self._hash_from(0, 0)
        return self._keys[n - self._start]

    def lengths_in(self, index: dict[int, list[Node]], lo: int, hi: int) -> Iterator[int]:
        """Lengths from ``hi`` down to ``lo`` whose key ``index`` holds (one C-level scan)."""
        if hi >= self._start:
            yield from self._scan(index, max(lo, self._start), hi)
        if lo < self._start:
            hi = min(hi, self._start - 1)
            self._hash_from(0, 0)
            yield from self._scan(index, lo, hi)

    def _scan(self, index: dict[int, list[Node]], lo: int, hi: int) -> list[int]:
        keys = self._keys[lo - self._start : hi - self._start + 1]
        return list(compress(range(lo, hi + 1), map(index.__contains__, keys)))[::-1]


def _bucket(ids: np.ndarray) -> int:
    return hash(ids[:_ROOT_BUCKET].tobytes())  # in-process only: the buckets are never stored
