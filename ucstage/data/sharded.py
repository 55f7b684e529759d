"""The one base of every dataset sharded by the slot rule, and its link to the loader.

:class:`ShardedDataset` does what ``VolumeDataset``, ``TableDataset`` and
``Mix`` (its three kinds) do the same way: the slot rule's parameters,
checked once; its slot (rank, world size, workers) in the calling process,
its layout and ranks per node; its epoch and read order; its checkpoint
state through :mod:`ucstage.data.state`; and one ``__iter__`` that takes the
epoch's parameters from the loader, deals the slot its items, starts the
slot's tracker and asks the kind for what the slot yields
(:meth:`ShardedDataset._slot_items`). The ucstage DataLoader's guard, state,
audit and holds work through this class only, so every kind plugs into the
same loader.

:class:`LoaderLink` is what passes between a dataset and the ucstage
DataLoader running it: a loaded state waiting for the next iteration, this
process's slot tracker and the rank's delivery progress, and the link to
the channel its workers read each epoch's parameters and the loop's
position from (:mod:`ucstage.data.channel`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch.utils.data as tud

from .. import params
from ..cache.runstats import job_id
from ..errors import InvalidArgument
from ..sharding import Layout, ReadOrder, Slot, World, rank_length, slot_length
from ..sharding.rule import SlotRule, layout_of
from . import channel, slotread
from . import state as _state

if TYPE_CHECKING:
    from ..cache import LocalCache
    from ..resume import LoaderState
    from .channel import Board, ChannelLink, LoopView
    from .frozen import Listing

__all__ = ["DEFAULT_NUM_WORKERS", "LoaderLink", "ShardedDataset",
           "equal_mode", "rule_order"]

DEFAULT_NUM_WORKERS = 6
"""The ucstage DataLoader's default ``num_workers``. A constant, never the
machine's CPU count: every rank must shard with the same value."""


def equal_mode(value: bool | str | None) -> str | None:
    """The public ``equal_length`` (False, True, "pad" or "drop") as a read order's
    mode; :class:`~ucstage.sharding.ReadOrder` checks the mode's name."""
    if value is None or value is False:
        return None
    if value is True:
        return "pad"
    if isinstance(value, str):
        return value
    raise InvalidArgument(
        f"equal_length must be False, True, 'pad' or 'drop', got {value!r}")


def rule_order(shuffle: bool, seed: int, shuffle_scope: str,
               equal_length: bool | str | None) -> ReadOrder:
    """A dataset's slot-rule parameters as given, checked once, by the value
    that holds them: a read order of no items yet (the listing's size, the
    epoch and the world size come later)."""
    return ReadOrder(0, bool(shuffle), params.whole(seed, "seed", minimum=None), 0,
                     equal_mode(equal_length), shuffle_scope)


class LoaderLink:
    """What a dataset and the ucstage DataLoader running it pass each other
    (see the module docstring); one per dataset, in each process."""

    __slots__ = ("board", "channel", "progress", "resume", "tracker")

    def __init__(self, resume: LoaderState | None = None,
                 channel: ChannelLink | None = None) -> None:
        self.resume = resume
        """A loaded state, applied by the next iteration of this process (data/state.py)."""
        self.tracker: _state.SlotTracker | None = None
        """This process's slot iteration: what it handed out."""
        self.progress: _state.LoaderProgress | None = None
        """The main process's deliveries of the rank's slots this epoch."""
        self.channel = channel
        """Where a DataLoader worker reads each epoch's parameters and how far
        the loader's loop is (data/channel.py)."""
        self.board: Board | None = None
        """The loop's board of a loader without workers, taken by the next
        slot iterator of this process (never pickled)."""

    def carried(self) -> LoaderLink:
        """The link a pickled (or copied) dataset takes along: the tracker and
        the progress are this process's own."""
        return LoaderLink(self.resume, self.channel)


class ShardedDataset(tud.IterableDataset):  # type: ignore[type-arg]
    """The base of the sharded datasets (see the module docstring).

    A kind gives its listing (:meth:`freeze`, ``fingerprint``), its item
    count (:meth:`_item_count`), its cache and volume, and what a slot
    yields (:meth:`_slot_items`); it may change the slot's tracker
    (:attr:`tracker_kind`) and whether the read order pads or drops items
    (:attr:`pads_items`).
    """

    num_workers: int = DEFAULT_NUM_WORKERS
    """The DataLoader ``num_workers`` that ``len()`` assumes in the main
    process: the ucstage DataLoader sets it to its own; with torch's
    DataLoader, set it to the value you pass there."""
    tracker_kind: type[_state.SlotTracker] = _state.SlotTracker
    """Counts what a slot's iterator hands out (a table's counts rows too)."""
    pads_items = True
    """The read order pads or drops items by ``equal_length`` (a kind whose
    items hold units deals them whole, and evens out its units instead)."""
    _UNPICKLED = ("_cache", "_manifest", "_volume", "_bound")
    """Rebuilt on demand in each process, never pickled."""

    read_ahead: int | str
    """Items fetched ahead of the consumer in each slot, or ``"auto"``."""
    _fingerprint: str | None

    def __init__(self, rule: ReadOrder, nproc_per_node: int | None) -> None:
        """``rule``: the slot rule's parameters (:func:`rule_order`)."""
        super().__init__()
        Layout.one_node(nproc_per_node)  # checked before the world size is known
        self.shuffle, self.seed = rule.shuffle, rule.seed
        self.shuffle_scope, self.equal_length = rule.shuffle_scope, rule.equal_length
        self.nproc_per_node = nproc_per_node
        self.epoch = 0
        self.run = job_id()
        """The run its cache counters belong to (``cache status``'s last run)."""
        self._dist_rank_world: tuple[int, int] | None = None
        self._link = LoaderLink()

    # -- what a kind gives -------------------------------------------------------

    def freeze(self, *, broadcast: bool | None = None) -> Listing:
        """Freeze the listing every rank shards (a collective when broadcasting)."""
        raise NotImplementedError

    def _get_volume(self) -> Any:
        """The volume its items come from (the loader picks its workers' start by it)."""
        raise NotImplementedError

    def _item_count(self) -> int:
        """Items the slot rule deals (freezes the listing)."""
        raise NotImplementedError

    def _slot_items(self, tracker: _state.SlotTracker, share: slotread.Share,
                    loop: LoopView | None) -> Iterator[Any]:
        """What the slot yields, its items (``tracker.indices`` from
        ``tracker.start``) counted by ``tracker``; ``share`` of the node's
        copies in flight, holds following ``loop``."""
        raise NotImplementedError

    # -- the cache -------------------------------------------------------------

    _cache: LocalCache | None
    _cache_dir: str | None
    _max_bytes: int | None

    def _use_cache(self, cache: LocalCache | None, cache_dir: str | os.PathLike[str] | None,
                   max_bytes: int | str | None) -> None:
        """The cache it copies into: ``cache``, or one built on first use at
        ``cache_dir`` with ``max_bytes``."""
        if cache is not None and cache_dir is not None:
            raise InvalidArgument("pass cache or cache_dir, not both")
        self._cache = cache
        self._cache_dir = os.fspath(cache_dir) if cache_dir is not None else None
        self._max_bytes = None if max_bytes is None else params.size(max_bytes, "max_bytes")
        if cache is not None:
            self._cache_dir = str(cache.root)
            self._max_bytes = cache.max_bytes

    def cache(self) -> LocalCache:
        """The local cache this dataset copies into (built on first use)."""
        if self._cache is None:
            from ..cache import LocalCache

            self._cache = LocalCache(self._cache_dir, max_bytes=self._max_bytes)
            if self._cache_dir is None:
                self._cache_dir = str(self._cache.root)
        return self._cache

    # -- state ---------------------------------------------------------------

    _source: str

    @property
    def fingerprint(self) -> str | None:
        """The frozen listing's fingerprint, or None before :meth:`freeze`."""
        return self._fingerprint

    @property
    def source(self) -> str:
        return self._source

    def _frozen(self, needs: str) -> None:
        """Refuse ``len()`` before the freeze, naming what it ``needs``.
        TypeError is what ``len()`` of a length-less object raises, so
        ``operator.length_hint`` and ``list()`` pass over it as they should."""
        if self._fingerprint is None:
            raise TypeError(f"len({type(self).__name__}) needs {needs}: call freeze() first "
                            "(the ucstage DataLoader does it before its workers start), "
                            "or iterate once")

    def _repr(self, details: str) -> str:
        """``Name(source, details..., epoch=..., fingerprint=...)``, the one shape of a repr."""
        frozen = f"fingerprint={self._fingerprint[:12]}" if self._fingerprint else "not frozen"
        return f"{type(self).__name__}({self._source!r}, {details}, epoch={self.epoch}, {frozen})"

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for key in self._UNPICKLED:
            if key in state:
                state[key] = None
        state["_link"] = self._link.carried()
        # A spawned worker has no process group: give it this rank's view.
        world = self.world()
        state["_dist_rank_world"] = (world.rank, world.world_size)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def read_order(self) -> ReadOrder:
        """This epoch's read order over the frozen listing (freezes it)."""
        return ReadOrder(self._item_count(), self.shuffle, self.seed, self.epoch,
                         self.equal_length if self.pads_items else None, self.shuffle_scope)

    # -- iteration -----------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        # In a ucstage DataLoader's worker: this epoch's parameters, read from
        # the loader's per-epoch record (persistent workers hold an old copy).
        link = self._link
        record = channel.apply(self) if link.channel is not None else None
        if record is not None and record["stopped"]:
            return iter(())  # given up before this worker started it
        gen = record["gen"] if record is not None else None
        here = self.world()
        rank, world, num_workers, worker = here.rank, here.world_size, here.num_workers, here.worker
        self.freeze()
        # Under a ucstage DataLoader, holds last until its loop is past their batch.
        board, link.board = link.board, None  # the main process's, taken once
        loop = channel.view_for(board, link.channel, gen, worker) \
            if board is not None or link.channel is not None else None
        share = slotread.check_loader_window(self, self.cache(), num_workers,
                                             in_loop=loop.in_loop if loop is not None else 0)
        # The slot rule is checked once per layout and slot (SlotRule.of), not
        # per epoch: an epoch only deals it (what slot_array does).
        order = self.read_order()
        dealt = SlotRule.of(order, self.layout(world, num_workers), Slot(rank, worker)).array(order)
        # Checkpoint and resume (data/state.py): a resumed epoch reads the rest of
        # the slot, or its share of the re-split remainder; deliveries are counted.
        tracker = self.tracker_kind.begin(self, dealt, rank=rank, world_size=world,
                                          num_workers=num_workers, worker=worker)
        it = self._slot_items(tracker, share, loop)
        if record is not None and record["persistent"]:
            # A persistent worker outlives the epoch: a `break` must still end
            # its read-ahead and holds (the record marks the epoch stopped).
            assert link.channel is not None
            return channel.guarded(it, link.channel, record["gen"])
        return it

    def track_deliveries(self, progress: _state.LoaderProgress) -> None:
        """The loader's progress of the epoch about to start (data/state.py)."""
        self._link.progress = progress

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch's permutation (with ``shuffle``); call it on every rank.

        The ucstage DataLoader passes the epoch to its workers, persistent
        ones included, when the next epoch's iteration starts.
        """
        _state.on_set_epoch(self, int(epoch))
        self.epoch = int(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Where this epoch stands, as small JSON-serialisable data (no file list).

        In a DataLoader worker (torchdata's ``StatefulDataLoader`` calls it
        there) it is the worker's slot; in the main process of a ucstage
        ``DataLoader``, every slot of this rank, counting only files whose
        batch the loader returned. See docs/training.md, "Checkpoint and resume".
        """
        return _state.dataset_state(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the state's epoch at the next iteration (same or another layout).

        Raises:
            ResumeMismatch: the state is for another listing, seed, shuffle or
                equal_length.
        """
        _state.load(self, state)

    if TYPE_CHECKING:
        def __len__(self) -> int:
            """Each kind's own (the base has none: ``len()`` of a kind without one raises)."""

    def __bool__(self) -> bool:
        # Without this, `dataset or default` would call __len__ (and raise
        # before freezing, or be False for an empty slot).
        return True

    def rule_length(self) -> int:
        """Items the slot rule gives this process per epoch over ``read_order()``:
        a worker's slot, or the rank's slots in the main process (for its
        ``num_workers``)."""
        world = self.world()
        order = self.read_order()
        if world.in_worker:
            layout = self.layout(world.world_size, world.num_workers)
            return slot_length(order, layout, layout.slot(world.rank, world.worker))
        return rank_length(order, self.layout(world.world_size, self.num_workers), world.rank)

    def world(self) -> World:
        """The calling process's rank, world size, worker and ``num_workers``
        (:meth:`ucstage.sharding.World.detect`; in a spawned worker, the rank's
        view this dataset was pickled with)."""
        return World.detect(self._dist_rank_world)

    def ranks_per_node(self, world_size: int) -> int | None:
        """The ``nproc_per_node`` this dataset shards with in a job of
        ``world_size`` ranks: the one given, else ``$LOCAL_WORLD_SIZE`` when
        the job has several ranks, else None (one node).

        Raises:
            InvalidArgument: ``world_size`` is not a multiple of it.
        """
        return self.layout(world_size, 0).nproc_per_node

    def layout(self, world_size: int, num_workers: int) -> Layout:
        """The layout of a job of ``world_size`` ranks with ``num_workers`` workers
        each, as this dataset shards it (its ranks per node: :meth:`ranks_per_node`).

        Raises:
            InvalidArgument: ``world_size`` is not a multiple of its ranks per node.
        """
        return layout_of(world_size, num_workers, self.nproc_setting(world_size))

    def nproc_setting(self, world_size: int) -> int | None:
        """:meth:`ranks_per_node` without checking it against ``world_size`` (the
        DataLoader's guard compares it across ranks first)."""
        if self.nproc_per_node is None and world_size > 1:
            return World.detect().local_ranks
        return self.nproc_per_node
