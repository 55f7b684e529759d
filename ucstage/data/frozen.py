"""The frozen-listing lifecycle of a sharded dataset: list once, freeze the
listing into a columnar manifest file under the cache root, and share it.

Every process opens the manifest file memory-mapped: a node holds one copy in
its page cache. The main process verifies its fingerprint once; workers check
only its header (fingerprint, row count, byte size). When
``torch.distributed`` is initialised, :meth:`FrozenListing.freeze` lists on
rank 0 only and broadcasts the manifest to the other ranks.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch.utils.data as tud

from .. import manifest as _manifest
from ..cache.paths import LISTINGS_DIR  # frozen listings live in the cache's control folder
from ..errors import EmptySource, ManifestError, RankMismatch, UcstageError
from ..manifest import Manifest, group_manifest
from ..manifest.files import write
from ..manifest.groups import Grouping
from ..volumes import FileEntry, Volume
from ..volumes.listing import skip_messages
from . import dist as dist_

if TYPE_CHECKING:
    from ..cache import LocalCache

__all__ = ["FrozenListing", "broadcast_listing", "freeze_once"]

_log = logging.getLogger("ucstage")


class FrozenListing:
    """The listing half of :class:`~ucstage.data.dataset.VolumeDataset`: what it
    lists, where the frozen manifest lives, and the cache it lives in.

    Pickled state is the paths and the fingerprint only; the manifest, the
    volume and the cache are rebuilt on demand in each process.
    """

    _source: str
    include: tuple[str, ...]
    exclude: tuple[str, ...]
    include_hidden: bool
    skip_unreadable: bool
    _cache_dir: str | None
    _max_bytes: int | None
    _manifest_path: str | None
    _fingerprint: str | None
    _manifest_size: int | None
    _cache: LocalCache | None
    _manifest: Manifest | None
    _volume: Volume | None
    _grouping: Grouping | None = None
    listing_skipped: int = 0
    """Entries the fresh listing left out as unsafe (a name with a backslash, a
    broken link, a link leaving the source), each warned of once: counted in
    every epoch's audit (``AuditResult.skipped``); 0 for a given manifest."""

    if TYPE_CHECKING:
        def cache(self) -> LocalCache:
            """The dataset's cache (:class:`~ucstage.data.sharded.ShardedDataset`)."""

    def _manifest_file(self, fingerprint: str) -> str:
        root = getattr(self.cache(), "root", None)
        if not root:
            raise ManifestError("the cache has no root folder to keep the frozen listing in")
        return os.path.join(os.fspath(root), LISTINGS_DIR,
                            f"{fingerprint}{_manifest.ARROW_SUFFIX}")

    def _save_manifest(self, manifest: Manifest) -> None:
        path = self._manifest_file(manifest.fingerprint)
        if not os.path.exists(path):
            write(manifest, path, format="arrow")  # ucstage's own file: no user file to spare
        self._manifest_path = path
        self._manifest_size = os.path.getsize(path)

    def _adopt(self, manifest: Manifest) -> Manifest:
        # A fresh listing (here or broadcast from rank 0) knows what it left out.
        self.listing_skipped = len(manifest.refused)
        self._manifest = manifest
        self._fingerprint = manifest.fingerprint
        # A manifest broadcast from rank 0 names rank 0's file, which may not
        # exist on this node: keep a local copy then.
        if manifest.path is not None and os.path.exists(manifest.path):
            self._manifest_path = manifest.path
            self._manifest_size = os.path.getsize(manifest.path)
        elif not isinstance(manifest.entries, _manifest.ArrowEntries):
            # Swap the Python listing for the mapped columns just written: the
            # list is freed and workers forked later share the page cache.
            self._save_manifest(manifest)
            assert self._manifest_path is not None
            manifest = _manifest.load(self._manifest_path, verify=False,
                                      expect_fingerprint=manifest.fingerprint)
            self._manifest = manifest
        else:
            self._save_manifest(manifest)
        return manifest

    def _snapshot(self) -> Manifest:
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
                         self._source, self._grouping.label, ", ".join(found.unkeyed_examples))
        if found.groups.dropped:
            examples = "; ".join(f"{key} lacks {', '.join(missing)}"
                                 for key, missing in found.incomplete)
            _log.warning("dropped %d of %d samples of %s that lack a required member "
                         "(require=%s), e.g. %s", found.groups.dropped,
                         found.groups.dropped + found.groups.count, self._source,
                         list(self._grouping.require), examples)
        return grouped

    def _load_frozen(self) -> Manifest:
        assert self._manifest_path is not None and self._fingerprint is not None
        if os.path.exists(self._manifest_path):
            if tud.get_worker_info() is not None:
                # A worker: its main process verified this file; check the header only.
                loaded = _manifest.load(self._manifest_path, verify=False,
                                        expect_fingerprint=self._fingerprint,
                                        expect_size=self._manifest_size)
            else:
                loaded = _manifest.load(self._manifest_path)
        else:
            # Unpickled on another node: re-list and insist on the same listing.
            loaded = self._snapshot()
            self._save_manifest(loaded)
        if loaded.fingerprint != self._fingerprint:
            raise ManifestError(
                f"the listing of {self._source} changed since it was frozen "
                f"(fingerprint {loaded.fingerprint[:12]}, expected {self._fingerprint[:12]})",
                hint="freeze it into a manifest with `ucstage cache lazy` and pass that to every rank",
            )
        self._manifest = loaded
        return loaded

    def freeze(self, *, broadcast: bool | None = None) -> Manifest:
        """Freeze the listing (once) and return it; lists the source on first call.

        Args:
            broadcast: list on rank 0 only and send the listing to the other
                ranks through ``torch.distributed``. This is a collective:
                every rank must call it. The default does so when a process
                group is initialised and this is not a DataLoader worker; the
                ucstage DataLoader calls it on every rank for you.
        """
        grouping = self._grouping
        request = (self._source, self.include, self.exclude, self.include_hidden,
                   self.skip_unreadable,
                   None if grouping is None else (grouping.label, grouping.require,
                                                  grouping.on_incomplete))
        manifest: Manifest = freeze_once(self, broadcast, self._snapshot, request)
        return manifest

    def _entries(self) -> Sequence[FileEntry]:
        return self.freeze().entries

    def _get_volume(self) -> Volume:
        if self._volume is None:
            self._volume = self.freeze().volume()
        return self._volume


def freeze_once(ds: Any, broadcast: bool | None, listing: Any, request: tuple[Any, ...],
                **check: Any) -> Any:
    """The freeze lifecycle every sharded dataset shares: the frozen listing
    if there is one (``ds._manifest``, or the file ``ds._manifest_path``
    through ``ds._load_frozen()``), else ``listing()`` here or, when
    broadcasting, on rank 0 (:func:`broadcast_listing`, with ``check``),
    handed to ``ds._adopt``."""
    if ds._manifest is not None:
        return ds._manifest
    if ds._manifest_path is not None:
        return ds._load_frozen()
    dist = dist_.active()
    if broadcast is None:
        broadcast = dist is not None and tud.get_worker_info() is None
    if not broadcast or dist is None or dist.get_world_size() == 1:
        return ds._adopt(listing())
    return ds._adopt(broadcast_listing(dist, request, listing, **check))


def broadcast_listing(dist: Any, request: tuple[Any, ...], snapshot: Any,
                       check: Any = None, describe: Any = None) -> Any:
    """Rank 0 lists; every rank gets its manifest (or its error).

    Ranks first compare what they ask for (source and filters): a rank must
    not silently adopt a listing made with another rank's filters. ``check``
    (manifest -> its fingerprint holds) defaults to a file listing's;
    ``describe`` says a request in the mismatch message.
    """
    requests = dist_.all_gather(dist, request)
    if len(set(requests)) > 1:
        describe = describe or _describe_request
        values = "; ".join(f"rank {r}: {describe(q)}" for r, q in enumerate(requests))
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
    if check is None:
        def check(m: Any) -> bool:
            # The grouping is part of the fingerprint (manifest/groups.py).
            return bool(m.computed_fingerprint() == m.fingerprint)
    if not check(manifest):
        raise ManifestError("the listing broadcast from rank 0 fails its fingerprint check")
    return manifest


def _describe_request(request: tuple[Any, ...]) -> str:
    source, include, exclude, hidden, skip, grouping = request
    parts = [repr(source)]
    if include:
        parts.append(f"include={list(include)}")
    if exclude:
        parts.append(f"exclude={list(exclude)}")
    if hidden:
        parts.append("include_hidden=True")
    if skip:
        parts.append("skip_unreadable=True")
    if grouping is not None:
        parts.append(f"group={grouping[0]} require={list(grouping[1])} "
                     f"on_incomplete={grouping[2]}")
    return " ".join(parts)
