"""The types the loader's machinery reads, in a module of their own so that
the modules implementing the one base (:mod:`ucstage.data.sharded`) and the
modules it uses (state, holds, the table's tracker) import no cycle: a frozen
listing as the loader reads it (:class:`Listing`), a sharded dataset as they
see it (:class:`Sharded`, what :class:`~ucstage.data.sharded.ShardedDataset`
is), and a source of a :class:`~ucstage.Mix` (:class:`MixSource`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..cache import LocalCache
    from ..sharding import Layout, ReadOrder, World

__all__ = ["Listing", "MixSource", "Sharded"]


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


class Sharded(Protocol):
    """A dataset sharded over ranks x DataLoader workers by the slot rule, as
    the state, the holds and the audit read it (documented on
    :class:`~ucstage.data.sharded.ShardedDataset`)."""

    epoch: int
    num_workers: int
    run: str
    shuffle: bool
    seed: int
    shuffle_scope: str
    equal_length: str | None
    _link: Any
    """Its :class:`~ucstage.data.sharded.LoaderLink`."""

    @property
    def read_ahead(self) -> int | str: ...

    @property
    def fingerprint(self) -> str | None: ...

    def freeze(self, *, broadcast: bool | None = None) -> Listing: ...

    def read_order(self) -> ReadOrder: ...

    def nproc_setting(self, world_size: int) -> int | None: ...

    def layout(self, world_size: int, num_workers: int) -> Layout: ...

    def world(self) -> World: ...

    def cache(self) -> LocalCache: ...

    def _get_volume(self) -> Any: ...

    def track_deliveries(self, progress: Any) -> None: ...


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
        """Its read order; ``n`` is its item count (files, samples, row groups),
        unless it has ``mix_items()`` (``ShardDataset``: the slot rule deals
        blocks, the mix deals samples)."""

    def iter_rows(self, rows: Any, rank: int, *, sharers: int = 1) -> Any:
        """The items at ``rows`` of its read order (an int array), in order,
        fetched and untracked (the mix tracks its own positions); ``sharers``:
        the sources whose readers share each worker (their read-ahead shares
        split the node's copies in flight among them)."""

    def cache(self) -> LocalCache: ...

    def _get_volume(self) -> Any: ...
