"""Read orders: the whole job's permutation and a node's own order (which
node deals which of them is the rule's, :func:`ucstage.sharding.rule.node_order`)."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, overload

from ..errors import InvalidArgument

if TYPE_CHECKING:
    import numpy as np

_ROUNDS = 6
_M1, _M2, _M3 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _half_bits(n: int) -> int:
    """Bits of each Feistel half: the smallest even-bit domain that holds ``n``."""
    return max(1, ((n - 1).bit_length() + 1) // 2)


def _round_keys(seed: int, epochs: Sequence[int], stream: str) -> np.ndarray:
    """The round keys of ``(seed, epoch, stream)`` for each of ``epochs``: a
    (rounds, len(epochs)) uint64 array, column ``j`` the 64-bit little-endian
    words of SHA-512 of ``ucstage:{seed}:{epochs[j]}[:{stream}]``. One digest
    per epoch in a loop (hashlib has no batch form), the words read at once."""
    import numpy as np

    suffix = f":{stream}" if stream else ""
    digests = b"".join(hashlib.sha512(f"ucstage:{seed}:{e}{suffix}".encode()).digest()
                       for e in epochs)
    words = np.frombuffer(digests, dtype="<u8").reshape(len(epochs), 8)[:, :_ROUNDS]
    return np.ascontiguousarray(words.T, dtype=np.uint64)


def _feistel(x: np.ndarray, half_bits: int, keys: Sequence[np.ndarray | np.uint64]
             ) -> np.ndarray:
    """The Feistel network over ``x``; each round's key is one uint64 for all
    of ``x`` or an array of one key per element (permutations of several
    epochs at once, :func:`permute_passes`): the same arithmetic either way."""
    import numpy as np

    half = np.uint64(half_bits)
    mask = np.uint64((1 << half_bits) - 1)
    left, right = x >> half, x & mask
    for key in keys:
        z = (right + key) * np.uint64(_M1)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(_M2)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(_M3)
        z ^= z >> np.uint64(31)
        left, right = right, left ^ (z & mask)
    return (left << half) | right


def _walk(pos: np.ndarray, n: int, half_bits: int, keys: Sequence[np.ndarray | np.uint64]
          ) -> np.ndarray:
    """Cycle walking: the network applied again to what falls at or above ``n``
    (a permutation of the even-bit domain so stays a bijection of 0..n-1)."""
    import numpy as np

    out = _feistel(pos.astype(np.uint64), half_bits, keys)
    outside = np.flatnonzero(out >= np.uint64(n))
    while outside.size:
        sub = [k[outside] if isinstance(k, np.ndarray) else k for k in keys]
        out[outside] = _feistel(out[outside], half_bits, sub)
        outside = outside[out[outside] >= np.uint64(n)]
    return out.astype(np.int64)


def permute_passes(n: int, positions: np.ndarray, epochs: np.ndarray, *, seed: int,
                   stream: str) -> np.ndarray:
    """``Permutation(n, seed=seed, epoch=epochs[j], stream=stream).take(positions[j])``
    for every ``j`` at once, exactly: one digest per distinct epoch in
    ``min(epochs)..max(epochs)`` and one vectorised network, so many short
    permutations (a small source's passes in a mix) cost their positions,
    not positions times epochs."""
    import numpy as np

    pos = np.asarray(positions, dtype=np.int64)
    eps = np.asarray(epochs, dtype=np.int64)
    if pos.shape != eps.shape:
        raise InvalidArgument("positions and epochs must have one value each")
    if pos.size and (pos.min() < 0 or pos.max() >= n):
        raise IndexError("read-order position out of range")
    if n <= 1 or not pos.size:
        return pos.copy()  # the one permutation of 0 or 1 items, whatever the key
    first = int(eps.min())
    table = _round_keys(seed, range(first, int(eps.max()) + 1), stream)
    at = eps - first
    return _walk(pos, n, _half_bits(n), [row[at] for row in table])


class _Order(Sequence[int]):
    """A read order computed by ``take`` (positions -> file indices): what
    indexing, slicing, iterating and ``array`` mean for every order here."""

    def __len__(self) -> int:
        raise NotImplementedError

    def take(self, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def array(self) -> np.ndarray:
        """The whole read order as an int64 array."""
        import numpy as np

        return self.take(np.arange(len(self), dtype=np.int64))

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        n = len(self)
        if isinstance(index, slice):
            return [int(i) for i in self.take(range(n)[index])]
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("read-order position out of range")
        return int(self.take([index])[0])

    def __iter__(self) -> Iterator[int]:
        # In blocks: one ``take`` per 65,536 positions, not one per file.
        n, step = len(self), 1 << 16
        for start in range(0, n, step):
            yield from (int(i) for i in self.take(range(start, min(n, start + step))))


class Permutation(_Order):
    """The shuffled read order of ``n`` files for ``(seed, epoch)``: a keyed bijection.

    Position ``p`` reads file ``self[p]``, computed by arithmetic alone: a
    6-round Feistel network over the smallest even-bit domain that holds
    ``n``, keyed by SHA-512 of ``ucstage:{seed}:{epoch}``, with cycle walking
    to stay below ``n``. Pure 64-bit integer arithmetic in numpy, so every
    rank on every node, with any numpy or Python version, computes the same
    order, and one slot's files (:meth:`take`) cost that slot, not ``n``.
    """

    def __init__(self, n: int, *, seed: int = 0, epoch: int = 0, stream: str = "") -> None:
        if n < 0:
            raise InvalidArgument(f"n must be 0 or more, got {n}")
        self.n, self.seed, self.epoch, self.stream = n, int(seed), int(epoch), stream
        # ``stream`` names an independent permutation of the same (seed, epoch)
        # (a node's block, the node assignment); "" is the whole-job order.
        self._keys = [int(k) for k in _round_keys(seed, [epoch], stream)[:, 0]]
        self._half = _half_bits(n)

    def __len__(self) -> int:
        return self.n

    def _feistel(self, x: np.ndarray) -> np.ndarray:
        import numpy as np

        return _feistel(x, self._half, [np.uint64(k) for k in self._keys])

    def take(self, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        """The file indices at read-order ``positions`` (an int64 array)."""
        import numpy as np

        pos = np.asarray(positions, dtype=np.int64)
        if pos.size and (pos.min() < 0 or pos.max() >= self.n):
            raise IndexError("read-order position out of range")
        return _walk(pos, self.n, self._half, [np.uint64(k) for k in self._keys])

    def __repr__(self) -> str:
        stream = f", stream={self.stream!r}" if self.stream else ""
        return f"Permutation({self.n}, seed={self.seed}, epoch={self.epoch}{stream})"


class GroupedOrder(_Order):
    """A read order of items that come in runs (a shard's blocks): the runs
    in a seeded order, each run's items together and in their own order.

    ``sizes[g]`` items of run ``g``, the runs back to back (run ``g`` is
    items ``sum(sizes[:g]) ..``); the runs are read in the order of
    ``Permutation(len(sizes), seed, epoch, stream)``. With ``base``, item
    ``i`` stands for ``base[i]`` (a node's own items, see :func:`node_deals`).
    Holds one value per run and per item of ``base``: a shard manifest's
    blocks are arrays already.
    """

    def __init__(self, sizes: Sequence[int] | np.ndarray, *, seed: int = 0, epoch: int = 0,
                 stream: str = "", base: np.ndarray | None = None) -> None:
        import numpy as np

        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.seed, self.epoch, self.stream, self.base = int(seed), int(epoch), stream, base
        self.n = int(self.sizes.sum())
        if base is not None and len(base) != self.n:
            raise InvalidArgument(f"groups hold {self.n} items but base has {len(base)}")
        firsts = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)
        self.runs = Permutation(len(self.sizes), seed=seed, epoch=epoch, stream=stream).array()
        ordered = self.sizes[self.runs]
        self._stops = np.cumsum(ordered)  # read-order position where each run ends
        self._firsts = firsts[self.runs]  # each run's first item, in read order

    def __len__(self) -> int:
        return self.n

    def take(self, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        """The items at read-order ``positions`` (int64)."""
        import numpy as np

        pos = np.asarray(positions, dtype=np.int64)
        if pos.size and (pos.min() < 0 or pos.max() >= self.n):
            raise IndexError("read-order position out of range")
        k = np.searchsorted(self._stops, pos, side="right")
        items = self._firsts[k] + pos - (self._stops[k] - self.sizes[self.runs[k]])
        return items if self.base is None else self.base[items]

    def __repr__(self) -> str:
        stream = f", stream={self.stream!r}" if self.stream else ""
        return (f"GroupedOrder({len(self.sizes)} runs of {self.n}, seed={self.seed}, "
                f"epoch={self.epoch}{stream})")


def _run_lengths(labels: np.ndarray) -> np.ndarray:
    """Lengths of the runs of equal consecutive values in ``labels``."""
    import numpy as np

    if not len(labels):
        return np.zeros(0, dtype=np.int64)
    cuts = np.flatnonzero(labels[1:] != labels[:-1]) + 1
    return np.diff(np.concatenate([[0], cuts, [len(labels)]])).astype(np.int64)


def _grouped_node(groups: np.ndarray, node: int, nodes: int, seed: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Node ``node``'s items under the ``"node"`` scope when items come in runs:
    block :func:`node_block` of the epoch-independent grouped assignment order
    (stream ``"nodes"``), so a node holds whole runs but for at most one cut
    run at each end of its block. Returns the items in assignment order and
    the lengths of the runs they form there."""
    import numpy as np

    sizes = np.asarray(groups, dtype=np.int64)
    n = int(sizes.sum())
    block = node_block(n, node, nodes)
    items = GroupedOrder(sizes, seed=seed, stream="nodes").take(
        np.arange(block.start, block.stop, dtype=np.int64))
    run_of = np.searchsorted(np.cumsum(sizes), items, side="right")
    return items, _run_lengths(run_of)


class _Same:
    """An array as a cache key, by identity: a listing's ``groups`` are one
    array (a cached property of its manifest), so equal keys are the same
    array, and the cache holding the key keeps its id from being reused."""

    def __init__(self, value: np.ndarray) -> None:
        self.value = value

    def __hash__(self) -> int:
        return id(self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.value is self.value


@functools.lru_cache(maxsize=64)
def _grouped(groups: _Same, seed: int, epoch: int, node: int | None, nodes: int
             ) -> GroupedOrder:
    """The grouped order of ``groups`` the whole job (``node`` None) or node
    ``node`` of ``nodes`` deals in one epoch. Built in time linear in the
    runs (and a node's items), so it is kept: every slot of a node asks."""
    if node is None:
        return GroupedOrder(groups.value, seed=seed, epoch=epoch)
    items, runs = _grouped_node(groups.value, node, nodes, seed)
    return GroupedOrder(runs, seed=seed, epoch=epoch, stream=f"node{node}", base=items)


def read_order(n: int, *, shuffle: bool = False, seed: int = 0, epoch: int = 0,
               groups: np.ndarray | None = None) -> Sequence[int]:
    """File indices in read order: listing order (a ``range``), or a
    :class:`Permutation` of it that depends only on ``(n, seed, epoch)``;
    with ``groups`` (items in runs, :class:`~.rule.ReadOrder`), a
    :class:`GroupedOrder` of the runs.

    Neither holds a Python object per file: index it, or take a slot's
    positions with :func:`ucstage.sharding.rule.slot_array`.
    """
    if not shuffle:
        return range(n)
    if groups is not None:
        return _grouped(_Same(groups), seed, epoch, None, 1)
    return Permutation(n, seed=seed, epoch=epoch)


def node_block(n: int, node: int, nodes: int) -> range:
    """Positions ``node``'s files take in the node assignment order: balanced
    blocks, the first ``n % nodes`` nodes one file more, so node sizes differ
    by at most one and the nodes with files are a prefix."""
    if not 0 <= node < nodes:
        raise InvalidArgument(f"node {node} is outside 0..{nodes - 1}")
    q, r = divmod(n, nodes)
    start = node * q + min(node, r)
    return range(start, start + q + (1 if node < r else 0))


class NodeOrder(_Order):
    """One node's read order in one epoch under the ``"node"`` scope, with
    several nodes: position ``p`` reads listing row ``self[p]``.

    The node's files are block :func:`node_block` of the assignment
    permutation (``Permutation(n, seed, stream="nodes")``: independent of the
    epoch, so the node keeps its files); the epoch permutes them with
    ``Permutation(len(block), seed, epoch, stream=f"node{node}")``. Arithmetic
    only, like :class:`Permutation`: a slot costs its own positions.
    """

    def __init__(self, n: int, *, node: int, nodes: int, seed: int = 0, epoch: int = 0) -> None:
        self.n, self.node, self.nodes = n, node, nodes
        self.block = node_block(n, node, nodes)
        self._assign = Permutation(n, seed=seed, stream="nodes")
        self._within = Permutation(len(self.block), seed=seed, epoch=epoch,
                                   stream=f"node{node}")

    def __len__(self) -> int:
        return len(self.block)

    def take(self, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        """The listing rows at the node's read-order ``positions`` (int64)."""
        return self._assign.take(self.block.start + self._within.take(positions))

    def members(self) -> np.ndarray:
        """The node's files (sorted listing rows): the same in every epoch."""
        import numpy as np

        return np.sort(self._assign.take(np.arange(self.block.start, self.block.stop,
                                                   dtype=np.int64)))

    def __repr__(self) -> str:
        return f"NodeOrder({self.n}, node={self.node}, nodes={self.nodes})"


def node_members(n: int, node: int, nodes: int, *, seed: int,
                 groups: np.ndarray | None = None) -> np.ndarray:
    """The files (sorted listing rows) of node ``node`` of ``nodes`` (two or
    more) under the ``"node"`` scope: the same in every epoch. ``groups``: as
    for :func:`read_order`."""
    import numpy as np

    if groups is not None:
        return np.sort(_grouped_node(groups, node, nodes, seed)[0])
    return NodeOrder(n, node=node, nodes=nodes, seed=seed).members()


def node_deals(n: int, node: int, nodes: int, *, shuffle: bool, seed: int, epoch: int,
               groups: np.ndarray | None) -> Sequence[int]:
    """The read order node ``node`` deals from in one epoch: with ``nodes``
    (two or more, shuffled under the ``"node"`` scope) the node's own
    :class:`NodeOrder`, or with ``groups`` its runs' :class:`GroupedOrder`;
    with ``nodes`` 0 (``"global"``, no shuffle, one node) the whole job's
    :func:`read_order`, which every node deals from.

    With ``groups`` (a shard's blocks) the node's items are whole runs of an
    epoch-independent grouped order (:func:`_grouped_node`), and each epoch
    permutes those runs (stream ``node{node}``), so a node keeps its shards
    and its slots read them shard by shard."""
    if nodes:
        if groups is not None:
            return _grouped(_Same(groups), seed, epoch, node, nodes)
        return NodeOrder(n, node=node, nodes=nodes, seed=seed, epoch=epoch)
    return read_order(n, shuffle=shuffle, seed=seed, epoch=epoch, groups=groups)
