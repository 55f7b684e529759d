"""The byte ledger: the bytes a cache root holds, copies in flight included.

One small file, ``.ucstage/usage``, is both the value and the lock
(:func:`locked_ledger`): an ``flock`` on it, shared by every process, guards the
byte count and the tree's names (files are renamed into place, evicted and
walked for counting only while it is held). See
:class:`ucstage.cache.space.CacheSpace`.

A process's threads take turns at it through one :class:`Turns`: whichever
thread gets the turn runs every operation queued meanwhile under one hold
(flat combining), so the lock is taken once per batch, not per copy.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Generic, TypeVar

from . import paths

__all__ = ["Ledger", "Turns", "locked_ledger"]

T = TypeVar("T")


class Ledger:
    """Bytes the cache holds (plus reservations), as a fixed-width number in
    one small file. Rewritten in place: that needs no new disk block (it must
    work on a full disk), and a torn write fails to parse, which makes the next
    reader recount from the tree."""

    def __init__(self, fd: int, recount: Callable[[], int]) -> None:
        self.fd = fd
        self.recount = recount

    def read(self) -> int:
        """The recorded bytes; recounted (and rewritten) when unreadable."""
        try:
            return int(os.pread(self.fd, 64, 0).decode("ascii").strip())
        except (OSError, ValueError, UnicodeDecodeError):
            total = self.recount()
            self.write(total)
            return total

    def write(self, value: int) -> None:
        """Record ``value`` bytes (never below 0)."""
        os.pwrite(self.fd, b"%20d\n" % max(0, value), 0)


@contextlib.contextmanager
def locked_ledger(root: str, recount: Callable[[], int]) -> Iterator[Ledger]:
    """The byte ledger of ``root``, locked for the ``with`` block;
    ``recount()`` counts the tree when the file cannot be read."""
    fd = paths.open_private(os.path.join(root, paths.CONTROL, "usage"), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield Ledger(fd, recount)
    finally:
        os.close(fd)


class _Held(Ledger):
    """The ledger seen by a batch of operations under one hold: read once,
    written once when the batch ends (:meth:`flush`)."""

    def __init__(self, ledger: Ledger) -> None:
        super().__init__(ledger.fd, ledger.recount)
        self._value: int | None = None
        self._dirty = False

    def read(self) -> int:
        if self._value is None:
            self._value = super().read()
        return self._value

    def write(self, value: int) -> None:
        self._value, self._dirty = max(0, value), True

    def flush(self) -> None:
        if self._dirty and self._value is not None:
            super().write(self._value)


class _Op(Generic[T]):
    """One thread's operation waiting for its turn, and its outcome."""

    def __init__(self, fn: Callable[[Ledger], T]) -> None:
        self.fn = fn
        self.done = False
        self.value: T | None = None
        self.error: BaseException | None = None

    def run(self, ledger: Ledger) -> None:
        # An Exception is this operation's alone; a KeyboardInterrupt (only
        # ever the main thread's) stops the whole turn (see Turns._serve).
        try:
            self.value = self.fn(ledger)
        except Exception as exc:
            self.error = exc
        self.done = True

    def outcome(self) -> T:
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]


class Turns:
    """This process's turns at the ledger: :meth:`run` an operation under
    the lock, batched with the other threads' that are waiting.

    Why: every copy settles the ledger twice (reserve, commit), and the lock
    is shared by every process. A DataLoader worker's read-ahead threads each
    took it on their own, and a holder that then waited for the GIL behind
    its own process's threads held every other process up (on 2 cores, 55%
    of the workers' samples of a lazy epoch waited on it). Here a process
    queues on a thread lock instead; the thread whose turn it is runs the
    whole queue under one hold, reading the value once and writing it once.
    Each operation sees the ledger as if it ran alone, in queue order; one
    that raises fails alone.

    An operation must not depend on its thread (thread-local state): it may
    run in another thread of the process. Forked children start with fresh
    turns.
    """

    def __init__(self, locked: Callable[[], AbstractContextManager[Ledger]]) -> None:
        self._locked = locked
        self._fresh()

    def _fresh(self) -> None:
        self._pid = os.getpid()
        self._turn = threading.Lock()
        self._queue_lock = threading.Lock()
        self._queue: list[_Op[object]] = []

    def run(self, fn: Callable[[Ledger], T]) -> T:
        """``fn(ledger)`` under the ledger lock (in this thread or another's
        turn); its result, or its exception raised here."""
        if self._pid != os.getpid():
            self._fresh()  # a forked child: the parent's locks may be held
        op: _Op[T] = _Op(fn)
        with self._queue_lock:
            self._queue.append(op)  # type: ignore[arg-type]
        with self._turn:
            if not op.done:
                self._serve()
        return op.outcome()

    def _take(self) -> list[_Op[object]]:
        with self._queue_lock:
            batch, self._queue = self._queue, []
        return batch

    def _serve(self) -> None:
        batch: list[_Op[object]] = []
        try:
            with self._locked() as ledger:
                # Taken once the lock is held: what queued while this thread
                # waited for it joins the batch.
                batch = self._take()
                held = _Held(ledger)
                try:
                    for op in batch:
                        op.run(held)
                finally:
                    held.flush()
        except BaseException as exc:
            # The lock could not be taken, or Ctrl-C reached the main thread
            # during its turn: every operation not run fails (an interrupt
            # as an OSError in the other threads, which were not
            # interrupted), and the thread whose turn it was raises.
            failed = exc if isinstance(exc, Exception) else InterruptedError(
                "interrupted while another thread settled the cache's byte ledger")
            for op in batch + self._take():
                if not op.done:
                    op.error, op.done = failed, True
            raise
