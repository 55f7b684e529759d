"""Volumes: resolve a source to a :class:`Volume`, and list it.

Two concepts, one module each: :mod:`~ucstage.volumes.location` resolves a
SOURCE string (``/Volumes/...``, ``dbfs:/Volumes/...``, an fsspec URL, a local
path) to a filesystem and root; :mod:`~ucstage.volumes.listing` lists a
volume deterministically (:func:`list_files`), over the parallel walk of
:mod:`~ucstage.volumes.walk`. A listed file is a :class:`FileEntry`
(:mod:`~ucstage.volumes.entry`). Whether a SOURCE names a volume at all or a
manifest file is decided once, by :func:`ucstage.source.open_source`.

Every name users import from ``ucstage.volumes`` is re-exported here.
"""

from __future__ import annotations

from ..errors import UnreadableFolders
from .entry import RANGES_DIR, FileEntry, RangeEntry, is_range_path, version_of
from .listing import Listing, list_files, matches
from .location import VOLUMES_ROOT_ENV, Volume, is_mapped, is_volumes_path, resolve, safe_relpath

# Readable here; the walk reads (and a test sets) ucstage.volumes.walk.LIST_THREADS.
from .walk import LIST_THREADS as LIST_THREADS

__all__ = [
    "RANGES_DIR",
    "VOLUMES_ROOT_ENV",
    "FileEntry",
    "Listing",
    "RangeEntry",
    "UnreadableFolders",
    "Volume",
    "is_mapped",
    "is_range_path",
    "is_volumes_path",
    "list_files",
    "matches",
    "resolve",
    "safe_relpath",
    "version_of",
]
