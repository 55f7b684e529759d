"""Network forecast of a multi-epoch job, per epoch and node."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

from ..errors import InvalidArgument
from .plan import shard_plan
from .rule import Layout, ReadOrder


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

    def over(self, max_bytes: int | None) -> list[int]:
        """Nodes whose share (every file they read over the forecast) exceeds
        ``max_bytes``: they evict and fetch again every epoch. None: not checked."""
        if max_bytes is None:
            return []
        return [node for node, nbytes in enumerate(self.share_bytes) if nbytes > max_bytes]

    def fits(self, max_bytes: int | None) -> bool:
        """Every node's share fits under ``max_bytes`` (True when it is None)."""
        return not self.over(max_bytes)

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


def forecast(sizes: Sequence[int] | np.ndarray, layout: Layout, order: ReadOrder, *,
             epochs: int) -> Forecast:
    """For each of ``epochs`` epochs from ``order.epoch`` on, and each node, the
    files and bytes the node reads that it read in no earlier epoch: what
    crosses the network when every node caches.

    Computed from :func:`shard_plan` of each epoch (the one rule), so it counts
    what the job would read, mismatched ``num_workers`` included. Holds one
    byte per file per node while it runs.
    """
    import numpy as np

    if epochs < 1:
        raise InvalidArgument(f"epochs must be at least 1, got {epochs}")
    size_arr = np.asarray(sizes, dtype=np.int64)
    n = len(size_arr)
    nodes = layout.nodes
    seen = [np.zeros(n, dtype=bool) for _ in range(nodes)]
    rows: list[ForecastRow] = []
    epoch_list = list(range(order.epoch, order.epoch + epochs))
    for epoch in epoch_list:
        p = shard_plan(size_arr, layout, replace(order, n=n, epoch=epoch, equal_length=None))
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
    return Forecast(order.shuffle_scope, nodes, epoch_list, rows,
                    [int(s.sum()) for s in seen], [int(size_arr[s].sum()) for s in seen])
