"""Walking a cache root's namespaces: every cached file and temp file, with
the lock stripe that guards it, and the sweep of temp files killed runs left.

A file or temp file whose stripe is held is being written right now
(:mod:`ucstage.cache.locks`) and is left alone. Counting walks run under the
ledger lock (:mod:`ucstage.cache.ledger`), so no file is seen twice or
missed mid-rename.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from . import paths
from .locks import FileLock, stripe_path

__all__ = ["Cached", "Tally", "sweep", "sweep_one", "unlink_if_exists", "walk"]


class Tally(NamedTuple):
    """What a walk of some namespaces found."""

    files: int
    """Cached files (temp files not included)."""
    bytes: int
    """Bytes of those files."""
    partial_files: int
    """Temp files: copies in flight, or left by killed runs."""
    partial_bytes: int


@dataclass(frozen=True)
class Cached:
    """One file a walk found."""

    atime_ns: int
    size: int
    path: str
    lock: str
    partial: bool = False
    """A copy in flight (or left by a killed run): counted, never evicted."""
    namespace: str = ""
    """The namespace folder's name."""


def walk(root: str, ns_dirs: Sequence[str]) -> Iterator[Cached]:
    """Every file under ``ns_dirs`` (namespaces of ``root``), cached or temp,
    with the lock that guards it."""
    for ns_dir in ns_dirs:
        ns_lock_dir = paths.lock_dir(root, ns_dir)
        namespace = os.path.basename(ns_dir)
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
                        continue
                    try:
                        st = d.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    stripe = paths.part_stripe(d.name)
                    lock = (stripe_path(ns_lock_dir, prefix + d.name) if stripe is None
                            else paths.part_lock(ns_lock_dir, stripe))
                    yield Cached(st.st_atime_ns, st.st_size, d.path, lock,
                                 stripe is not None, namespace)


def sweep(root: str, ns_dir: str) -> int:
    """Remove temp files left by killed runs (nobody holds their stripe) in
    the namespace ``ns_dir`` of ``root``; return how many."""
    removed = 0
    ns_lock_dir = paths.lock_dir(root, ns_dir)
    for folder, _, names in os.walk(ns_dir):
        for name in names:
            stripe = paths.part_stripe(name)
            if stripe is None:
                continue
            if sweep_one(os.path.join(folder, name), paths.part_lock(ns_lock_dir, stripe)):
                removed += 1
    return removed


def sweep_one(path: str, lock_path: str) -> bool:
    """Delete the temp file ``path`` unless its copy is running (holds
    ``lock_path``); True when it is gone."""
    lock = FileLock(lock_path)
    if not lock.acquire(blocking=False):
        return False  # its copy is running
    try:
        unlink_if_exists(path)
        return True
    finally:
        lock.release()


def unlink_if_exists(path: str) -> None:
    """Delete ``path``; a file already gone is what was wanted."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
