"""A shard plan with the row group as its unit: rows, row groups and bytes per
slot, rows and batches per rank (``ucstage shard-plan --unit row-group``).

The slots' row groups are :func:`ucstage.sharding.shard_plan`'s, over the
row groups' bytes (of the chosen columns), so the slot rule, the shuffle and
its scope are the ones :class:`~ucstage.TableDataset` and ``VolumeDataset``
apply; the batch counts are :func:`ucstage.tables.rowplan.equal_batches`'s, the
dataset's ``equal_length``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgument
from ..manifest.rowgroups import RowGroupManifest
from ..sharding import Layout, ReadOrder, ShardPlan, shard_plan
from .rowplan import EQUAL_MODES, equal_batches

__all__ = ["RankRows", "RowGroupPlan", "plan_row_groups"]


@dataclass(frozen=True)
class RankRows:
    """What one rank reads: its slots' row groups, rows, bytes and batches."""

    rank: int
    num_workers: int
    row_groups: int
    rows: int
    bytes: int
    batches: int


@dataclass(frozen=True)
class RowGroupPlan:
    """Which row groups every slot reads, and the rows and batches that makes.

    ``plan``'s units are row groups (``plan.slots[i].indices``, ``.bytes``
    their chunks' bytes); ``slot_rows[i]`` and ``slot_batches[i]`` go with
    ``plan.slots[i]``. Slots without a row group (``plan.empty``) deliver
    nothing.
    """

    manifest: RowGroupManifest
    columns: list[str]
    plan: ShardPlan
    slot_rows: list[int]
    slot_batches: list[int]
    batch_rows: int | None
    equal_length: str | None
    equal: int | None
    """Batches every slot yields with ``equal_length``; None without."""
    ranks: list[RankRows]

    @property
    def batch_counts(self) -> list[int]:
        """The distinct numbers of batches ranks yield, sorted; the ranks that
        read no row group (not in ``ranks``) count too."""
        counts = {r.batches for r in self.ranks}
        if self.plan.empty.ranks:
            counts.add(0 if self.equal is None else self.equal)
        return sorted(counts)

    @property
    def batches_equal(self) -> bool:
        """Every rank yields the same number of batches (DDP needs it)."""
        return len(self.batch_counts) <= 1

    @property
    def problems(self) -> list[str]:
        """What is wrong with the plan, in words (empty when all is well)."""
        out = self.plan.coverage_problems("row groups", "no row group")
        if not self.batches_equal:
            out.append("ranks would get different batch counts")
        elif self.empty_epoch:
            out.append("every rank yields 0 batches: the epoch is empty")
        return out

    @property
    def empty_epoch(self) -> bool:
        """Rows to read, yet no rank yields a batch (``equal_length="drop"``
        with batches larger than any slot's rows)."""
        return bool(sum(self.slot_rows)) and all(r.batches == 0 for r in self.ranks) \
            and (self.equal or 0) == 0

    def spread(self, values: Sequence[int]) -> dict[str, float]:
        """min / mean / max over every slot of the job, the empty ones as zeros."""
        if not values:
            return {"min": 0, "mean": 0.0, "max": 0}
        low = 0 if self.plan.empty.count else min(values)
        return {"min": low, "mean": sum(values) / self.plan.layout.slots, "max": max(values)}

    def to_json(self) -> dict[str, Any]:
        """The plan as docs/json.md#shard-plan---unit-row-group documents it."""
        m, p = self.manifest, self.plan
        layout, order = p.layout, p.order
        return {
            "unit": "row-group",
            "source": m.source,
            "kind": m.kind,
            "table_version": m.table_version,
            "fingerprint": m.fingerprint,
            "columns": self.columns,
            "files": len(m.files),
            "row_groups": m.row_groups,
            "rows": m.rows,
            "bytes": p.total_bytes,
            "filter": None if not m.filter else {
                "text": m.filter["text"], "columns": m.filter["columns"],
                "pruned": m.filter.get("pruned")},
            "world_size": layout.world_size,
            "num_workers": [r.num_workers for r in self.ranks],
            "shuffle": order.shuffle, "shuffle_scope": order.shuffle_scope,
            "nproc_per_node": layout.nproc_per_node, "node_count": layout.nodes,
            "seed": order.seed, "epoch": order.epoch,
            "batch_rows": self.batch_rows,
            "equal_length": self.equal_length,
            "batches_per_slot": self.equal,
            "consistent": p.consistent,
            "batches_equal": self.batches_equal,
            "summary": {
                "slots": layout.slots,
                "row_groups_per_slot": self.spread([s.count for s in p.slots]),
                "rows_per_slot": self.spread(self.slot_rows),
                "bytes_per_slot": self.spread([s.bytes for s in p.slots]),
            },
            "ranks": [{"rank": r.rank, "num_workers": r.num_workers,
                       "row_groups": r.row_groups, "rows": r.rows, "bytes": r.bytes,
                       "batches": r.batches} for r in self.ranks],
            "slots": [{"rank": s.rank, "worker": s.worker, "node": s.node,
                       "row_groups": s.files, "rows": rows, "bytes": s.bytes,
                       "batches": batches}
                      for s, rows, batches in zip(p.slots, self.slot_rows, self.slot_batches,
                                                  strict=True)],
            "empty_slots": p.empty.to_json() if p.empty.count else None,
        }


def plan_row_groups(manifest: RowGroupManifest, layout: Layout, order: ReadOrder, *,
                    columns: Sequence[str] | None = None, batch_rows: int | None = None,
                    equal_length: str | None = None) -> RowGroupPlan:
    """Plan which row groups of ``manifest`` every slot of ``layout`` reads in
    ``order`` (``order.n`` row groups; its ``equal_length`` is not used).

    Without ``batch_rows`` a batch is one row group, as the dataset yields
    them. With it a slot yields ``ceil(rows / batch_rows)`` batches, or with
    ``equal_length`` (``"pad"`` or ``"drop"``) the count every slot yields.

    Raises:
        InvalidArgument: ``batch_rows`` below 1, an unknown ``equal_length``,
            ``equal_length`` without ``batch_rows``, ``"pad"`` with a slot
            that has no rows, or ``order.n`` not the row-group count.
        UnknownColumn: a column the table does not have.
    """
    import numpy as np

    if batch_rows is not None and batch_rows < 1:
        raise InvalidArgument(f"batch_rows must be at least 1, got {batch_rows}")
    if equal_length is not None and equal_length not in EQUAL_MODES:
        raise InvalidArgument(f"equal_length must be one of {', '.join(EQUAL_MODES)}, "
                              f"got {equal_length!r}")
    if order.n != manifest.row_groups:
        raise InvalidArgument(f"the read order has {order.n} row groups but the table "
                              f"has {manifest.row_groups}")
    chosen = manifest.check_columns(columns)
    planned = shard_plan(manifest.group_bytes(columns), layout, order)
    rows = np.asarray(manifest.rows_per_group, dtype=np.int64)
    slot_rows = [int(rows[s.indices].sum()) for s in planned.slots]
    equal = equal_batches([*slot_rows, *[0] * planned.empty.count], batch_rows, equal_length)
    if equal is not None:
        slot_batches = [equal] * len(slot_rows)
    elif batch_rows:
        slot_batches = [-(-n // batch_rows) for n in slot_rows]
    else:  # one batch per row group that has rows, as the dataset yields them
        slot_batches = [int((rows[s.indices] > 0).sum()) for s in planned.slots]
    ranks: list[RankRows] = []
    for s, n, b in zip(planned.slots, slot_rows, slot_batches, strict=True):
        if ranks and ranks[-1].rank == s.rank:
            r = ranks[-1]
            ranks[-1] = RankRows(r.rank, r.num_workers, r.row_groups + s.count, r.rows + n,
                                 r.bytes + s.bytes, r.batches + b)
        else:
            ranks.append(RankRows(s.rank, layout.workers_of(s.rank), s.count, n, s.bytes, b))
    if equal:
        # A rank's empty slots (its last workers) still yield their equal count.
        ranks = [RankRows(r.rank, r.num_workers, r.row_groups, r.rows, r.bytes,
                          equal * layout.readers_of(r.rank)) for r in ranks]
    return RowGroupPlan(manifest, chosen, planned, slot_rows, slot_batches, batch_rows,
                        equal_length, equal, ranks)
