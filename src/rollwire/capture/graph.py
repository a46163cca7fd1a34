"""The rollout graph: model calls linked by exact token prefix, independent of arrival order.

A node is one model call: the prompt ids the engine saw and the ids it sampled. Its *sequence*
is ``prompt + sampled``. The parent of a node is the node whose sequence is the longest exact
prefix of its prompt. Linking never looks at request ids, timestamps or headers: those are
per-agent, the prefix is not.

Linking is indexed, not scanned: every node's sequence and prompt are keyed by a position-aware
additive hash, and a new node walks its own prompt from the end until it meets an indexed
sequence. The cost is linear in the new node's prompt (in practice, in the tokens it added since
its parent), not in the number of nodes. Candidates are always verified token by token, so a
hash collision can cost time but never a wrong link.

Re-tokenisation: when a node's prompt starts with an earlier node's *prompt* but not with that
node's sequence (the engine re-tokenised the earlier reply differently, or the agent edited it),
the node starts a new root and records ``retokenized_from``. Fragmentation is counted, not hidden.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

_POS = np.uint64(0x9E3779B97F4A7C15)
_OFF = np.uint64(0xD1B54A32D192ED03)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_ROOT_BUCKET = 16  # roots are bucketed by their first 16 ids so adoption never scans all roots

TOKEN_DTYPE = np.int64


def prefix_hashes(ids: np.ndarray) -> np.ndarray:
    """``h[i]`` keys ``ids[: i + 1]``: a sum of per-position splitmix64 mixes (uint64, wrapping)."""
    x = ids.astype(np.uint64)
    x += np.arange(len(ids), dtype=np.uint64) * _POS
    x += _OFF
    x ^= x >> _S30
    x *= _M1
    x ^= x >> _S27
    x *= _M2
    x ^= x >> _S31
    return np.cumsum(x, dtype=np.uint64)


def as_ids(values: Sequence[int] | np.ndarray) -> np.ndarray:
    """A read-only int64 array of token ids (copied from a list, shared from an array)."""
    if isinstance(values, np.ndarray):
        arr = values.astype(TOKEN_DTYPE, copy=False)
    else:
        arr = np.fromiter(values, dtype=TOKEN_DTYPE, count=len(values))
    arr.flags.writeable = False
    return arr


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
        n_p = len(node.prompt)
        seq = node.sequence()
        hashes = prefix_hashes(seq)
        node.seq_key = int(hashes[-1]) if len(seq) else 0
        node.prompt_key = int(hashes[n_p - 1]) if n_p else 0

        parent, parent_len = self._find_parent(node, hashes)
        self._set_prefix_parent(node, parent)

        # Late arrivals: nodes already here may hang below this one. Their current prefix parent
        # is a node whose sequence is a prefix of ours no shorter than our parent's, or a root.
        for holder, held_len in self._holders(node, seq, hashes, parent_len):
            if holder is None:
                pool = self._root_pool(node.prompt)
            else:
                pool = self._children.get(holder.node_id, set())
            for other in list(pool):
                if other is not node:
                    self._maybe_adopt(node, other, held_len)

        self._nodes[node_id] = node
        self._by_seq.setdefault(node.seq_key, []).append(node)
        if n_p:
            self._by_prompt.setdefault(node.prompt_key, []).append(node)
        return node

    def _find_parent(self, node: Node, hashes: np.ndarray) -> tuple[Node | None, int]:
        prompt = node.prompt
        n_p = len(prompt)
        anchor: Node | None = None
        anchor_len = 0
        for length in range(n_p, 0, -1):
            key = int(hashes[length - 1])
            best: Node | None = None
            for cand in self._by_seq.get(key, ()):
                # A parent's prompt is strictly shorter: same-prompt calls are siblings, never kin.
                if (
                    cand.seq_len == length
                    and len(cand.prompt) < n_p
                    and _seq_prefix_of(cand, prompt)
                ):
                    if _better(cand, length, best, length):
                        best = cand
            if best is not None:
                node.anchor = anchor
                return best, length
            if self._detect and anchor is None and length < n_p:
                for cand in self._by_prompt.get(key, ()):
                    if len(cand.prompt) == length and _prompt_prefix_of(cand, prompt):
                        if _better(cand, length, anchor, anchor_len):
                            anchor, anchor_len = cand, length
        node.anchor = anchor
        return None, 0

    def _holders(
        self, node: Node, seq: np.ndarray, hashes: np.ndarray, parent_len: int
    ) -> Iterable[tuple[Node | None, int]]:
        """Nodes whose children might now prefer ``node``; ``None`` stands for the roots."""
        if parent_len == 0:
            yield None, 0
        for length in range(len(seq), max(parent_len, 1) - 1, -1):
            for cand in self._by_seq.get(int(hashes[length - 1]), ()):
                if cand.seq_len == length and _seq_prefix_of(cand, seq):
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


def _bucket(ids: np.ndarray) -> int:
    head = ids[:_ROOT_BUCKET]
    return int(prefix_hashes(head)[-1]) if len(head) else 0
