"""Which cached files an eviction takes first, and the clock that decides it.

Two kinds of reader use the cache, and one order cannot suit both:

* **Epoch scans** (:class:`ucstage.VolumeDataset`) read every file once per
  epoch, in order or shuffled. Under a cap smaller than the dataset, LRU
  evicts each file just before it is needed again (a hit rate of 0). Evicting
  the *most recently consumed* file instead keeps a stable resident set: a
  file read this epoch is not needed again before the next one, so every
  file resident when an epoch starts is still there when it is read, and an
  epoch hits about ``cap / dataset`` of its reads.
* **Everyone else** (``LocalCache.fetch``/``lookup``, ``cache warm``) keeps
  least recently used first, with a time lease: a file handed out within
  ``lease_seconds`` is not evicted.

The clock is the cached file's atime, which ucstage sets itself (the walk
that evicts already ``stat``\\ s every file, so the order costs nothing more):

* a hand-out to an ordinary caller sets it to *now* (LRU and lease);
* a dataset reader moving past a file sets it to *now +* :data:`SCAN_OFFSET_NS`,
  about 208 days in the future. That marks the file as scan-read and records
  when it was consumed; a future atime is also never overwritten by the
  kernel's ``relatime`` (it only moves an atime older than the mtime, the
  ctime or a day).

Eviction takes, first, ordinary files out of their lease, oldest first; then
scan-read files, most recently consumed first. Files a reader holds (see
:mod:`ucstage.cache.leases`) and copies in flight are never taken.

Evictions and the waits for room are charged to the calling thread's sink
(:func:`ucstage.cache.space.charging`, beside the eviction itself).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any, Protocol

__all__ = ["SCAN_OFFSET_NS", "eviction_order", "is_scan", "mark_consumed", "time_leased"]

SCAN_OFFSET_NS = 1 << 54
"""How far ahead of the consumption time a scan-read file's atime is set
(about 208 days): far enough to tell it from any hand-out time, near enough
for filesystems whose timestamps end in 2038."""
_SCAN_THRESHOLD_NS = SCAN_OFFSET_NS // 2


class _File(Protocol):
    atime_ns: int
    partial: bool


def is_scan(atime_ns: int, now_ns: int | None = None) -> bool:
    """Whether a file with this atime was last consumed by a scan reader."""
    now = time.time_ns() if now_ns is None else now_ns
    return atime_ns > now + _SCAN_THRESHOLD_NS


def time_leased(atime_ns: int, now_ns: int, lease_ns: int) -> bool:
    """Whether an ordinary file is still inside its time lease (handed out
    within ``lease_ns``). Scan-read files have no time lease."""
    return not is_scan(atime_ns, now_ns) and atime_ns > now_ns - lease_ns


def eviction_order(found: Iterable[Any], now_ns: int, lease_ns: int) -> list[Any]:
    """The evictable files among ``found`` (objects with ``atime_ns`` and
    ``partial``), in the order to evict them: ordinary files out of their
    lease oldest first, then scan-read files most recently consumed first.
    Copies in flight and files in their time lease are left out."""
    ordinary, scanned = [], []
    for c in found:
        if c.partial:
            continue
        if is_scan(c.atime_ns, now_ns):
            scanned.append(c)
        elif c.atime_ns <= now_ns - lease_ns:
            ordinary.append(c)
    ordinary.sort(key=lambda c: c.atime_ns)
    scanned.sort(key=lambda c: c.atime_ns, reverse=True)
    return ordinary + scanned


def mark_consumed(file: int | str, mtime_ns: int) -> None:
    """Stamp ``file`` (a path, or a descriptor open on it) as just consumed by
    a scan reader: atime = now + offset, mtime kept."""
    os.utime(file, ns=(time.time_ns() + SCAN_OFFSET_NS, mtime_ns))
