"""Disk accounting of a cache folder: the byte ledger, LRU eviction, sweeping.

Everything here works on the folder layout of :mod:`ucstage.cache.layout`
(``root`` and its control folder), not on a :class:`ucstage.cache.LocalCache`,
so the fetch path and the maintenance commands share one implementation.
Locks are the stripes of :mod:`ucstage.cache.locks`: a cached file or temp file
whose stripe is held is being written right now and is left alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
import uuid
from collections.abc import Iterator, Sequence

from . import layout as cd
from .locks import FileLock, stripe_path
from .reports import _Cached, _Ledger

__all__ = [
    "evict_lru",
    "free_bytes",
    "ledger",
    "lock_dir",
    "namespace_dirs",
    "sweep",
    "trash_name",
    "unlink_if_exists",
    "walk",
]


def lock_dir(control: str, ns_dir: str) -> str:
    """The folder of lock stripes for one namespace."""
    return os.path.join(control, "locks", os.path.basename(ns_dir))


def _part_lock(ns_lock_dir: str, stripe: int) -> str:
    """The stripe lock a temp file's name points at (see :func:`_cachedir.part_name`)."""
    return os.path.join(ns_lock_dir, f"{stripe:04d}.lock")


def namespace_dirs(root: str) -> list[str]:
    """Every namespace folder under ``root``, by name (the control folder is hidden)."""
    return [e.path for e in sorted(os.scandir(root), key=lambda e: e.name)
            if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")]


def trash_name(control: str) -> str:
    """A fresh path in the trash folder: renaming there makes a file or folder
    disappear at once (same filesystem) before it is deleted."""
    trash = os.path.join(control, "trash")
    os.makedirs(trash, mode=0o700, exist_ok=True)
    return os.path.join(trash, uuid.uuid4().hex)


@contextlib.contextmanager
def ledger(root: str, control: str) -> Iterator[_Ledger]:
    """The byte ledger, locked (one file is both the lock and the value)."""
    fd = os.open(os.path.join(control, "usage"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield _Ledger(fd, lambda: sum(c.size for c in walk(control, namespace_dirs(root))))
    finally:
        os.close(fd)


def walk(control: str, ns_dirs: Sequence[str]) -> Iterator[_Cached]:
    """Every file under ``ns_dirs``, cached or temp, with the lock that guards it."""
    for ns_dir in ns_dirs:
        ns_lock_dir = lock_dir(control, ns_dir)
        stack = [(ns_dir, "")]
        while stack:
            folder, prefix = stack.pop()
            try:
                it = os.scandir(folder)
            except FileNotFoundError:
                continue
            with it:
                for d in it:
                    if d.is_dir(follow_symlinks=False):
                        stack.append((d.path, prefix + d.name + "/"))
                    else:
                        try:
                            st = d.stat(follow_symlinks=False)
                        except FileNotFoundError:
                            continue
                        stripe = cd.part_stripe(d.name)
                        lock = (stripe_path(ns_lock_dir, prefix + d.name) if stripe is None
                                else _part_lock(ns_lock_dir, stripe))
                        yield _Cached(st.st_atime_ns, st.st_size, d.path, lock,
                                      stripe is not None)


def evict_lru(ledger: _Ledger, target: int, *, root: str, control: str, lease_ns: int,
              memo: dict[str, tuple[int, int, int, str]]) -> int:
    """Evict least recently used, unleased files until usage <= target.

    Call with the ledger lock held. Returns the usage after, and resets
    the ledger to it (the walk is the truth). Evicted paths are dropped from
    ``memo`` (the cache's stamp memo).
    """
    # Copies in flight are their preallocated temp files, created and
    # renamed only under this lock: the walk counts them exactly. Temp
    # files of dead runs are deleted on the way (nobody holds their stripe).
    found = sorted(walk(control, namespace_dirs(root)), key=lambda c: c.atime_ns)
    used = sum(c.size for c in found)
    for c in found:
        if c.partial and _sweep_one(c.path, c.lock):
            used -= c.size
    cutoff = time.time_ns() - lease_ns
    for c in found:
        if used <= target or c.atime_ns > cutoff:
            break
        if not c.partial and _evict(c, control, memo):
            used -= c.size
    ledger.write(used)
    return used


def _evict(c: _Cached, control: str, memo: dict[str, tuple[int, int, int, str]]) -> bool:
    lock = FileLock(c.lock)
    if not lock.acquire(blocking=False):
        return False  # being fetched right now
    try:
        staged = trash_name(control)
        try:
            os.rename(c.path, staged)
        except FileNotFoundError:
            return True
        # A reader touches atime before it gets the path; if that happened
        # after our walk, the file was just handed out: put it back.
        if os.stat(staged).st_atime_ns != c.atime_ns:
            os.rename(staged, c.path)
            return False
        os.unlink(staged)
        memo.pop(c.path, None)
        return True
    finally:
        lock.release()


def _sweep_one(path: str, lock_path: str) -> bool:
    lock = FileLock(lock_path)
    if not lock.acquire(blocking=False):
        return False  # its copy is running
    try:
        unlink_if_exists(path)
        return True
    finally:
        lock.release()


def sweep(control: str, ns_dir: str) -> int:
    """Remove temp files left by killed runs (nobody holds their stripe)."""
    removed = 0
    ns_lock_dir = lock_dir(control, ns_dir)
    for folder, _, names in os.walk(ns_dir):
        for name in names:
            stripe = cd.part_stripe(name)
            if stripe is None:
                continue
            if _sweep_one(os.path.join(folder, name), _part_lock(ns_lock_dir, stripe)):
                removed += 1
    return removed


def free_bytes(path: str) -> int:
    """Free bytes on the filesystem holding ``path``; 0 when it cannot be asked."""
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return 0


def unlink_if_exists(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
