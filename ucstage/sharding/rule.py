"""The slot rule: which files one (rank, worker) slot reads, and how many."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import numpy as np

from ..errors import InvalidArgument
from .order import (
    DEFAULT_SHUFFLE_SCOPE,
    NodeOrder,
    Permutation,
    _node_scoped,
    node_block,
    node_order,
    node_share,
)
from .values import _check_world, effective_workers, node_count, slot_count

T = TypeVar("T")


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


def rank_entries(
    entries: Sequence[T], *, ranks: Sequence[int], world_size: int, num_workers: int,
    shuffle: bool = False, seed: int = 0, epoch: int = 0,
    shuffle_scope: str = DEFAULT_SHUFFLE_SCOPE, nproc_per_node: int | None = None,
) -> list[T]:
    """The entries that ``ranks`` read under the slot rule, in listing order.

    Calls :func:`ucstage.sharding.slot_files` for every worker of every rank,
    the same function ``shard-plan`` and the dataset use. With ``shuffle``
    under the ``"node"`` scope, a node's files are the same every epoch: the
    whole share of every node holding one of ``ranks``
    (:func:`ucstage.sharding.node_share`), whatever ``epoch``.
    """
    n = len(entries)
    node_count(world_size, nproc_per_node)  # refuses a world size that is not a multiple
    per_node = nproc_per_node if nproc_per_node is not None else world_size
    wanted: set[int] = set()
    if shuffle and shuffle_scope == "node":
        for node in sorted({rank // per_node for rank in ranks}):
            wanted.update(node_share(n, node=node, world_size=world_size,
                                     nproc_per_node=nproc_per_node, seed=seed).tolist())
        return [entries[i] for i in sorted(wanted)]
    for rank in ranks:
        order = node_order(n, node=rank // per_node, world_size=world_size,
                           nproc_per_node=nproc_per_node, shuffle=shuffle, seed=seed,
                           epoch=epoch, shuffle_scope=shuffle_scope)
        for worker in range(effective_workers(num_workers)):
            wanted.update(slot_files(n, rank=rank, world_size=world_size,
                                     num_workers=num_workers, worker=worker, shuffle=shuffle,
                                     seed=seed, epoch=epoch, order=order,
                                     shuffle_scope=shuffle_scope,
                                     nproc_per_node=nproc_per_node))
    return [entries[i] for i in sorted(wanted)]
