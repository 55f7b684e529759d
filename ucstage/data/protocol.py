"""What the sharded datasets need of the values they are built from: a frozen
listing as the loader reads it (:class:`Listing`), and a source of a
:class:`~ucstage.Mix` (:class:`MixSource`). The datasets themselves share
one base, :class:`~ucstage.data.sharded.ShardedDataset`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..cache import LocalCache
    from ..sharding import ReadOrder

__all__ = ["Listing", "MixSource"]


class Listing(Protocol):
    """What the loader reads of a frozen listing (a :class:`~ucstage.Manifest`, a
    row-group manifest, or a mix's positions): its fingerprint, its length, sizes."""

    @property
    def fingerprint(self) -> str: ...

    def __len__(self) -> int: ...

    def sizes(self) -> Any: ...

    @property
    def entries(self) -> Any: ...


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
