"""Timed reads: ``workers`` threads share one file list and read every byte.

Each reader takes the next file, reads it to the end with a large buffer and
records its latency. A stop flag ends the run early (deadline, first error,
Ctrl-C); the caller decides what a cut-short run means. A :class:`Meter`
passes the running totals to the progress callback, from the calling thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import FetchFailed, SourceUnreadable
from ..progress import Callback
from ..volumes import FileEntry, Volume

if TYPE_CHECKING:
    from ..cache import LocalCache

__all__ = ["BUFFER_BYTES", "FileReader", "Meter", "ReadTally", "measure", "raise_read_error"]

BUFFER_BYTES = 4 * 1024 * 1024
"""Read size per call: large, so per-call overhead does not hide the volume's speed."""
_TICK = 0.1


class _Stopped(Exception):
    """A reader saw the stop flag in the middle of a file."""


def _drain(fh: Any, buf: bytearray, stop: threading.Event) -> int:
    """Read a file object to its end; return the byte count."""
    view = memoryview(buf)
    total = 0
    readinto = getattr(fh, "readinto", None)
    while True:
        if stop.is_set():
            raise _Stopped
        if readinto is not None:
            n = readinto(view)
            if not n:
                return total
            total += n
        else:
            chunk = fh.read(len(buf))
            if not chunk:
                return total
            total += len(chunk)


def _read_local(path: str, buf: bytearray, stop: threading.Event) -> int:
    with open(path, "rb", buffering=0) as fh:
        return _drain(fh, buf, stop)


class FileReader:
    """How one mode reads one file: direct from the volume, or via a cache."""

    def __init__(self, volume: Volume, cache: LocalCache | None) -> None:
        self.volume = volume
        self.cache = cache

    def read(self, entry: FileEntry, buf: bytearray, stop: threading.Event) -> int:
        if self.cache is not None:
            # fetch() copies on a miss and validates on a hit, as training does.
            return _read_local(self.cache.fetch(self.volume, entry), buf, stop)
        if self.volume.is_local:
            return _read_local(self.volume.full_path(entry.path), buf, stop)
        with self.volume.open(entry.path) as fh:
            return _drain(fh, buf, stop)


class Meter:
    """One phase of a bench (a timed run, or the warm fill) on a progress callback.

    The timing loops know running totals; the callback takes a description,
    a size and increments, so this turns one into the other. Bench calls it
    only from the thread that called :func:`ucstage.bench.run`, so whatever
    the callback raises (a notebook's interrupt) stops the bench there.
    """

    def __init__(self, callback: Callback, description: str, entries: Sequence[FileEntry],
                 status: str = "read") -> None:
        """Announce the phase: ``set_description``, then ``set_size`` of ``entries``;
        ``status`` is what :meth:`update` reports each finished file as."""
        self.callback = callback
        self.status = status
        self._bytes = 0
        callback.set_description(description)
        callback.set_size(sum(e.size for e in entries), items=len(entries))

    def update(self, nbytes: int, finished: Sequence[str] = ()) -> None:
        """``nbytes`` done so far in this phase; ``finished`` names the files
        completed since the last call."""
        for name in finished:
            self.callback.item_done(name, self.status)
        if nbytes > self._bytes:
            self.callback.relative_update(nbytes - self._bytes)
            self._bytes = nbytes


@dataclass
class ReadTally:
    """What the readers of one run counted."""

    files: int = 0
    bytes: int = 0
    latencies: list[float] = field(default_factory=list)
    done: list[str] = field(default_factory=list)
    """Paths of the files read completely, in the order they finished."""
    error: BaseException | None = None
    error_path: str = ""


def measure(
    entries: Sequence[FileEntry],
    workers: int,
    read: Callable[[FileEntry, bytearray, threading.Event], int],
    *,
    deadline: float | None,
    meter: Meter,
) -> tuple[ReadTally, float, bool]:
    """Read ``entries`` with ``workers`` threads; return (tally, seconds, complete)."""
    tally = ReadTally()
    lock = threading.Lock()
    stop = threading.Event()
    cursor = iter(range(len(entries)))
    finished: list[float] = []
    all_done = threading.Event()
    running = [workers]

    def work() -> None:
        try:
            _work()
        finally:
            with lock:
                finished.append(time.perf_counter())
                running[0] -= 1
                if running[0] == 0:
                    all_done.set()

    def _work() -> None:
        buf = bytearray(BUFFER_BYTES)
        while not stop.is_set():
            with lock:
                index = next(cursor, None)
            if index is None:
                return
            entry = entries[index]
            start = time.perf_counter()
            try:
                n = read(entry, buf, stop)
            except _Stopped:
                return
            except BaseException as exc:  # reported to the caller, which re-raises
                with lock:
                    if tally.error is None:
                        tally.error, tally.error_path = exc, entry.path
                stop.set()
                return
            elapsed = time.perf_counter() - start
            with lock:
                tally.files += 1
                tally.bytes += n
                tally.latencies.append(elapsed)
                tally.done.append(entry.path)

    threads = [threading.Thread(target=work, name=f"ucstage-bench-{i}", daemon=True)
               for i in range(workers)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    timed_out = False
    sent = 0

    def report() -> None:
        nonlocal sent
        with lock:
            nbytes, newly_done = tally.bytes, tally.done[sent:]
        sent += len(newly_done)
        meter.update(nbytes, newly_done)

    try:
        while not all_done.wait(_TICK):  # a timed wait lets Ctrl-C reach this thread
            if deadline is not None and time.monotonic() >= deadline and not stop.is_set():
                timed_out = True
                stop.set()
            report()
    finally:
        stop.set()
        for t in threads:
            t.join()
    # The last reader's finish, not this loop's wake-up, ends the run.
    seconds = max(finished or [time.perf_counter()]) - started
    report()
    complete = tally.files == len(entries) and not timed_out
    return tally, seconds, complete


def raise_read_error(tally: ReadTally, mode: str) -> None:
    """Re-raise the first error a reader met, as FetchFailed unless it was an interrupt."""
    if tally.error is None:
        return
    exc = tally.error
    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
        raise exc
    if isinstance(exc, FetchFailed):
        raise exc
    path = tally.error_path
    if isinstance(exc, PermissionError):
        # One file the listing showed but this user may not read: the volume
        # is reachable, so saying so would send the user the wrong way.
        raise SourceUnreadable(
            f"{mode} read of {path}: permission denied",
            hint="bench reads every sampled file: make it readable, or leave it out "
                 "(--exclude GLOB)") from exc
    if isinstance(exc, FileNotFoundError):
        raise FetchFailed(f"{mode} read of {path}: the file is gone (the source changed "
                          "while bench ran)", hint="rerun the bench") from exc
    raise FetchFailed(f"{mode} read of {path} failed: {type(exc).__name__}: {exc}",
                      hint="check the volume is reachable") from exc

