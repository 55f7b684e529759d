"""Copy one source file into a local temp file: bytes and mtime, nothing else.

Never ``shutil.copy2``/``copytree``: they copy xattrs, which FUSE mounts
(rclone's among them) answer with EIO, and they copy the source's permission
bits, which the cache must not inherit. The temp file is created 0600 by us.

Local-like sources (plain folders, FUSE mounts) are read and written 1 MiB
at a time (not ``sendfile``: see ``_pump``). Object stores on the
obstore engine are streamed by :mod:`.objget`; other sources go through
``fs.open`` with large reads.
"""

from __future__ import annotations

import errno
import functools
import os
import stat
from datetime import datetime
from typing import Any, NamedTuple

from .. import cloudfs, objstore
from ..errors import UnsafePath
from ..volumes import RangeEntry, Volume, version_of
from ..volumes.ranges import read_ranges
from . import checksums, integrity, mounts
from .hedge import Requests
from .inflight import Inflight

__all__ = ["CHUNK", "Copied", "copy_ranges", "copy_to"]

_HASH_KEYS = ("ETag", "etag", "md5Hash", "md5", "crc32c")
CHUNK = 8 * 1024 * 1024
"""Bytes per read call of a remote fsspec source: large, so a network-bound
source sees few round trips per file."""


class Copied(NamedTuple):
    """What was actually copied, to stamp the cache entry with."""

    size: int
    version: str
    """The version observed while copying ('' when the source gave none)."""
    mtime_ns: int | None


def _inside(real: str, real_root: str) -> bool:
    return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)


@functools.lru_cache(maxsize=64)
def _real_root(root: str) -> str:
    return os.path.realpath(root)


def _folders_inside(volume: Volume, relpath: str, full: str, real_root: str) -> bool:
    """Whether the folders of ``relpath`` resolve inside the volume.

    One ``lstat`` per folder below the root (the root's own real path is
    known): a path of plain folders stays inside by construction, and only a
    symlinked folder on the way costs a full ``realpath``. On a mount every
    ``lstat`` of the root's own ancestors, which ``realpath`` would redo for
    every file, can be a round trip.
    """
    folder = volume.root
    for part in relpath.split("/")[:-1]:
        folder = os.path.join(folder, part)
        if stat.S_ISLNK(os.lstat(folder).st_mode):
            return _inside(os.path.realpath(os.path.dirname(full)), real_root)
    return True


def _open_local(volume: Volume, relpath: str) -> int:
    """Open a local source file without following a symlink out of the volume."""
    full = volume.full_path(relpath)
    real_root = _real_root(volume.root)
    # The folders on the way must resolve inside the volume; O_NOFOLLOW then
    # refuses a last component that is a symlink, which we resolve ourselves.
    if not _folders_inside(volume, relpath, full, real_root):
        raise UnsafePath(f"{relpath}: a folder on its path links outside the volume")
    try:
        return os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
    real = os.path.realpath(full)
    if not _inside(real, real_root):
        raise UnsafePath(f"{relpath}: symlink to {real}, outside the volume")
    return os.open(real, os.O_RDONLY | os.O_CLOEXEC)


READ_CHUNK = 1024 * 1024
"""Bytes per read and write of a local-like source."""


def _pump(src: int, dst: int, inflight: Inflight | None, size: int) -> int:
    """Copy ``src`` to ``dst``; stop at EOF or once ``size`` bytes (the size
    ``fstat`` gave) are copied, which saves the read that would find EOF (a
    round trip on some mounts). A file that grew meanwhile is caught by the
    caller's second ``fstat``.

    Reads and writes of up to 1 MiB, not ``sendfile``: sendfile moves the
    bytes through a pipe 64 KiB at a time, and the page cache then keeps the
    copy in 64 KiB pieces instead of one large folio, which made every later
    read of a page-cached 256 KiB copy about 15% slower (docs/benchmarks.md,
    "Warm epochs"). The copy through Python's memory costs far less than the
    rest of a copy's work, and is what a bare copy does."""
    total = 0
    while True:
        if inflight is not None:
            inflight.check()
        block = os.read(src, READ_CHUNK)
        if not block:
            return total
        view = memoryview(block)
        while view:
            view = view[os.write(dst, view):]
        total += len(block)
        if total >= size > 0:
            return total


def _copy_local(volume: Volume, relpath: str, dst: int, inflight: Inflight | None) -> Copied:
    try:
        src = _open_local(volume, relpath)
        try:
            before = os.fstat(src)
            if not stat.S_ISREG(before.st_mode):
                raise UnsafePath(f"{relpath}: not a regular file")
            size = _pump(src, dst, inflight, before.st_size)
            os.ftruncate(dst, size)  # the caller may have preallocated more
            after = os.fstat(src)
        finally:
            os.close(src)
    except OSError as exc:
        gone = mounts.lost(volume.root, relpath, exc)
        if gone is not None:
            raise gone from exc  # not retried: the mount's server is gone
        raise
    if (after.st_mtime_ns, after.st_size) != (before.st_mtime_ns, before.st_size):
        # Rewritten while we read it: the bytes may mix two versions.
        raise InterruptedError(f"{relpath} changed while it was copied")
    if size != before.st_size:
        # Fewer bytes than the file has, and it did not change: a read cut
        # short (a FUSE mount's glitch). Discarded and retried, never cached.
        raise OSError(f"short read: {size} of {before.st_size} bytes of {relpath}")
    return Copied(size, version_of({"mtime": before.st_mtime}), before.st_mtime_ns)


def _mtime_ns(info: dict[str, Any]) -> int | None:
    for key in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(key)
        if isinstance(value, datetime):
            return int(value.timestamp() * 1e9)
        if isinstance(value, (int, float)):
            return int(value * 1e9)
    return None


def _copy_remote(volume: Volume, relpath: str, dst: int, inflight: Inflight | None,
                 listed: str = "") -> Copied:
    path = volume.full_path(relpath)
    with volume.fs.open(path, "rb") as src:
        # s3fs and friends attach the object's info to the open file (served
        # from the listing cache when this process listed the source).
        info = getattr(src, "details", None) or volume.fs.info(path)
        # GCS and Azure keep an MD5 that the listed version carries: checked
        # here too (a forked worker's copy), while the object is the one listed.
        want = checksums.listed_expect(listed, cloudfs.marker(version_of(info)))
        digest = checksums.hasher(want.check)
        size = 0
        while True:
            if inflight is not None:
                inflight.check()
            block = src.read(CHUNK)
            if not block:
                break
            if digest is not None:
                digest.update(block)
            view = memoryview(block)
            while view:
                view = view[os.write(dst, view):]
            size += len(block)
        os.ftruncate(dst, size)
    if digest is not None:
        integrity.record(dst, checksums.judge(f"{_kind(volume)}://", relpath, want,
                                              digest.hexdigest()))
    # Only a content hash is comparable across calls: fsspec backends format
    # timestamps differently in info() and find() (memory gives a datetime in
    # one and a float in the other), so those fall back to the listing's.
    version = version_of(info) if any(k in info for k in _HASH_KEYS) else ""
    return Copied(size, version, _mtime_ns(info))


def _kind(volume: Volume) -> str:
    return str(getattr(volume.fs, "kind", "") or "")


def _copy_object(volume: Volume, relpath: str, dst: int, inflight: Inflight | None,
                 size: int, root: str, requests: Requests | None, listed: str = "") -> Copied:
    from .objget import get_into

    got = get_into(volume, volume.full_path(relpath), dst, size_hint=size, inflight=inflight,
                   root=root, requests=requests, listed=listed)
    return Copied(got.size, got.etag, got.mtime_ns)


def copy_to(volume: Volume, relpath: str, dst: int, inflight: Inflight | None = None,
            size: int = 0, root: str = "", requests: Requests | None = None,
            version: str = "") -> Copied:
    """Copy ``relpath`` of ``volume`` into the open file ``dst`` (at offset 0;
    a preallocated file is overwritten and cut to the copied size).

    With ``inflight`` (a warm's :class:`~ucstage.cache.inflight.Inflight`), the copy
    checks between chunks whether the warm stopped. ``size`` (the listed size)
    lets the object-store engine split a large object into ranged GETs;
    ``root`` (the cache's) is where it remembers which sources serve MD5
    ETags (:func:`ucstage.cache.integrity.judge`); ``version`` (the listed
    one) carries a GCS or Azure object's MD5.

    Raises:
        Stopped: ``inflight`` stopped.
        UnsafePath: the entry is a symlink or folder link leaving the volume.
        OSError: from the source or the local disk (ENOSPC included); the
            caller removes the temp file.
    """
    if volume.is_local:
        return _copy_local(volume, relpath, dst, inflight)
    if objstore.engine(volume) == "obstore":
        return _copy_object(volume, relpath, dst, inflight, size, root, requests, version)
    return _copy_remote(volume, relpath, dst, inflight, version)


def copy_ranges(volume: Volume, entry: RangeEntry, dst: int,
                inflight: Inflight | None = None, requests: Requests | None = None) -> Copied:
    """Copy the byte ranges of ``entry`` (of its source file) into ``dst``, one
    after another: ranged reads (ranged GETs on the object-store engine), each
    checked against the source file's listed version
    (:func:`ucstage.volumes.ranges.read_ranges`).

    Raises:
        Stopped: ``inflight`` stopped.
        InterruptedError: the file changed since it was listed (retried).
        OSError: from the source or the local disk.
    """
    if inflight is not None:
        inflight.check()
    if volume.is_local:
        # The folders on the way must stay inside the volume, as for whole files.
        os.close(_open_local(volume, entry.source))
    try:
        blobs, seen = read_ranges(volume, entry.source, entry.ranges, version=entry.version,
                                  deadline=None if requests is None else requests.deadline)
    except OSError as exc:
        gone = mounts.lost(volume.root, entry.source, exc) if volume.is_local else None
        if gone is not None:
            raise gone from exc
        raise
    size = 0
    for blob in blobs:
        view = memoryview(blob)
        while view:
            written = os.pwrite(dst, view, size)
            view, size = view[written:], size + written
    os.ftruncate(dst, size)
    return Copied(size, seen or entry.version, None)
