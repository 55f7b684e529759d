"""Stopping copies: the stop flag and the copies in flight, shared by a job's threads.

A warm's worker threads (or a dataset's read-ahead threads, through
``LocalCache.fetch(..., inflight=)``) copy one file each at a time. When the job
must stop (Ctrl-C or SIGTERM reached the thread that waits for them, the
cache is full, the loader shuts down), no thread may start another copy, and
every copy still in flight is either ended by its thread or abandoned by the
waiting thread (:meth:`ucstage.cache.LocalCache.abandon`): its temp file
removed and its byte reservation given back, exactly once.

Why abandon at all: a thread blocked in a read on a slow or hung mount
cannot be interrupted from Python, and the caller (a person at Ctrl-C) should
not wait for it. The copy's thread may wake up later; it then finds its copy
abandoned and only closes its file, never touching a path that by then may
name another copy's temp file.

Each copy goes through these states (one lock guards them all)::

    reserve() ── reserving ──> copying ──claim()──> committing ──> done
                   │              └── abandon() by the waiting thread: temp file removed
                   └── stopped meanwhile: the copy's thread cleans up itself
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable

from ..engines.context import Stopped

__all__ = ["Inflight", "Stopped"]


_RESERVING, _COPYING, _COMMITTING = "reserving", "copying", "committing"


class Inflight:
    """The stop flag of one job (a warm, a read-ahead) and the registry of its
    copies in flight. Thread-safe; create one per job."""

    def __init__(self, on_retry: Callable[[], None] | None = None) -> None:
        self._on_retry = on_retry
        """Told of each retry's backoff (the warm's concurrency backs off on errors)."""
        self._event = threading.Event()
        self._lock = threading.Condition()
        self._state: dict[int, str] = {}
        self._copies: dict[int, tuple[str, int]] = {}
        self._wakes: dict[int, Callable[[], None]] = {}
        self._tokens = itertools.count()

    # -- the stop flag --------------------------------------------------------

    def stop(self) -> None:
        """No copy starts after this; copies in flight stop at their next chunk,
        and waits registered with :meth:`watch` are woken."""
        self._event.set()
        with self._lock:
            wakes = list(self._wakes.values())
        for wake in wakes:
            wake()

    def watch(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake`` when the job stops (at once if it has): a copy waiting
        for a request elsewhere (the object-store engine's event loop) sleeps
        without polling. Returns the function that unregisters it."""
        with self._lock:
            key = next(self._tokens)
            self._wakes[key] = wake
        if self._event.is_set():
            wake()

        def unwatch() -> None:
            with self._lock:
                self._wakes.pop(key, None)

        return unwatch

    @property
    def stopped(self) -> bool:
        return self._event.is_set()

    @property
    def copying_now(self) -> int:
        """How many copies are copying their bytes now (reserved, not yet
        claimed back): the ones :meth:`abandon` would give up."""
        with self._lock:
            return len(self._copies)

    def check(self) -> None:
        """Raise :exc:`Stopped` once the warm has stopped."""
        if self._event.is_set():
            raise Stopped()

    def sleep(self, seconds: float, *, slow_down: bool = True) -> None:
        """Wait ``seconds`` (a retry's backoff), or less if the warm stops; then
        check. ``slow_down``: the retry's error asks for fewer copies in
        flight (throttling, a timeout), so the job's ``on_retry`` hears it."""
        if slow_down and self._on_retry is not None:
            self._on_retry()
        if seconds > 0:
            self._event.wait(seconds)
        self.check()

    async def asleep(self, seconds: float, *, slow_down: bool = True) -> None:
        """:meth:`sleep` for a copy running as a coroutine: a stop cancels the
        coroutine itself (the driver's work), so this only waits and checks."""
        import asyncio

        if slow_down and self._on_retry is not None:
            self._on_retry()
        if seconds > 0:
            await asyncio.sleep(seconds)
        self.check()

    # -- one copy's life ----------------------------------------------------------

    def begin(self) -> int:
        """A copy is about to reserve its temp file; returns its token.

        Raises:
            Stopped: the warm has stopped; start no copy.
        """
        with self._lock:
            self.check()
            token = next(self._tokens)
            self._state[token] = _RESERVING
            return token

    def copying(self, token: int, tmp: str, reserved: int) -> bool:
        """The temp file exists and ``reserved`` bytes are counted for it.
        False when the warm stopped meanwhile: the caller removes it itself."""
        with self._lock:
            if self._event.is_set():
                self._state.pop(token, None)
                self._lock.notify_all()
                return False
            self._state[token] = _COPYING
            self._copies[token] = (tmp, reserved)
            return True

    def claim(self, token: int) -> bool:
        """The bytes are copied; take the copy back to finish it (stamp, rename).
        False when it was abandoned: the temp file is no longer the caller's."""
        with self._lock:
            if token not in self._copies:
                return False
            del self._copies[token]
            self._state[token] = _COMMITTING
            return True

    def release(self, token: int) -> bool:
        """The copy ends (done or failed). True when its temp file is still the
        caller's to remove; False when :meth:`abandon` already did."""
        with self._lock:
            mine = self._state.pop(token, None) is not None
            self._copies.pop(token, None)
            self._lock.notify_all()
            return mine

    # -- the waiting thread -----------------------------------------------------------

    def abandon(self, remove: Callable[[str, int], None], *, wait: float = 2.0) -> int:
        """Stop, then remove every copy still copying (``remove(tmp, reserved)``),
        and wait up to ``wait`` seconds for copies that are reserving or being
        committed (short steps) to end. Returns how many copies were abandoned."""
        self.stop()
        with self._lock:
            taken = list(self._copies.items())
            for token, _ in taken:
                del self._copies[token]
                del self._state[token]
        for _, (tmp, reserved) in taken:
            remove(tmp, reserved)
        deadline = time.monotonic() + wait
        with self._lock:
            while self._state and time.monotonic() < deadline:
                self._lock.wait(max(0.0, min(0.1, deadline - time.monotonic())))
        return len(taken)
