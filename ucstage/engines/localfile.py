"""Whole files of a local folder or a mount, copied into an open descriptor.

The local engine's copy (:meth:`ucstage.engines.engine.Engine.copy`): a
source file is opened without following a link out of its volume
(:func:`open_local`), read and written 1 MiB at a time (not ``sendfile``:
see :func:`pump`), and checked not to have changed or come short while it
was read. A mount that died meanwhile is named (:func:`ucstage.engines.mounts.lost`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import stat
from collections.abc import Iterator

from ..errors import UnsafePath
from ..volumes.entry import version_of
from ..volumes.location import Volume
from . import mounts
from .context import Copied, FetchContext, Stoppable

__all__ = ["READ_CHUNK", "copy_local", "open_local", "pump", "read_blocks"]


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


def open_local(volume: Volume, relpath: str) -> int:
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


def read_blocks(src: int, size: int, inflight: Stoppable | None,
                read_size: int = READ_CHUNK) -> Iterator[bytes]:
    """``src``'s bytes from its offset, ``read_size`` at a time, checking
    before each read whether ``inflight`` stopped (raises :exc:`Stopped`);
    ends at EOF or once ``size`` bytes (the size ``fstat`` gave) are read,
    which saves the read that would find EOF (a round trip on some mounts).

    The check between reads is all a stop can do to a read of a mount: a
    read the kernel has sent to a FUSE daemon is waited for even by a dying
    process, so a stop waits for at most one read per thread. A
    ``read_size`` below ``READ_CHUNK`` also turns the kernel's read-ahead off
    for ``src``, which would otherwise ask the mount for more than each
    read."""
    if read_size < READ_CHUNK:
        with contextlib.suppress(OSError):  # advice only
            os.posix_fadvise(src, 0, 0, os.POSIX_FADV_RANDOM)
    total = 0
    while True:
        if inflight is not None:
            inflight.check()
        block = os.read(src, read_size)
        if not block:
            return
        yield block
        total += len(block)
        if total >= size > 0:
            return


def pump(src: int, dst: int, inflight: Stoppable | None, size: int,
          read_size: int = READ_CHUNK) -> int:
    """Copy ``src`` to ``dst`` (:func:`read_blocks`); returns the bytes copied.
    A file that grew meanwhile is caught by the caller's second ``fstat``.

    Reads and writes of up to 1 MiB, not ``sendfile``: sendfile moves the
    bytes through a pipe 64 KiB at a time, and the page cache then keeps the
    copy in 64 KiB pieces instead of one large folio, which made every later
    read of a page-cached 256 KiB copy about 15% slower (docs/benchmarks.md,
    "Warm epochs"). The copy through Python's memory costs far less than the
    rest of a copy's work, and is what a bare copy does."""
    total = 0
    for block in read_blocks(src, size, inflight, read_size):
        view = memoryview(block)
        while view:
            view = view[os.write(dst, view):]
        total += len(block)
    return total


def copy_local(volume: Volume, relpath: str, dst: int, ctx: FetchContext) -> Copied:
    """The local engine's whole-file copy (:meth:`ucstage.engines.engine.Engine.copy`)."""
    inflight = ctx.inflight
    try:
        src = open_local(volume, relpath)
        try:
            before = os.fstat(src)
            if not stat.S_ISREG(before.st_mode):
                raise UnsafePath(f"{relpath}: not a regular file")
            size = pump(src, dst, inflight, before.st_size, ctx.read_size or READ_CHUNK)
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
