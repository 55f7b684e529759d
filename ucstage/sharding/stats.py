"""What a shard plan counts: one slot's files, per-rank and per-node sums,
spreads, and the slots that read nothing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

__all__ = ["MAX_RANGES", "EmptySlots", "NodeStats", "RankStats", "SlotPlan", "Spread"]


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
