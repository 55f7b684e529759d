"""File locks for the cache: ``flock`` on small lock files that never move.

Why ``flock`` and not ``fcntl.lockf``: POSIX record locks belong to the
process, so two threads of one ``warm`` would both "get" the same lock; an
``flock`` lock belongs to the open file description, so each acquisition opens
its own descriptor and threads exclude each other too. Either kind is dropped
by the kernel when the process dies, so a SIGKILLed run never leaves a lock
that hangs the next one.

Entries are mapped onto a fixed number of stripes per namespace, so the
number of lock files stays bounded however many entries are cached. Lock
files are deleted only with their namespace (``cache clear``), and only by a
holder of the lock (:meth:`FileLock.unlink`). Unlinking a lock file that
others wait on would let two processes hold "the same" lock on different
inodes, so every acquisition checks, once it holds the lock, that the path
still names the file it locked; a waiter that won the lock on an unlinked
file starts over on the path's new file.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import zlib
from types import TracebackType

from .paths import open_private

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
        while True:
            try:
                fd = open_private(self.path, os.O_RDWR | os.O_CREAT)
            except FileNotFoundError:
                os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
                if _same_file(fd, self.path):
                    self._fd = fd
                    return True
            except BlockingIOError:
                os.close(fd)
                return False
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # its holder unlinked it meanwhile: lock the path's new file

    def unlink(self) -> None:
        """Delete the lock file; call while holding the lock. Waiters on it
        start over on a new file when they get it (see :meth:`acquire`)."""
        if self._fd is None:
            raise RuntimeError(f"unlink of {self.path} without holding its lock")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

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


def _same_file(fd: int, path: str) -> bool:
    """Whether ``path`` still names the open file ``fd``."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_ino, st.st_dev) == (own.st_ino, own.st_dev)
