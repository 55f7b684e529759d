""":class:`Mix`: several sharded datasets mixed by weight into one epoch.

Each source keeps its own listing, cache namespace and read-ahead; the mix
decides which of its items an epoch reads and in which order, with the
torch-free arithmetic of :mod:`ucstage.sharding.mixing`: each source's share
of the epoch (weights or repeat), its passes (a new permutation per pass),
and one interleaving of ``epoch_size`` positions, the same on every rank.
The slot rule (:func:`ucstage.sharding.slot_array`) deals those positions, so
checkpoint and resume, the exactly-once audit and the rank guard of the
ucstage DataLoader work on a mix exactly as on one :class:`~ucstage.VolumeDataset`:
its "listing" is the epoch's positions, its fingerprint covers every
source's and the shares.

Usage and every argument: docs/training.md, "Mixing sources".
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..cache.leases import DEFAULT_SLACK
from ..errors import EmptySource, InvalidArgument
from ..sharding import Layout, slot_array
from ..sharding.mixing import MixOrder, MixShares, check_shares, mix_shares
from . import state as _state
from .audit import SourceAudit
from .sharded import ShardedDataset, rule_order
from .slotread import AUTO, Share

if TYPE_CHECKING:
    from ..cache import LocalCache
    from ..resume import LoaderState
    from ..sharding import ReadOrder
    from ..volumes import Volume
    from .channel import LoopView

__all__ = ["Mix"]


class MixSource(Protocol):
    """What :class:`ucstage.Mix` needs of each of its sources."""

    read_ahead: int | str
    run: str

    @property
    def fingerprint(self) -> str | None: ...

    def freeze(self, *, broadcast: bool | None = None) -> Any:
        """The frozen listing: ``len()`` items, a ``fingerprint`` (and ``sizes()``)."""

    def read_order(self) -> ReadOrder:
        """Its read order; ``n`` is its item count (files, samples, row groups),
        unless it has ``mix_items()`` (``ShardDataset``: the slot rule deals
        blocks, the mix deals samples)."""

    def iter_rows(self, rows: Any, rank: int, *, sharers: int = 1) -> Any:
        """The items at ``rows`` of its read order (an int array), in order,
        fetched and untracked (the mix tracks its own positions); ``sharers``:
        the sources whose readers share each worker (their read-ahead shares
        split the node's copies in flight among them)."""

    def cache(self) -> LocalCache: ...

    def _get_volume(self) -> Volume: ...


class MixListing:
    """What :meth:`Mix.freeze` returns: the epoch's positions as the loader's
    "listing" (its length, fingerprint), and the sources' files for the
    loader's window check (``sizes``, ``entries``)."""

    groups = None  # a position is one item: nothing is grouped (as for row groups)

    def __init__(self, fingerprint: str, positions: int, listings: list[Any]) -> None:
        self.fingerprint = fingerprint
        self._n = positions
        self._listings = listings
        self.path: str | None = None
        self.source = "mix"

    def __len__(self) -> int:
        return self._n

    def sizes(self) -> np.ndarray:
        parts = [np.asarray(m.sizes(), dtype=np.int64) for m in self._listings
                 if hasattr(m, "sizes")]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    @property
    def entries(self) -> _Entries:
        return _Entries(self._listings)


class _Entries:
    """The sources' entries, one after the other (indexed only for a few names)."""

    def __init__(self, listings: list[Any]) -> None:
        self._listings = [m for m in listings if hasattr(m, "sizes")]

    def __getitem__(self, index: int) -> Any:
        for m in self._listings:
            if index < len(m):
                return m.entries[index]
            index -= len(m)
        raise IndexError(index)


def _labels(keys: Sequence[Hashable]) -> list[str]:
    """The sources' names as text (per-source metrics, audits): ``str`` of each
    key, or ``repr`` of those whose ``str`` would collide (1 and "1" give "1"
    and "'1'"), so no two sources share a label."""
    text = [str(k) for k in keys]
    clash = {t for t in text if text.count(t) > 1}
    labels = [repr(k) if t in clash else t for k, t in zip(keys, text, strict=True)]
    if len(set(labels)) < len(labels):
        raise InvalidArgument(f"the sources' names {list(keys)!r} are not distinct as text",
                              hint="give each source a distinct name")
    return labels


class _Unread:
    """The listing of a source weighted 0 that has nothing to read."""

    fingerprint = "unread"

    def __len__(self) -> int:
        return 0


_UNREAD = _Unread()


class Mix(ShardedDataset):
    """Several sharded datasets (``VolumeDataset``, ``TableDataset``,
    ``ShardDataset``: its items are samples) mixed by weight.

    Args:
        datasets: the sources, a sequence or a mapping of names to datasets
            (names label the per-source counts; default ``"0"``, ``"1"``, ...;
            :attr:`counts`, :attr:`lengths` and :attr:`delivered` are keyed
            by the mapping's own keys, :attr:`names` holds them as distinct text).
        weights: each source's share of an epoch (each >= 0, sum > 0,
            normalised); a sequence in the sources' order, or a mapping by name.
        epoch_size: items per epoch with ``weights`` (default ``ceil(n_L /
            w_L)``, ``L`` the source with the most items).
        seed: seeds the passes' permutations and the interleaving.
        repeat: instead of weights, how many times each source is read per
            epoch (2.5: twice and a half; 0.1: a tenth, a new tenth each epoch).
        equal_length: ``False`` (default), ``"pad"`` (or ``True``) or ``"drop"``,
            as for :class:`~ucstage.VolumeDataset`, over the mix's positions: every slot
            then reads the same count, so ranks get equal batch counts.

    Without weights or repeat, each source is read once per epoch. A source
    smaller than its share repeats with a new permutation per pass; a larger
    one is subsampled by disjoint windows of one permutation. The sources' own
    ``shuffle``, ``seed`` and ``equal_length`` do not apply: the mix deals.

    ``len(mix)`` is one integer (this worker's slot, or the rank's slots in
    the main process, like ``VolumeDataset``); :attr:`counts` holds each
    source's items per epoch and :attr:`lengths` this process's.
    """

    def __init__(self, datasets: Sequence[Any] | Mapping[str, Any],
                 weights: Sequence[float] | Mapping[str, float] | None = None,
                 epoch_size: int | None = None, seed: int = 0,
                 repeat: Sequence[float] | Mapping[str, float] | None = None,
                 equal_length: bool | str | None = False) -> None:
        if isinstance(datasets, Mapping):
            self.keys: list[Hashable] = list(datasets)
            sources = list(datasets.values())
        else:
            sources = list(datasets)
            self.keys = [str(i) for i in range(len(sources))]
        self.names = _labels(self.keys)
        for ds in sources:
            if not callable(getattr(ds, "iter_rows", None)) or isinstance(ds, Mix):
                raise InvalidArgument(f"Mix mixes VolumeDataset, TableDataset and ShardDataset "
                                      "sources, "
                                      f"got {type(ds).__name__}")
        self.datasets: list[MixSource] = sources
        self.weights = self._by_name(weights, "weights")
        self.repeat = self._by_name(repeat, "repeat")
        self.epoch_size = epoch_size
        ws, rs = check_shares(len(sources), self.weights, self.repeat, epoch_size)
        # Sources never read (weight or repeat 0): an empty one is allowed, not listed twice.
        self._zero = frozenset(i for i, v in enumerate(ws or rs or ()) if v == 0)
        self._unread: set[int] = set()
        # The mix deals in one order over the whole job: no shuffle of its
        # own, no node scope (what the loader's guard and per-epoch record read).
        super().__init__(rule_order(False, int(seed), "global", equal_length),
                         getattr(sources[0], "nproc_per_node", None))
        # Every source's reader holds files at once (read-ahead, the one being
        # read, the slack): the window is their sum, as one reader's read-ahead.
        # A source reading ahead by "auto" takes its share of the node's copies
        # with the other sources as fellow readers (iter_rows' sharers), so the
        # mix's window is "auto" too: one reader's share, cut to fit the cap.
        self.read_ahead: int | str = AUTO if any(ds.read_ahead == AUTO for ds in sources) \
            else sum(int(ds.read_ahead) for ds in sources) + \
            (1 + DEFAULT_SLACK) * (len(sources) - 1)
        self.run = sources[0].run
        self._shares: MixShares | None = None
        self._fingerprint: str | None = None
        self._delivered: np.ndarray = np.zeros(len(sources), dtype=np.int64)

    def _by_name(self, values: Any, what: str) -> list[float] | None:
        if values is None:
            return None
        if isinstance(values, Mapping):
            # A source's own key, or its label ("1" for the key 1, as before).
            found = {}
            for key, value in values.items():
                if key in self.keys:
                    found[self.keys.index(key)] = value
                elif isinstance(key, str) and key in self.names:
                    found[self.names.index(key)] = value
                else:
                    raise InvalidArgument(f"{what} names unknown sources [{key!r}]; the mix "
                                          f"has {self.keys}")
            return [found.get(i, 0) for i in range(len(self.keys))]
        if isinstance(values, (str, bytes)):
            raise InvalidArgument(f"{what} must be a sequence or a mapping of numbers, "
                                  f"got {values!r}")
        return list(values)

    # -- the listing -----------------------------------------------------------

    def freeze(self, *, broadcast: bool | None = None) -> MixListing:
        """Freeze every source's listing (in order: a collective on each) and the shares."""
        listings: list[Any] = []
        for i, ds in enumerate(self.datasets):
            if i in self._unread:
                listings.append(_UNREAD)
                continue
            try:
                listings.append(ds.freeze(broadcast=broadcast))
            except EmptySource:
                if i not in self._zero:
                    raise
                # Weighted 0: never read, so its having nothing to read is fine.
                self._unread.add(i)
                listings.append(_UNREAD)
        if self._shares is None:
            # Items per source: files, samples when grouped, row groups of a
            # table, samples of shards (a source's mix_items() when it deals
            # other units than the items it yields).
            sizes = [0 if i in self._unread else
                     ds.mix_items() if hasattr(ds, "mix_items") else ds.read_order().n
                     for i, ds in enumerate(self.datasets)]
            self._shares = mix_shares(sizes, self.weights, self.repeat, self.epoch_size)
            digest = hashlib.sha256(b"ucstage-mix\0")
            for m, n, count in zip(listings, sizes, self._shares.counts, strict=True):
                digest.update(f"{m.fingerprint}:{n}:{count}\0".encode())
            self._fingerprint = digest.hexdigest()
        assert self._fingerprint is not None
        return MixListing(self._fingerprint, self._shares.epoch_size, listings)

    @property
    def shares(self) -> MixShares:
        self.freeze()
        assert self._shares is not None
        return self._shares

    @property
    def counts(self) -> dict[Hashable, int]:
        """Each source's items per epoch (freezes the listings)."""
        return dict(zip(self.keys, self.shares.counts, strict=True))

    def _item_count(self) -> int:
        return self.shares.epoch_size

    # -- cache, volume (slot, layout, epoch, state: ShardedDataset) -----------

    def _first_read(self) -> MixSource:
        return next(ds for i, ds in enumerate(self.datasets) if i not in self._unread)

    def cache(self) -> LocalCache:
        """The first read source's cache (the loader's hit-rate counts the sources on its root)."""
        return self._first_read().cache()

    def _get_volume(self) -> Any:
        return self._first_read()._get_volume()

    def order(self, slots: int, epoch: int | None = None) -> MixOrder:
        """This epoch's (or ``epoch``'s) interleaving, dealt over ``slots`` slots."""
        return MixOrder(self.shares, seed=self.seed,
                        epoch=self.epoch if epoch is None else epoch, slots=slots)

    @staticmethod
    def _dealt_slots(resume: LoaderState | None, layout: Layout) -> int:
        """The slots the epoch's interleaving was made for: a resumed epoch keeps
        the first segment's, whatever the layout now."""
        if resume is not None and not resume.finished:
            return int(resume.segments[0].layout.slots)
        return layout.slots

    def track_deliveries(self, progress: _state.LoaderProgress) -> None:
        """The loader's progress of an epoch: count its deliveries per source too."""
        super().track_deliveries(progress)
        self._delivered = np.zeros(len(self.datasets), dtype=np.int64)
        order = self.order(self._dealt_slots(progress.resume, progress.layout), progress.epoch)

        def count(rows: Any) -> None:
            if len(rows):
                self._delivered += np.bincount(order.sources(rows),
                                               minlength=len(self.datasets))
        progress.listeners.append(count)

    @property
    def delivered(self) -> dict[Hashable, int]:
        """Items of each source the ucstage DataLoader returned on this rank this epoch."""
        progress = self._link.progress
        if progress is not None:
            progress.sync()
        return dict(zip(self.keys, self._delivered.tolist(), strict=True))

    def audit_sources(self, progress: Any, total: np.ndarray) -> tuple[SourceAudit, ...]:
        """The audit's per-source view: ``total`` counts deliveries per position."""
        order = self.order(self._dealt_slots(progress.resume, progress.layout), progress.epoch)
        src = order.sources(np.arange(len(total), dtype=np.int64))
        found = []
        for s, name in enumerate(self.names):
            mine = total[src == s]
            items = int(np.count_nonzero(mine))
            found.append(SourceAudit(
                name=name, items=items, duplicates=int(mine.sum()) - items,
                gaps=len(mine) - items, passes=self.shares.pass_range(s, progress.epoch)))
        return tuple(found)

    # -- lengths ---------------------------------------------------------------

    def __len__(self) -> int:
        if self._fingerprint is None:
            raise TypeError("len(Mix) needs the frozen listings: call freeze() first (the "
                            "ucstage DataLoader does it before its workers start)")
        return self.rule_length()

    @property
    def lengths(self) -> dict[Hashable, int]:
        """Each source's items in ``len(self)``: this worker's slot, or the rank's."""
        here = self.world()
        if here.in_worker:
            layout = self.layout(here.world_size, here.num_workers)
            workers = range(here.worker, here.worker + 1)
        else:
            layout = self.layout(here.world_size, self.num_workers)
            workers = range(layout.readers_of(here.rank))
        rank = here.rank
        order = self.order(layout.slots)
        total = np.zeros(len(self.datasets), dtype=np.int64)
        for w in workers:
            positions = slot_array(self.read_order(), layout, layout.slot(rank, w))
            total += np.bincount(order.sources(positions), minlength=len(self.datasets))
        return dict(zip(self.keys, total.tolist(), strict=True))

    def __repr__(self) -> str:
        return (f"Mix({len(self.datasets)} sources {self.names}, seed={self.seed}, "
                f"epoch={self.epoch})")

    # -- iteration -------------------------------------------------------------

    def _slot_items(self, tracker: _state.SlotTracker, share: Share,
                    loop: LoopView | None) -> Iterator[Any]:
        slots = self._dealt_slots(tracker.pending, tracker.layout)
        return self._read(self.order(slots), tracker, tracker.rank)

    def _read(self, order: MixOrder, tracker: _state.SlotTracker, rank: int) -> Iterator[Any]:
        src, items, _ = order.take(tracker.indices)
        opened = [iter(()) if s in self._unread else
                  iter(ds.iter_rows(items[src == s], rank, sharers=len(self.datasets)))
                  for s, ds in enumerate(self.datasets)]
        # The source's iterator for each position, advanced from C (map(next)):
        # no Python frame of the mix's own between the consumer and the source.
        ordered = [opened[s] for s in src.tolist()]
        try:
            yield from tracker.count(map(next, ordered))
        finally:
            for it in opened:
                close = getattr(it, "close", None)
                if close is not None:
                    close()
        tracker.end()
