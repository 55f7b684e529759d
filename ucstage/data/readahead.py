"""Fetching the next few files of a slot in the background, and stopping cleanly.

:class:`ReadAhead` runs ``depth`` threads that fetch a slot's entries into the
cache ahead of the consumer, and hands the local paths back in slot order.
While the consumer holds item ``i``, items up to ``i + depth`` may be fetched,
never more.

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
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..volumes import FileEntry

__all__ = ["ReadAhead"]

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

    When ``cache.fetch`` takes a ``run`` (the stop handle ``cache warm`` stops
    its copies with: :class:`ucstage.cache.inflight.Inflight`; LocalCache does,
    a cache object of the user's own may not), ``stop`` makes
    copies in flight end at their next chunk and remove their temp files, and
    ``abandon`` (``cache.abandon(run)``) removes the temp files of copies
    still blocked in a read. Otherwise both are None and a copy in flight is
    finished before the iterator closes.
    """
    if not _takes(cache.fetch, "run"):
        return functools.partial(cache.fetch, volume), None, None
    from ..cache.inflight import Inflight

    run = Inflight()
    abandon = getattr(cache, "abandon", None)
    return (functools.partial(cache.fetch, volume, run=run), run.stop,
            functools.partial(abandon, run) if callable(abandon) else None)


def _takes(func: Callable[..., Any], name: str) -> bool:
    try:
        return name in inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False


class ReadAhead:
    """Fetch ``entries`` with ``depth`` threads; :meth:`take` returns them in order.

    Args:
        fetch: ``fetch(entry)`` -> local path.
        entries: the slot's files, in read order.
        depth: how many files beyond the one being consumed may be fetched.
        stop: called by :meth:`close` to stop the copies in flight, if the
            fetcher can (see :func:`cache_fetcher`).
        abandon: called by :meth:`close` when stopped copies have not ended
            within :data:`GRACE_SECONDS`: removes what they left.
    """

    def __init__(self, fetch: Callable[[FileEntry], str], entries: Sequence[FileEntry],
                 depth: int, *, stop: Callable[[], None] | None = None,
                 abandon: Callable[[], None] | None = None) -> None:
        self._fetch = fetch
        self._stop_copies = stop
        self._abandon = abandon
        self._entries = entries
        self._depth = depth
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._next = 0
        """The next index a thread takes."""
        self._asked = 0
        """The index the consumer asked for last: items up to it + depth may be fetched."""
        self._results: dict[int, tuple[bool, Any]] = {}
        self._threads = [threading.Thread(target=self._work, name=f"ucstage-read-ahead-{i}",
                                          daemon=True)
                         for i in range(min(depth, len(entries)))]
        for thread in self._threads:
            thread.start()

    def _claim(self) -> int | None:
        """The next index to fetch, once the window allows it; None when done."""
        with self._cond:
            while (not self._stop.is_set() and self._next < len(self._entries)
                   and self._next > self._asked + self._depth):
                self._cond.wait()
            if self._stop.is_set() or self._next >= len(self._entries):
                return None
            index = self._next
            self._next += 1
            return index

    def _work(self) -> None:
        while (index := self._claim()) is not None:
            try:
                result: tuple[bool, Any] = (True, self._fetch(self._entries[index]))
            except BaseException as exc:  # handed to the consumer, which raises it
                result = (False, exc)
            with self._cond:
                self._results[index] = result
                self._cond.notify_all()

    def take(self, index: int) -> str:
        """The local path of entry ``index`` (0, 1, 2, ... in turn), waiting for its fetch.

        Raises:
            whatever its fetch raised (``FetchFailed``, ``CacheFull``, ...).
        """
        with self._cond:
            self._asked = index
            self._cond.notify_all()
            while index not in self._results:
                self._cond.wait()
            ok, value = self._results.pop(index)
        if not ok:
            raise value
        return str(value)

    def close(self) -> None:
        """Start no new fetch; stop (or finish) the copies in flight; wait for the threads."""
        with self._cond:
            self._stop.set()
            self._cond.notify_all()
        if self._stop_copies is not None:
            self._stop_copies()
        wait = GRACE_SECONDS if self._abandon is not None else JOIN_SECONDS
        deadline = time.monotonic() + wait
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if self._abandon is not None and self.alive:
            # Threads blocked in a read on a slow or hung mount: their copies
            # are given up (temp files removed); they end when the read returns.
            self._abandon()

    @property
    def alive(self) -> int:
        """Threads still running."""
        return sum(t.is_alive() for t in self._threads)
