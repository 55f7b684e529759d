"""The slot rule, shard plans, their statistics and mismatch diagnosis.

This module is the only place the slot rule lives. ``ucstage shard-plan``,
``ucstage cache warm --rank`` and :class:`ucstage.VolumeDataset` all call
:func:`slot_files`, so what the plan prints is what training reads.

The rule (the platform's documented one): files in listing order, or in a
permutation seeded by ``seed`` and ``epoch`` that is the same on every rank;
``slots = world_size * num_workers``; slot ``s = rank * num_workers + worker``
reads files ``s, s + slots, s + 2 * slots, ...``. ``num_workers = 0`` (the main
process reads) counts as one worker.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidArgument

__all__ = [
    "EQUAL_LENGTH_MODES",
    "EmptySlots",
    "RankStats",
    "ShardPlan",
    "SlotPlan",
    "effective_workers",
    "equal_slot_files",
    "node_ranks",
    "plan",
    "rank_length",
    "read_order",
    "slot_count",
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


def read_order(n: int, *, shuffle: bool = False, seed: int = 0, epoch: int = 0) -> Sequence[int]:
    """File indices in read order: listing order, or a permutation of it.

    The permutation depends only on ``(n, seed, epoch)``; Python's ``random``
    with a string seed is stable across platforms and versions, so every rank
    on every node computes the same order.
    """
    if not shuffle:
        return range(n)
    order = list(range(n))
    random.Random(f"ucstage:{seed}:{epoch}").shuffle(order)
    return order


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


def _take(order: Sequence[int], start: int, n: int, step: int) -> list[int]:
    """``order[start], order[start + step], ...`` below ``n``: one slot's files.

    Slicing keeps this in C for the two orders :func:`read_order` returns.
    """
    if isinstance(order, range):
        return list(range(start, n, step))
    if isinstance(order, list) and len(order) == n:
        return order[start::step]
    return [order[i] for i in range(start, n, step)]


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
) -> list[int]:
    """File indices (into the listing) that slot (rank, worker) reads, in read order.

    Pass ``order`` (from :func:`read_order`) to avoid recomputing a permutation
    for every slot.
    """
    positions = slot_indices(n, rank=rank, world_size=world_size,
                             num_workers=num_workers, worker=worker)
    if order is None:
        order = read_order(n, shuffle=shuffle, seed=seed, epoch=epoch)
    return _take(order, positions.start, n, positions.step)


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


@dataclass(frozen=True)
class SlotPlan:
    """What one (rank, worker) slot reads."""

    rank: int
    worker: int
    files: list[int]
    """Indices into the listing, in read order."""
    bytes: int

    def to_json(self, paths: Sequence[str]) -> dict[str, Any]:
        """This slot as docs/json.md documents it; ``paths`` is the listing's paths."""
        return {"rank": self.rank, "worker": self.worker,
                "files": [paths[i] for i in self.files], "bytes": self.bytes}


@dataclass(frozen=True)
class RankStats:
    rank: int
    num_workers: int
    files: int
    bytes: int
    batches: int | None


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
        return self._spread([len(s.files) for s in self.slots])

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
            "slots": [s.to_json(paths) for s in self.slots],
            "duplicated": [paths[i] for i in self.duplicated],
            "skipped": [paths[i] for i in self.skipped],
        }
        if self.empty.count:
            doc["empty_slots"] = self.empty.to_json()
        return doc

    def readers(self, index: int) -> list[tuple[int, int]]:
        """The (rank, worker) slots that read listing index ``index``."""
        return [(s.rank, s.worker) for s in self.slots if index in s.files]


def _ranks_to_plan(spec: int | list[int], world_size: int, n: int) -> Iterator[tuple[int, int]]:
    """(rank, num_workers) of every rank that may read a file.

    With one value for all ranks, rank ``r`` reads nothing once ``r * K >= n``,
    so the walk stops there: a plan costs O(files), not O(ranks).
    """
    if isinstance(spec, int):
        last = min(world_size, -(-n // effective_workers(spec)))
        for rank in range(last):
            yield rank, spec
    else:
        yield from enumerate(spec)


def plan(
    sizes: Sequence[int],
    *,
    world_size: int,
    num_workers: int | Sequence[int],
    shuffle: bool = False,
    seed: int = 0,
    epoch: int = 0,
    batch_size: int | None = None,
) -> ShardPlan:
    """Plan which files every slot reads, as each rank would compute it itself.

    Time and memory grow with the number of files, not of slots: slots that
    read nothing (more slots than files) are counted and described by ranges
    in :attr:`ShardPlan.empty`, never listed.

    Args:
        sizes: file sizes in listing order.
        world_size: number of ranks.
        num_workers: one value, or one per rank; rank ``r`` applies the slot rule
            with its own value, exactly as a rank given that value would, so a
            mismatch shows up as duplicated and skipped files.
        shuffle, seed, epoch: the read order (see :func:`read_order`).
        batch_size: when given, per-rank batch counts (a DataLoader over an
            IterableDataset batches per worker: ``sum(ceil(files_w / B))``).
    """
    spec = _workers_spec(num_workers, world_size)
    if batch_size is not None and batch_size < 1:
        raise InvalidArgument(f"batch_size must be at least 1, got {batch_size}")
    sizes = sizes if isinstance(sizes, list) else list(sizes)
    n = len(sizes)
    order = read_order(n, shuffle=shuffle, seed=seed, epoch=epoch)
    # One effective worker count for all ranks partitions the read order, so
    # every file is read exactly once; only disagreeing ranks need counting.
    agree = isinstance(spec, int) or len({effective_workers(k) for k in spec}) == 1
    counts = bytearray(b"\x01") * n if agree else bytearray(n)
    slots: list[SlotPlan] = []
    ranks: list[RankStats] = []
    empty = EmptySlots()
    planned_ranks = 0
    for rank, k in _ranks_to_plan(spec, world_size, n):
        planned_ranks += 1
        workers = effective_workers(k)
        step = world_size * workers
        first = rank * workers
        busy = max(0, min(workers, n - first))  # workers with a file: a prefix
        empty.add(rank, busy, workers)
        if not busy:
            continue
        rank_files = rank_bytes = batches = 0
        for worker in range(busy):
            files = _take(order, first + worker, n, step)
            if isinstance(order, range):
                nbytes = sum(sizes[first + worker::step])
            else:
                nbytes = sum(map(sizes.__getitem__, files))
            if not agree:
                for i in files:
                    if counts[i] < 255:
                        counts[i] += 1
            slots.append(SlotPlan(rank, worker, files, nbytes))
            rank_files += len(files)
            rank_bytes += nbytes
            if batch_size:
                batches += -(-len(files) // batch_size)
        ranks.append(RankStats(rank, k, rank_files, rank_bytes, batches if batch_size else None))
    if isinstance(spec, int):
        # The ranks past the walk read nothing at all: counted, never visited.
        empty.add(planned_ranks, 0, effective_workers(spec), ranks=world_size - planned_ranks)
    return ShardPlan(
        n_files=n,
        total_bytes=sum(sizes),
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
        duplicated=[] if agree else [i for i in range(n) if counts[i] > 1],
        skipped=[] if agree else [i for i in range(n) if counts[i] == 0],
        read_count=counts,
    )


def slot_plan(
    sizes: Sequence[int],
    *,
    rank: int,
    worker: int,
    world_size: int,
    num_workers: int | Sequence[int],
    shuffle: bool = False,
    seed: int = 0,
    epoch: int = 0,
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
    files = slot_files(len(sizes), rank=rank, world_size=world_size, num_workers=k,
                       worker=worker, shuffle=shuffle, seed=seed, epoch=epoch)
    return SlotPlan(rank, worker, files, sum(sizes[i] for i in files))


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
    """
    if mode not in EQUAL_LENGTH_MODES:
        raise InvalidArgument(f"equal_length must be one of {EQUAL_LENGTH_MODES}, got {mode!r}")
    if order is None:
        order = read_order(n, shuffle=shuffle, seed=seed, epoch=epoch)
    files = slot_files(n, rank=rank, world_size=world_size, num_workers=num_workers,
                       worker=worker, order=order)
    if n == 0:
        return files
    slots = slot_count(world_size, num_workers)
    if mode == "drop":
        return files[: n // slots]
    s = rank * effective_workers(num_workers) + worker
    for i in range(len(files), -(-n // slots)):
        files.append(order[(s + i * slots) % n])
    return files


def slot_length(
    n: int,
    *,
    rank: int,
    world_size: int,
    num_workers: int,
    worker: int,
    equal_length: str | None = None,
) -> int:
    """How many files slot (rank, worker) reads: ``len`` of :func:`slot_files`
    (``equal_length=None``) or :func:`equal_slot_files`, without building either."""
    positions = slot_indices(n, rank=rank, world_size=world_size, num_workers=num_workers,
                             worker=worker)
    if equal_length is None:
        return len(positions)
    if equal_length not in EQUAL_LENGTH_MODES:
        raise InvalidArgument(
            f"equal_length must be one of {EQUAL_LENGTH_MODES}, got {equal_length!r}")
    if n == 0:
        return 0
    return n // positions.step if equal_length == "drop" else -(-n // positions.step)


def rank_length(
    n: int,
    *,
    rank: int,
    world_size: int,
    num_workers: int,
    equal_length: str | None = None,
) -> int:
    """How many files rank ``rank`` reads over all its workers (see :func:`slot_length`)."""
    return sum(slot_length(n, rank=rank, world_size=world_size, num_workers=num_workers,
                           worker=w, equal_length=equal_length)
               for w in range(effective_workers(num_workers)))
