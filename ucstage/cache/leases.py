"""Leases that follow the reader: a dataset's files stay until it moves on.

A :class:`Reader` is one slot's reader (one ``VolumeDataset`` iterator). Every
path it fetches (read-ahead included) is *held* from the moment it is valid in
the cache until the reader's caller lets it go: under a ucstage DataLoader,
once the training loop has moved past the batch it went into
(:mod:`ucstage.data.channel`), else once the consumer asked for an item
``slack`` places further on. A held file is never evicted.

How a hold works, across processes: the reader opens the cached file and
takes a shared ``flock`` on it; an eviction takes an exclusive ``flock``
without waiting (:func:`take_exclusive`) and skips the file when it cannot.
The kernel drops a dead reader's locks, so a killed job holds nothing. The
hold is checked after the lock is granted: an eviction keeps its exclusive
lock from before its rename until after its unlink, so a file that is still
linked then is still at its path; an unlinked one (evicted between the open
and the lock) fails the hold, and the reader fetches again.

When a file is let go it is marked consumed
(:func:`ucstage.cache.policy.mark_consumed`: the scan clock that makes
eviction take the most recently consumed file first) and lets it go.

Paths that ``LocalCache.fetch``/``lookup`` hand to other callers are not held:
they keep the time lease (``lease_seconds``).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import threading
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..volumes import FileEntry

from ..errors import CacheFull
from ..units import format_bytes
from . import policy
from .paths import take_exclusive
from .runstats import Counters
from .space import charging

__all__ = ["DEFAULT_SLACK", "Reader", "check_window", "take_exclusive"]

DEFAULT_SLACK = 2
"""Files handed out before the current one that stay held: wrappers that look
ahead one or two items before opening still find their files."""


class BoundLookup(Protocol):
    """What a reader looks files up in: the cache bound to their volume
    (:class:`ucstage.cache.local.Bound`; a Protocol, for the cache's space
    imports this module)."""

    def lookup(self, entry: FileEntry, *, touch: bool = True) -> str | None: ...


class Reader:
    """The holds and counters of one slot's reader.

    Args:
        counters: where hits, misses, evictions and waits are counted (None: nowhere).
        slack: how many files handed out before the current one stay held.
        holding: hold files at all (without a byte cap nothing is evicted
            while a job runs: only counting is needed).
    """

    def __init__(self, counters: Counters | None = None, slack: int = DEFAULT_SLACK, *,
                 holding: bool = True) -> None:
        self.counters = counters
        self.slack = slack
        self.holding = holding
        self._lock = threading.Lock()
        self._held: dict[str, list[int]] = {}
        """path -> [descriptor, holds, mtime]: one file can be handed out twice (padding)."""
        self._kept: set[str] = set()
        """Paths that outlive :meth:`close` until released (their loop is not past them)."""
        self._closed = False

    # -- space.Charge: what the cache did for this reader -----------------

    def evicted(self, files: int, nbytes: int) -> None:
        if self.counters is not None:
            self.counters.add(evictions=files, evicted_bytes=nbytes)

    def waiting(self) -> None:
        if self.counters is not None:
            self.counters.add(waits=1)
            self.counters.flush()  # seen at once by whoever watches the run

    def waited(self, seconds: float) -> None:
        if self.counters is not None:
            self.counters.add(wait_ns=int(seconds * 1e9))
            self.counters.flush()

    # -- fetching ----------------------------------------------------------

    def _lookup(self, bound: BoundLookup) -> Callable[[FileEntry], str | None]:
        # A held hit is not touched (no LRU time): the hold protects it, and
        # the consumed mark replaces the time once the reader moves on.
        return functools.partial(bound.lookup, touch=not self.holding)

    def looker(self, bound: BoundLookup) -> Callable[[FileEntry], str | None]:
        """``lookup(entry)`` of ``bound`` (the cache at the entries' volume)
        that returns a held, counted hit, or None (a miss, or a hit evicted
        before it could be held: the fetch then takes it). Read-ahead calls
        it in the consumer's thread, so a hit costs no thread hand-off."""
        lookup, counters = self._lookup(bound), self.counters

        def held_lookup(entry: FileEntry) -> str | None:
            path = lookup(entry)
            if path is None or not self.hold(path):
                return None
            if counters is not None:
                counters.count(True, entry.size)
            return path

        return held_lookup

    def fetcher(self, bound: BoundLookup, fetch: Callable[[FileEntry], str], *,
                checked: int | None = 0) -> Callable[[FileEntry], str]:
        """``fetch(entry)`` that returns a held path: a valid cached file is
        taken as a hit, anything else goes through ``fetch`` (``bound.fetch_missing``,
        with the job's stop handle); both are counted.

        ``checked``: how many of the first entries asked for the caller has
        just found missing itself (``None``: every one, as read-ahead looks
        each entry up before it queues it). Those go straight to ``fetch``,
        whose check under the entry's lock is then the only other one: a
        miss is checked once before its lock and once under it."""

        lookup, counters = self._lookup(bound), self.counters

        def held_fetch(entry: FileEntry) -> str:
            nonlocal checked
            path = ""
            known_missing = checked is None or checked > 0
            if checked:
                checked -= 1
            for _ in range(3):
                found = None if known_missing else lookup(entry)
                known_missing = False  # a retry after a lost hold checks again
                hit = found is not None
                if found is None:
                    with charging(self):  # evictions and waits happen here only
                        path = fetch(entry)
                else:
                    path = found
                if self.hold(path):
                    if counters is not None:
                        counters.count(hit, entry.size)
                    return path
            # Evicted three times between its copy and the hold (only
            # possible with lease_seconds=0): hand it out unheld.
            if counters is not None:
                counters.count(False, entry.size)
            return path

        return held_fetch

    # -- holds -------------------------------------------------------------

    def hold(self, path: str) -> bool:
        """Hold ``path`` (see the module docstring); False when it is gone or
        was replaced meanwhile. After :meth:`close`, nothing is held (and
        True is returned: a read-ahead thread finishing late hands nothing out)."""
        if not self.holding:
            return True
        with self._lock:
            if self._closed:
                return True
            found = self._held.get(path)
            if found is not None:
                found[1] += 1
                return True
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            return False
        try:
            # Blocks only while an eviction holds the file exclusively: from
            # before its rename until after its unlink (or its putting back).
            fcntl.flock(fd, fcntl.LOCK_SH)
            mine = os.fstat(fd)
            # Still linked: no eviction (nor a replacing copy, nor verify's
            # delete) took this file between the open and the lock, so the
            # path still names it, and now nothing can evict it.
            ok = mine.st_nlink > 0
        except OSError:
            ok = False
        if not ok:
            os.close(fd)
            return False
        with self._lock:
            found = self._held.get(path)
            if self._closed or found is not None:
                os.close(fd)
                if found is not None:
                    found[1] += 1
                return True
            self._held[path] = [fd, 1, mine.st_mtime_ns]
        return True

    def release(self, path: str, *, consumed: bool = True) -> None:
        """Let ``path`` go once; a consumed file is marked for the scan policy."""
        with self._lock:
            found = self._held.get(path)
            if found is None:
                return
            found[1] -= 1
            if found[1] > 0:
                return
            del self._held[path]
            self._kept.discard(path)
        fd = found[0]
        try:
            if consumed:
                with contextlib.suppress(OSError):
                    # Marked while still held, so an eviction that sees it
                    # unheld also sees it as consumed.
                    policy.mark_consumed(fd, found[2])
        finally:
            os.close(fd)

    def close(self, keep: Collection[str] = ()) -> None:
        """Let every file go, without marking (the rest were never consumed),
        except those in ``keep`` (or kept by an earlier call): handed out but
        not yet past their training loop, they stay held until :meth:`release`."""
        with self._lock:
            self._closed = True
            self._kept.update(keep)
            kept = self._kept
            held = {p: v for p, v in self._held.items() if p not in kept}
            self._held = {p: v for p, v in self._held.items() if p in kept}
        for fd, *_ in held.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        if self.counters is not None:
            self.counters.flush()

    @property
    def held(self) -> int:
        """Files held now."""
        with self._lock:
            return len(self._held)


def check_window(max_bytes: int | None, *, readers: int, depth: int, largest: int,
                 largest_name: str = "", unit: str = "file", in_loop: int = 0) -> None:
    """Refuse at once a read that can never fit under ``max_bytes``.

    ``readers`` slots each hold up to ``depth`` files at once (read-ahead, the
    current file, the slack, and ``in_loop`` handed out in batches the
    training loop has not moved past yet); with files of up to ``largest``
    bytes that window alone must fit under the cap, else readers would wait
    for each other forever. ``unit``: what is held, as messages name it
    (``"sample"`` for a grouped dataset, whose ``largest`` is its largest
    sample's bytes).

    Raises:
        CacheFull: the largest file, or the window, is larger than the cap.
    """
    if max_bytes is None:
        return
    if largest > max_bytes:
        name = f"{largest_name} is " if largest_name else f"the largest {unit} is "
        raise CacheFull(f"{name}{format_bytes(largest)}, larger than the whole cache cap "
                        f"{format_bytes(max_bytes)}", hint="raise max_bytes")
    window = readers * depth * largest
    if window > max_bytes:
        loop = f" + {in_loop} in batches the loop has not moved past" if in_loop else ""
        fits = max_bytes // (readers * largest)
        lower = "lower read_ahead, num_workers"
        if in_loop:
            lower += ", batch_size or prefetch_factor"
        raise CacheFull(
            f"the readers' window does not fit under the cache cap {format_bytes(max_bytes)}: "
            f"{readers} readers x {depth} {unit}s held each (read_ahead + the current {unit} + "
            f"{DEFAULT_SLACK} of slack{loop}) x the largest {unit} {format_bytes(largest)} = "
            f"{format_bytes(window)}; the cap fits {fits} {unit}s per reader",
            hint=f"raise max_bytes to at least {format_bytes(window)} (more leaves room for "
                 f"hits), or {lower} until each reader holds at most {fits} {unit}s")
