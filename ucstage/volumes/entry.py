"""One listed file (:class:`FileEntry`) and its change marker (:func:`version_of`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

__all__ = ["FileEntry", "version_of"]

# Keys fsspec backends use for a change marker, best first. An ETag or checksum
# changes with the content; an mtime is what local and FUSE files have.
_VERSION_KEYS = ("ETag", "etag", "md5Hash", "md5", "crc32c", "mtime", "LastModified",
                 "last_modified", "updated", "created")


class FileEntry(NamedTuple):
    """One listed file. A NamedTuple keeps a million of them small."""

    path: str
    """Path relative to the source root, POSIX separators."""
    size: int
    """Size in bytes."""
    version: str
    """A change marker: ETag where the store has one, else the mtime."""



def version_of(info: dict[str, Any]) -> str:
    """A file's change marker from an fsspec ``info`` dict: the first of
    :data:`_VERSION_KEYS` present (ETag or hash on object stores, the mtime on
    local folders and mounts), as a string; ``""`` when there is none. The
    listing and the cache's copy both use it, so a copied file's stamp and its
    listing entry always agree."""
    for key in _VERSION_KEYS:
        value = info.get(key)
        if value is None or value == "":
            continue
        if isinstance(value, datetime):
            return value.isoformat()
        if isinstance(value, float):
            return repr(value)
        return str(value).strip('"')
    return ""

