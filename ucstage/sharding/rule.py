"""The slot rule: which files one (rank, worker) slot reads, and how many.

Slot ``(rank, worker)`` of a group of ranks that deals one read order (the
whole job, or one node under the ``"node"`` shuffle scope) reads positions
``start, start + step, ...`` of it: :func:`stride` is the only place that
arithmetic lives, and :meth:`Stride.positions` the only place of the
equal-length wrap. The plan, the forecast, the resume re-split, the cache's
``rank_entries`` and the dataset all call them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import numpy as np

from ..errors import InvalidArgument
from .order import (
    GroupedOrder,
    NodeOrder,
    Permutation,
    node_block,
    node_deals,
    node_order,
    node_share,
)
from .values import Layout, ReadOrder, Slot

__all__ = ["Dealing", "SlotRule", "Stride", "equal_count", "rank_entries", "rank_length", "slot_array",
           "slot_dealing", "slot_length", "stride"]

T = TypeVar("T")


@dataclass(frozen=True)
class Stride:
    """A slot's positions in the read order its group deals: ``start``,
    ``start + step``, ..."""

    start: int
    step: int

    def length(self, m: int) -> int:
        """Positions below ``m`` (files the slot reads of an order of ``m``)."""
        return len(range(self.start, m, self.step))

    def positions(self, m: int, count: int | None = None) -> np.ndarray:
        """The slot's positions in an order of ``m`` (int64).

        With ``count`` (equal length), exactly ``count`` positions: ``"pad"``
        continues the rule past the end, position ``p`` reading ``p % m``
        (so a few files from the start are read twice, as
        ``DistributedSampler`` pads); none when the order is empty.
        """
        import numpy as np

        if count is None:
            return np.arange(self.start, m, self.step, dtype=np.int64)
        pos = (self.start + self.step * np.arange(count, dtype=np.int64)) % max(m, 1)
        return pos if m else pos[:0]


def stride(layout: Layout, slot: Slot, *, per_node: bool) -> Stride:
    """Where ``slot`` of ``layout`` reads: the slot rule.

    ``per_node``: the slot's node deals its own order over its ranks x workers
    (the ``"node"`` scope with several nodes); else the whole job deals one.
    Each rank applies the rule with its own ``num_workers``, exactly as a
    rank given that value would (a mismatch then reads files twice or never).
    """
    k = layout.readers_of(slot.rank)
    if per_node:
        return Stride(layout.local_rank(slot.rank) * k + slot.worker, layout.ranks_per_node * k)
    return Stride(slot.rank * k + slot.worker, layout.world_size * k)


def equal_count(n: int, slots: int, equal_length: str | None) -> int | None:
    """Files every slot reads with ``equal_length`` (None without): counted over
    the whole job's ``slots``, so every rank of every node gets the same count."""
    if equal_length is None:
        return None
    return n // slots if equal_length == "drop" else -(-n // slots)


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
    def stride(self) -> Stride:
        return Stride(self.start, self.step)

    @property
    def length(self) -> int:
        """Files the slot reads (without ``equal_length``)."""
        return self.stride.length(len(self.order))


def slot_dealing(order: ReadOrder, layout: Layout, slot: Slot, *,
                 deals_from: Sequence[int] | None = None) -> Dealing:
    """Where ``slot`` reads from in one epoch: the slot rule with the scope.

    A slot's file at step ``i`` is ``deals_from[start + i * step]``; a resumed
    epoch can skip the first steps by arithmetic alone. Pass ``deals_from``
    (:func:`node_order` of the slot's node) to reuse it for the node's slots.
    """
    rule = SlotRule.of(order, layout, slot)
    if deals_from is None:
        deals_from = rule.deals_from(order)
    return Dealing(deals_from, rule.stride.start, rule.stride.step, rule.node, layout.nodes)


@dataclass(frozen=True)
class SlotRule:
    """One slot's part of the slot rule, checked and worked out once for a
    layout and the parts of a read order that no epoch changes (its size,
    shuffle, scope and equal-length mode): where it reads (``stride``), its
    node, whether that node deals its own order (``nodes``: the layout's
    node count then, else 0) and the equal-length ``count``. :meth:`array`
    deals one epoch; :meth:`of` keeps each rule on its layout, so a dataset's
    per-epoch path checks nothing again."""

    stride: Stride
    node: int
    nodes: int
    count: int | None
    n: int

    @staticmethod
    def of(order: ReadOrder, layout: Layout, slot: Slot) -> SlotRule:
        """The rule of ``slot`` of ``layout`` over ``order`` (any epoch).

        Raises:
            InvalidArgument: the slot is outside the layout.
        """
        # Kept on the layout by plain values: hashing a Layout or a Slot per
        # epoch would cost more than the rule it saves.
        key = (slot.rank, slot.worker, order.n, order.shuffle, order.shuffle_scope,
               order.equal_length)
        found = layout.rules.get(key)
        if found is None:
            found = layout.rules[key] = _slot_rule(layout, slot, order)
        return found

    def deals_from(self, order: ReadOrder) -> Sequence[int]:
        """The read order this slot's node deals from in ``order``'s epoch."""
        return node_deals(order, self.node, self.nodes)

    def array(self, order: ReadOrder, deals_from: Sequence[int] | None = None) -> np.ndarray:
        """:func:`slot_array` of ``order``'s epoch."""
        if deals_from is None:
            deals_from = node_deals(order, self.node, self.nodes)
        m = len(deals_from)
        if self.count and not m:
            raise InvalidArgument(
                f'equal_length="pad" needs a file on every node: {self.n} files, '
                f'{self.nodes} nodes', hint='use fewer nodes, or equal_length="drop"')
        # m: the files the slot's node deals (the whole job's with one node).
        return _pick(deals_from, self.stride.positions(m, self.count))


def _slot_rule(layout: Layout, slot: Slot, order: ReadOrder) -> SlotRule:
    """:meth:`SlotRule.of` worked out (``order``'s epoch plays no part)."""
    layout.slot(slot.rank, slot.worker)  # refuses a slot outside the layout
    node = layout.node_of(slot.rank)
    layout.node_ranks(node)
    per_node = order.per_node(layout)
    count = equal_count(order.n, layout.slots, order.equal_length) if order.n else None
    return SlotRule(stride(layout, slot, per_node=per_node), node,
                    layout.nodes if per_node else 0, count, order.n)


def _pick(order: Sequence[int], positions: np.ndarray) -> np.ndarray:
    """``order[p]`` for each read-order position in ``positions``, as int64,
    computed for those positions only (a permutation is never materialised)."""
    import numpy as np

    if isinstance(order, range):
        return order.start + positions * order.step
    if isinstance(order, (Permutation, NodeOrder, GroupedOrder)):
        return order.take(positions)
    if isinstance(order, np.ndarray):
        return order[positions].astype(np.int64, copy=False)
    return np.asarray([order[int(p)] for p in positions], dtype=np.int64)


def slot_array(order: ReadOrder, layout: Layout, slot: Slot, *,
               deals_from: Sequence[int] | None = None) -> np.ndarray:
    """The listing rows ``slot`` reads in one epoch, in read order, as an int64
    array: no Python object per file, and with a shuffle only this slot's
    positions are permuted. Pass ``deals_from`` (:func:`node_order` of the
    slot's node) to avoid recomputing a permutation for every slot.

    With ``order.equal_length`` every slot reads the same count, so every rank
    gets the same number of batches and DDP does not hang at the end of an
    epoch waiting for a rank with one more:

    * ``"drop"``: every slot reads ``n // slots`` files; the last ``n % slots``
      files of the read order are skipped this epoch (with ``shuffle`` a
      different few each epoch).
    * ``"pad"``: every slot reads ``ceil(n / slots)`` files; a slot one short
      continues the slot rule past the end of the read order, wrapping around
      (position ``p`` reads ``order[p % n]``), so a few files from the start of
      the read order are read twice, as ``DistributedSampler`` pads.

    Under the ``"node"`` scope with several nodes, ``slots`` still counts the
    whole job's, and the read order is the node's.
    """
    return SlotRule.of(order, layout, slot).array(order, deals_from)


def slot_length(order: ReadOrder, layout: Layout, slot: Slot) -> int:
    """How many files ``slot`` reads in one epoch: ``len`` of :func:`slot_array`,
    without building it (``order.seed`` and ``order.epoch`` change no count)."""
    layout.slot(slot.rank, slot.worker)
    if order.equal_length is not None:
        count = equal_count(order.n, layout.slots, order.equal_length)
        return count if order.n and count else 0
    per_node = order.per_node(layout)
    m = len(node_block(order.n, layout.node_of(slot.rank), layout.nodes)) if per_node \
        else order.n
    return stride(layout, slot, per_node=per_node).length(m)


def rank_length(order: ReadOrder, layout: Layout, rank: int) -> int:
    """How many files rank ``rank`` reads over all its workers (see :func:`slot_length`)."""
    return sum(slot_length(order, layout, layout.slot(rank, w))
               for w in range(layout.readers_of(rank)))


def rank_entries(entries: Sequence[T], ranks: Sequence[int], layout: Layout,
                 order: ReadOrder) -> list[T]:
    """The entries that ``ranks`` of ``layout`` read under the slot rule, in listing order.

    Calls :func:`slot_array` for every worker of every rank, the function
    ``shard-plan`` and the dataset use. With ``shuffle`` under the ``"node"``
    scope, a node's files are the same every epoch: the whole share of every
    node holding one of ``ranks`` (:func:`node_share`), whatever the epoch.
    ``order.n`` is ``len(entries)``; its ``equal_length`` is not applied.
    """
    order = order.with_n(len(entries)) if order.n != len(entries) else order
    wanted: set[int] = set()
    if order.shuffle and order.shuffle_scope == "node":
        for node in sorted({layout.node_of(rank) for rank in ranks}):
            wanted.update(node_share(order.n, layout, node, seed=order.seed,
                                     groups=order.groups).tolist())
        return [entries[i] for i in sorted(wanted)]
    plain = replace(order, equal_length=None)
    for rank in ranks:
        layout.slot(rank, 0)
        deals_from = node_order(plain, layout, layout.node_of(rank))
        for worker in range(layout.readers_of(rank)):
            wanted.update(slot_array(plain, layout, Slot(rank, worker),
                                     deals_from=deals_from).tolist())
    return [entries[i] for i in sorted(wanted)]
