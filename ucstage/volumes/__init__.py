"""Volumes: resolve a source to a :class:`Volume`, and list it.

Two concepts, one module each: :mod:`~ucstage.volumes.location` resolves a
SOURCE string (``/Volumes/...``, ``dbfs:/Volumes/...``, an fsspec URL, a local
path) to a filesystem and root; :mod:`~ucstage.volumes.listing` lists a
volume deterministically (:func:`list_files`), over the parallel walk of
:mod:`~ucstage.volumes.walk`. A listed file is a :class:`FileEntry`
(:mod:`~ucstage.volumes.entry`). Whether a SOURCE names a volume at all or a
manifest file is decided once, by :func:`ucstage.source.open_source`.

The names other packages and users import are re-exported here; the rest
is imported from its module.
"""

from __future__ import annotations

from .entry import RANGES_DIR, FileEntry, RangeEntry, is_range_path, version_of
from .listing import list_files
from .location import VOLUMES_ROOT_ENV, Volume, is_volumes_path, resolve, safe_relpath

__all__ = [
    "RANGES_DIR",
    "VOLUMES_ROOT_ENV",
    "FileEntry",
    "RangeEntry",
    "Volume",
    "is_range_path",
    "is_volumes_path",
    "list_files",
    "resolve",
    "safe_relpath",
    "version_of",
]
