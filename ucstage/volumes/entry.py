"""One listed file (:class:`FileEntry`) and its change marker (:func:`version_of`)."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from typing import Any, NamedTuple

__all__ = ["NAME_MAX", "PART_SUFFIX", "PLAIN", "RANGES_DIR", "FileEntry", "RangeEntry",
           "is_range_path", "local_version", "part_stripe", "uncacheable", "version_of"]

RANGES_DIR = ".ucstage-ranges"
"""The top folder of a namespace that holds byte-range entries (row groups of
a table): ``.ucstage-ranges/<file's path>/<name>``. A listed file under it is
refused by the cache, so a whole file can never take a range entry's place."""
PART_SUFFIX = ".ucstage-part"
"""How the cache's temp files end (``.NNNN.<name>.ucstage-part``, NNNN the
lock stripe; named in :mod:`ucstage.cache.paths`)."""
NAME_MAX = 255
"""Bytes a file or folder name may have on the cache's file system (Linux's
``NAME_MAX``): a longer segment cannot be a cache entry."""
CANNOT_HOLD = "the cache cannot hold it"
"""How every reason of :func:`uncacheable` begins (and the listing's folder rule)."""

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
"""Control characters: obstore cannot GET a key holding one (its paths refuse
them), so no engine lists one, and the engines list a source alike."""

_NAME = r"[\x20-\x2d\x30-\x5b\x5d-\x7e][\x20-\x2e\x30-\x5b\x5d-\x7e]{0,254}"
PLAIN = re.compile(f"(?:{_NAME}/)*{_NAME}")
"""A relative path of plain names, each of 1 to :data:`NAME_MAX` printable
ASCII characters without ``/`` or ``\\``, none starting with ``.``: what
almost every listed path is. ``PLAIN.fullmatch(path)`` vouches at C speed
that the path is safe (:func:`~ucstage.volumes.location.safe_relpath`) and
cacheable (:func:`uncacheable`); a path it does not match goes through those
checks in full, which alone decide (a copy and a source path run this
screen first)."""

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


class RangeEntry(NamedTuple):
    """Byte ranges of one listed file, cached as an entry of their own (the
    chunks of one Parquet row group); read like a :class:`FileEntry`."""

    path: str
    """Where the entry lives in the cache namespace: ``RANGES_DIR/<source>/<name>``."""
    size: int
    """The ranges' total bytes (the entry's size)."""
    version: str
    """The source file's change marker (the entry is stale when the file changes)."""
    source: str
    """The file's path relative to the source root."""
    ranges: tuple[tuple[int, int], ...]
    """(offset, length) in the file, in the order the entry holds them."""
    parquet: bool = True
    """The ranges are Parquet column chunks, whose pages' CRCs the copy
    checks. False for other bytes (a checkpoint's items, which their reader
    checks against its own record): walking them as pages would fail and
    read each range twice."""

    @classmethod
    def of(cls, entry: FileEntry, name: str, ranges: tuple[tuple[int, int], ...],
           *, parquet: bool = True) -> RangeEntry:
        return cls(f"{RANGES_DIR}/{entry.path}/{name}", sum(n for _, n in ranges),
                   entry.version, entry.path, ranges, parquet)


def is_range_path(relpath: str) -> bool:
    """Whether a namespace path is under :data:`RANGES_DIR`."""
    return relpath == RANGES_DIR or relpath.startswith(RANGES_DIR + "/")


def part_stripe(name: str) -> int | None:
    """The stripe number in a cache temp file's name, or None if ``name`` is not one."""
    if not (name.startswith(".") and name.endswith(PART_SUFFIX)) or name[5:6] != ".":
        return None
    digits = name[1:5]
    return int(digits) if digits.isdigit() else None


def uncacheable(relpath: str) -> str | None:
    """Why a source file at ``relpath`` (a safe relative path) can never be
    cached, or None: a control character in it (``\\r``, ``\\n``, ``\\t``,
    ``ESC``: no engine can read every such key), a segment over
    :data:`NAME_MAX` bytes (no file system takes it), a name like a cache
    temp file (the cache's sweep would take it for a dead copy), or a place
    under the cache's byte-range folder. The listing refuses them (warned,
    counted, in ``--json``) and the cache refuses them again, for good (a
    permanent error, never retried). A file that is also a folder of other
    listed files (``d`` beside ``d/e``) is the listing's rule: it needs the
    whole listing."""
    # isprintable() is the fast test (C, no regex) a usual path passes.
    if not relpath.isprintable() and _CONTROL.search(relpath) is not None:
        return f"{CANNOT_HOLD}: a control character in its name"
    # Split only a path that could hold a long segment: 63 characters are at
    # most 252 bytes in UTF-8, and an ASCII path's bytes are its characters.
    if len(relpath) > NAME_MAX // 4 and (len(relpath) > NAME_MAX or not relpath.isascii()):
        longest = max(len(part.encode("utf-8", "surrogateescape"))
                      for part in relpath.split("/"))
        if longest > NAME_MAX:
            return f"{CANNOT_HOLD}: a name of {longest} bytes (at most {NAME_MAX})"
    if not relpath.startswith(".") and "/." not in relpath:
        return None  # the cache's own names all start with "."
    if part_stripe(relpath.rsplit("/", 1)[-1]) is not None:
        return f"{CANNOT_HOLD}: the name looks like one of ucstage's temp files"
    if is_range_path(relpath):
        return f"{CANNOT_HOLD}: the folder is where ucstage keeps byte-range entries"
    return None


local_version: Callable[[float], str] = repr
"""The change marker of a local file (a folder's, a mount's) of mtime
``mtime`` (``st_mtime``): its ``repr``, what :func:`version_of` gives of
``{"mtime": mtime}``, without its search for an object store's keys. The
local listing (once per file) and the local engine's copy both use it: the
builtin itself, so neither pays a Python call for it."""


def version_of(info: dict[str, Any]) -> str:
    """A file's change marker from an fsspec ``info`` dict: the first of
    :data:`_VERSION_KEYS` present (ETag or hash on object stores, the mtime on
    local folders and mounts), as a string; ``""`` when there is none. The
    listing and the cache's copy both use it, so a copied file's stamp and its
    listing entry always agree. GCS and Azure infos (gcsfs, adlfs) give
    :func:`ucstage.cloudfs.version`: the generation or ETag with the stored
    checksum, as the obstore engine lists them."""
    from ..cloudfs import version

    cloud = version(info)
    if cloud:
        return cloud
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

