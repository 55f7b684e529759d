"""How much of a set of local files is in the OS page cache right now.

Reads of a file whose pages the kernel already holds come from memory, at
memory speed: a "direct" rate measured on them says nothing about the disk or
the volume behind it. Before each run that reads the source, bench asks the
kernel (``mincore(2)`` on a read-only mapping) which pages of the sample are
resident, and reports the share.

The file is opened first, then mapped: on a FUSE mount the kernel drops a
file's cached pages at open unless the filesystem asked to keep them, so the
answer is what the run's own open will find. Linux only; anywhere the probe
cannot run, the answer is None (unknown), never a guess.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Sequence

__all__ = ["resident_share"]

_PAGE = mmap.PAGESIZE


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t,
                                 ctypes.POINTER(ctypes.c_ubyte)]
    except (OSError, AttributeError):
        return None
    return libc


def _resident(libc: ctypes.CDLL, path: str) -> tuple[int, int] | None:
    """(resident bytes, size) of one file, or None when it cannot be probed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0, 0
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            return None
        try:
            pages = (size + _PAGE - 1) // _PAGE
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(addr, size, vec) != 0:
                return None
            held = sum(v & 1 for v in vec)
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
    return min(size, held * _PAGE), size


def resident_share(paths: Sequence[str]) -> float | None:
    """Share (0..1) of the files' bytes in the page cache; None when unknown.

    Files that cannot be probed are left out; None when none could be (or
    there are no bytes at all).
    """
    libc = _libc()
    if libc is None:
        return None
    held = total = 0
    for path in paths:
        found = _resident(libc, path)
        if found is not None:
            held += found[0]
            total += found[1]
    return held / total if total else None
