"""The slot rule, shard plans, their statistics and mismatch diagnosis.

This module is the only place the slot rule lives. ``ucstage shard-plan``,
``ucstage cache warm --rank`` and :class:`ucstage.VolumeDataset` all call
:func:`slot_files`, so what the plan prints is what training reads.

The rule (the platform's documented one): files in listing order, or in a
permutation seeded by ``seed`` and ``epoch`` that is the same on every rank
(:class:`Permutation`: a keyed bijection, so one slot's files cost only that
slot's arithmetic, never a list of every file);
``slots = world_size * num_workers``; slot ``s = rank * num_workers + worker``
reads files ``s, s + slots, s + 2 * slots, ...``. ``num_workers = 0`` (the main
process reads) counts as one worker.

Shuffle scope (with ``shuffle``): under ``"global"`` every rank deals from the
one permutation above. Under ``"node"`` (the default) the job is cut into nodes
of ``nproc_per_node`` ranks (``node = rank // nproc_per_node``, as torchrun
numbers ranks); files are assigned to nodes once per seed, in balanced blocks
of a seeded permutation, and each epoch permutes each node's block and deals it
over that node's ranks x workers with the same rule. With one node (no
``nproc_per_node``) both scopes are exactly the rule above.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, overload

if TYPE_CHECKING:
    import numpy as np

from .errors import InvalidArgument

__all__ = [
    "DEFAULT_SHUFFLE_SCOPE",
    "EQUAL_LENGTH_MODES",
    "SHUFFLE_SCOPES",
    "Dealing",
    "EmptySlots",
    "EpochOrder",
    "Forecast",
    "ForecastRow",
    "NodeOrder",
    "NodeStats",
    "Permutation",
    "RankStats",
    "Segment",
    "ShardPlan",
    "SlotPlan",
    "SlotRun",
    "effective_workers",
    "epoch_slot_length",
    "equal_slot_files",
    "forecast",
    "node_block",
    "node_count",
    "node_order",
    "node_ranks",
    "node_share",
    "plan",
    "rank_length",
    "read_order",
    "resume_nodes",
    "resume_slots",
    "same_layout",
    "segment_runs",
    "slot_array",
    "slot_count",
    "slot_dealing",
    "slot_files",
    "slot_indices",
    "slot_length",
    "slot_plan",
    "workers_per_rank",
]


def effective_workers(num_workers: int) -> int:
    """Reading processes per rank: ``num_workers=0`` means the main process reads."""
    return max(1, num_workers)


def slot_count(world_size: int, num_workers: int | Sequence[int]) -> int:
    """How many (rank, worker) slots a job has: ``world_size * max(1, num_workers)``,
    or, with one ``num_workers`` per rank, the sum of each rank's readers."""
    if isinstance(num_workers, int) and not isinstance(num_workers, bool) and num_workers >= 0:
        _check_world(world_size)
        return world_size * effective_workers(num_workers)  # the hot path: one value for all
    spec = _workers_spec(num_workers, world_size)
    if isinstance(spec, int):
        return world_size * effective_workers(spec)
    return sum(effective_workers(k) for k in spec)


def node_ranks(node_rank: int, nproc_per_node: int, world_size: int) -> list[int]:
    """The ranks on node ``node_rank``, as torchrun assigns them: ranks
    ``node_rank * nproc_per_node`` up to the next node's first rank."""
    if nproc_per_node < 1:
        raise InvalidArgument(f"nproc_per_node must be at least 1, got {nproc_per_node}")
    if node_rank < 0:
        raise InvalidArgument(f"node_rank must be 0 or more, got {node_rank}")
    _check_world(world_size)
    ranks = list(range(node_rank * nproc_per_node, (node_rank + 1) * nproc_per_node))
    if ranks[-1] >= world_size:
        raise InvalidArgument(f"node {node_rank} x {nproc_per_node} ranks per node covers rank "
                              f"{ranks[-1]}, outside world_size {world_size}")
    return ranks


_ROUNDS = 6
_M1, _M2, _M3 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


class Permutation(Sequence[int]):
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
        label = f"ucstage:{seed}:{epoch}" + (f":{stream}" if stream else "")
        digest = hashlib.sha512(label.encode()).digest()
        self._keys = [int.from_bytes(digest[8 * i:8 * i + 8], "little") for i in range(_ROUNDS)]
        self._half = max(1, ((n - 1).bit_length() + 1) // 2)

    def __len__(self) -> int:
        return self.n

    def _feistel(self, x: np.ndarray) -> np.ndarray:
        import numpy as np

        half = np.uint64(self._half)
        mask = np.uint64((1 << self._half) - 1)
        left, right = x >> half, x & mask
        for key in self._keys:
            z = (right + np.uint64(key)) * np.uint64(_M1)
            z = (z ^ (z >> np.uint64(30))) * np.uint64(_M2)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(_M3)
            z ^= z >> np.uint64(31)
            left, right = right, left ^ (z & mask)
        return (left << half) | right

    def take(self, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        """The file indices at read-order ``positions`` (an int64 array)."""
        import numpy as np

        pos = np.asarray(positions, dtype=np.int64)
        if pos.size and (pos.min() < 0 or pos.max() >= self.n):
            raise IndexError("read-order position out of range")
        out = self._feistel(pos.astype(np.uint64))
        outside = np.flatnonzero(out >= np.uint64(self.n))
        while outside.size:  # cycle walking: a permutation of the domain stays one below n
            out[outside] = self._feistel(out[outside])
            outside = outside[out[outside] >= np.uint64(self.n)]
        return out.astype(np.int64)

    def array(self) -> np.ndarray:
        """The whole read order as an int64 array."""
        import numpy as np

        return self.take(np.arange(self.n, dtype=np.int64))

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            return [int(i) for i in self.take(range(self.n)[index])]
        if index < 0:
            index += self.n
        if not 0 <= index < self.n:
            raise IndexError("read-order position out of range")
        return int(self.take([index])[0])

    def __iter__(self) -> Iterator[int]:
        step = 1 << 16
        for start in range(0, self.n, step):
            yield from (int(i) for i in self.take(range(start, min(self.n, start + step))))

    def __repr__(self) -> str:
        stream = f", stream={self.stream!r}" if self.stream else ""
        return f"Permutation({self.n}, seed={self.seed}, epoch={self.epoch}{stream})"


def read_order(n: int, *, shuffle: bool = False, seed: int = 0, epoch: int = 0) -> Sequence[int]:
    """File indices in read order: listing order (a ``range``), or a
    :class:`Permutation` of it that depends only on ``(n, seed, epoch)``.

    Neither holds a Python object per file: index it, or take a slot's
    positions with :func:`slot_array`.
    """
    if not shuffle:
        return range(n)
    return Permutation(n, seed=seed, epoch=epoch)


SHUFFLE_SCOPES = ("node", "global")
DEFAULT_SHUFFLE_SCOPE = "node"
"""Shuffling keeps each node's files by default: its cache serves every epoch."""


def _check_scope(shuffle_scope: str) -> None:
    if shuffle_scope not in SHUFFLE_SCOPES:
        raise InvalidArgument(
            f"shuffle_scope must be one of {SHUFFLE_SCOPES}, got {shuffle_scope!r}")


def node_count(world_size: int, nproc_per_node: int | None) -> int:
    """How many nodes a job of ``world_size`` ranks has: ``world_size //
    nproc_per_node``, or 1 when ``nproc_per_node`` is None (the whole job is one node).

    Raises:
        InvalidArgument: ``nproc_per_node`` is below 1 or does not divide ``world_size``.
    """
    _check_world(world_size)
    if nproc_per_node is None:
        return 1
    if isinstance(nproc_per_node, bool) or not isinstance(nproc_per_node, int) \
            or nproc_per_node < 1:
        raise InvalidArgument(f"nproc_per_node must be an int of at least 1, "
                              f"got {nproc_per_node!r}")
    if world_size % nproc_per_node:
        raise InvalidArgument(
            f"world_size {world_size} is not a multiple of nproc_per_node {nproc_per_node}",
            hint="every node runs nproc_per_node ranks (torchrun's --nproc-per-node)")
    return world_size // nproc_per_node


def node_block(n: int, node: int, nodes: int) -> range:
    """Positions ``node``'s files take in the node assignment order: balanced
    blocks, the first ``n % nodes`` nodes one file more, so node sizes differ
    by at most one and the nodes with files are a prefix."""
    if not 0 <= node < nodes:
        raise InvalidArgument(f"node {node} is outside 0..{nodes - 1}")
    q, r = divmod(n, nodes)
    start = node * q + min(node, r)
    return range(start, start + q + (1 if node < r else 0))


class NodeOrder(Sequence[int]):
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

    def array(self) -> np.ndarray:
        """The node's whole read order for the epoch."""
        import numpy as np

        return self.take(np.arange(len(self), dtype=np.int64))

    def members(self) -> np.ndarray:
        """The node's files (sorted listing rows): the same in every epoch."""
        import numpy as np

        return np.sort(self._assign.take(np.arange(self.block.start, self.block.stop,
                                                   dtype=np.int64)))

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            return [int(i) for i in self.take(range(len(self))[index])]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("read-order position out of range")
        return int(self.take([index])[0])

    def __repr__(self) -> str:
        return f"NodeOrder({self.n}, node={self.node}, nodes={self.nodes})"


def node_share(n: int, *, node: int, world_size: int, nproc_per_node: int | None = None,
               seed: int = 0) -> np.ndarray:
    """The files (sorted listing rows) node ``node`` reads under the ``"node"``
    scope with ``shuffle``: the same in every epoch, so warming them serves
    every epoch. With one node, every file."""
    import numpy as np

    nodes = node_count(world_size, nproc_per_node)
    if not 0 <= node < nodes:
        raise InvalidArgument(f"node {node} is outside 0..{nodes - 1}")
    if nodes == 1:
        return np.arange(n, dtype=np.int64)
    return NodeOrder(n, node=node, nodes=nodes, seed=seed).members()


def _node_scoped(shuffle: bool, shuffle_scope: str, nodes: int) -> bool:
    """Whether nodes deal from their own orders (else every rank deals from one)."""
    _check_scope(shuffle_scope)
    return shuffle and shuffle_scope == "node" and nodes > 1


def node_order(
    n: int,
    *,
    node: int,
    world_size: int,
    nproc_per_node: int | None = None,
    shuffle: bool = False,
    seed: int = 0,
    epoch: int = 0,
    shuffle_scope: str = DEFAULT_SHUFFLE_SCOPE,
) -> Sequence[int]:
    """The read order node ``node``'s slots deal from in one epoch.

    Under the ``"node"`` scope with several nodes and ``shuffle``, the node's
    own :class:`NodeOrder`; otherwise (``"global"``, no shuffle, one node) the
    whole job's :func:`read_order`, which every node deals from.
    """
    nodes = node_count(world_size, nproc_per_node)
    if not 0 <= node < nodes:
        raise InvalidArgument(f"node {node} is outside 0..{nodes - 1}")
    if _node_scoped(shuffle, shuffle_scope, nodes):
        return NodeOrder(n, node=node, nodes=nodes, seed=seed, epoch=epoch)
    return read_order(n, shuffle=shuffle, seed=seed, epoch=epoch)


@dataclass(frozen=True)
class Dealing:
    """How one slot reads in one epoch: positions ``start``, ``start + step``,
    ... (below ``len(order)``) of ``order``, the read order its node deals from."""

    order: Sequence[int]
    start: int
    step: int
    node: int
    nodes: int

    @property
    def length(self) -> int:
        """Files the slot reads (without ``equal_length``)."""
        return len(range(self.start, len(self.order), self.step))


def slot_dealing(
    n: int,
    *,
    rank: int,
    world_size: int,
    num_workers: int,
    worker: int,
    shuffle: bool = False,
    seed: int = 0,
    epoch: int = 0,
    shuffle_scope: str = DEFAULT_SHUFFLE_SCOPE,
    nproc_per_node: int | None = None,
    order: Sequence[int] | None = None,
) -> Dealing:
    """Where slot (rank, worker) reads from in one epoch: the slot rule with the scope.

    A slot's file at step ``i`` is ``order[start + i * step]``; a resumed
    epoch can skip the first steps by arithmetic alone. Pass ``order`` (from
    :func:`node_order`) to reuse it for the node's slots.
    """
    _check(world_size, num_workers, rank, worker)
    nodes = node_count(world_size, nproc_per_node)
    k = effective_workers(num_workers)
    node = rank // nproc_per_node if nproc_per_node is not None else 0
    if _node_scoped(shuffle, shuffle_scope, nodes):
        assert nproc_per_node is not None
        start, step = (rank - node * nproc_per_node) * k + worker, nproc_per_node * k
    else:
        start, step = rank * k + worker, world_size * k
    if order is None:
        order = node_order(n, node=node, world_size=world_size, nproc_per_node=nproc_per_node,
                           shuffle=shuffle, seed=seed, epoch=epoch, shuffle_scope=shuffle_scope)
    return Dealing(order, start, step, node, nodes)


def _check_world(world_size: int) -> None:
    if world_size < 1:
        raise InvalidArgument(f"world_size must be at least 1, got {world_size}")


def _check(world_size: int, num_workers: int, rank: int, worker: int) -> None:
    _check_world(world_size)
    if num_workers < 0:
        raise InvalidArgument(f"num_workers must be 0 or more, got {num_workers}")
    if not 0 <= rank < world_size:
        raise InvalidArgument(f"rank {rank} is outside 0..{world_size - 1}")
    if not 0 <= worker < effective_workers(num_workers):
        raise InvalidArgument(
            f"worker {worker} is outside 0..{effective_workers(num_workers) - 1}"
        )


def slot_indices(n: int, *, rank: int, world_size: int, num_workers: int, worker: int) -> range:
    """Positions in the read order that slot (rank, worker) reads: the slot rule."""
    _check(world_size, num_workers, rank, worker)
    k = effective_workers(num_workers)
    return range(rank * k + worker, n, slot_count(world_size, num_workers))


def _pick(order: Sequence[int], positions: np.ndarray) -> np.ndarray:
    """``order[p]`` for each read-order position in ``positions``, as int64,
    computed for those positions only (a permutation is never materialised)."""
    import numpy as np

    if isinstance(order, range):
        return order.start + positions * order.step
    if isinstance(order, (Permutation, NodeOrder)):
        return order.take(positions)
    if isinstance(order, np.ndarray):
        return order[positions].astype(np.int64, copy=False)
    return np.asarray([order[int(p)] for p in positions], dtype=np.int64)


def _equal_count(n: int, slots: int, equal_length: str) -> int:
    """Files every slot reads with ``equal_length``: counted over the whole
    job's slots, so every rank of every node gets the same count."""
    return n // slots if equal_length == "drop" else -(-n // slots)


def slot_array(
    n: int,
    *,
    rank: int,
    world_size: int,
    num_workers: int,
    worker: int,
    shuffle: bool = False,
    seed: int = 0,
    epoch: int = 0,
    equal_length: str | None = None,
    order: Sequence[int] | None = None,
    shuffle_scope: str = DEFAULT_SHUFFLE_SCOPE,
    nproc_per_node: int | None = None,
) -> np.ndarray:
    """:func:`slot_files` (or, with ``equal_length``, :func:`equal_slot_files`)
    as an int64 numpy array: no Python object per file, and with a shuffle
    only this slot's positions are permuted."""
    import numpy as np

    if equal_length is not None and equal_length not in EQUAL_LENGTH_MODES:
        raise InvalidArgument(
            f"equal_length must be one of {EQUAL_LENGTH_MODES}, got {equal_length!r}")
    deal = slot_dealing(n, rank=rank, world_size=world_size, num_workers=num_workers,
                        worker=worker, shuffle=shuffle, seed=seed, epoch=epoch,
                        shuffle_scope=shuffle_scope, nproc_per_node=nproc_per_node,
                        order=order)
    m = len(deal.order)
    if equal_length is None or n == 0:
        wanted = np.arange(deal.start, m, deal.step, dtype=np.int64)
    else:
        count = _equal_count(n, slot_count(world_size, num_workers), equal_length)
        if count and not m:
            raise InvalidArgument(
                f'equal_length="pad" needs a file on every node: {n} files, {deal.nodes} nodes',
                hint='use fewer nodes, or equal_length="drop"')
        # "pad" continues the rule past the end, position p reading order[p % m]
        # (m: the files the slot's node deals; the whole job's with one node).
        wanted = (deal.start + deal.step * np.arange(count, dtype=np.int64)) % max(m, 1)
    return _pick(deal.order, wanted)


def slot_files(
    n: int,
    *,
    rank: int,
    world_size: int,
    num_workers: int,
    worker: int,
    shuffle: bool = False,
    seed: int = 0,
    epoch: int = 0,
    order: Sequence[int] | None = None,
    shuffle_scope: str = DEFAULT_SHUFFLE_SCOPE,
    nproc_per_node: int | None = None,
) -> list[int]:
    """File indices (into the listing) that slot (rank, worker) reads, in read order.

    Pass ``order`` (from :func:`node_order` for the slot's node) to avoid
    recomputing a permutation for every slot.
    """
    return slot_array(n, rank=rank, world_size=world_size, num_workers=num_workers,
                      worker=worker, shuffle=shuffle, seed=seed, epoch=epoch,
                      order=order, shuffle_scope=shuffle_scope,
                      nproc_per_node=nproc_per_node).tolist()


def _workers_spec(num_workers: int | Sequence[int], world_size: int) -> int | list[int]:
    """Checked ``num_workers``: one int for every rank, or a list of one per rank.

    One value stays one int, so a plan over a huge ``world_size`` never holds
    a per-rank list of it.
    """
    _check_world(world_size)
    if isinstance(num_workers, int) and not isinstance(num_workers, bool):
        values = [num_workers]
    elif isinstance(num_workers, Sequence) and not isinstance(num_workers, str):
        values = list(num_workers)
    else:
        values = []
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise InvalidArgument(f"num_workers must be an int or a non-empty sequence of ints, "
                              f"got {num_workers!r}")
    if any(v < 0 for v in values):
        raise InvalidArgument(f"num_workers must be 0 or more, got {min(values)}")
    if len(values) == 1:
        return values[0]
    if len(values) != world_size:
        raise InvalidArgument(
            f"num_workers lists {len(values)} values but world_size is {world_size}",
            hint="give one value for all ranks, or exactly one per rank",
        )
    return values


def workers_per_rank(num_workers: int | Sequence[int], world_size: int) -> list[int]:
    """``num_workers`` for every rank: one int for all, or exactly one per rank.

    The library takes ints only; the CLI parses comma lists (``-k 6,4``).
    """
    spec = _workers_spec(num_workers, world_size)
    return [spec] * world_size if isinstance(spec, int) else spec


@dataclass(frozen=True, eq=False)
class SlotPlan:
    """What one (rank, worker) slot reads."""

    rank: int
    worker: int
    indices: np.ndarray
    """Indices into the listing, in read order (int64; often a view into the
    plan's read order, so a plan holds no Python object per file)."""
    bytes: int
    node: int = 0
    """The node the slot's rank runs on (``rank // nproc_per_node``; 0 with one node)."""

    @property
    def files(self) -> list[int]:
        """:attr:`indices` as a list of ints."""
        return [int(i) for i in self.indices]

    @property
    def count(self) -> int:
        """Files this slot reads."""
        return len(self.indices)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SlotPlan):
            return NotImplemented
        return ((self.rank, self.worker, self.bytes, self.node)
                == (other.rank, other.worker, other.bytes, other.node)
                and self.files == other.files)

    __hash__ = None  # type: ignore[assignment]

    def to_json(self, paths: Sequence[str]) -> dict[str, Any]:
        """This slot as docs/json.md documents it; ``paths`` is the listing's paths."""
        return {"rank": self.rank, "worker": self.worker, "node": self.node,
                "files": [paths[int(i)] for i in self.indices], "bytes": self.bytes}


@dataclass(frozen=True)
class RankStats:
    rank: int
    num_workers: int
    files: int
    bytes: int
    batches: int | None


@dataclass(frozen=True)
class NodeStats:
    """What one node's ranks read in the planned epoch."""

    node: int
    first_rank: int
    last_rank: int
    files: int
    """Files its slots read (a file read by two of its slots counts twice)."""
    bytes: int

    def to_json(self) -> dict[str, Any]:
        """One object of ``nodes`` in docs/json.md#shard-plan."""
        return {"node": self.node, "ranks": [self.first_rank, self.last_rank],
                "files": self.files, "bytes": self.bytes}


@dataclass(frozen=True)
class Spread:
    min: float
    mean: float
    max: float


MAX_RANGES = 10
"""Empty-slot ranges a plan keeps (it counts them all)."""


@dataclass
class EmptySlots:
    """Slots that read no file, as a count and ranges in (rank, worker) order.

    A rank's empty slots are always its last workers (slot ``rank * K +
    worker`` reads nothing when it is past the file count), so the ranges
    are few: at most one per rank that has files, plus one more.
    """

    count: int = 0
    """Slots that read nothing."""
    ranks: int = 0
    """Ranks none of whose workers reads a file."""
    ranges: list[tuple[tuple[int, int], tuple[int, int]]] = field(default_factory=list)
    """The first :data:`MAX_RANGES` ranges, each ((rank, worker), (rank, worker)), inclusive."""
    range_count: int = 0
    """All ranges, listed or not."""
    range_sizes: list[int] = field(default_factory=list)
    """Slots in each listed range."""

    _ends_at: int = field(default=-2, repr=False)
    """The rank whose last worker the latest range ends at."""

    def add(self, rank: int, first_worker: int, workers: int, *, ranks: int = 1) -> None:
        """Ranks ``rank`` .. ``rank + ranks - 1``, each with ``workers`` workers,
        read nothing from worker ``first_worker`` on (0 when ``ranks > 1``)."""
        per_rank = workers - first_worker
        if per_rank <= 0 or ranks <= 0:
            return
        self.count += per_rank * ranks
        if first_worker == 0:
            self.ranks += ranks
        last = (rank + ranks - 1, workers - 1)
        if first_worker == 0 and self._ends_at == rank - 1:
            # Continues the latest range, which ended at the previous rank's last worker.
            if len(self.ranges) == self.range_count:
                self.ranges[-1] = (self.ranges[-1][0], last)
                self.range_sizes[-1] += per_rank * ranks
        else:
            self.range_count += 1
            if self.range_count <= MAX_RANGES:
                self.ranges.append(((rank, first_worker), last))
                self.range_sizes.append(per_rank * ranks)
        self._ends_at = last[0]

    def to_json(self) -> dict[str, Any]:
        """``empty_slots`` as docs/json.md#shard-plan documents it."""
        return {
            "count": self.count,
            "ranks": self.ranks,
            "ranges": [{"first": list(a), "last": list(b), "slots": size}
                       for (a, b), size in zip(self.ranges, self.range_sizes, strict=True)],
            "ranges_not_listed": self.range_count - len(self.ranges),
        }


@dataclass
class ShardPlan:
    """A whole plan: the slots that read files, and what is wrong with it.

    Sized by the files, not the slots: ``slots`` and ``ranks`` hold only the
    slots and ranks that read at least one file, and :attr:`empty` describes
    the rest by count and ranges.
    """

    n_files: int
    total_bytes: int
    world_size: int
    num_workers: int | list[int]
    """As given: one int for every rank, or one per rank."""
    shuffle: bool
    seed: int
    epoch: int
    batch_size: int | None
    slots: list[SlotPlan]
    """Slots that read at least one file, by rank then worker."""
    ranks: list[RankStats]
    """Ranks that read at least one file, in rank order."""
    slot_total: int = 0
    """Every slot of the job, empty or not."""
    empty: EmptySlots = field(default_factory=EmptySlots)
    duplicated: list[int] = field(default_factory=list)
    """Listing indices read by two or more slots."""
    skipped: list[int] = field(default_factory=list)
    """Listing indices no slot reads."""
    read_count: bytearray = field(default_factory=bytearray, repr=False)
    """How many slots read each file (capped at 255)."""
    shuffle_scope: str = DEFAULT_SHUFFLE_SCOPE
    nproc_per_node: int | None = None
    """Ranks per node, or None: the whole job is one node."""
    node_count: int = 1
    nodes: list[NodeStats] = field(default_factory=list)
    """Nodes that read at least one file, in node order."""

    def workers_of(self, rank: int) -> int:
        """The ``num_workers`` rank ``rank`` runs with."""
        return self.num_workers if isinstance(self.num_workers, int) else self.num_workers[rank]

    @property
    def consistent(self) -> bool:
        """No file is read twice or never."""
        return not self.duplicated and not self.skipped

    @property
    def batches_equal(self) -> bool:
        counts = {r.batches for r in self.ranks}
        if self.empty.ranks and self.batch_size:
            counts.add(0)
        return len(counts) <= 1

    @property
    def ok(self) -> bool:
        """Consistent, equal batch counts, and every slot reads something."""
        return self.consistent and self.batches_equal and not self.empty.count

    def files_per_slot(self) -> Spread:
        return self._spread([s.count for s in self.slots])

    def bytes_per_slot(self) -> Spread:
        return self._spread([s.bytes for s in self.slots])

    def _spread(self, values: list[int]) -> Spread:
        """min / mean / max over every slot, the empty ones counted as zeros."""
        if not values:
            return Spread(0, 0, 0)
        total = self.slot_total or len(values)
        low = 0 if self.empty.count else min(values)
        return Spread(low, sum(values) / total, max(values))

    @property
    def imbalance(self) -> float:
        """Largest slot's bytes over the mean (1.0 is perfectly even)."""
        spread = self.bytes_per_slot()
        return spread.max / spread.mean if spread.mean else 1.0

    def to_json(self, paths: Sequence[str], *, source: str, fingerprint: str) -> dict[str, Any]:
        """The plan as docs/json.md#shard-plan documents it.

        Args:
            paths: the listing's relative paths, indexed like the plan's files.
            source, fingerprint: the listing's, echoed so a saved plan names
                what it was made from.
        """
        fps, bps = self.files_per_slot(), self.bytes_per_slot()
        doc = {
            "source": source,
            "fingerprint": fingerprint,
            "files": self.n_files,
            "bytes": self.total_bytes,
            "world_size": self.world_size,
            "num_workers": [r.num_workers for r in self.ranks],
            "shuffle": self.shuffle,
            "shuffle_scope": self.shuffle_scope,
            "nproc_per_node": self.nproc_per_node,
            "node_count": self.node_count,
            "seed": self.seed,
            "epoch": self.epoch,
            "batch_size": self.batch_size,
            "consistent": self.consistent,
            "batches_equal": self.batches_equal,
            "summary": {
                "slots": self.slot_total,
                "files_per_slot": {"min": fps.min, "mean": fps.mean, "max": fps.max},
                "bytes_per_slot": {"min": bps.min, "mean": bps.mean, "max": bps.max},
                "imbalance": round(self.imbalance, 4),
            },
            "ranks": [
                {"rank": r.rank, "num_workers": r.num_workers, "files": r.files,
                 "bytes": r.bytes, "batches": r.batches}
                for r in self.ranks
            ],
            "batches": [r.batches for r in self.ranks] if self.batch_size else None,
            "nodes": [nd.to_json() for nd in self.nodes],
            "slots": [s.to_json(paths) for s in self.slots],
            "duplicated": [paths[i] for i in self.duplicated],
            "skipped": [paths[i] for i in self.skipped],
        }
        if self.empty.count:
            doc["empty_slots"] = self.empty.to_json()
        return doc

    def readers(self, index: int) -> list[tuple[int, int]]:
        """The (rank, worker) slots that read listing index ``index``."""
        return [(s.rank, s.worker) for s in self.slots if bool((s.indices == index).any())]


def _ranks_to_plan(spec: int | list[int], first: int, count: int,
                   n: int) -> Iterator[tuple[int, int]]:
    """(rank, num_workers) of every rank of ranks ``first .. first + count - 1``
    that may read a file of an order of ``n``.

    With one value for all ranks, the group's ``i``-th rank reads nothing once
    ``i * K >= n``, so the walk stops there: a plan costs O(files), not O(ranks).
    """
    if isinstance(spec, int):
        last = min(count, -(-n // effective_workers(spec)))
        for i in range(last):
            yield first + i, spec
    else:
        for rank in range(first, first + count):
            yield rank, spec[rank]


def plan(
    sizes: Sequence[int] | np.ndarray,
    *,
    world_size: int,
    num_workers: int | Sequence[int],
    shuffle: bool = False,
    seed: int = 0,
    epoch: int = 0,
    batch_size: int | None = None,
    shuffle_scope: str = DEFAULT_SHUFFLE_SCOPE,
    nproc_per_node: int | None = None,
) -> ShardPlan:
    """Plan which files every slot reads, as each rank would compute it itself.

    Time and memory grow with the number of files, not of slots: slots that
    read nothing (more slots than files) are counted and described by ranges
    in :attr:`ShardPlan.empty`, never listed.

    Args:
        sizes: file sizes in listing order (a numpy array costs no Python
            object per file; :meth:`ucstage.Manifest.sizes` gives one).
        world_size: number of ranks.
        num_workers: one value, or one per rank; rank ``r`` applies the slot rule
            with its own value, exactly as a rank given that value would, so a
            mismatch shows up as duplicated and skipped files.
        shuffle, seed, epoch: the read order (see :func:`read_order`).
        batch_size: when given, per-rank batch counts (a DataLoader over an
            IterableDataset batches per worker: ``sum(ceil(files_w / B))``).
        shuffle_scope, nproc_per_node: with ``shuffle``, ``"node"`` keeps each
            node's files across epochs (see the module docstring); ``"global"``
            deals one permutation over the whole job. ``nproc_per_node=None``
            makes the whole job one node.
    """
    import numpy as np

    spec = _workers_spec(num_workers, world_size)
    if batch_size is not None and batch_size < 1:
        raise InvalidArgument(f"batch_size must be at least 1, got {batch_size}")
    nodes = node_count(world_size, nproc_per_node)
    scoped = _node_scoped(shuffle, shuffle_scope, nodes)
    size_arr = np.asarray(sizes, dtype=np.int64)
    n = len(size_arr)
    # Groups of ranks that deal one read order: each node under the node
    # scope, else the whole job. (first rank, ranks, node of a group's order)
    per_node = nproc_per_node if nproc_per_node is not None else world_size
    groups: Iterator[tuple[int, int, int]]
    if scoped:
        # Nodes with files are a prefix (node_block); the rest are counted at the end.
        groups = ((j * per_node, per_node, j) for j in range(min(nodes, n)))
    else:
        groups = iter([(0, world_size, 0)])
    # One effective worker count for all ranks partitions each group's order,
    # so every file is read exactly once; only disagreeing ranks need counting.
    agree = isinstance(spec, int) or len({effective_workers(k) for k in spec}) == 1
    counts = None if agree else np.zeros(n, dtype=np.int32)
    slots: list[SlotPlan] = []
    ranks: list[RankStats] = []
    empty = EmptySlots()
    planned_ranks = 0
    for first_rank, group_ranks, node in groups:
        order = node_order(n, node=node, world_size=world_size, nproc_per_node=nproc_per_node,
                           shuffle=shuffle, seed=seed, epoch=epoch, shuffle_scope=shuffle_scope)
        # The group's read order as one int64 array: each slot's files are a strided view.
        order_arr = (order.array() if isinstance(order, (Permutation, NodeOrder))
                     else np.arange(n, dtype=np.int64))
        m = len(order_arr)
        in_order = size_arr[order_arr] if shuffle else size_arr
        slot_bytes = None
        if agree:
            step = group_ranks * effective_workers(spec if isinstance(spec, int) else spec[0])
            if step <= m:  # bytes of every slot at once: the read order as rows of `step` slots
                padded = np.zeros(-(-m // step) * step, dtype=np.int64)
                padded[:m] = in_order
                slot_bytes = padded.reshape(-1, step).sum(axis=0)
            else:
                slot_bytes = in_order
        walked = 0
        for rank, k in _ranks_to_plan(spec, first_rank, group_ranks, m):
            walked += 1
            workers = effective_workers(k)
            step = group_ranks * workers
            first = (rank - first_rank) * workers
            busy = max(0, min(workers, m - first))  # workers with a file: a prefix
            empty.add(rank, busy, workers)
            if not busy:
                continue
            rank_files = rank_bytes = batches = 0
            for worker in range(busy):
                files = order_arr[first + worker::step]
                if slot_bytes is not None:
                    nbytes = int(slot_bytes[first + worker])
                else:
                    nbytes = int(in_order[first + worker::step].sum())
                if counts is not None:
                    counts[files] += 1
                slots.append(SlotPlan(rank, worker, files, nbytes, _node_of(rank, nproc_per_node)))
                rank_files += len(files)
                rank_bytes += nbytes
                if batch_size:
                    batches += -(-len(files) // batch_size)
            ranks.append(RankStats(rank, k, rank_files, rank_bytes,
                                   batches if batch_size else None))
        if isinstance(spec, int):
            # The group's ranks past the walk read nothing at all: counted, never visited.
            empty.add(first_rank + walked, 0, effective_workers(spec),
                      ranks=group_ranks - walked)
        planned_ranks = first_rank + group_ranks
    if planned_ranks < world_size:  # whole nodes without a file (more nodes than files)
        if isinstance(spec, int):
            empty.add(planned_ranks, 0, effective_workers(spec),
                      ranks=world_size - planned_ranks)
        else:
            for rank in range(planned_ranks, world_size):
                empty.add(rank, 0, effective_workers(spec[rank]))
    read_count = (bytearray(b"\x01") * n if counts is None
                  else bytearray(np.minimum(counts, 255).astype(np.uint8).tobytes()))
    return ShardPlan(
        n_files=n,
        total_bytes=int(size_arr.sum()),
        world_size=world_size,
        num_workers=spec,
        shuffle=shuffle,
        seed=seed,
        epoch=epoch,
        batch_size=batch_size,
        slots=slots,
        ranks=ranks,
        slot_total=slot_count(world_size, spec),
        empty=empty,
        duplicated=[] if counts is None else np.flatnonzero(counts > 1).tolist(),
        skipped=[] if counts is None else np.flatnonzero(counts == 0).tolist(),
        read_count=read_count,
        shuffle_scope=shuffle_scope,
        nproc_per_node=nproc_per_node,
        node_count=nodes,
        nodes=_node_stats(ranks, nproc_per_node, world_size),
    )


def _node_of(rank: int, nproc_per_node: int | None) -> int:
    return rank // nproc_per_node if nproc_per_node is not None else 0


def _node_stats(ranks: list[RankStats], nproc_per_node: int | None,
                world_size: int) -> list[NodeStats]:
    """Per-node sums of the ranks that read files (in rank order, so nodes come in order)."""
    per_node = nproc_per_node if nproc_per_node is not None else world_size
    out: list[NodeStats] = []
    for r in ranks:
        node = _node_of(r.rank, nproc_per_node)
        if out and out[-1].node == node:
            last = out[-1]
            out[-1] = NodeStats(node, last.first_rank, last.last_rank, last.files + r.files,
                                last.bytes + r.bytes)
        else:
            out.append(NodeStats(node, node * per_node, (node + 1) * per_node - 1, r.files,
                                 r.bytes))
    return out


def slot_plan(
    sizes: Sequence[int] | np.ndarray,
    *,
    rank: int,
    worker: int,
    world_size: int,
    num_workers: int | Sequence[int],
    shuffle: bool = False,
    seed: int = 0,
    epoch: int = 0,
    shuffle_scope: str = DEFAULT_SHUFFLE_SCOPE,
    nproc_per_node: int | None = None,
) -> SlotPlan:
    """What one slot reads, without planning the others (``shard-plan --slot``).

    Raises:
        InvalidArgument: no such slot (the message says which ranks and
            workers there are).
    """
    spec = _workers_spec(num_workers, world_size)
    if not 0 <= rank < world_size:
        raise InvalidArgument(f"no slot {rank}:{worker}: ranks are 0..{world_size - 1}")
    k = spec if isinstance(spec, int) else spec[rank]
    if not 0 <= worker < effective_workers(k):
        raise InvalidArgument(
            f"no slot {rank}:{worker}: rank {rank} has workers 0..{effective_workers(k) - 1} "
            f"(num_workers {k}; 0 means the main process reads, as worker 0)")
    files = slot_array(len(sizes), rank=rank, world_size=world_size, num_workers=k,
                       worker=worker, shuffle=shuffle, seed=seed, epoch=epoch,
                       shuffle_scope=shuffle_scope, nproc_per_node=nproc_per_node)
    if hasattr(sizes, "take"):  # a numpy array: no Python object per file
        nbytes = int(sizes.take(files).sum())
    else:
        nbytes = sum(sizes[int(i)] for i in files)
    return SlotPlan(rank, worker, files, nbytes, _node_of(rank, nproc_per_node))


EQUAL_LENGTH_MODES = ("pad", "drop")


def equal_slot_files(
    n: int,
    *,
    rank: int,
    world_size: int,
    num_workers: int,
    worker: int,
    mode: str,
    shuffle: bool = False,
    seed: int = 0,
    epoch: int = 0,
    order: Sequence[int] | None = None,
    shuffle_scope: str = DEFAULT_SHUFFLE_SCOPE,
    nproc_per_node: int | None = None,
) -> list[int]:
    """:func:`slot_files`, trimmed or padded so that every slot reads the same count.

    Equal counts per slot give every rank the same number of batches, so DDP
    does not hang at the end of an epoch waiting for a rank with one more.

    * ``"drop"``: every slot reads ``n // slots`` files; the last ``n % slots``
      files of the read order are skipped this epoch (with ``shuffle`` a
      different few each epoch).
    * ``"pad"``: every slot reads ``ceil(n / slots)`` files; a slot one short
      continues the slot rule past the end of the read order, wrapping around
      (position ``p`` reads ``order[p % n]``), so a few files from the start of
      the read order are read twice, as ``DistributedSampler`` pads.

    Under the ``"node"`` scope with several nodes, ``slots`` still counts the
    whole job's, and the read order is the node's (``n`` its file count).
    """
    if mode not in EQUAL_LENGTH_MODES:
        raise InvalidArgument(f"equal_length must be one of {EQUAL_LENGTH_MODES}, got {mode!r}")
    return slot_array(n, rank=rank, world_size=world_size, num_workers=num_workers,
                      worker=worker, shuffle=shuffle, seed=seed, epoch=epoch,
                      equal_length=mode, order=order, shuffle_scope=shuffle_scope,
                      nproc_per_node=nproc_per_node).tolist()


def slot_length(
    n: int,
    *,
    rank: int,
    world_size: int,
    num_workers: int,
    worker: int,
    equal_length: str | None = None,
    shuffle: bool = False,
    shuffle_scope: str = DEFAULT_SHUFFLE_SCOPE,
    nproc_per_node: int | None = None,
) -> int:
    """How many files slot (rank, worker) reads: ``len`` of :func:`slot_files`
    (``equal_length=None``) or :func:`equal_slot_files`, without building either."""
    _check(world_size, num_workers, rank, worker)
    if equal_length is not None and equal_length not in EQUAL_LENGTH_MODES:
        raise InvalidArgument(
            f"equal_length must be one of {EQUAL_LENGTH_MODES}, got {equal_length!r}")
    if equal_length is not None:
        return _equal_count(n, slot_count(world_size, num_workers), equal_length) if n else 0
    nodes = node_count(world_size, nproc_per_node)
    k = effective_workers(num_workers)
    if _node_scoped(shuffle, shuffle_scope, nodes):
        assert nproc_per_node is not None
        node, local = divmod(rank, nproc_per_node)
        return len(range(local * k + worker, len(node_block(n, node, nodes)),
                         nproc_per_node * k))
    return len(range(rank * k + worker, n, world_size * k))


def rank_length(
    n: int,
    *,
    rank: int,
    world_size: int,
    num_workers: int,
    equal_length: str | None = None,
    shuffle: bool = False,
    shuffle_scope: str = DEFAULT_SHUFFLE_SCOPE,
    nproc_per_node: int | None = None,
) -> int:
    """How many files rank ``rank`` reads over all its workers (see :func:`slot_length`)."""
    return sum(slot_length(n, rank=rank, world_size=world_size, num_workers=num_workers,
                           worker=w, equal_length=equal_length, shuffle=shuffle,
                           shuffle_scope=shuffle_scope, nproc_per_node=nproc_per_node)
               for w in range(effective_workers(num_workers)))


@dataclass(frozen=True)
class ForecastRow:
    """What one node reads in one epoch, and how much of it crosses the network."""

    epoch: int
    node: int
    files: int
    """Distinct files the node's slots read this epoch."""
    bytes: int
    new_files: int
    """Of those, files the node read in no earlier epoch of the forecast:
    what its cache must fetch (the rest it already holds, cap permitting)."""
    new_bytes: int

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "node": self.node, "files": self.files,
                "bytes": self.bytes, "new_files": self.new_files, "new_bytes": self.new_bytes}


@dataclass
class Forecast:
    """Network traffic of a multi-epoch job, per epoch and node (:func:`forecast`)."""

    shuffle_scope: str
    node_count: int
    epochs: list[int]
    rows: list[ForecastRow]
    """One per (epoch, node), epochs in order, nodes in order."""
    share_files: list[int]
    """Per node: distinct files it reads over all the epochs (what its cache
    must hold to serve every epoch without fetching again)."""
    share_bytes: list[int]

    @property
    def new_files(self) -> int:
        """Fetches over the whole job, every node counted."""
        return sum(r.new_files for r in self.rows)

    @property
    def new_bytes(self) -> int:
        return sum(r.new_bytes for r in self.rows)

    def epoch_new(self, epoch: int) -> tuple[int, int]:
        """(files, bytes) every node together fetches in ``epoch``."""
        rows = [r for r in self.rows if r.epoch == epoch]
        return sum(r.new_files for r in rows), sum(r.new_bytes for r in rows)

    def to_json(self, max_bytes: int | None = None) -> dict[str, Any]:
        """One scope's forecast as docs/json.md#shard-plan documents it;
        ``max_bytes``, when given, decides each node's ``fits``."""
        return {
            "shuffle_scope": self.shuffle_scope,
            "new_files": self.new_files,
            "new_bytes": self.new_bytes,
            "epochs": [r.to_json() for r in self.rows],
            "shares": [{"node": i, "files": f, "bytes": b,
                        "fits": None if max_bytes is None else b <= max_bytes}
                       for i, (f, b) in enumerate(zip(self.share_files, self.share_bytes,
                                                      strict=True))],
        }


def forecast(
    sizes: Sequence[int] | np.ndarray,
    *,
    world_size: int,
    num_workers: int | Sequence[int],
    epochs: int,
    first_epoch: int = 0,
    shuffle: bool = True,
    seed: int = 0,
    shuffle_scope: str = DEFAULT_SHUFFLE_SCOPE,
    nproc_per_node: int | None = None,
) -> Forecast:
    """For each epoch and node, the files and bytes the node reads that it read
    in no earlier epoch: what crosses the network when every node caches.

    Computed from :func:`plan` of each epoch (the one rule), so it counts what
    the job would read, mismatched ``num_workers`` included. Holds one byte
    per file per node while it runs.
    """
    import numpy as np

    if epochs < 1:
        raise InvalidArgument(f"epochs must be at least 1, got {epochs}")
    size_arr = np.asarray(sizes, dtype=np.int64)
    n = len(size_arr)
    nodes = node_count(world_size, nproc_per_node)
    seen = [np.zeros(n, dtype=bool) for _ in range(nodes)]
    rows: list[ForecastRow] = []
    epoch_list = list(range(first_epoch, first_epoch + epochs))
    for epoch in epoch_list:
        p = plan(size_arr, world_size=world_size, num_workers=num_workers, shuffle=shuffle,
                 seed=seed, epoch=epoch, shuffle_scope=shuffle_scope,
                 nproc_per_node=nproc_per_node)
        by_node: dict[int, list[np.ndarray]] = {}
        for s in p.slots:
            by_node.setdefault(s.node, []).append(s.indices)
        for node in range(nodes):
            parts = by_node.get(node)
            read = np.zeros(n, dtype=bool)
            if parts:
                read[np.concatenate(parts)] = True
            new = read & ~seen[node]
            seen[node] |= read
            rows.append(ForecastRow(epoch, node, int(read.sum()), int(size_arr[read].sum()),
                                    int(new.sum()), int(size_arr[new].sum())))
    return Forecast(shuffle_scope, nodes, epoch_list, rows,
                    [int(s.sum()) for s in seen], [int(size_arr[s].sum()) for s in seen])


# -- resuming an interrupted epoch ---------------------------------------------
#
# Kept apart from the rule above on purpose: it only *calls* the slot rule
# (through `_epoch_slot` and `epoch_slot_length`, the only places that ask for a
# slot's epoch order), so a change to the rule reaches resumes without an edit here.


@dataclass(frozen=True)
class Segment:
    """A stretch of one epoch run with one layout, and what each slot delivered.

    The first segment of an epoch reads the epoch's read order by the slot
    rule; each later one reads what the earlier ones left (:func:`resume_slots`).
    """

    world_size: int
    num_workers: int
    delivered: tuple[int | None, ...]
    """Files each slot ``rank * max(1, num_workers) + worker`` delivered, in
    its order; None where unknown (a single rank's state, before merging)."""
    nproc_per_node: int | None = None

    @property
    def slots(self) -> int:
        return self.world_size * effective_workers(self.num_workers)


@dataclass(frozen=True)
class EpochOrder:
    """What decides an epoch's read order, besides the layout."""

    n: int
    shuffle: bool = False
    seed: int = 0
    epoch: int = 0
    equal_length: str | None = None
    shuffle_scope: str = "global"


@dataclass(frozen=True)
class SlotRun:
    """One slot's files in one segment: ``files`` in order, of which the
    first ``real`` are the segment's own share and the rest equal-length padding."""

    files: np.ndarray
    real: int


def _epoch_slot(order: EpochOrder, layout: Segment, rank: int, worker: int) -> SlotRun:
    """A slot's files for a whole epoch by the slot rule. With
    :func:`epoch_slot_length`, the resume's only call to the rule."""
    files = slot_array(order.n, rank=rank, world_size=layout.world_size,
                       num_workers=layout.num_workers, worker=worker, shuffle=order.shuffle,
                       seed=order.seed, epoch=order.epoch, equal_length=order.equal_length,
                       shuffle_scope=order.shuffle_scope, nproc_per_node=layout.nproc_per_node)
    return SlotRun(files, min(epoch_slot_length(order, layout, rank, worker)[1], len(files)))


def epoch_slot_length(order: EpochOrder, layout: Segment, rank: int, worker: int
                      ) -> tuple[int, int]:
    """(files, of which its real share) a slot reads in a whole epoch, by arithmetic."""
    def length_of(equal_length: str | None) -> int:
        return slot_length(order.n, rank=rank, world_size=layout.world_size,
                           num_workers=layout.num_workers, worker=worker,
                           equal_length=equal_length, shuffle=order.shuffle,
                           shuffle_scope=order.shuffle_scope,
                           nproc_per_node=layout.nproc_per_node)

    length, real = length_of(order.equal_length), length_of(None)
    return length, min(length, real)


def resume_nodes(layout: Segment, order: EpochOrder) -> int:
    """Nodes whose remainders stay apart: under the ``"node"`` shuffle scope,
    ``world_size // nproc_per_node``; otherwise the whole job is one."""
    if not order.shuffle or order.shuffle_scope != "node" or not layout.nproc_per_node:
        return 1
    return max(1, layout.world_size // layout.nproc_per_node)


def _remainder(runs: list[SlotRun], done: Segment, groups: int) -> list[np.ndarray]:
    """What the slots of segment ``done`` left, in order, per group of the next layout.

    A slot's leftover is its real files past its delivered count. Leftovers
    are merged back in the order the segment dealt them (step ``i`` of every
    slot, slots in slot order): for a first segment this is the read order.
    With several groups, a slot's leftover stays with its node.
    """
    import numpy as np

    k = effective_workers(done.num_workers)
    keys: list[list[np.ndarray]] = [[] for _ in range(groups)]
    vals: list[list[np.ndarray]] = [[] for _ in range(groups)]
    for s, run in enumerate(runs):
        d = done.delivered[s]
        if d is None:
            raise InvalidArgument(f"the state does not say what slot {s // k}:{s % k} delivered",
                                  hint="merge every rank's state with ucstage.merge_states")
        left = run.files[d:run.real]
        if not len(left):
            continue
        g = 0 if groups == 1 else (s // k) // (done.nproc_per_node or 1)
        keys[g].append(np.arange(d, run.real, dtype=np.int64) * done.slots + s)
        vals[g].append(left)
    out = []
    for g in range(groups):
        if not keys[g]:
            out.append(np.zeros(0, dtype=np.int64))
            continue
        key, val = np.concatenate(keys[g]), np.concatenate(vals[g])
        out.append(val[np.argsort(key, kind="stable")])
    return out


def _deal(remainder: list[np.ndarray], layout: Segment, equal_length: str | None) -> list[SlotRun]:
    """The slot rule applied to a remainder list: slot ``t`` of a group reads
    its positions ``t, t + step, ...``; with ``equal_length`` every slot of the
    job reads the same count, padded by wrapping or trimmed."""
    import numpy as np

    total = sum(len(r) for r in remainder)
    k, slots = effective_workers(layout.num_workers), layout.slots
    if equal_length is not None and len(remainder) > 1 and total and \
            any(not len(r) for r in remainder):
        remainder = [np.concatenate(remainder)]  # a node with nothing left cannot pad
    count = 0
    if equal_length is not None:
        count = total // slots if equal_length == "drop" else -(-total // slots)
    runs = []
    for rank in range(layout.world_size):
        for worker in range(k):
            if len(remainder) == 1:
                group, t, step = remainder[0], rank * k + worker, slots
            else:
                per = layout.nproc_per_node or layout.world_size
                node = rank // per
                group, t, step = remainder[node], (rank - node * per) * k + worker, per * k
            m = len(group)
            real = len(range(t, m, step))
            if equal_length is None:
                pos = np.arange(t, m, step, dtype=np.int64)
            else:
                pos = (t + step * np.arange(count, dtype=np.int64)) % max(m, 1)
                real = min(real, count)
                if not m:
                    pos = pos[:0]
            runs.append(SlotRun(group[pos], real))
    return runs


def _check_layout(seg: Segment, order: EpochOrder) -> None:
    _check_world(seg.world_size)
    if seg.num_workers < 0:
        raise InvalidArgument(f"num_workers must be 0 or more, got {seg.num_workers}")
    if len(seg.delivered) != seg.slots:
        raise InvalidArgument(f"the state lists {len(seg.delivered)} slots but world_size "
                              f"{seg.world_size} x num_workers {seg.num_workers} has {seg.slots}")
    if seg.nproc_per_node is not None and (seg.nproc_per_node < 1
                                           or seg.world_size % seg.nproc_per_node):
        raise InvalidArgument(f"world_size {seg.world_size} is not a multiple of "
                              f"nproc_per_node {seg.nproc_per_node}")
    if order.equal_length is not None and order.equal_length not in EQUAL_LENGTH_MODES:
        raise InvalidArgument(
            f"equal_length must be one of {EQUAL_LENGTH_MODES}, got {order.equal_length!r}")


def segment_runs(order: EpochOrder, segments: Sequence[Segment]) -> list[list[SlotRun]]:
    """Every slot's files in each segment of an epoch, in order.

    The first segment reads the epoch by the slot rule. Each later segment
    re-splits what the earlier ones left undelivered: the leftovers, in the
    order they were dealt, are dealt again over the new slots by the same
    rule (per node under the ``"node"`` scope when the node count did not
    change, else over the whole job). Deterministic: every rank computes the
    same runs.

    Raises:
        InvalidArgument: a delivered count beyond its slot's files, or a
            segment whose counts do not match its layout.
    """
    out: list[list[SlotRun]] = []
    for i, seg in enumerate(segments):
        _check_layout(seg, order)
        k = effective_workers(seg.num_workers)
        if i == 0:
            runs = [_epoch_slot(order, seg, s // k, s % k) for s in range(seg.slots)]
        else:
            prev = segments[i - 1]
            nodes = resume_nodes(seg, order)
            groups = nodes if nodes > 1 and nodes == resume_nodes(prev, order) else 1
            runs = _deal(_remainder(out[-1], prev, groups), seg, order.equal_length)
        for s, (run, d) in enumerate(zip(runs, seg.delivered, strict=True)):
            if d is not None and not 0 <= d <= len(run.files):
                raise InvalidArgument(
                    f"slot {s // k}:{s % k} delivered {d} files but reads only "
                    f"{len(run.files)} in this epoch",
                    hint="the state belongs to another listing or layout")
        out.append(runs)
    return out


def same_layout(a: Segment, b: Segment, order: EpochOrder) -> bool:
    """Whether a resume on layout ``b`` continues segment ``a`` slot for slot."""
    return (a.world_size == b.world_size
            and effective_workers(a.num_workers) == effective_workers(b.num_workers)
            and ((resume_nodes(a, order) == 1 and resume_nodes(b, order) == 1)
                 or a.nproc_per_node == b.nproc_per_node))


def resume_slots(order: EpochOrder, segments: Sequence[Segment], layout: Segment
                 ) -> tuple[list[Segment], list[np.ndarray | None]]:
    """What each slot of ``layout`` reads to finish an interrupted epoch.

    ``segments`` are the epoch's stretches so far (the last may be partly
    unknown on a single rank's state). On the same layout as the last
    segment every slot continues where it stopped; on another layout, what
    is left is re-split over the new slots (:func:`segment_runs`).

    Returns:
        The epoch's segments from now on (the last being the one that runs),
        and per slot of ``layout`` the listing indices it still reads, in
        order (None for a slot whose count the state does not hold).
    """
    if not segments:
        raise InvalidArgument("the state has no segment to resume")
    last = segments[-1]
    if same_layout(last, layout, order):
        runs = segment_runs(order, segments)[-1]
        return list(segments), [None if d is None else run.files[d:]
                                for run, d in zip(runs, last.delivered, strict=True)]
    new = Segment(layout.world_size, layout.num_workers, (0,) * layout.slots,
                  layout.nproc_per_node)
    chain = [*segments, new]
    return chain, [run.files for run in segment_runs(order, chain)[-1]]
