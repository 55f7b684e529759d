"""Resuming an interrupted epoch: what is left, re-split over new slots.

Kept apart from the rule on purpose: it only *calls* the slot rule (through
:func:`_epoch_slot`, :func:`epoch_slot_length` and :func:`~.rule.stride`), so a
change to the rule reaches resumes without an edit here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

from ..errors import InvalidArgument
from .rule import Layout, ReadOrder, Slot, equal_count, slot_array, slot_length, stride

__all__ = ["EpochOrder", "Segment", "SlotRun", "epoch_slot_length", "resume_nodes",
           "resume_slots", "same_layout", "segment_runs"]


@dataclass(frozen=True)
class EpochOrder(ReadOrder):
    """A :class:`ReadOrder` as a resume state reads it: without a scope it is
    ``"global"``, because states saved before the node scope were global."""

    shuffle_scope: str = "global"


@dataclass(frozen=True)
class Segment:
    """A stretch of one epoch run with one layout, and what each slot delivered.

    The first segment of an epoch reads the epoch's read order by the slot
    rule; each later one reads what the earlier ones left (:func:`resume_slots`).

    Raises:
        InvalidArgument: per-rank ``num_workers``, or counts that are not one
            per slot of the layout.
    """

    layout: Layout
    delivered: tuple[int | None, ...]
    """Files each slot ``rank * max(1, num_workers) + worker`` delivered, in
    its order; None where unknown (a single rank's state, before merging)."""

    def __post_init__(self) -> None:
        if not self.layout.uniform:
            raise InvalidArgument("a resumed epoch's segment runs one num_workers on every rank")
        if len(self.delivered) != self.layout.slots:
            raise InvalidArgument(
                f"the state lists {len(self.delivered)} slots but world_size "
                f"{self.layout.world_size} x num_workers {self.layout.num_workers} has "
                f"{self.layout.slots}")

    @classmethod
    def start(cls, layout: Layout) -> Segment:
        """A segment of ``layout`` in which no slot has delivered anything yet."""
        return cls(layout, (0,) * layout.slots)


@dataclass(frozen=True)
class SlotRun:
    """One slot's files in one segment: ``files`` in order, of which the
    first ``real`` are the segment's own share and the rest equal-length padding."""

    files: np.ndarray
    real: int


def _epoch_slot(order: ReadOrder, layout: Layout, slot: Slot) -> SlotRun:
    """A slot's files for a whole epoch by the slot rule."""
    files = slot_array(order, layout, slot)
    return SlotRun(files, min(epoch_slot_length(order, layout, slot)[1], len(files)))


def epoch_slot_length(order: ReadOrder, layout: Layout, slot: Slot) -> tuple[int, int]:
    """(files, of which its real share) a slot reads in a whole epoch, by arithmetic."""
    length = slot_length(order, layout, slot)
    real = slot_length(replace(order, equal_length=None), layout, slot)
    return length, min(length, real)


def resume_nodes(layout: Layout, order: ReadOrder) -> int:
    """Nodes whose remainders stay apart: under the ``"node"`` shuffle scope,
    ``world_size // nproc_per_node``; otherwise the whole job is one."""
    if not order.shuffle or order.shuffle_scope != "node" or not layout.nproc_per_node:
        return 1
    return layout.nodes


def _remainder(runs: list[SlotRun], done: Segment, groups: int) -> list[np.ndarray]:
    """What the slots of segment ``done`` left, in order, per group of the next layout.

    A slot's leftover is its real files past its delivered count. Leftovers
    are merged back in the order the segment dealt them (step ``i`` of every
    slot, slots in slot order): for a first segment this is the read order.
    With several groups, a slot's leftover stays with its node.
    """
    import numpy as np

    keys: list[list[np.ndarray]] = [[] for _ in range(groups)]
    vals: list[list[np.ndarray]] = [[] for _ in range(groups)]
    for s, run in enumerate(runs):
        d = done.delivered[s]
        if d is None:
            raise InvalidArgument(f"the state does not say what slot {done.layout.slot_at(s)} "
                                  "delivered",
                                  hint="merge every rank's state with ucstage.merge_states")
        left = run.files[d:run.real]
        if not len(left):
            continue
        g = 0 if groups == 1 else done.layout.node_of(done.layout.slot_at(s).rank)
        keys[g].append(np.arange(d, run.real, dtype=np.int64) * done.layout.slots + s)
        vals[g].append(left)
    out = []
    for g in range(groups):
        if not keys[g]:
            out.append(np.zeros(0, dtype=np.int64))
            continue
        key, val = np.concatenate(keys[g]), np.concatenate(vals[g])
        out.append(val[np.argsort(key, kind="stable")])
    return out


def _deal(remainder: list[np.ndarray], layout: Layout, equal_length: str | None
          ) -> list[SlotRun]:
    """The slot rule applied to a remainder list: slot ``t`` of a group reads
    its positions ``t, t + step, ...``; with ``equal_length`` every slot of the
    job reads the same count, padded by wrapping or trimmed."""
    import numpy as np

    total = sum(len(r) for r in remainder)
    if equal_length is not None and len(remainder) > 1 and total and \
            any(not len(r) for r in remainder):
        remainder = [np.concatenate(remainder)]  # a node with nothing left cannot pad
    count = equal_count(total, layout.slots, equal_length)
    per_node = len(remainder) > 1
    runs = []
    for s in range(layout.slots):
        slot = layout.slot_at(s)
        group = remainder[layout.node_of(slot.rank) if per_node else 0]
        at = stride(layout, slot, per_node=per_node)
        real = at.length(len(group))
        if count is not None:
            real = min(real, count)
        runs.append(SlotRun(group[at.positions(len(group), count)], real))
    return runs


def segment_runs(order: ReadOrder, segments: Sequence[Segment]) -> list[list[SlotRun]]:
    """Every slot's files in each segment of an epoch, in order.

    The first segment reads the epoch by the slot rule. Each later segment
    re-splits what the earlier ones left undelivered: the leftovers, in the
    order they were dealt, are dealt again over the new slots by the same
    rule (per node under the ``"node"`` scope when the node count did not
    change, else over the whole job). Deterministic: every rank computes the
    same runs.

    Raises:
        InvalidArgument: a delivered count beyond its slot's files.
    """
    out: list[list[SlotRun]] = []
    for i, seg in enumerate(segments):
        layout = seg.layout
        if i == 0:
            runs = [_epoch_slot(order, layout, layout.slot_at(s)) for s in range(layout.slots)]
        else:
            prev = segments[i - 1]
            nodes = resume_nodes(layout, order)
            groups = nodes if nodes > 1 and nodes == resume_nodes(prev.layout, order) else 1
            runs = _deal(_remainder(out[-1], prev, groups), layout, order.equal_length)
        for s, (run, d) in enumerate(zip(runs, seg.delivered, strict=True)):
            if d is not None and not 0 <= d <= len(run.files):
                raise InvalidArgument(
                    f"slot {layout.slot_at(s)} delivered {d} files but reads only "
                    f"{len(run.files)} in this epoch",
                    hint="the state belongs to another listing or layout")
        out.append(runs)
    return out


def same_layout(a: Layout, b: Layout, order: ReadOrder) -> bool:
    """Whether a resume on layout ``b`` continues a segment of layout ``a`` slot for slot."""
    return (a.world_size == b.world_size and a.workers == b.workers
            and ((resume_nodes(a, order) == 1 and resume_nodes(b, order) == 1)
                 or a.nproc_per_node == b.nproc_per_node))


def resume_slots(order: ReadOrder, segments: Sequence[Segment], layout: Layout
                 ) -> tuple[list[Segment], list[np.ndarray | None]]:
    """What each slot of ``layout`` reads to finish an interrupted epoch.

    ``segments`` are the epoch's stretches so far (the last may be partly
    unknown on a single rank's state). On the same layout as the last
    segment every slot continues where it stopped; on another layout, what
    is left is re-split over the new slots (:func:`segment_runs`).

    Returns:
        The epoch's segments from now on (the last being the one that runs),
        and per slot of ``layout`` the listing indices it still reads, in
        order (None for a slot whose count the state does not hold).
    """
    if not segments:
        raise InvalidArgument("the state has no segment to resume")
    last = segments[-1]
    if same_layout(last.layout, layout, order):
        runs = segment_runs(order, segments)[-1]
        return list(segments), [None if d is None else run.files[d:]
                                for run, d in zip(runs, last.delivered, strict=True)]
    chain = [*segments, Segment.start(layout)]
    return chain, [run.files for run in segment_runs(order, chain)[-1]]
