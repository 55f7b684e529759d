"""What the DataLoader needs of a dataset that shards itself by the slot rule.

The loader's guard, checkpoint state, exactly-once audit and holds work
through :class:`ShardedDataset`, never through :class:`VolumeDataset`
itself, so every sharded dataset (a volume's files, a table's row groups,
a mix of them) plugs into the same loader.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..cache import LocalCache
    from ..sharding import Layout, ReadOrder, World

__all__ = ["Listing", "MixSource", "ShardedDataset"]


class Listing(Protocol):
    """What the loader reads of a frozen listing (a :class:`~ucstage.Manifest`, a
    row-group manifest, or a mix's positions): its fingerprint, its length, sizes."""

    @property
    def fingerprint(self) -> str: ...

    def __len__(self) -> int: ...

    def sizes(self) -> Any: ...

    @property
    def entries(self) -> Any: ...

    @property
    def groups(self) -> Any:
        """Sample boundaries (``Groups``) of files grouped into samples, else None."""


class ShardedDataset(Protocol):
    """A dataset sharded over ranks x DataLoader workers by the slot rule."""

    epoch: int
    """The epoch whose read order it deals (:meth:`set_epoch`)."""
    num_workers: int
    """The DataLoader ``num_workers`` the main process assumes."""

    @property
    def read_ahead(self) -> int | str:
        """Items fetched ahead of the consumer in each slot, or ``"auto"``."""

    run: str
    """The job its cache counters belong to."""
    shuffle: bool
    seed: int
    shuffle_scope: str
    equal_length: str | None
    # The loader's checkpoint bookkeeping (data/state.py) kept on the dataset:
    # a loaded state waiting for the next iteration, this process's slot
    # tracker, and the main process's LoaderProgress.
    _resume: Any
    _tracker: Any
    _progress: Any
    _epoch_link: Any
    """Where a worker reads each epoch's parameters (data/epochrecord.py)."""

    @property
    def fingerprint(self) -> str | None:
        """The frozen listing's fingerprint, or None before :meth:`freeze`."""

    def freeze(self, *, broadcast: bool | None = None) -> Listing:
        """Freeze the listing every rank shards (a collective when broadcasting):
        files (a Manifest), row groups (a RowGroupManifest) or a mix's positions."""

    def read_order(self) -> ReadOrder:
        """This epoch's read order over the frozen listing."""

    def ranks_per_node(self, world_size: int) -> int | None:
        """The ``nproc_per_node`` it shards with in a job of ``world_size`` ranks
        (None: one node), checked against ``world_size``."""

    def nproc_setting(self, world_size: int) -> int | None:
        """:meth:`ranks_per_node` before the check (the guard compares it across ranks)."""

    def layout(self, world_size: int, num_workers: int) -> Layout:
        """The job's layout as this dataset shards it."""

    def world(self) -> World:
        """The calling process's rank, world size, worker and ``num_workers``."""

    def cache(self) -> LocalCache:
        """The local cache it reads through."""

    def _get_volume(self) -> Any:
        """The volume its files come from (the loader picks its workers' start by it)."""

    def __len__(self) -> int:
        """Items this process yields per epoch (a worker's slot, or the rank's slots)."""

    def set_epoch(self, epoch: int) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class MixSource(Protocol):
    """What :class:`ucstage.Mix` needs of each of its sources."""

    read_ahead: int | str
    run: str

    @property
    def fingerprint(self) -> str | None: ...

    def freeze(self, *, broadcast: bool | None = None) -> Any:
        """The frozen listing: ``len()`` items, a ``fingerprint`` (and ``sizes()``)."""

    def read_order(self) -> ReadOrder:
        """Its read order; ``n`` is its item count (files, samples, row groups)."""

    def iter_rows(self, rows: Any, rank: int, *, sharers: int = 1) -> Any:
        """The items at ``rows`` of its read order (an int array), in order,
        fetched and untracked (the mix tracks its own positions); ``sharers``:
        the sources whose readers share each worker (their read-ahead shares
        split the node's copies in flight among them)."""

    def cache(self) -> LocalCache: ...

    def _get_volume(self) -> Any: ...
