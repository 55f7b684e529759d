"""What every dataset sharded by the slot rule does the same way: the calling
process's :class:`~ucstage.sharding.World` (rank, world size, worker), its
layout and ranks per node, its epoch, and its checkpoint state through
:mod:`ucstage.data.state`.

:class:`SlotRule` is the mixin ``VolumeDataset`` and ``TableDataset`` share,
so the rank guard, the state and the audit see one behaviour.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import InvalidArgument
from ..sharding import Layout, World, rank_length, slot_length
from . import state as _state

if TYPE_CHECKING:
    from ..cache import LocalCache

__all__ = ["SlotRule", "equal_mode"]


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


class SlotRule:
    """The slot-rule half of a sharded dataset (see the module docstring)."""

    epoch: int
    nproc_per_node: int | None
    _dist_rank_world: tuple[int, int] | None
    _UNPICKLED = ("_cache", "_manifest", "_volume", "_tracker", "_progress")
    """Rebuilt on demand in each process, never pickled."""

    _source: str
    _fingerprint: str | None
    _cache: Any
    _cache_dir: str | None
    _max_bytes: int | None

    @property
    def fingerprint(self) -> str | None:
        """The frozen listing's fingerprint, or None before :meth:`freeze`."""
        return self._fingerprint

    @property
    def source(self) -> str:
        return self._source

    def cache(self) -> LocalCache:
        """The local cache this dataset copies into (built on first use)."""
        if self._cache is None:
            from ..cache import LocalCache

            self._cache = LocalCache(self._cache_dir, max_bytes=self._max_bytes)
            if self._cache_dir is None:
                self._cache_dir = str(getattr(self._cache, "root", "")) or None
        return self._cache  # type: ignore[no-any-return]

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for key in self._UNPICKLED:
            if key in state:
                state[key] = None
        # A spawned worker has no process group: give it this rank's view.
        world = self.world()
        state["_dist_rank_world"] = (world.rank, world.world_size)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch's permutation (with ``shuffle``); call it on every rank.

        The ucstage DataLoader passes the epoch to its workers, persistent
        ones included, when the next epoch's iteration starts.
        """
        _state.on_set_epoch(self, int(epoch))  # type: ignore[arg-type]
        self.epoch = int(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Where this epoch stands, as small JSON-serialisable data (no file list).

        In a DataLoader worker (torchdata's ``StatefulDataLoader`` calls it
        there) it is the worker's slot; in the main process of a ucstage
        ``DataLoader``, every slot of this rank, counting only files whose
        batch the loader returned. See docs/training.md, "Checkpoint and resume".
        """
        return _state.dataset_state(self)  # type: ignore[arg-type]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the state's epoch at the next iteration (same or another layout).

        Raises:
            ResumeMismatch: the state is for another listing, seed, shuffle or
                equal_length.
        """
        _state.load(self, state)  # type: ignore[arg-type]

    def __bool__(self) -> bool:
        # Without this, `dataset or default` would call __len__ (and raise
        # before freezing, or be False for an empty slot).
        return True

    def rule_length(self) -> int:
        """Items the slot rule gives this process per epoch over ``read_order()``:
        a worker's slot, or the rank's slots in the main process (for its
        ``num_workers``)."""
        world = self.world()
        order = self.read_order()  # type: ignore[attr-defined]
        if world.in_worker:
            layout = self.layout(world.world_size, world.num_workers)
            return slot_length(order, layout, layout.slot(world.rank, world.worker))
        layout = self.layout(world.world_size, self.num_workers)  # type: ignore[attr-defined]
        return rank_length(order, layout, world.rank)

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
        return Layout(world_size, num_workers, self.nproc_setting(world_size))

    def nproc_setting(self, world_size: int) -> int | None:
        """:meth:`ranks_per_node` without checking it against ``world_size`` (the
        DataLoader's guard compares it across ranks first)."""
        if self.nproc_per_node is None and world_size > 1:
            return World.detect().local_ranks
        return self.nproc_per_node
