"""Fetching the next few files of a slot in the background, and stopping cleanly.

:class:`ReadAhead` fetches a slot's entries into the cache ahead of the
consumer and hands the local paths back in slot order. While the consumer
holds item ``i``, items up to ``i + depth`` may be fetched, never more. Each
entry is first looked up in the consumer's own thread as it enters that
window (a cache hit costs a ``stat`` and a dictionary lookup, and no thread
hand-off); only misses go to up to ``depth`` threads, started at the first
miss, so an epoch over a warm cache starts none.

**Stopping.** :meth:`ReadAhead.close` (called when the dataset's iterator is
closed: the loop broke out, a ``KeyboardInterrupt`` went through it, the
DataLoader shut its workers down, or the iterator was garbage-collected)
starts no new fetch and ends the copies in flight, so nothing is copied for
the iterator after it returns and no temp file is left behind. When the cache
can stop copies (:func:`cache_fetcher`), they end at their next chunk and
remove their temp files, and one still blocked in a read after
:data:`GRACE_SECONDS` is abandoned (its temp file removed at once). Otherwise
each copy in flight is finished first: at most one file per thread, within
:data:`JOIN_SECONDS`.

**How many in flight** (``read_ahead="auto"``, the default): every reader of
a node (``LOCAL_WORLD_SIZE`` x DataLoader workers) takes an equal share of
the node's budget (:func:`node_share`): the first guess ``cache warm --jobs
auto`` starts from for the source's kind (:data:`ucstage.cache.tuning.FIRST_GUESS`)
and its ceiling, so the node's copies in flight start where a warm's do and
may ramp as far. Each reader's share is then tuned as it runs by the same
rule as ``--jobs auto`` (:class:`ucstage.cache.tuning.Jobs`: doubling while
its throughput rises, backing off on errors). Under a byte cap the share's
ceiling is cut so that the node's read-ahead takes at most :data:`CAP_SHARE`
of the cap, and every reader's window (its share, the current file, the
slack and the batches its loop has not moved past, of the largest file)
fits under the cap.
"""

from __future__ import annotations

import collections
import functools
import inspect
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

from ..cache import tuning
from ..volumes import FileEntry

__all__ = ["AUTO", "CAP_SHARE", "ReadAhead", "Share", "cache_fetcher", "cache_lookup", "check_read_ahead",
           "node_share"]

AUTO = "auto"
FALLBACK = 4
"""The read-ahead of ``"auto"`` when there is no volume to size it by."""
CAP_SHARE = 16
"""Under a byte cap, ``"auto"``'s read-ahead takes at most 1/8 of it (over
every reader of the node): copies in flight are held, so a window near the
cap would leave nothing to keep files in for the next epoch (a hit rate near
0 instead of about cap / dataset)."""
READER_CEILING = 64
"""The most copies one reader (a DataLoader worker's slot iterator) keeps in
flight, whatever its share: each is a thread waiting on its copy."""

GRACE_SECONDS = 2.0
"""How long :meth:`ReadAhead.close` lets stopped copies reach their next
chunk before abandoning them (when the cache can abandon copies)."""
JOIN_SECONDS = 60.0
"""How long :meth:`ReadAhead.close` waits for a copy in flight to finish when
the cache cannot stop it: a hung mount must not hang the training loop's exit."""


def cache_fetcher(cache: Any, volume: Any) -> tuple[Callable[[FileEntry], str],
                                                    Callable[[], None] | None,
                                                    Callable[[], None] | None]:
    """``(fetch, stop, abandon)`` for a :class:`ReadAhead` over ``cache``.

    When ``cache.fetch`` takes an ``inflight`` (the stop handle ``cache warm``
    stops its copies with: :class:`ucstage.cache.inflight.Inflight`; LocalCache
    does, a cache object of the user's own may not), ``stop`` makes
    copies in flight end at their next chunk and remove their temp files, and
    ``abandon`` (``cache.abandon(inflight)``) removes the temp files of copies
    still blocked in a read. Otherwise both are None and a copy in flight is
    finished before the iterator closes.
    """
    if not _takes(cache.fetch, "inflight"):
        return functools.partial(cache.fetch, volume), None, None
    from ..cache.inflight import Inflight

    inflight = Inflight()
    abandon = getattr(cache, "abandon", None)
    return (functools.partial(cache.fetch, volume, inflight=inflight), inflight.stop,
            functools.partial(abandon, inflight) if callable(abandon) else None)


def cache_lookup(cache: Any, volume: Any) -> Callable[[FileEntry], str | None] | None:
    """``lookup(entry)`` for a :class:`ReadAhead` over ``cache``: the cache's own
    ``lookup`` (a hit's path, or None; it never copies), or None when the
    cache object has none (every entry then goes through ``fetch``)."""
    lookup = getattr(cache, "lookup", None)
    return functools.partial(lookup, volume) if callable(lookup) else None


class Share(NamedTuple):
    """One reader's part of the node's copies in flight."""

    start: int
    """Where its tuning starts."""
    ceiling: int
    """The most it keeps in flight (its window beyond the current file)."""
    tuned: bool
    """False for a fixed ``read_ahead=N``: ``start == ceiling == N``."""


def check_read_ahead(value: int | str) -> int | str:
    """``"auto"`` or the read-ahead as a non-negative int.

    Raises:
        ValueError: anything else (the caller names its parameter).
    """
    if value == AUTO:
        return AUTO
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"read_ahead must be 0 or more, or 'auto', got {value!r}")
    return int(value)


def node_share(read_ahead: int | str, volume: Any, readers: int,
               cap_depth: int | None = None) -> Share:
    """One reader's :class:`Share` of the node's copies in flight.

    Args:
        read_ahead: the dataset's ``read_ahead``: a fixed N (used as given), or
            :data:`AUTO`.
        volume: the source (its kind picks the first guess, see
            :func:`ucstage.cache.tuning.first_guess`).
        readers: readers on this node (``LOCAL_WORLD_SIZE`` x workers).
        cap_depth: the most files a reader may fetch ahead under the cache's
            byte cap (None: no cap).
    """
    if read_ahead != AUTO:
        depth = int(read_ahead)
        return Share(depth, depth, False)
    if volume is None:  # a dataset of the user's own, with no volume to size by
        return Share(FALLBACK, FALLBACK, False)
    from ..engines import engine

    reader = engine.of(volume)
    readers = max(1, readers)
    total = tuning.first_guess(volume, reader)
    top = tuning.ceiling(reader)
    ceiling = min(READER_CEILING, max(1, -(-top // readers)))
    if cap_depth is not None:
        ceiling = max(1, min(ceiling, cap_depth))
    return Share(min(ceiling, max(1, -(-total // readers))), ceiling, True)


def _takes(func: Callable[..., Any], name: str) -> bool:
    try:
        return name in inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False


class ReadAhead:
    """Fetch ``entries`` with up to ``depth`` threads; iterating returns their paths in order.

    Args:
        fetch: ``fetch(entry)`` -> local path.
        entries: the slot's files, in read order.
        depth: how many files beyond the one being consumed may be fetched.
        stop: called by :meth:`close` to stop the copies in flight, if the
            fetcher can (see :func:`cache_fetcher`).
        abandon: called by :meth:`close` when stopped copies have not ended
            within :data:`GRACE_SECONDS`: removes what they left.
        lookup: ``lookup(entry)`` -> the local path of a valid cached copy,
            or None; never copies (see :func:`cache_lookup`). With it, the
            consumer's thread looks each entry up as it enters the window and
            only misses go to the threads, which start at the first miss: an
            epoch over a warm cache pays no thread hand-off and starts none.
        jobs: how many of the ``depth`` threads may copy at once, tuned as
            they run (``read_ahead="auto"``: :func:`node_share`); None lets
            every thread copy.
    """

    def __init__(self, fetch: Callable[[FileEntry], str], entries: Sequence[FileEntry],
                 depth: int, *, stop: Callable[[], None] | None = None,
                 abandon: Callable[[], None] | None = None,
                 lookup: Callable[[FileEntry], str | None] | None = None,
                 jobs: tuning.Jobs | None = None) -> None:
        self._fetch = fetch
        self._jobs = jobs
        self._lookup = lookup
        self._stop_copies = stop
        self._abandon = abandon
        self._entries = entries
        self._depth = depth
        self._count = len(entries)
        lock = threading.Lock()
        self._cond = threading.Condition(lock)
        """The threads wait on it for a miss (one woken per miss queued)."""
        self._done = threading.Condition(lock)
        """The consumer waits on it for a result."""
        self._stop = threading.Event()
        self._window = 0
        """The threads may end once this reaches the entry count and no miss
        is queued; only the consumer's thread moves it."""
        self._misses: collections.deque[int] = collections.deque()
        """Indices for the threads to fetch, in order (guarded by ``_cond``)."""
        self._results: dict[int, tuple[bool, Any]] = {}
        self._threads: list[threading.Thread] = []

    def _queue(self, index: int) -> None:
        """Hand entry ``index`` to the threads (started at the first miss)."""
        with self._cond:
            # The window moves with the queue, under the lock: a thread that
            # saw the window at the end and nothing queued would end for good.
            self._window = index + 1
            self._misses.append(index)
            self._cond.notify()
            if not self._threads:
                self._threads = [
                    threading.Thread(target=self._work, name=f"ucstage-read-ahead-{i}",
                                     daemon=True)
                    for i in range(max(1, min(self._depth, self._count)))]
                for thread in self._threads:
                    thread.start()

    def _claim(self) -> int | None:
        """The next index to fetch; None once stopped or every entry is handed out."""
        with self._cond:
            while not self._stop.is_set() and not self._misses and self._window < self._count:
                self._cond.wait()
            if self._stop.is_set() or not self._misses:
                return None
            return self._misses.popleft()

    def _work(self) -> None:
        jobs = self._jobs
        while (index := self._claim()) is not None:
            entry = self._entries[index]
            copied = 0
            try:
                if jobs is not None and not jobs.enter():
                    raise RuntimeError("read-ahead closed")  # never reaches the consumer
                try:
                    result: tuple[bool, Any] = (True, self._fetch(entry))
                    copied = int(getattr(entry, "size", 0) or 0)
                finally:
                    if jobs is not None:
                        jobs.leave(copied, counted=bool(copied))
            except BaseException as exc:  # handed to the consumer, which raises it
                result = (False, exc)
            with self._cond:
                self._results[index] = result
                self._done.notify()

    def _fetched(self, index: int) -> Any:
        """Wait for a thread's fetch of entry ``index``; raise what it raised
        (a path, or what the fetch returns: a grouped sample's dict)."""
        with self._done:
            while index not in self._results:
                self._done.wait()
            ok, value = self._results.pop(index)
        if not ok:
            raise value
        return value

    def __iter__(self) -> Iterator[str]:
        """The local paths of the entries, in order, each once its fetch is done.

        While the consumer holds entry ``i``, entries up to ``i + depth`` may
        be fetched, never more. The first fetch that fails raises here, in its
        turn (``FetchFailed``, ``CacheFull``, ...).
        """
        # The hot loop of a warm epoch: locals only, one lookup per entry,
        # no lock unless there is a miss.
        entries, lookup, depth, count = self._entries, self._lookup, self._depth, self._count
        hits: dict[int, str] = {}
        queue = self._queue
        for index in range(-depth, count):
            ahead = index + depth  # the entry that enters the window now
            if 0 <= ahead < count:
                path = None
                if lookup is not None:
                    try:
                        path = lookup(entries[ahead])
                    except Exception:  # the fetch raises it again, in its turn
                        path = None
                if path is None:
                    queue(ahead)
                else:
                    hits[ahead] = path
                if ahead + 1 == count and self._window < count:
                    with self._cond:
                        self._window = count
                        self._cond.notify_all()  # nothing more to come: idle threads end
            if index >= 0:
                path = hits.pop(index, None)
                yield path if path is not None else self._fetched(index)

    def close(self) -> None:
        """Start no new fetch; stop (or finish) the copies in flight; wait for the threads."""
        if sys.is_finalizing():
            # A generator left open is closed while the interpreter shuts down,
            # after its daemon threads were frozen: one frozen holding this lock
            # (woken from its wait, never to run again) would hang the exit for
            # good (seen: a Mix left unfinished, 1 exit in 13 under load). The
            # threads are gone with the process; nothing is left to stop.
            return
        with self._cond:
            self._stop.set()
            self._cond.notify_all()
            threads = list(self._threads)
        if self._jobs is not None:
            self._jobs.close()  # threads waiting for a place in flight give up
        if not threads:
            return  # nothing was ever copied by this iterator
        if self._stop_copies is not None:
            self._stop_copies()
        wait = GRACE_SECONDS if self._abandon is not None else JOIN_SECONDS
        deadline = time.monotonic() + wait
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if self._abandon is not None and self.alive:
            # Threads blocked in a read on a slow or hung mount: their copies
            # are given up (temp files removed); they end when the read returns.
            self._abandon()

    @property
    def alive(self) -> int:
        """Threads still running."""
        return sum(t.is_alive() for t in self._threads)
