"""Checkpoint and resume of a :class:`~ucstage.data.table.TableDataset` slot,
exact at row granularity.

The loader's machinery (:mod:`ucstage.data.state`) counts, per slot, the
items of its run delivered whole: here the leading row groups of the slot's
run whose every row was delivered. What a batch leaves half done travels in
the batch's tag as ``partial`` (row group -> rows delivered, a prefix of the
order :mod:`ucstage.tables.rowplan` reads its rows in), and lands in the state's
``partial``; a resume skips exactly those rows, on the same layout (the
slot continues, its window replayed) or another one (the row group goes,
with its skip, to whichever slot the re-split deals it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import ResumeMismatch
from ..resume import LoaderState
from ..sharding import Segment, segment_runs
from . import state as _state

if TYPE_CHECKING:
    from .protocol import Sharded

__all__ = ["TableTracker", "slot_runs"]


class TableTracker(_state.SlotTracker):
    """A slot's delivery, by row group and row (see the module docstring)."""

    run: Any
    """The slot's row groups in this segment, in order (int64)."""
    skip: dict[int, int]
    """Rows already delivered of row groups begun before this iteration."""
    segment: int
    """The segment's number in the epoch (seeds the windows with the slot)."""

    def __init__(self, dataset: Sharded, indices: Any, *, rank: int, world_size: int,
                 num_workers: int, worker: int, start: int, done: list[Segment],
                 pending: LoaderState | None = None) -> None:
        import numpy as np

        super().__init__(dataset, indices, rank=rank, world_size=world_size,
                         num_workers=num_workers, worker=worker, start=start, done=done,
                         pending=pending)
        self.run = np.asarray(indices, dtype=np.int64)
        self.skip = dict(pending.partial) if pending is not None else {}
        self.segment = len(done)
        self._pos = start
        self._started = start
        self._complete = np.zeros(len(self.run), dtype=bool)
        self._complete[:start] = True
        self._finished: list[int] = []
        self._partial: dict[int, int] = {}
        self._frozen = False

    @staticmethod
    def check_loaded(dataset: Sharded, loaded: LoaderState) -> None:
        """A state's partial row groups must be row groups of this table, each
        with no more rows than it has."""
        loaded.check_partial(dataset.freeze().rows_per_group)  # type: ignore[attr-defined]

    @staticmethod
    def resumed(pending: LoaderState, chain: list[Segment], rest: list[Any], slot: int
                ) -> tuple[Any, int]:
        """On the same layout the slot's whole run, its leading row groups
        delivered whole skipped (a window begun there is replayed); else its
        share of the re-split remainder."""
        if len(chain) == len(pending.segments):  # the same layout: continue the slot
            return segment_runs(pending.order, chain)[-1][slot].files, \
                chain[-1].delivered[slot] or 0
        return rest[slot], 0

    @property
    def position(self) -> int:
        """Leading row groups of the run delivered whole."""
        return self._pos

    def freeze(self) -> None:
        """From now on batches are padding (``equal_length="pad"``): not counted."""
        self._frozen = True

    def delivered(self, first: int, counts: Any, sizes: Any, *, before: bool = False) -> None:
        """After a batch: ``counts[i]`` rows delivered of the window's group at
        run position ``first + i``, of its ``sizes[i]``. ``before``: the
        window's start, where the counts are what a resumed state delivered
        (a group complete then was counted before the restart: the audit's
        prior, never again)."""
        if self._frozen:
            return
        partial = {}
        for i, (c, n) in enumerate(zip(counts.tolist(), sizes.tolist(), strict=True)):
            p = first + i
            if p < self._started or self._complete[p]:
                continue
            g = int(self.run[p])
            if c >= n:
                self._complete[p] = True
                # a row group with no live rows (its deletion vector deletes them
                # all) is delivered when reached, unless the resumed state holds it
                if not before or (n == 0 and g not in self.skip):
                    self._finished.append(g)
            elif c:
                partial[g] = c
        while self._pos < len(self.run) and self._complete[self._pos]:
            self._pos += 1
        # Row groups past the leading run that are done stay partial (with all their rows).
        for i, (c, n) in enumerate(zip(counts.tolist(), sizes.tolist(), strict=True)):
            p = first + i
            if p >= self._pos and c >= n and p >= self._started:
                partial[int(self.run[p])] = c
        self._partial = partial

    def take(self) -> tuple[int, int, Any, dict[int, int]]:  # type: ignore[override]
        """(slot, position, row groups finished since the last take, rows of those begun)."""
        finished, self._finished = self._finished, []
        return self.slot, self._pos, finished, dict(self._partial)

    def partial_rows(self) -> dict[int, int]:
        """Rows delivered of the row groups begun: those a resumed state held
        (unless since delivered whole) and those this iteration began."""
        lead = set(self.run[:self._pos].tolist())  # delivered whole: no skip needed
        partial = {g: n for g, n in self.skip.items() if g not in lead}
        partial.update(self._partial)
        return partial


def slot_runs(dataset: Sharded, layout: Any, pending: LoaderState | None
              ) -> list[tuple[Any, int]]:
    """(run, start) of every slot of ``layout`` in this iteration: the epoch's
    slot rule, or what a resumed state leaves each slot (it must say what
    every slot delivered: a merged state)."""
    from ..sharding import slot_array

    order = dataset.read_order()
    if pending is None:
        return [(slot_array(order, layout, layout.slot_at(s)), 0) for s in range(layout.slots)]
    chain, rest = _state.resume_plan(dataset, pending, layout.world_size, layout.num_workers)
    if any(r is None for r in rest):
        raise ResumeMismatch("equal_length on a resumed epoch needs every slot's count",
                             hint="load the state merged over every rank (ucstage.merge_states)")
    if len(chain) == len(pending.segments):
        runs = segment_runs(pending.order, chain)[-1]
        return [(runs[s].files, chain[-1].delivered[s] or 0) for s in range(layout.slots)]
    return [(r, 0) for r in rest]
