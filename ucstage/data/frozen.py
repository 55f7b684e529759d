"""The frozen-listing lifecycle of a sharded dataset: list once, freeze the
listing into a columnar manifest file under the cache root, and share it.

:class:`Freezable` is that lifecycle for either kind of listing (files for
:class:`~ucstage.data.dataset.VolumeDataset`, row groups for
:class:`~ucstage.data.table.TableDataset`); :class:`FrozenListing` is what a
VolumeDataset lists. Every process opens the manifest file memory-mapped: a
node holds one copy in its page cache. The main process verifies its
fingerprint once; workers check only its header (fingerprint, row count, byte
size). When ``torch.distributed`` is initialised, :meth:`Freezable.freeze`
lists on rank 0 only and broadcasts the manifest to the other ranks.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch
import torch.utils.data as tud

from .. import manifest as _manifest
from ..cache.paths import LISTINGS_DIR  # frozen listings live in the cache's control folder
from ..errors import EmptySource, ManifestError, RankMismatch, UcstageError
from ..manifest import Manifest, group_manifest
from ..manifest.files import write
from ..manifest.groups import Grouping
from ..manifest.model import Frozen
from ..shown import shown
from ..volumes import FileEntry, Volume
from ..volumes.listing import skip_messages

if TYPE_CHECKING:
    from ..cache import LocalCache
    from ..cache.fetch import Bound

__all__ = ["Freezable", "FrozenListing", "Listing", "active", "all_gather", "broadcast_listing"]

_log = logging.getLogger("ucstage")

Request = tuple[tuple[str, Any], ...]
"""What a rank asks to list: (name, value) pairs, the source first; ranks
compare them before adopting rank 0's listing."""


class Freezable:
    """The frozen listing of a sharded dataset, either kind: the manifest, the
    file it is frozen to under the cache root, its fingerprint and byte size.

    A dataset names its kind and says how to list afresh (:meth:`_list`) and
    what it asks for (:meth:`_request`); pickled state is the paths and the
    fingerprint only (the manifest is rebuilt on demand in each process).
    """

    _kind: ClassVar[type[Frozen]]
    """The kind of listing it freezes (``Manifest`` or ``RowGroupManifest``)."""
    _changed: ClassVar[str]
    """The message when a listing made again does not match (``{source}``;
    the two fingerprints are added)."""
    _freeze_hint: ClassVar[str]
    """How to freeze it once for every rank."""
    _source: str
    _manifest: Any
    _manifest_path: str | None
    _fingerprint: str | None
    _manifest_size: int | None = None

    if TYPE_CHECKING:
        def cache(self) -> LocalCache:
            """The dataset's cache (:class:`~ucstage.data.sharded.ShardedDataset`)."""

    def _list(self) -> Any:
        """A fresh listing of the source (on the rank that lists)."""
        raise NotImplementedError

    def _request(self) -> Request:
        raise NotImplementedError

    def _checked(self, manifest: Any) -> None:
        """Refuse a listing this dataset cannot read (before adopting it)."""

    def _manifest_file(self, fingerprint: str) -> str:
        root = getattr(self.cache(), "root", None)
        if not root:
            raise ManifestError("the cache has no root folder to keep the frozen listing in")
        return os.path.join(os.fspath(root), LISTINGS_DIR, f"{fingerprint}{self._kind.suffix}")

    def _save_manifest(self, manifest: Frozen) -> None:
        path = self._manifest_file(manifest.fingerprint)
        if not os.path.exists(path):
            write(manifest, path)  # ucstage's own file: no user file to spare
        self._manifest_path = path
        self._manifest_size = os.path.getsize(path)

    def _adopt(self, manifest: Any) -> Any:
        self._checked(manifest)
        self._manifest = manifest
        self._fingerprint = manifest.fingerprint
        # A manifest broadcast from rank 0 names rank 0's file, which may not
        # exist on this node: keep a local copy then.
        if manifest.path is not None and os.path.exists(manifest.path):
            self._manifest_path = manifest.path
            self._manifest_size = os.path.getsize(manifest.path)
        else:
            self._save_manifest(manifest)
        return manifest

    def _load_frozen(self) -> Any:
        assert self._manifest_path is not None and self._fingerprint is not None
        if os.path.exists(self._manifest_path):
            if tud.get_worker_info() is not None:
                # A worker: its main process verified this file; check the header only.
                loaded = _manifest.load(self._manifest_path, kind=self._kind, verify=False,
                                        expect_fingerprint=self._fingerprint,
                                        expect_size=self._manifest_size)
            else:
                loaded = _manifest.load(self._manifest_path, kind=self._kind)
        else:
            # Unpickled on another node: list again and insist on the same listing.
            loaded = self._list()
            self._save_manifest(loaded)
        if loaded.fingerprint != self._fingerprint:
            raise ManifestError(
                f"{self._changed.format(source=self._source)} (fingerprint "
                f"{loaded.fingerprint[:12]}, expected {self._fingerprint[:12]})",
                hint=self._freeze_hint)
        self._manifest = loaded
        return loaded

    def freeze(self, *, broadcast: bool | None = None) -> Any:
        """Freeze the listing (once) and return it; lists the source on first call.

        Args:
            broadcast: list on rank 0 only and send the listing to the other
                ranks through ``torch.distributed``. This is a collective:
                every rank must call it. The default does so when a process
                group is initialised and this is not a DataLoader worker; the
                ucstage DataLoader calls it on every rank for you.
        """
        if self._manifest is not None:
            return self._manifest
        if self._manifest_path is not None:
            return self._load_frozen()
        dist = active()
        if broadcast is None:
            broadcast = dist is not None and tud.get_worker_info() is None
        if not broadcast or dist is None or dist.get_world_size() == 1:
            return self._adopt(self._list())
        return self._adopt(broadcast_listing(dist, self._request(), self._list))


class FrozenListing(Freezable):
    """The listing half of :class:`~ucstage.data.dataset.VolumeDataset`: what
    it lists (a source's files, filtered, grouped into samples or not).

    The volume and the cache are rebuilt on demand in each process.
    """

    _kind = Manifest
    _changed = "the listing of {source} changed since it was frozen"
    _freeze_hint = ("freeze it into a manifest with `ucstage cache lazy` and pass that to "
                    "every rank")
    include: tuple[str, ...]
    exclude: tuple[str, ...]
    include_hidden: bool
    skip_unreadable: bool
    _cache_dir: str | None
    _max_bytes: int | None
    _cache: LocalCache | None
    _manifest: Manifest | None
    _bound: Bound | None
    """The cache bound to the listing's volume (:meth:`_bind`): what every
    epoch reads through, made once per process."""
    _grouping: Grouping | None = None
    listing_skipped: int = 0
    """Entries the fresh listing left out as unsafe (a name with a backslash, a
    broken link, a link leaving the source), each warned of once: counted in
    every epoch's audit (``AuditResult.skipped``); 0 for a given manifest."""

    def _adopt(self, manifest: Manifest) -> Manifest:
        # A fresh listing (here or broadcast from rank 0) knows what it left out.
        self.listing_skipped = len(manifest.refused)
        saved = manifest.path is None or not os.path.exists(manifest.path)
        manifest = super()._adopt(manifest)
        if saved and not isinstance(manifest.entries, _manifest.ArrowEntries):
            # Swap the Python listing for the mapped columns just written: the
            # list is freed and workers forked later share the page cache.
            assert self._manifest_path is not None
            manifest = _manifest.load(self._manifest_path, verify=False,
                                      expect_fingerprint=manifest.fingerprint
                                      ).with_listing_of(manifest)
            self._manifest = manifest
        return self._bind(manifest)

    def _load_frozen(self) -> Manifest:
        return self._bind(super()._load_frozen())

    def _bind(self, manifest: Manifest) -> Manifest:
        """Resolve the listing's volume and prepare its namespace in the cache,
        once per process as the listing is adopted: work of the listing, not
        of its first item (docs/design.md, "The read path of one item")."""
        self._bound = self.cache().at(manifest.volume())
        self._bound.prepare()
        return manifest

    def _request(self) -> Request:
        grouping = self._grouping
        return (("source", self._source), ("include", self.include),
                ("exclude", self.exclude), ("include_hidden", self.include_hidden),
                ("skip_unreadable", self.skip_unreadable),
                *(() if grouping is None else (("group", grouping.label),
                                               ("require", grouping.require),
                                               ("on_incomplete", grouping.on_incomplete))))

    def _list(self) -> Manifest:
        manifest = _manifest.snapshot(self._source, include=self.include, exclude=self.exclude,
                                      include_hidden=self.include_hidden,
                                      skip_unreadable=self.skip_unreadable)
        # What shard-plan prints, once per listing (on the rank that lists).
        for line in skip_messages(manifest.source, manifest.refused, manifest.unreadable):
            _log.warning("%s", line)
        if self._grouping is not None and manifest.groups is None:
            manifest = self._group(manifest)
        return manifest

    def _group(self, manifest: Manifest) -> Manifest:
        """The listing grouped into samples (frozen with the listing, on the
        rank that lists, so no worker regroups it); dropped samples warned of."""
        assert self._grouping is not None
        grouped, found = group_manifest(manifest, self._grouping)
        if found.unkeyed and found.unkeyed == len(manifest):
            raise EmptySource(f"group={self._grouping.label} returned None for every file of "
                              f"{self._source}: no file is part of a sample",
                              hint="return a key (a str) for the files of each sample; None "
                                   "leaves a file out")
        if found.unkeyed:
            _log.warning("left out %d of %d files of %s: group=%s returned None for them "
                         "(not part of any sample), e.g. %s", found.unkeyed, len(manifest),
                         shown(self._source), self._grouping.label,
                         shown(", ".join(found.unkeyed_examples)))
        if found.groups.dropped:
            examples = "; ".join(f"{key} lacks {', '.join(missing)}"
                                 for key, missing in found.incomplete)
            _log.warning("dropped %d of %d samples of %s that lack a required member "
                         "(require=%s), e.g. %s", found.groups.dropped,
                         found.groups.dropped + found.groups.count, shown(self._source),
                         list(self._grouping.require), shown(examples))
        return grouped

    def _entries(self) -> Sequence[FileEntry]:
        return self.freeze().entries

    def _namespace(self) -> Bound:
        """The cache bound to the listing's volume (frozen and bound first
        if it is not yet)."""
        if self._bound is None:  # a listing given as a Manifest: adopted as it is
            self._bind(self.freeze())
        assert self._bound is not None
        return self._bound

    def _get_volume(self) -> Volume:
        return self._namespace().volume


def broadcast_listing(dist: Any, request: Request, snapshot: Any) -> Any:
    """Rank 0 lists; every rank gets its manifest (or its error).

    Ranks first compare what they ask for (source and filters): a rank must
    not silently adopt a listing made with another rank's filters.
    """
    requests = all_gather(dist, request)
    if len(set(requests)) > 1:
        values = "; ".join(f"rank {r}: {_describe(q)}" for r, q in enumerate(requests))
        raise RankMismatch(
            f"ranks ask for different listings ({values})",
            hint="pass the same source, include/exclude and group on every rank",
        )
    payload: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            payload[0] = ("ok", snapshot())
        except UcstageError as exc:
            payload[0] = ("error", type(exc).__name__, exc.message, exc.hint)
        except Exception as exc:
            payload[0] = ("error", "UcstageError", f"listing failed on rank 0: {exc!r}", "")
    dist.broadcast_object_list(payload, src=0)
    result = payload[0]
    if result[0] == "error":
        from .. import errors

        cls = getattr(errors, result[1], UcstageError)
        raise cls(result[2], result[3])
    manifest = result[1]
    if not manifest.intact():
        raise ManifestError("the listing broadcast from rank 0 fails its fingerprint check")
    return manifest


def _describe(request: Request) -> str:
    """A request as the mismatch message says it: the source, then what was set."""
    (_, source), *rest = request
    parts = [repr(source)]
    for name, value in rest:
        if value is not None and value is not False and value != ():
            parts.append(f"{name}={list(value) if isinstance(value, tuple) else value}")
    return " ".join(parts)


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


# -- the two torch.distributed calls of the collectives (the listing's broadcast,
# the loader's guard, the state's check); the rank and world size themselves
# are read by ucstage.sharding.World.detect.


def active() -> Any | None:
    """``torch.distributed`` when a process group is initialised, else None."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist
    return None


def all_gather(dist: Any, value: Any) -> list[Any]:
    """Every rank's ``value``, indexed by rank (a collective: every rank must call it)."""
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out
