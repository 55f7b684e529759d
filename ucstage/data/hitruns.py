"""The warm path of a VolumeDataset iterator: runs of cache hits handed out in blocks.

Without a byte cap nothing is held, so a hit needs only its lookup: the
cache's one validity rule (:meth:`ucstage.cache.LocalCache.lookup`, a
``stat`` against the stamp memo), made for every path before it is handed
out. :func:`hits` looks up a block of a slot's entries in one loop, counts
the run of hits at once and hands their paths out with ``yield from`` a
list (:meth:`ucstage.data.state.SlotTracker.run`, which keeps the resume
position without a per-path step), so a warm epoch pays per file for the
lookup and nothing else: no read-ahead window, no generator per layer, no
lock, no per-file counter.

The first miss (or a lookup that raises) ends the warm path: the rest of the
slot goes through the read-ahead (:mod:`.readahead`), which copies misses in
its threads and still looks hits up in the consumer's thread.

Under a cap every path handed out is held while its consumer needs it, and
:func:`ucstage.cache.leases.check_window` counts on a window of
``read_ahead + 1 + slack`` held files per reader: looking up a block ahead
would hold too many, so the capped path never comes here.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Generator, Sequence
from typing import Any

from ..volumes import FileEntry

__all__ = ["BLOCK", "ROWS", "hits", "rows_lookup", "run_lookup"]

BLOCK = 16
"""Entries looked up before their run is handed out: enough that the
per-run work (a list, a count) is small beside the lookups, few enough that
a path's proof is at most this many files old when it is handed out (the
read-ahead's lookups run its window ahead: ``read_ahead`` files, or under
``"auto"`` the reader's share, :func:`ucstage.data.readahead.node_share`)."""
ROWS = 1024
"""Entries made from the manifest at once (making them has a fixed cost per call)."""
_size = operator.attrgetter("size")


def hits(entries: Sequence[FileEntry], lookup_run: Callable[[Sequence[FileEntry]], list[str]],
         counters: Any, tracker: Any, lookup_rows: Callable[..., list[str]] | None = None
         ) -> Generator[str, None, int]:
    """Hand out the paths of the leading run of hits of ``entries``, in order;
    return how many (``yield from`` gives it). ``lookup_run(block)`` is the
    cache's validity check over a block (the valid paths of its leading run,
    :meth:`ucstage.cache.LocalCache.lookup_run`); ``counters`` (or None)
    counts the hits, ``tracker`` the position (its ``run``).

    ``lookup_rows(paths, sizes, versions)`` (ucstage's own cache:
    :meth:`~ucstage.cache.LocalCache.lookup_rows`), with ``entries`` a slot's
    files (:class:`~ucstage.data.samples.SlotRows`), checks the same blocks
    from the manifest's columns: no entry object is made on the warm path."""
    columns = getattr(entries, "columns", None)
    if lookup_rows is not None and columns is not None:
        def window(start: int) -> _Window:
            rels, sizes, versions = columns(start, start + ROWS)
            return (len(rels),
                    lambda a, b: lookup_rows(rels[a:b], sizes[a:b], versions[a:b]),
                    lambda a, n: (sum(sizes[a:a + n]), n))
    else:
        def window(start: int) -> _Window:
            rows = entries[start:start + ROWS]
            return (len(rows), lambda a, b: lookup_run(rows[a:b]),
                    lambda a, n: (sum(map(_size, rows[a:a + n])), _files(rows[a:a + n])))
    return (yield from _leading_hits(len(entries), window, counters, tracker))


_Window = tuple[int, Callable[[int, int], list[str]], Callable[[int, int], tuple[int, int]]]
"""``ROWS`` rows of a slot: how many, the validity check of rows ``a:b`` (the
valid paths of their leading run), and the bytes and files of ``n`` rows
from ``a``."""


def _leading_hits(count: int, window: Callable[[int], _Window], counters: Any,
                  tracker: Any) -> Generator[str, None, int]:
    """:func:`hits`' one loop: ``window(done)`` at a time, checked ``BLOCK``
    rows at a time, up to the first miss."""
    done = 0
    while done < count:
        rows, check, weigh = window(done)
        for first in range(0, rows, BLOCK):
            last = min(first + BLOCK, rows)
            try:
                paths = check(first, last)
            except Exception:  # the read-ahead's fetch raises it again, in its turn
                paths = []
            if paths:
                if counters is not None:
                    counters.count(True, *weigh(first, len(paths)))
                yield from tracker.run(paths)
                done += len(paths)
            if len(paths) < last - first:
                return done
    return done


def _files(run: Sequence[Any]) -> int:
    """Files in a run of entries, or of grouped samples (each ``len()`` members)."""
    if run and not isinstance(run[0], FileEntry):
        return sum(map(len, run))
    return len(run)


def rows_lookup(cache: Any, volume: Any) -> Callable[..., list[str]] | None:
    """``lookup_rows(paths, sizes, versions)`` of ``cache`` (ucstage's own), or
    None for a cache object of the user's own (its ``lookup_run`` is used)."""
    own = getattr(cache, "lookup_rows", None)
    return functools.partial(own, volume) if callable(own) else None


def run_lookup(cache: Any, volume: Any) -> Callable[[Sequence[FileEntry]], list[str]] | None:
    """``lookup_run(entries)`` for ``cache``: its own, else one made of its
    ``lookup`` (a cache object of the user's own); None when it has neither."""
    own = getattr(cache, "lookup_run", None)
    if callable(own):
        return functools.partial(own, volume)
    lookup = getattr(cache, "lookup", None)
    if not callable(lookup):
        return None

    def one_by_one(block: Sequence[FileEntry]) -> list[str]:
        found: list[str] = []
        for entry in block:
            path = lookup(volume, entry)
            if path is None:
                break
            found.append(path)
        return found

    return one_by_one
