"""Shard plans: what every slot reads, with statistics and mismatch diagnosis."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

from ..errors import InvalidArgument
from .order import GroupedOrder, NodeOrder, Permutation
from .rule import Layout, ReadOrder, Slot, node_order, slot_array, stride
from .stats import EmptySlots, NodeStats, RankStats, SlotPlan, Spread


@dataclass
class ShardPlan:
    """A whole plan: the slots that read files, and what is wrong with it.

    Sized by the files, not the slots: ``slots`` and ``ranks`` hold only the
    slots and ranks that read at least one file, and :attr:`empty` describes
    the rest by count and ranges.
    """

    layout: Layout
    """The job planned; its ``num_workers`` as given: one for every rank, or one per rank."""
    order: ReadOrder
    """The epoch's read order (``order.n`` files)."""
    total_bytes: int
    batch_size: int | None
    slots: list[SlotPlan]
    """Slots that read at least one file, by rank then worker."""
    ranks: list[RankStats]
    """Ranks that read at least one file, in rank order."""
    empty: EmptySlots = field(default_factory=EmptySlots)
    duplicated: list[int] = field(default_factory=list)
    """Listing indices read by two or more slots."""
    skipped: list[int] = field(default_factory=list)
    """Listing indices no slot reads."""
    read_count: bytearray = field(default_factory=bytearray, repr=False)
    """How many slots read each file (capped at 255)."""
    nodes: list[NodeStats] = field(default_factory=list)
    """Nodes that read at least one file, in node order."""

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

    def coverage_problems(self, units: str = "files", none: str = "nothing") -> list[str]:
        """What this plan reads twice, never, or in no slot, in words, for
        units named ``units`` (plural); a slot that reads none "read ``none``"."""
        out = []
        if not self.consistent:
            out.append(f"{len(self.duplicated):,} {units} read twice or more, "
                       f"{len(self.skipped):,} never read")
        if self.empty.count:
            total = self.layout.slots
            out.append(f"{self.empty.count:,} of {total:,} slot{'s' * (total != 1)} read {none}")
        return out

    @property
    def problems(self) -> list[str]:
        """What is wrong with the plan, in words (empty when it is :attr:`ok`)."""
        out = self.coverage_problems()
        if not self.batches_equal:
            out.append("ranks would get different batch counts")
        return out

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
        total = self.layout.slots or len(values)
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
            "files": self.order.n,
            "bytes": self.total_bytes,
            "world_size": self.layout.world_size,
            "num_workers": [r.num_workers for r in self.ranks],
            "shuffle": self.order.shuffle,
            "shuffle_scope": self.order.shuffle_scope,
            "nproc_per_node": self.layout.nproc_per_node,
            "node_count": self.layout.nodes,
            "seed": self.order.seed,
            "epoch": self.order.epoch,
            "batch_size": self.batch_size,
            "consistent": self.consistent,
            "batches_equal": self.batches_equal,
            "summary": {
                "slots": self.layout.slots,
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


def _ranks_to_plan(layout: Layout, first: int, count: int, n: int) -> Iterator[tuple[int, int]]:
    """(rank, num_workers) of every rank of ranks ``first .. first + count - 1``
    that may read a file of an order of ``n``.

    With one value for all ranks, the group's ``i``-th rank reads nothing once
    ``i * K >= n``, so the walk stops there: a plan costs O(files), not O(ranks).
    """
    spec = layout.num_workers
    if isinstance(spec, int):
        last = min(count, -(-n // layout.workers))
        for i in range(last):
            yield first + i, spec
    else:
        for rank in range(first, first + count):
            yield rank, spec[rank]


def shard_plan(sizes: Sequence[int] | np.ndarray, layout: Layout, order: ReadOrder, *,
               batch_size: int | None = None) -> ShardPlan:
    """Plan which files every slot of ``layout`` reads in ``order`` (``order.n``
    is ``len(sizes)``; its ``equal_length`` is not applied), as each rank
    would compute it itself.

    Time and memory grow with the number of files, not of slots: slots that
    read nothing (more slots than files) are counted and described by ranges
    in :attr:`ShardPlan.empty`, never listed.

    Args:
        sizes: file sizes in listing order (a numpy array costs no Python
            object per file; :meth:`ucstage.Manifest.sizes` gives one).
        layout: the job; with one ``num_workers`` per rank, rank ``r`` applies
            the slot rule with its own value, exactly as a rank given that value
            would, so a mismatch shows up as duplicated and skipped files.
        order: the epoch's read order (shuffle, seed, epoch and scope).
        batch_size: when given, per-rank batch counts (a DataLoader over an
            IterableDataset batches per worker: ``sum(ceil(files_w / B))``).
    """
    import numpy as np

    if batch_size is not None and batch_size < 1:
        raise InvalidArgument(f"batch_size must be at least 1, got {batch_size}")
    spec = layout.num_workers
    world_size, nodes = layout.world_size, layout.nodes
    scoped = order.per_node(layout)
    size_arr = np.asarray(sizes, dtype=np.int64)
    n = len(size_arr)
    if order.n != n:
        raise InvalidArgument(f"the read order has {order.n} files but sizes has {n}")
    # Groups of ranks that deal one read order: each node under the node
    # scope, else the whole job. (first rank, ranks, node of a group's order)
    per_node = layout.ranks_per_node
    groups: Iterator[tuple[int, int, int]]
    if scoped:
        # Nodes with files are a prefix (node_block); the rest are counted at the end.
        groups = ((j * per_node, per_node, j) for j in range(min(nodes, n)))
    else:
        groups = iter([(0, world_size, 0)])
    # One effective worker count for all ranks partitions each group's order,
    # so every file is read exactly once; only disagreeing ranks need counting.
    agree = layout.readers_agree
    counts = None if agree else np.zeros(n, dtype=np.int32)
    slots: list[SlotPlan] = []
    ranks: list[RankStats] = []
    empty = EmptySlots()
    planned_ranks = 0
    for first_rank, group_ranks, node in groups:
        deals_from = node_order(order, layout, node)
        # The group's read order as one int64 array: each slot's files are a strided view.
        order_arr = (deals_from.array() if isinstance(deals_from, (Permutation, NodeOrder, GroupedOrder))
                     else np.arange(n, dtype=np.int64))
        m = len(order_arr)
        in_order = size_arr[order_arr] if order.shuffle else size_arr
        slot_bytes = None
        if agree:
            step = stride(layout, Slot(first_rank), per_node=scoped).step
            if step <= m:  # bytes of every slot at once: the read order as rows of `step` slots
                padded = np.zeros(-(-m // step) * step, dtype=np.int64)
                padded[:m] = in_order
                slot_bytes = padded.reshape(-1, step).sum(axis=0)
            else:
                slot_bytes = in_order
        walked = 0
        for rank, k in _ranks_to_plan(layout, first_rank, group_ranks, m):
            walked += 1
            workers = layout.readers_of(rank)
            at = stride(layout, Slot(rank), per_node=scoped)
            busy = max(0, min(workers, m - at.start))  # workers with a file: a prefix
            empty.add(rank, busy, workers)
            if not busy:
                continue
            rank_files = rank_bytes = batches = 0
            for worker in range(busy):
                first = at.start + worker  # the rule's start of slot (rank, worker)
                files = order_arr[first::at.step]
                if slot_bytes is not None:
                    nbytes = int(slot_bytes[first])
                else:
                    nbytes = int(in_order[first::at.step].sum())
                if counts is not None:
                    counts[files] += 1
                slots.append(SlotPlan(rank, worker, files, nbytes, layout.node_of(rank)))
                rank_files += len(files)
                rank_bytes += nbytes
                if batch_size:
                    batches += -(-len(files) // batch_size)
            ranks.append(RankStats(rank, k, rank_files, rank_bytes,
                                   batches if batch_size else None))
        if isinstance(spec, int):
            # The group's ranks past the walk read nothing at all: counted, never visited.
            empty.add(first_rank + walked, 0, layout.workers,
                      ranks=group_ranks - walked)
        planned_ranks = first_rank + group_ranks
    if planned_ranks < world_size:  # whole nodes without a file (more nodes than files)
        if isinstance(spec, int):
            empty.add(planned_ranks, 0, layout.workers,
                      ranks=world_size - planned_ranks)
        else:
            for rank in range(planned_ranks, world_size):
                empty.add(rank, 0, layout.readers_of(rank))
    read_count = (bytearray(b"\x01") * n if counts is None
                  else bytearray(np.minimum(counts, 255).astype(np.uint8).tobytes()))
    return ShardPlan(
        layout=layout,
        order=order,
        total_bytes=int(size_arr.sum()),
        batch_size=batch_size,
        slots=slots,
        ranks=ranks,
        empty=empty,
        duplicated=[] if counts is None else np.flatnonzero(counts > 1).tolist(),
        skipped=[] if counts is None else np.flatnonzero(counts == 0).tolist(),
        read_count=read_count,
        nodes=_node_stats(ranks, layout),
    )


def _node_stats(ranks: list[RankStats], layout: Layout) -> list[NodeStats]:
    """Per-node sums of the ranks that read files (in rank order, so nodes come in order)."""
    out: list[NodeStats] = []
    for r in ranks:
        node = layout.node_of(r.rank)
        if out and out[-1].node == node:
            last = out[-1]
            out[-1] = NodeStats(node, last.first_rank, last.last_rank, last.files + r.files,
                                last.bytes + r.bytes)
        else:
            on_node = layout.node_ranks(node)
            out.append(NodeStats(node, on_node[0], on_node[-1], r.files, r.bytes))
    return out


def slot_plan(sizes: Sequence[int] | np.ndarray, layout: Layout, order: ReadOrder,
              slot: Slot) -> SlotPlan:
    """What one slot reads, without planning the others (``shard-plan --slot``).

    Raises:
        InvalidArgument: no such slot (the message says which ranks and
            workers there are).
    """
    rank, worker = slot.rank, slot.worker
    if not 0 <= rank < layout.world_size:
        raise InvalidArgument(f"no slot {rank}:{worker}: ranks are 0..{layout.world_size - 1}")
    k = layout.workers_of(rank)
    if not 0 <= worker < layout.readers_of(rank):
        raise InvalidArgument(
            f"no slot {rank}:{worker}: rank {rank} has workers 0..{layout.readers_of(rank) - 1} "
            f"(num_workers {k}; 0 means the main process reads, as worker 0)")
    files = slot_array(order, layout, slot)
    if hasattr(sizes, "take"):  # a numpy array: no Python object per file
        nbytes = int(sizes.take(files).sum())
    else:
        nbytes = sum(sizes[int(i)] for i in files)
    return SlotPlan(rank, worker, files, nbytes, layout.node_of(rank))
