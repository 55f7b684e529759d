"""What the loader counts of a dataset whose items hold units of their own:
a table's row groups hold rows (:class:`~ucstage.data.table.TableDataset`),
a shard's blocks hold samples (:class:`~ucstage.data.shardset.ShardDataset`).

Items are dealt whole by the slot rule; what a slot yields is counted in
units (``batch_rows`` of them per batch), through one arithmetic
(:func:`~ucstage.data.tablebatches.slot_totals`,
:func:`~ucstage.tables.rowplan.equal_batches`): ``len()``, the
equal-length count and what the audit expects of a resumed or dropped epoch.
The frozen listing answers ``rows_per_group`` (units per item).

The exactly-once audit counts items, or with :attr:`UnitCounts.audit_by_unit`
units: a ``ShardDataset``'s epoch is its samples (a block delivered counts its
samples), a ``TableDataset``'s its row groups.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..tables.rowplan import equal_batches
from .tablebatches import slot_totals, whole_groups

__all__ = ["UnitCounts"]


class UnitCounts:
    """The counts of a dataset of items holding units (see the module docstring)."""

    batch_rows: int | None
    equal_length: str | None
    audit_by_unit = False
    """The audit counts units (each item weighs its units), not items."""
    num_workers: int

    if TYPE_CHECKING:  # the sharded dataset's (never defined here: they would shadow it)
        def world(self) -> Any: ...

        def layout(self, world_size: int, num_workers: int) -> Any: ...

        def freeze(self, *, broadcast: bool | None = None) -> Any: ...

    def unit_length(self) -> int:
        """Batches this process yields per epoch: a worker's slot, or the
        rank's slots in the main process (for :attr:`num_workers` workers)."""
        here = self.world()
        rank, worker, in_worker = here.rank, here.worker, here.in_worker
        layout = self.layout(here.world_size, here.num_workers if in_worker else self.num_workers)
        totals, counts = slot_totals(self, layout)
        fixed = equal_batches(totals, self.batch_rows, self.equal_length)
        slots = [layout.slot_index(layout.slot(rank, worker))] if in_worker else \
            [layout.slot_index(layout.slot(rank, w)) for w in range(layout.readers_of(rank))]
        return sum(fixed if fixed is not None else counts[s] for s in slots)

    def audit_weights(self) -> Any:
        """Per item, what the audit counts it as: its units with
        :attr:`audit_by_unit` (int64), else None (one each)."""
        import numpy as np

        if not self.audit_by_unit:
            return None
        return np.asarray(self.freeze().rows_per_group, dtype=np.int64)

    def audit_prior(self, state: Any) -> Any:
        """Items ``state`` holds as delivered whole in its ``partial`` (past
        their slot's leading count): delivered before the restart."""
        import numpy as np

        rows = self.freeze().rows_per_group
        return np.array([g for g, n in state.partial if n >= int(rows[g])], dtype=np.int64)

    def audit_planned(self, progress: Any) -> int | None:
        """Items the rank's slots deliver whole this epoch under
        ``equal_length="drop"`` (the rest are the audit's expected gaps), in
        the audit's measure (:meth:`audit_weights`); None otherwise. Called by
        the audit at the start of an epoch."""
        if self.equal_length != "drop":
            return None
        layout = progress.layout
        totals, _ = slot_totals(self, layout)
        count = equal_batches(totals, self.batch_rows, "drop") or 0
        weights = self.audit_weights()
        whole = [whole_groups(self, layout, s, count * (self.batch_rows or 0))
                 for s in progress.own]
        return sum(len(w) if weights is None else int(weights[w].sum()) for w in whole)
