"""The manifest model: a frozen listing (:class:`Manifest`) and its
:func:`fingerprint`.

Every rank of a job can shard the same manifest while the volume changes
underneath. The fingerprint is the SHA-256 of the canonical listing (one
``path NUL size NUL version LF`` record per file, in listing order); it does
not depend on where the source is mounted, so ranks on different nodes agree.
The files it is saved to and loaded from: :mod:`ucstage.manifest.files`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ..errors import InvalidArgument
from ..volumes.entry import FileEntry
from ..volumes.listing import Listing
from ..volumes.location import Volume, is_volumes_path, resolve
from . import columns
from .columns import ArrowEntries
from .groups import Grouped, Grouping, Groups, combined_fingerprint, group_paths

if TYPE_CHECKING:
    import numpy as np

__all__ = ["FORMAT", "FORMAT_VERSION", "Manifest", "fingerprint", "group_manifest"]

FORMAT = "ucstage.manifest"
FORMAT_VERSION = 1


def fingerprint(entries: Iterable[FileEntry]) -> str:
    """SHA-256 hex digest of the canonical form of a listing."""
    if isinstance(entries, ArrowEntries):
        # Through the module, so that a test's stand-in sees every full pass.
        return columns.arrow_fingerprint(entries.table.to_batches())
    digest = hashlib.sha256()
    for path, size, version in entries:
        digest.update(f"{path}\0{size}\0{version}\n".encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class Manifest:
    """A frozen, fingerprinted listing of a source."""

    source: str
    """Where the files live: a ``/Volumes/...`` path (re-resolved on each node)
    or an absolute path or URL."""
    entries: Sequence[FileEntry]
    """The files in listing order: a list, or for a columnar manifest an
    :class:`ArrowEntries` that makes a :class:`FileEntry` per access."""
    fingerprint: str
    created: str = ""
    filters: dict[str, Any] = field(default_factory=dict)
    path: str | None = None
    """The manifest file this was loaded from, if any."""
    refused: Sequence[tuple[str, str]] = ()
    """(path, reason) of unsafe entries left out of a fresh listing."""
    unreadable: Sequence[tuple[str, str]] = ()
    """(folder, reason) of folders a fresh listing skipped because they could
    not be read (only with ``skip_unreadable``); paths relative to the source."""
    groups: Groups | None = None
    """Sample boundaries when the rows are grouped into samples
    (:func:`ucstage.manifest.groups.group_manifest`); the fingerprint then
    covers them too."""

    def computed_fingerprint(self) -> str:
        """The fingerprint recomputed from the rows (and the grouping)."""
        return combined_fingerprint(fingerprint(self.entries), self.groups)

    @property
    def total_bytes(self) -> int:
        if isinstance(self.entries, ArrowEntries):
            return int(self.entries.sizes().sum())
        return sum(e.size for e in self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def sizes(self) -> Sequence[int] | np.ndarray:
        """Every file's size in listing order: a numpy array for a columnar
        manifest (no per-file Python objects), else a list."""
        if isinstance(self.entries, ArrowEntries):
            return self.entries.sizes()
        return [e.size for e in self.entries]

    def take(self, indices: Sequence[int] | np.ndarray) -> list[FileEntry]:
        """The entries at ``indices``, making only those rows."""
        if isinstance(self.entries, ArrowEntries):
            return self.entries.take(indices)
        return [self.entries[int(i)] for i in indices]

    def paths(self, indices: Sequence[int] | np.ndarray | None = None) -> list[str]:
        """The relative paths at ``indices`` (None: every path, in listing order)."""
        if isinstance(self.entries, ArrowEntries):
            return self.entries.paths(indices)
        if indices is None:
            return [e.path for e in self.entries]
        return [self.entries[int(i)].path for i in indices]

    def volume(self) -> Volume:
        """Resolve the source for reading (on this node, with this node's env).

        A manifest made by a fresh listing in this process returns the volume
        that listing resolved moments ago: resolving again would ask the store
        (a HEAD and a LIST for an object-store prefix) once more on every
        command. A copy in another process (pickled, forked, loaded from a
        file) resolves afresh."""
        fresh = self.__dict__.get("_listed")
        if fresh is not None and fresh[0] == os.getpid():
            return fresh[1]  # type: ignore[no-any-return]
        return resolve(self.source)

    def __getstate__(self) -> dict[str, Any]:
        # The listing's volume belongs to this process (see volume()).
        return {k: v for k, v in self.__dict__.items() if k != "_listed"}

    @classmethod
    def from_listing(cls, listing: Listing, filters: dict[str, Any] | None = None) -> Manifest:
        """The manifest of a fresh listing; :meth:`volume` returns the
        listing's volume in this process, named as the manifest names its source."""
        vol = listing.volume
        # A /Volumes path is kept as given (each node maps it); anything else
        # is named by where it resolved (a relative path means nothing elsewhere).
        source = vol.source if is_volumes_path(vol.source) else vol.url
        manifest = cls(
            source=source,
            entries=listing.entries,
            fingerprint=fingerprint(listing.entries),
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            filters=dict(filters or {}),
            refused=list(listing.refused),
            unreadable=list(listing.unreadable),
        )
        # Remembered outside the dataclass's fields (see volume()).
        object.__setattr__(manifest, "_listed",
                           (os.getpid(), dataclasses.replace(vol, source=source)))
        return manifest

    def header(self) -> dict[str, Any]:
        """The manifest's fields without its files (both formats store them)."""
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "source": self.source,
            "created": self.created,
            "filters": self.filters,
            "fingerprint": self.fingerprint,
            "files_count": len(self.entries),
            "bytes": self.total_bytes,
            **({"grouping": self.groups.header()} if self.groups is not None else {}),
        }

    def to_json(self) -> dict[str, Any]:
        """The JSON manifest's document (docs/manifest.md)."""
        return {**self.header(), "files": [list(e) for e in self.entries]}


def group_manifest(manifest: Manifest, grouping: Grouping) -> tuple[Manifest, Grouped]:
    """``manifest`` grouped: its rows in sample order (incomplete samples left
    out), its :attr:`~ucstage.manifest.Manifest.groups` set and its
    fingerprint covering both; and what :func:`group_paths` found."""
    if manifest.groups is not None:
        raise InvalidArgument("this manifest is already grouped into samples")
    table = columns.table(manifest.entries).select([0, 1, 2])
    found = group_paths(table.column(0), grouping)
    rows_fingerprint = manifest.fingerprint
    if found.order is not None:
        table = table.take(found.order)
        rows_fingerprint = columns.arrow_fingerprint(table.to_batches())
    grouped = dataclasses.replace(
        manifest, entries=ArrowEntries(table), groups=found.groups, path=None,
        fingerprint=combined_fingerprint(rows_fingerprint, found.groups))
    listed = manifest.__dict__.get("_listed")
    if listed is not None:  # the fresh listing's volume (Manifest.volume)
        object.__setattr__(grouped, "_listed", listed)
    return grouped, found
