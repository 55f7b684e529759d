"""How many copies a job keeps in flight: a fixed number, or tuned as it runs.

``jobs="auto"`` (the default of warm) starts from a first guess for the
source's kind (:func:`first_guess`: a few threads on a local disk folder,
dozens through a FUSE or network mount or an fsspec remote, more requests on
the object-store engine's event loop), so that a short job is not spent
ramping, and doubles the copies in
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

from ..engines.engine import Engine
from ..engines.mounts import mount_fstype
from ..volumes.location import Volume

__all__ = ["AUTO", "FIRST_GUESS", "OBJECT_STORE_CEILING", "THREAD_CEILING", "Jobs", "ceiling",
           "check_jobs", "first_guess", "source_kind"]

AUTO = "auto"
OBJECT_STORE_CEILING = 256
THREAD_CEILING = 64
_START = 8
"""Where a tuned job starts with threads when its caller gives no first guess."""
_START_REQUESTS = 32
"""Where it starts with requests on the event loop when given no first guess."""
LOCAL, MOUNT, OBJECT_STORE, REMOTE = "local", "mount", "object-store", "remote"
FIRST_GUESS = {LOCAL: 8, MOUNT: 32, OBJECT_STORE: 64, REMOTE: 32}
"""Where a tuned job starts, per source kind (:func:`source_kind`). A local
disk gains nothing from many threads; a FUSE or network mount and an fsspec
remote pay a round trip per file, which only dozens in flight hide (through
an rclone mount at 20 ms, 1,000 x 256 KiB: 16-32 threads were the best bare
copies, docs/benchmarks.md "--jobs auto's first guess"); requests on the
object-store engine's event loop are cheap, so it starts higher still. From
there the tuner ramps and backs off as before: the guess only saves the
windows a short job would spend doubling from a low start."""
_NETWORK_FS = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph",
                         "lustre", "gpfs", "glusterfs", "afs", "beegfs"})
"""Kernel filesystems that are a remote store behind a local path, as FUSE is."""
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


def source_kind(volume: Volume, engine: Engine) -> str:
    """What kind of source ``volume`` is, for :data:`FIRST_GUESS`:
    :data:`OBJECT_STORE` when its engine's requests share an event loop (they
    are cheap), :data:`REMOTE` for another fsspec filesystem, :data:`MOUNT`
    for a local path on a FUSE (``fuse``, ``fuse.*``) or network filesystem,
    else :data:`LOCAL`."""
    if engine.on_loop:
        return OBJECT_STORE
    if not getattr(volume, "is_local", False):
        return REMOTE
    fstype = mount_fstype(volume.root)
    if fstype == "fuse" or fstype.startswith("fuse.") or fstype in _NETWORK_FS:
        return MOUNT
    return LOCAL


def first_guess(volume: Volume, engine: Engine) -> int:
    """Where ``jobs="auto"`` starts for ``volume`` read by ``engine``."""
    return FIRST_GUESS[source_kind(volume, engine)]


def ceiling(engine: Engine) -> int:
    """The most copies in flight ``engine`` may have: :data:`OBJECT_STORE_CEILING`
    requests on its event loop, else :data:`THREAD_CEILING` threads."""
    return OBJECT_STORE_CEILING if engine.on_loop else THREAD_CEILING


class Jobs:
    """The in-flight limit of one job. Workers call :meth:`enter` before a copy
    and :meth:`leave` after it; the limit moves between windows. Thread-safe."""

    def __init__(self, jobs: int | None, *, ceiling: int, start: int | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        """``start``: where a tuned job starts (:func:`first_guess`); by
        default 8, or 32 when the ceiling is an event loop's."""
        self.fixed = jobs is not None
        self.ceiling = jobs if jobs is not None else ceiling
        if start is None:
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
