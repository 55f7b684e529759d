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

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidArgument

__all__ = [
    "EQUAL_LENGTH_MODES",
    "RankStats",
    "ShardPlan",
    "SlotPlan",
    "effective_workers",
    "equal_slot_files",
    "node_ranks",
    "plan",
    "read_order",
    "slot_count",
    "slot_files",
    "slot_indices",
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
    return sum(effective_workers(k) for k in workers_per_rank(num_workers, world_size))


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
    if order is None:
        order = read_order(n, shuffle=shuffle, seed=seed, epoch=epoch)
    positions = slot_indices(n, rank=rank, world_size=world_size,
                             num_workers=num_workers, worker=worker)
    if isinstance(order, range):
        return list(positions)
    return [order[i] for i in positions]


def workers_per_rank(num_workers: int | Sequence[int], world_size: int) -> list[int]:
    """``num_workers`` for every rank: one int for all, or exactly one per rank.

    The library takes ints only; the CLI parses comma lists (``-k 6,4``).
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
        return values * world_size
    if len(values) != world_size:
        raise InvalidArgument(
            f"num_workers lists {len(values)} values but world_size is {world_size}",
            hint="give one value for all ranks, or exactly one per rank",
        )
    return values


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


@dataclass
class ShardPlan:
    """A whole plan: every slot of every rank, and what is wrong with it."""

    n_files: int
    total_bytes: int
    world_size: int
    num_workers: list[int]
    shuffle: bool
    seed: int
    epoch: int
    batch_size: int | None
    slots: list[SlotPlan]
    ranks: list[RankStats]
    duplicated: list[int] = field(default_factory=list)
    """Listing indices read by two or more slots."""
    skipped: list[int] = field(default_factory=list)
    """Listing indices no slot reads."""
    read_count: bytearray = field(default_factory=bytearray, repr=False)
    """How many slots read each file (capped at 255)."""

    @property
    def consistent(self) -> bool:
        return not self.duplicated and not self.skipped

    @property
    def batches_equal(self) -> bool:
        counts = {r.batches for r in self.ranks}
        return len(counts) <= 1

    @property
    def ok(self) -> bool:
        return self.consistent and self.batches_equal

    def files_per_slot(self) -> Spread:
        return _spread([len(s.files) for s in self.slots])

    def bytes_per_slot(self) -> Spread:
        return _spread([s.bytes for s in self.slots])

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
        return {
            "source": source,
            "fingerprint": fingerprint,
            "files": self.n_files,
            "bytes": self.total_bytes,
            "world_size": self.world_size,
            "num_workers": self.num_workers,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "epoch": self.epoch,
            "batch_size": self.batch_size,
            "consistent": self.consistent,
            "batches_equal": self.batches_equal,
            "summary": {
                "slots": len(self.slots),
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

    def readers(self, index: int) -> list[tuple[int, int]]:
        """The (rank, worker) slots that read listing index ``index``."""
        return [(s.rank, s.worker) for s in self.slots if index in s.files]


def _spread(values: list[int]) -> Spread:
    if not values:
        return Spread(0, 0, 0)
    return Spread(min(values), sum(values) / len(values), max(values))


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
    workers = workers_per_rank(num_workers, world_size)
    if batch_size is not None and batch_size < 1:
        raise InvalidArgument(f"batch_size must be at least 1, got {batch_size}")
    n = len(sizes)
    order = read_order(n, shuffle=shuffle, seed=seed, epoch=epoch)
    counts = bytearray(n)
    slots: list[SlotPlan] = []
    ranks: list[RankStats] = []
    for rank, k in enumerate(workers):
        rank_files = rank_bytes = 0
        batches = 0
        for worker in range(effective_workers(k)):
            files = slot_files(n, rank=rank, world_size=world_size, num_workers=k,
                               worker=worker, order=order)
            nbytes = 0
            for i in files:
                nbytes += sizes[i]
                if counts[i] < 255:
                    counts[i] += 1
            slots.append(SlotPlan(rank, worker, files, nbytes))
            rank_files += len(files)
            rank_bytes += nbytes
            if batch_size:
                batches += math.ceil(len(files) / batch_size)
        ranks.append(RankStats(rank, k, rank_files, rank_bytes, batches if batch_size else None))
    duplicated = [i for i in range(n) if counts[i] > 1]
    skipped = [i for i in range(n) if counts[i] == 0]
    return ShardPlan(
        n_files=n,
        total_bytes=sum(sizes),
        world_size=world_size,
        num_workers=workers,
        shuffle=shuffle,
        seed=seed,
        epoch=epoch,
        batch_size=batch_size,
        slots=slots,
        ranks=ranks,
        duplicated=duplicated,
        skipped=skipped,
        read_count=counts,
    )


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
