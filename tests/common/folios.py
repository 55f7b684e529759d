"""How many page-cache folios hold a file (root only: /proc/kpageflags)."""

from __future__ import annotations

import ctypes
import mmap
import os
import struct

_PAGE = mmap.PAGESIZE
_HEAD, _TAIL = 1 << 15, 1 << 16  # KPF_COMPOUND_HEAD, KPF_COMPOUND_TAIL


def folios(path: str | os.PathLike[str]) -> int | None:
    """The number of folios caching ``path`` (read whole first, so every page
    is cached); None when the kernel does not say (not root, no kpageflags)."""
    with open(path, "rb") as fh:
        size = len(fh.read())
        if not size:
            return 0
        # A private writable mapping gives ctypes an address; it is only read,
        # so its pages stay the page cache's own.
        mapped = mmap.mmap(fh.fileno(), size, flags=mmap.MAP_PRIVATE,
                           prot=mmap.PROT_READ | mmap.PROT_WRITE)
    try:
        view = ctypes.c_char.from_buffer(mapped)
        base = ctypes.addressof(view)
        pages = -(-size // _PAGE)
        for offset in range(0, size, _PAGE):
            mapped[offset]  # fault every page in
        count = 0
        try:
            with open("/proc/self/pagemap", "rb") as pagemap, \
                    open("/proc/kpageflags", "rb") as kflags:
                for i in range(pages):
                    pagemap.seek((base // _PAGE + i) * 8)
                    (entry,) = struct.unpack("Q", pagemap.read(8))
                    pfn = entry & ((1 << 55) - 1)
                    if not entry >> 63 or not pfn:
                        return None  # not present, or the frame number is hidden from us
                    kflags.seek(pfn * 8)
                    (flags,) = struct.unpack("Q", kflags.read(8))
                    count += not flags & _TAIL  # a head or a single page starts a folio
        except OSError:
            return None
        del view
        return count
    finally:
        mapped.close()
