"""The byte ledger: the bytes a cache root holds, copies in flight included.

One small file, ``.ucstage/usage``, is both the value and the lock
(:func:`locked_ledger`): an ``flock`` on it, shared by every process, guards the
byte count and the tree's names (files are renamed into place, evicted and
walked for counting only while it is held). See
:class:`ucstage.cache.space.CacheSpace`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator

from . import paths

__all__ = ["Ledger", "locked_ledger"]


class Ledger:
    """Bytes the cache holds (plus reservations), as a fixed-width number in
    one small file. Rewritten in place: that needs no new disk block (it must
    work on a full disk), and a torn write fails to parse, which makes the next
    reader recount from the tree."""

    def __init__(self, fd: int, recount: Callable[[], int]) -> None:
        self.fd = fd
        self.recount = recount

    def read(self) -> int:
        """The recorded bytes; recounted (and rewritten) when unreadable."""
        try:
            return int(os.pread(self.fd, 64, 0).decode("ascii").strip())
        except (OSError, ValueError, UnicodeDecodeError):
            total = self.recount()
            self.write(total)
            return total

    def write(self, value: int) -> None:
        """Record ``value`` bytes (never below 0)."""
        os.pwrite(self.fd, b"%20d\n" % max(0, value), 0)


@contextlib.contextmanager
def locked_ledger(root: str, recount: Callable[[], int]) -> Iterator[Ledger]:
    """The byte ledger of ``root``, locked for the ``with`` block;
    ``recount()`` counts the tree when the file cannot be read."""
    fd = os.open(os.path.join(root, paths.CONTROL, "usage"),
                 os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield Ledger(fd, recount)
    finally:
        os.close(fd)
