"""Mixing sources by weight: each source's share of an epoch, its passes, and
the one interleaving every rank deals.

Torch-free: ``ucstage.Mix`` (data/mix.py) and ``ucstage shard-plan SRC1 SRC2
--weights`` both compute from here.

* **Shares** (:func:`mix_shares`): ``weights`` (each >= 0, sum > 0,
  normalised) give source ``i`` ``epoch_size * w_i`` items of an epoch,
  rounded by largest remainder so the counts add up exactly; without
  ``epoch_size`` the epoch is ``ceil(n_L / w_L)`` items, ``L`` the source with
  the most items. ``repeat`` instead gives source ``i`` ``round(repeat_i *
  n_i)`` items.
* **Passes** (:class:`SourceStream`): source ``i`` reads an endless stream of
  passes, pass ``p`` a :class:`~.order.Permutation` of its items seeded by
  ``(seed, p)``; epoch ``e`` takes stream positions ``e * c_i .. (e + 1) *
  c_i``. A small source repeats (a new permutation per pass), a large one is
  subsampled by disjoint windows of one permutation: every item is used once
  before any repeats, across epochs.
* **Interleaving** (:class:`MixOrder`): the epoch's sources, one after the
  other, are cut into rounds of ``slots`` positions and the full rounds are
  permuted by ``(seed, epoch)``. Position ``p`` keeps its residue ``p %
  slots``, so when the slot rule (:func:`~.rule.slot_array` over the
  ``epoch_size`` positions) deals the mix, each slot reads within 1 of every
  source's ``c_i / slots``, in an order that changes every epoch.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

from ..errors import InvalidArgument
from .order import Permutation, permute_passes
from .rule import Layout, ReadOrder, Slot, slot_array

__all__ = ["MAX_EPOCH_SIZE", "MixOrder", "MixPlan", "MixShares", "SourceStream", "check_shares",
           "largest_remainder", "mix_plan", "mix_shares", "slot_mix"]


MAX_EPOCH_SIZE = 10**9
"""The most items a mix's epoch may have: the loader keeps a count per
position of the epoch on every rank (and sums them in the audit), as for a
listing of that many files; an epoch beyond it is refused up front rather
than failing at the first item for want of memory."""


def _fraction(value: object, name: str) -> Fraction:
    # numbers' ABCs take numpy's scalars too (np.int64 is Integral, np.float32 Real).
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgument(f"{name} must be numbers, got {value!r}")
    if isinstance(value, numbers.Rational):
        return Fraction(int(value.numerator), int(value.denominator))
    as_float = float(value)
    if not math.isfinite(as_float):
        raise InvalidArgument(f"{name} must be finite numbers, got {value!r}")
    try:  # 0.7 means 7/10, not the float's binary value (str: numpy's shortest form too)
        return Fraction(str(value))
    except ValueError:
        return Fraction(repr(as_float))


def _whole(value: object) -> int | None:
    """``value`` as an int when it is a whole number (numpy's integers too), else None."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return None
    return int(value)


def _check_epoch_size(size: int, why: str, hint: str) -> None:
    if size > MAX_EPOCH_SIZE:
        shown = f"{size:,}" if size < 10**15 else f"about 10^{len(str(size)) - 1}"
        raise InvalidArgument(f"the mix's epoch would have {shown} items ({why}), more than "
                              f"the {MAX_EPOCH_SIZE:,} a mix allows", hint=hint)


def check_shares(sources: int, weights: Sequence[float] | None = None,
                 repeat: Sequence[float] | None = None,
                 epoch_size: int | None = None) -> tuple[tuple[Fraction, ...] | None,
                                                         tuple[Fraction, ...] | None]:
    """Check the mix's options before any listing: (normalised weights, repeats).

    Weights and repeats are Python's or numpy's numbers; ``epoch_size`` a
    whole number (an int or numpy integer).

    Raises:
        InvalidArgument: both weights and repeat, a count that is not one per
            source, a negative value, weights whose sum is not positive, an
            ``epoch_size`` below 1, above :data:`MAX_EPOCH_SIZE` or beside
            ``repeat``.
    """
    if sources < 1:
        raise InvalidArgument("a mix needs at least one source")
    if weights is not None and repeat is not None:
        raise InvalidArgument("pass weights or repeat, not both",
                              hint="weights share an epoch of epoch_size items; repeat reads "
                                   "each source that many times its size")
    if epoch_size is not None:
        whole = _whole(epoch_size)
        if whole is None or whole < 1:
            raise InvalidArgument(f"epoch_size must be a whole number of at least 1, "
                                  f"got {epoch_size!r}")
        _check_epoch_size(whole, "epoch_size", "pass a smaller epoch_size")
    if repeat is not None and epoch_size is not None:
        raise InvalidArgument("epoch_size goes with weights, not with repeat",
                              hint="with repeat the epoch is the sum of the repeated sizes")
    for name, values in (("weights", weights), ("repeat", repeat)):
        if values is not None and len(values) != sources:
            raise InvalidArgument(f"{name} has {len(values)} values for {sources} sources",
                                  hint="give one value per source")
    if weights is not None:
        ws = tuple(_fraction(w, "weights") for w in weights)
        if any(w < 0 for w in ws):
            raise InvalidArgument(f"weights must be 0 or more, got {list(weights)}")
        total = sum(ws, Fraction(0))
        if total <= 0:
            raise InvalidArgument(f"weights must sum to a positive number, got {list(weights)}")
        return tuple(w / total for w in ws), None
    if repeat is not None:
        rs = tuple(_fraction(r, "repeat") for r in repeat)
        if any(r < 0 for r in rs):
            raise InvalidArgument(f"repeat must be 0 or more, got {list(repeat)}")
        return None, rs
    return None, None


def largest_remainder(total: int, shares: Sequence[Fraction]) -> list[int]:
    """``total`` split by ``shares`` (summing to 1) into whole counts that add
    up to ``total``: each gets its quota's floor, and the rest go one each to
    the largest fractional parts (ties to the earlier source)."""
    quotas = [total * s for s in shares]
    counts = [math.floor(q) for q in quotas]
    rest = total - sum(counts)
    by_part = sorted(range(len(shares)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in by_part[:rest]:
        counts[i] += 1
    return counts


@dataclass(frozen=True)
class MixShares:
    """Each source's items per epoch (``counts``) out of its ``sizes``."""

    sizes: tuple[int, ...]
    counts: tuple[int, ...]

    @property
    def epoch_size(self) -> int:
        return sum(self.counts)

    def passes(self, source: int) -> float:
        """Passes over source ``source`` per epoch (2.5: twice and a half)."""
        n = self.sizes[source]
        return self.counts[source] / n if n else 0.0

    def stream(self, source: int, seed: int) -> SourceStream:
        return SourceStream(self.sizes[source], self.counts[source], seed, source)

    def pass_range(self, source: int, epoch: int) -> tuple[int, int]:
        """(first, last) pass of source ``source`` that epoch ``epoch`` reads
        ((0, -1) when it reads none)."""
        return self.stream(source, 0).pass_range(epoch)


def mix_shares(sizes: Sequence[int], weights: Sequence[float] | None = None,
               repeat: Sequence[float] | None = None,
               epoch_size: int | None = None) -> MixShares:
    """Each source's count per epoch (see the module docstring).

    Neither ``weights`` nor ``repeat``: every source once per epoch.

    Raises:
        InvalidArgument: see :func:`check_shares`; also an empty source given a
            share, the largest source weighted 0 without ``epoch_size``, an
            epoch of no items or of more than :data:`MAX_EPOCH_SIZE`.
    """
    ws, rs = check_shares(len(sizes), weights, repeat, epoch_size)
    sizes = tuple(int(n) for n in sizes)
    if ws is not None:
        if epoch_size is None:
            largest = max(range(len(sizes)), key=lambda i: (sizes[i], -i))
            if ws[largest] == 0:
                raise InvalidArgument(
                    f"the largest source (source {largest}, {sizes[largest]} items) has weight "
                    "0, so the epoch size cannot follow from it", hint="pass epoch_size")
            epoch_size = math.ceil(sizes[largest] / ws[largest])
            _check_epoch_size(epoch_size, f"ceil(n / w), source {largest}: {sizes[largest]:,} "
                                          f"items at weight {float(ws[largest]):.3g}",
                              "pass epoch_size, or give the largest source more weight")
        counts = largest_remainder(int(epoch_size), ws)
    elif rs is not None:
        counts = [math.floor(r * n + Fraction(1, 2)) for r, n in zip(rs, sizes, strict=True)]
    else:
        counts = list(sizes)
    for i, (n, c) in enumerate(zip(sizes, counts, strict=True)):
        if c and not n:
            raise InvalidArgument(f"source {i} has no items but its share is {c} per epoch",
                                  hint="give it weight 0, or check its listing")
    if not sum(counts):
        raise InvalidArgument("the mix's epoch has no items", hint="check the sources' listings")
    _check_epoch_size(sum(counts), "the sum of repeat x items", "repeat the sources fewer times")
    return MixShares(sizes, tuple(counts))


@dataclass(frozen=True)
class SourceStream:
    """Source ``index``'s endless stream of passes (see the module docstring)."""

    n: int
    count: int
    """Stream positions each epoch takes."""
    seed: int
    index: int

    def items(self, epoch: int, local: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(items, passes) at positions ``local`` (0 .. count-1) of epoch ``epoch``."""
        import numpy as np

        at = epoch * self.count + np.asarray(local, dtype=np.int64)
        passes, within = np.divmod(at, self.n) if self.n else (at, at)
        # Pass p reads Permutation(n, seed, epoch=p, stream=f"mix{index}"), all
        # passes in one vectorised network: a source repeating 100,000 times
        # costs its positions, not positions times passes.
        items = permute_passes(self.n, within, passes, seed=self.seed,
                               stream=f"mix{self.index}")
        return items, passes

    def pass_range(self, epoch: int) -> tuple[int, int]:
        if not self.count:
            return 0, -1
        first = epoch * self.count
        return first // self.n, (first + self.count - 1) // self.n


class MixOrder:
    """One epoch's interleaving of the sources over ``epoch_size`` positions,
    for a layout of ``slots`` slots: position ``p`` reads ``(source, item)``
    (:meth:`take`). The same on every rank; depends on the slot count, which
    keeps every slot's per-source counts within 1."""

    def __init__(self, shares: MixShares, *, seed: int, epoch: int, slots: int) -> None:
        import numpy as np

        if slots < 1:
            raise InvalidArgument(f"slots must be at least 1, got {slots}")
        self.shares, self.seed, self.epoch, self.slots = shares, int(seed), int(epoch), slots
        self.n = shares.epoch_size
        self.rounds = self.n // slots
        self._rounds = Permutation(self.rounds, seed=seed, epoch=epoch, stream="mix-rounds")
        self._ends = np.cumsum(np.asarray(shares.counts, dtype=np.int64))
        self._streams = [shares.stream(i, seed) for i in range(len(shares.counts))]

    def sources(self, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        """The source read at each mix position (int64)."""
        import numpy as np

        return np.searchsorted(self._ends, self._concat(positions), side="right")

    def _concat(self, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        """Positions in the sources-one-after-the-other order (full rounds permuted)."""
        import numpy as np

        pos = np.asarray(positions, dtype=np.int64)
        full = pos < self.rounds * self.slots
        out = pos.copy()
        if full.any():
            r, j = np.divmod(pos[full], self.slots)
            out[full] = self._rounds.take(r) * self.slots + j
        return out

    def take(self, positions: Sequence[int] | np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(source, item, pass) at each mix position."""
        import numpy as np

        q = self._concat(positions)
        src = np.searchsorted(self._ends, q, side="right")
        items = np.empty(len(q), dtype=np.int64)
        passes = np.empty(len(q), dtype=np.int64)
        starts = self._ends - np.asarray(self.shares.counts, dtype=np.int64)
        for s in np.unique(src).tolist():
            mask = src == s
            items[mask], passes[mask] = self._streams[s].items(self.epoch, q[mask] - starts[s])
        return src, items, passes


@dataclass(frozen=True)
class SlotMix:
    """What one slot reads of a mix in one epoch: items per source, in read order."""

    slot: Slot
    sources: np.ndarray
    items: np.ndarray
    passes: np.ndarray

    def counts(self, sources: int) -> list[int]:
        import numpy as np

        return np.bincount(self.sources, minlength=sources).tolist()


def slot_mix(shares: MixShares, layout: Layout, slot: Slot, *, seed: int, epoch: int,
             equal_length: str | None = None) -> SlotMix:
    """The slot rule over the mix's positions, read through :class:`MixOrder`."""
    order = ReadOrder(shares.epoch_size, False, seed, epoch, equal_length, "global")
    positions = slot_array(order, layout, slot)
    src, items, passes = MixOrder(shares, seed=seed, epoch=epoch,
                                  slots=layout.slots).take(positions)
    return SlotMix(slot, src, items, passes)


@dataclass(frozen=True)
class MixPlan:
    """What ``shard-plan SRC1 SRC2 --weights`` prints: each source's share and
    passes, and per slot the items it reads from each source."""

    names: tuple[str, ...]
    shares: MixShares
    layout: Layout
    seed: int
    epoch: int
    slots: tuple[tuple[Slot, tuple[int, ...]], ...]

    def to_json(self) -> dict[str, Any]:
        sources = []
        for i, name in enumerate(self.names):
            first, last = self.shares.pass_range(i, self.epoch)
            sources.append({"source": name, "items": self.shares.sizes[i],
                            "per_epoch": self.shares.counts[i],
                            "passes_per_epoch": self.shares.passes(i),
                            "passes": [first, last] if last >= first else []})
        return {"epoch_size": self.shares.epoch_size, "seed": self.seed, "epoch": self.epoch,
                "world_size": self.layout.world_size, "num_workers": self.layout.num_workers,
                "sources": sources,
                "slots": [{"rank": s.rank, "worker": s.worker, "items": list(counts),
                           "total": sum(counts)} for s, counts in self.slots]}


def mix_plan(names: Sequence[str], shares: MixShares, layout: Layout, *, seed: int = 0,
             epoch: int = 0) -> MixPlan:
    """Per slot of ``layout``, the items it reads from each source in ``epoch``."""
    import numpy as np

    order = MixOrder(shares, seed=seed, epoch=epoch, slots=layout.slots)
    read = ReadOrder(shares.epoch_size, False, seed, epoch, None, "global")
    rows = []
    for rank in range(layout.world_size):
        for worker in range(layout.readers_of(rank)):
            slot = layout.slot(rank, worker)
            found = order.sources(slot_array(read, layout, slot))
            rows.append((slot, tuple(np.bincount(found, minlength=len(names)).tolist())))
    return MixPlan(tuple(names), shares, layout, int(seed), int(epoch), tuple(rows))
