"""Resuming an interrupted epoch: the re-split of what was left over new slots."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

from ..errors import InvalidArgument
from .rule import EQUAL_LENGTH_MODES, slot_array, slot_length
from .values import _check_world, effective_workers

# -- resuming an interrupted epoch ---------------------------------------------
#
# Kept apart from the rule above on purpose: it only *calls* the slot rule
# (through `_epoch_slot` and `epoch_slot_length`, the only places that ask for a
# slot's epoch order), so a change to the rule reaches resumes without an edit here.


@dataclass(frozen=True)
class Segment:
    """A stretch of one epoch run with one layout, and what each slot delivered.

    The first segment of an epoch reads the epoch's read order by the slot
    rule; each later one reads what the earlier ones left (:func:`resume_slots`).
    """

    world_size: int
    num_workers: int
    delivered: tuple[int | None, ...]
    """Files each slot ``rank * max(1, num_workers) + worker`` delivered, in
    its order; None where unknown (a single rank's state, before merging)."""
    nproc_per_node: int | None = None

    @property
    def slots(self) -> int:
        return self.world_size * effective_workers(self.num_workers)


@dataclass(frozen=True)
class EpochOrder:
    """What decides an epoch's read order, besides the layout."""

    n: int
    shuffle: bool = False
    seed: int = 0
    epoch: int = 0
    equal_length: str | None = None
    shuffle_scope: str = "global"


@dataclass(frozen=True)
class SlotRun:
    """One slot's files in one segment: ``files`` in order, of which the
    first ``real`` are the segment's own share and the rest equal-length padding."""

    files: np.ndarray
    real: int


def _epoch_slot(order: EpochOrder, layout: Segment, rank: int, worker: int) -> SlotRun:
    """A slot's files for a whole epoch by the slot rule. With
    :func:`epoch_slot_length`, the resume's only call to the rule."""
    files = slot_array(order.n, rank=rank, world_size=layout.world_size,
                       num_workers=layout.num_workers, worker=worker, shuffle=order.shuffle,
                       seed=order.seed, epoch=order.epoch, equal_length=order.equal_length,
                       shuffle_scope=order.shuffle_scope, nproc_per_node=layout.nproc_per_node)
    return SlotRun(files, min(epoch_slot_length(order, layout, rank, worker)[1], len(files)))


def epoch_slot_length(order: EpochOrder, layout: Segment, rank: int, worker: int
                      ) -> tuple[int, int]:
    """(files, of which its real share) a slot reads in a whole epoch, by arithmetic."""
    def length_of(equal_length: str | None) -> int:
        return slot_length(order.n, rank=rank, world_size=layout.world_size,
                           num_workers=layout.num_workers, worker=worker,
                           equal_length=equal_length, shuffle=order.shuffle,
                           shuffle_scope=order.shuffle_scope,
                           nproc_per_node=layout.nproc_per_node)

    length, real = length_of(order.equal_length), length_of(None)
    return length, min(length, real)


def resume_nodes(layout: Segment, order: EpochOrder) -> int:
    """Nodes whose remainders stay apart: under the ``"node"`` shuffle scope,
    ``world_size // nproc_per_node``; otherwise the whole job is one."""
    if not order.shuffle or order.shuffle_scope != "node" or not layout.nproc_per_node:
        return 1
    return max(1, layout.world_size // layout.nproc_per_node)


def _remainder(runs: list[SlotRun], done: Segment, groups: int) -> list[np.ndarray]:
    """What the slots of segment ``done`` left, in order, per group of the next layout.

    A slot's leftover is its real files past its delivered count. Leftovers
    are merged back in the order the segment dealt them (step ``i`` of every
    slot, slots in slot order): for a first segment this is the read order.
    With several groups, a slot's leftover stays with its node.
    """
    import numpy as np

    k = effective_workers(done.num_workers)
    keys: list[list[np.ndarray]] = [[] for _ in range(groups)]
    vals: list[list[np.ndarray]] = [[] for _ in range(groups)]
    for s, run in enumerate(runs):
        d = done.delivered[s]
        if d is None:
            raise InvalidArgument(f"the state does not say what slot {s // k}:{s % k} delivered",
                                  hint="merge every rank's state with ucstage.merge_states")
        left = run.files[d:run.real]
        if not len(left):
            continue
        g = 0 if groups == 1 else (s // k) // (done.nproc_per_node or 1)
        keys[g].append(np.arange(d, run.real, dtype=np.int64) * done.slots + s)
        vals[g].append(left)
    out = []
    for g in range(groups):
        if not keys[g]:
            out.append(np.zeros(0, dtype=np.int64))
            continue
        key, val = np.concatenate(keys[g]), np.concatenate(vals[g])
        out.append(val[np.argsort(key, kind="stable")])
    return out


def _deal(remainder: list[np.ndarray], layout: Segment, equal_length: str | None) -> list[SlotRun]:
    """The slot rule applied to a remainder list: slot ``t`` of a group reads
    its positions ``t, t + step, ...``; with ``equal_length`` every slot of the
    job reads the same count, padded by wrapping or trimmed."""
    import numpy as np

    total = sum(len(r) for r in remainder)
    k, slots = effective_workers(layout.num_workers), layout.slots
    if equal_length is not None and len(remainder) > 1 and total and \
            any(not len(r) for r in remainder):
        remainder = [np.concatenate(remainder)]  # a node with nothing left cannot pad
    count = 0
    if equal_length is not None:
        count = total // slots if equal_length == "drop" else -(-total // slots)
    runs = []
    for rank in range(layout.world_size):
        for worker in range(k):
            if len(remainder) == 1:
                group, t, step = remainder[0], rank * k + worker, slots
            else:
                per = layout.nproc_per_node or layout.world_size
                node = rank // per
                group, t, step = remainder[node], (rank - node * per) * k + worker, per * k
            m = len(group)
            real = len(range(t, m, step))
            if equal_length is None:
                pos = np.arange(t, m, step, dtype=np.int64)
            else:
                pos = (t + step * np.arange(count, dtype=np.int64)) % max(m, 1)
                real = min(real, count)
                if not m:
                    pos = pos[:0]
            runs.append(SlotRun(group[pos], real))
    return runs


def _check_layout(seg: Segment, order: EpochOrder) -> None:
    _check_world(seg.world_size)
    if seg.num_workers < 0:
        raise InvalidArgument(f"num_workers must be 0 or more, got {seg.num_workers}")
    if len(seg.delivered) != seg.slots:
        raise InvalidArgument(f"the state lists {len(seg.delivered)} slots but world_size "
                              f"{seg.world_size} x num_workers {seg.num_workers} has {seg.slots}")
    if seg.nproc_per_node is not None and (seg.nproc_per_node < 1
                                           or seg.world_size % seg.nproc_per_node):
        raise InvalidArgument(f"world_size {seg.world_size} is not a multiple of "
                              f"nproc_per_node {seg.nproc_per_node}")
    if order.equal_length is not None and order.equal_length not in EQUAL_LENGTH_MODES:
        raise InvalidArgument(
            f"equal_length must be one of {EQUAL_LENGTH_MODES}, got {order.equal_length!r}")


def segment_runs(order: EpochOrder, segments: Sequence[Segment]) -> list[list[SlotRun]]:
    """Every slot's files in each segment of an epoch, in order.

    The first segment reads the epoch by the slot rule. Each later segment
    re-splits what the earlier ones left undelivered: the leftovers, in the
    order they were dealt, are dealt again over the new slots by the same
    rule (per node under the ``"node"`` scope when the node count did not
    change, else over the whole job). Deterministic: every rank computes the
    same runs.

    Raises:
        InvalidArgument: a delivered count beyond its slot's files, or a
            segment whose counts do not match its layout.
    """
    out: list[list[SlotRun]] = []
    for i, seg in enumerate(segments):
        _check_layout(seg, order)
        k = effective_workers(seg.num_workers)
        if i == 0:
            runs = [_epoch_slot(order, seg, s // k, s % k) for s in range(seg.slots)]
        else:
            prev = segments[i - 1]
            nodes = resume_nodes(seg, order)
            groups = nodes if nodes > 1 and nodes == resume_nodes(prev, order) else 1
            runs = _deal(_remainder(out[-1], prev, groups), seg, order.equal_length)
        for s, (run, d) in enumerate(zip(runs, seg.delivered, strict=True)):
            if d is not None and not 0 <= d <= len(run.files):
                raise InvalidArgument(
                    f"slot {s // k}:{s % k} delivered {d} files but reads only "
                    f"{len(run.files)} in this epoch",
                    hint="the state belongs to another listing or layout")
        out.append(runs)
    return out


def same_layout(a: Segment, b: Segment, order: EpochOrder) -> bool:
    """Whether a resume on layout ``b`` continues segment ``a`` slot for slot."""
    return (a.world_size == b.world_size
            and effective_workers(a.num_workers) == effective_workers(b.num_workers)
            and ((resume_nodes(a, order) == 1 and resume_nodes(b, order) == 1)
                 or a.nproc_per_node == b.nproc_per_node))


def resume_slots(order: EpochOrder, segments: Sequence[Segment], layout: Segment
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
    if same_layout(last, layout, order):
        runs = segment_runs(order, segments)[-1]
        return list(segments), [None if d is None else run.files[d:]
                                for run, d in zip(runs, last.delivered, strict=True)]
    new = Segment(layout.world_size, layout.num_workers, (0,) * layout.slots,
                  layout.nproc_per_node)
    chain = [*segments, new]
    return chain, [run.files for run in segment_runs(order, chain)[-1]]
