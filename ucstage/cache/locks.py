"""File locks for the cache: ``flock`` on small lock files that never move.

Why ``flock`` and not ``fcntl.lockf``: POSIX record locks belong to the
process, so two threads of one ``warm`` would both "get" the same lock; an
``flock`` lock belongs to the open file description, so each acquisition opens
its own descriptor and threads exclude each other too. Either kind is dropped
by the kernel when the process dies, so a SIGKILLed run never leaves a lock
that hangs the next one.

Lock files are never deleted: unlinking a lock file while another process
waits on it would let two processes hold "the same" lock on different inodes.
Entries are mapped onto a fixed number of stripes per namespace instead, so
the number of lock files stays bounded however many entries are cached.
"""

from __future__ import annotations

import fcntl
import os
import zlib
from types import TracebackType

__all__ = ["STRIPES", "FileLock", "stripe_path"]

STRIPES = 1024
"""Lock files per namespace. Two entries share a stripe with probability
1/STRIPES, which only makes them fetch one after the other."""


def stripe_path(lock_dir: str, relpath: str) -> str:
    """The lock file that guards ``relpath`` inside one namespace."""
    return os.path.join(lock_dir, f"{zlib.crc32(relpath.encode()) % STRIPES:04d}.lock")


class FileLock:
    """An exclusive ``flock`` on ``path`` (created 0600 if missing).

    Usable as a context manager (blocking) or through :meth:`acquire` with
    ``blocking=False`` to test whether anyone else holds it.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self, blocking: bool = True) -> bool:
        """Take the lock; with ``blocking=False`` return False instead of waiting."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return True

    def release(self) -> None:
        """Drop the lock (closing the descriptor releases it)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()
