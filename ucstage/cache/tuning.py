"""How many copies a job keeps in flight: a fixed number, or tuned as it runs.

``jobs="auto"`` (the default of warm) starts low (8 threads, or 32 requests
on the event loop) and doubles the copies in
flight while the measured throughput keeps rising by at least
:data:`_GAIN`; when a doubling stops paying, it settles on the best value
seen (and when even the first doubling did not pay, it tries halving the
start while that helps). Afterwards it halves on errors (a retry: throttling such as S3's 503
SlowDown, timeouts) and steps back by a quarter when throughput falls well
below the best it saw, then probes upwards again. It never exceeds a ceiling:
:data:`OBJECT_STORE_CEILING` requests for object stores (they are cheap on
one event loop), :data:`THREAD_CEILING` threads for FUSE mounts and local
folders. An explicit ``jobs=N`` is used as given.

Throughput is measured per window: a window closes once it has seen at least
as many finished copies as were allowed in flight and :data:`_WINDOW` seconds
have passed, so each measurement covers a full round of requests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["AUTO", "OBJECT_STORE_CEILING", "THREAD_CEILING", "Jobs", "check_jobs"]

AUTO = "auto"
OBJECT_STORE_CEILING = 256
THREAD_CEILING = 64
_START = 8
"""Where a tuned job starts with threads (mounts, folders, fsspec)."""
_START_REQUESTS = 32
"""Where it starts with requests on the event loop: cheap, and an object
store at tens of ms per request needs dozens in flight to fill a link."""
_WINDOW = 0.15
_GAIN = 1.10
"""A doubling must raise throughput by this factor to count as rising."""
_UP, _DOWN, _HOLD = "up", "down", "hold"
_FALL = 0.70
"""Throughput below this share of the best seen backs off."""


def check_jobs(jobs: int | str | None) -> int | None:
    """``None`` for auto (``None`` or ``"auto"``), else the positive job count.

    Raises:
        ValueError: anything else (the caller names its parameter).
    """
    if jobs is None or jobs == AUTO:
        return None
    if isinstance(jobs, str):
        if not jobs.strip().isdigit():
            raise ValueError(f"jobs must be a positive number or 'auto', got {jobs!r}")
        jobs = int(jobs)
    if isinstance(jobs, bool) or jobs < 1:
        raise ValueError(f"jobs must be a positive number or 'auto', got {jobs!r}")
    return int(jobs)


class Jobs:
    """The in-flight limit of one job. Workers call :meth:`enter` before a copy
    and :meth:`leave` after it; the limit moves between windows. Thread-safe."""

    def __init__(self, jobs: int | None, *, ceiling: int,
                 clock: Callable[[], float] | None = None) -> None:
        self.fixed = jobs is not None
        self.ceiling = jobs if jobs is not None else ceiling
        start = _START_REQUESTS if ceiling > 64 else _START
        self.limit = jobs if jobs is not None else min(start, ceiling)
        self.peak = self.limit
        """The highest limit reached (how many workers a job needed)."""
        self._clock = clock or time.monotonic
        self._cond = threading.Condition()
        self._active = 0
        self._closed = False
        self._phase = _UP
        self._first = self.limit
        self._best = (0.0, self.limit)
        self._last = 0.0
        self._start = self._clock()
        self._bytes = 0
        self._done = 0
        self._errors = 0

    @property
    def settled(self) -> int:
        """The limit in force now: the value a tuned job settled on."""
        return self.limit

    def close(self) -> None:
        """Wake every waiting worker: no more copies start."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def enter(self) -> bool:
        """Wait for a place in flight; False once :meth:`close` was called."""
        with self._cond:
            while self._active >= self.limit and not self._closed:
                self._cond.wait()
            if self._closed:
                return False
            self._active += 1
            return True

    def try_enter(self) -> bool:
        """Take a place in flight if one is free now (never waits); False when
        the limit is reached or :meth:`close` was called. For a driver that
        starts copies as coroutines rather than threads."""
        with self._cond:
            if self._closed or self._active >= self.limit:
                return False
            self._active += 1
            return True

    def leave(self, nbytes: int, *, counted: bool = True) -> None:
        """One copy ended, with ``nbytes`` copied (``counted=False``: the place
        was not used for a copy, so it says nothing about throughput)."""
        with self._cond:
            self._active -= 1
            limit = self.limit
            if counted:
                self._bytes += nbytes
                self._done += 1
                if not self.fixed:
                    self._tune()
            # One place freed: wake one waiter, not every thread above the limit.
            self._cond.notify(max(1, self.limit - limit + 1))

    def error(self) -> None:
        """A copy hit a transient error and will retry (throttling, a timeout)."""
        with self._cond:
            self._errors += 1

    def _tune(self) -> None:
        now = self._clock()
        elapsed = now - self._start
        if self._done < self.limit or elapsed < _WINDOW:
            return
        rate = self._bytes / elapsed
        errors = self._errors
        self._start, self._bytes, self._done, self._errors = now, 0, 0, 0
        best_rate = self._best[0]
        if rate > best_rate:
            self._best = (rate, self.limit)
        if errors:
            self._phase = _HOLD
            self._set(max(1, self.limit // 2))
            self._best = (0.0, self.limit)  # conditions changed: measure afresh
        elif self._phase == _UP:
            if rate >= self._last * _GAIN and self.limit < self.ceiling:
                self._set(self.limit * 2)
            elif self._best[1] == self._first and self._first > 1 and \
                    self.limit != self._first:
                # Doubling from the start never paid: the start may be past
                # the store's best already, so try fewer.
                self._phase = _DOWN
                self._set(self._first // 2)
            else:
                self._phase = _HOLD
                self._set(self._best[1])
        elif self._phase == _DOWN:
            if rate > best_rate and self.limit > 1:
                self._set(self.limit // 2)
            else:
                self._phase = _HOLD
                self._set(self._best[1])
        elif rate < best_rate * _FALL:
            self._set(max(1, self.limit * 3 // 4))
            self._best = (rate, self.limit)
        elif rate >= self._last * _GAIN and self.limit < self.ceiling:
            self._set(self.limit + max(1, self.limit // 4))  # probe upwards again
        self._last = rate

    def _set(self, limit: int) -> None:
        self.limit = max(1, min(self.ceiling, limit))
        self.peak = max(self.peak, self.limit)
