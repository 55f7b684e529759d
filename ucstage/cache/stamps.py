"""This process's memory of validity stamps: :class:`StampMemo`.

A cached file's stamp (``size NUL version``, :func:`ucstage.cache.paths.read_stamp`)
is an xattr read; the memo keeps it per path with the inode and ctime it was
read at, so a hot lookup costs one ``stat`` and no xattr read. An entry is
trusted only while the file's inode and ctime still match, which any rewrite
changes (a rename into place is a new inode; setting an xattr moves the ctime).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping

from . import paths

__all__ = ["StampMemo"]

_MEMO_MAX = 1 << 18
"""Stamps remembered per process; past this the memo starts over (bounded memory
in every DataLoader worker, at the cost of one xattr read per file)."""

Memo = tuple[int, int, tuple[int, str]]
"""(inode, ctime_ns, (size, version))."""


class StampMemo:
    """path -> (inode, ctime, stamp) of cached files this process read.

    Every write (insert, pop, clear) happens under the object's lock; reads
    take no lock, because a ``dict.get`` is atomic in CPython and a read that
    races a write is harmless (an entry is checked against the file's inode
    and ctime before it is trusted). The lock makes compound writes (the
    bound check, then the insert) whole; it is held for the dictionary
    update only, never during I/O.
    """

    def __init__(self) -> None:
        self._memo: dict[str, Memo] = {}
        self._lock = threading.Lock()

    def stamp(self, path: str, st: os.stat_result) -> tuple[int, str] | None:
        """The ``(size, version)`` stamped on the cached file ``path``, whose
        ``stat`` is ``st``; None when it has none. Read once per file and
        process, then remembered while the inode and ctime stay the same."""
        memo = self._memo.get(path)
        if memo is None or memo[0] != st.st_ino or memo[1] != st.st_ctime_ns:
            found = paths.read_stamp(path)
            if found is None:
                return None
            memo = (st.st_ino, st.st_ctime_ns, found)
            self._put(path, memo)
        return memo[2]

    def touched(self, path: str, before: os.stat_result, stamp: tuple[int, str]) -> None:
        """``path`` (whose ``stat`` was ``before`` and stamp ``stamp``) just had
        its atime set by this process, which moved its ctime: remember the new
        ctime with the same stamp, if ``path`` still names the same file (a
        touch changes no stamp; a replacement is a new inode)."""
        try:
            st = os.stat(path)
        except OSError:
            return
        if st.st_ino == before.st_ino and st.st_dev == before.st_dev:
            self._put(path, (st.st_ino, st.st_ctime_ns, stamp))

    @property
    def entries(self) -> Mapping[str, Memo]:
        """The memo, read-only: path -> (inode, ctime_ns, (size, version)).
        For a lookup's hot path, which reads it without a call per file; an
        entry is trusted only while the file's inode and ctime match, and
        every path in it passed a lookup's path-safety check."""
        return self._memo

    def forget(self, path: str) -> None:
        """Drop ``path``'s entry (the file was removed)."""
        with self._lock:
            self._memo.pop(path, None)

    def clear(self) -> None:
        """Forget every entry (namespaces were removed)."""
        with self._lock:
            self._memo.clear()

    def _put(self, path: str, memo: Memo) -> None:
        with self._lock:
            if len(self._memo) >= _MEMO_MAX:
                self._memo.clear()
            self._memo[path] = memo
