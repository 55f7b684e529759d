"""Hits, misses, evictions and waits of a training run, counted across processes.

Every process that reads through a :class:`ucstage.VolumeDataset` (the main
process of each rank, each DataLoader worker) counts into one small file of
its own, ``<root>/.ucstage/runs/<run>/r<rank>-<pid>.counters``: fixed-width
integers rewritten in place at most twice a second and when a reader ends
(one ``pwrite``; no lock is shared between processes). Readers sum the files: ``cache status``
the last run's (the run whose files changed last), the DataLoader its own
rank's before and after each epoch (``epoch_cache_hit_rate``).

A run is one job: the ranks torchrun started together (same agent process
and run id), or else one Python process and the DataLoader workers it
starts. The newest :data:`KEEP_RUNS` runs are kept.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import struct
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..engines import checks
from ..errors import CacheOwnershipError
from ..sharding import World
from ..shutdown import exiting
from . import paths

__all__ = ["KEEP_RUNS", "Counters", "RunStats", "counters", "job_id", "last_run", "read_run"]

KEEP_RUNS = 8
_FIELDS = ("hits", "misses", "hit_bytes", "miss_bytes", "evictions", "evicted_bytes",
           "wait_ns", "waits", "checked_md5", "checked_size", "mismatches", "checked_crc32c",
           "checked_page_crc")
_RECORD = struct.Struct(f"<{len(_FIELDS)}q")
_OLD_SIZES = (8 * 8, 11 * 8, 12 * 8)
"""Files written by older versions hold the first eight fields (before the
check counts), the first eleven (before the CRC32C count) or the first
twelve (before the page CRC count)."""
_CHECKED = {kind: _FIELDS.index(name) for name, kind in (
    ("checked_md5", "md5"), ("checked_size", "size"), ("mismatches", "mismatches"),
    ("checked_crc32c", "crc32c"), ("checked_page_crc", "page_crc"))}
"""The counter of each check this process's integrity tally counts (by its kind)."""
_job: str | None = None


def job_id() -> str:
    """This job's run name: shared by the ranks of one torchrun launch (their
    agent's pid and run id), else this process's start time and pid."""
    global _job
    if _job is None:
        run = World.detect().torchrun_run
        if run is not None:
            name = "".join(ch if ch.isalnum() else "_" for ch in run)[:40]
            _job = f"torchrun-{os.getppid()}-{name}"
        else:
            _job = f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    return _job


def _runs_dir(root: str) -> str:
    return os.path.join(root, paths.CONTROL, "runs")


_FLUSH_NS = 500_000_000
"""Counters are written out at most twice a second (and when a reader ends)."""
_HITS, _MISSES, _HIT_BYTES, _MISS_BYTES = 0, 1, 2, 3


class Counters:
    """One process's counters for one run and rank. Thread-safe (read-ahead
    threads count concurrently). Written out at most every half second and
    on :meth:`flush`: a reader flushes when it ends, so an epoch's counts are
    on disk before its DataLoader worker reports the end of its data."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._values = [0] * len(_FIELDS)
        self._lock = threading.Lock()
        # The first write comes half a second on, as every later one does (and
        # when the reader ends): a file copied or found counts in memory only.
        self._written = time.monotonic_ns()
        self._fd = paths.open_private(path, os.O_RDWR | os.O_CREAT)
        with contextlib.suppress(OSError):
            raw = os.pread(self._fd, _RECORD.size, 0)
            if raw:  # a file of this run and rank this process opened before
                self._values = _unpack(raw) or self._values
        # The checks this process's copies make from now on count for this
        # run (copies a reader made, and any other copy of the process): the
        # tally tells each live counter as it counts (:meth:`checked`).
        checks.TALLY.watchers.add(self)
        _LIVE.add(self)

    def checked(self, kind: str, n: int) -> None:
        """``n`` checks of ``kind`` (a :data:`ucstage.engines.checks.Tally.FIELDS`
        name) were made by this process's copies."""
        field = _CHECKED.get(kind)
        if field is not None:
            with self._lock:
                self._values[field] += n

    def add(self, **values: int) -> None:
        """Add to named counters (``evictions=1, evicted_bytes=size``)."""
        with self._lock:
            for name, value in values.items():
                self._values[_FIELDS.index(name)] += int(value)
        self._maybe_flush()

    def count(self, hit: bool, size: int, files: int = 1) -> None:
        """``files`` files of ``size`` bytes in all handed out: hits (already
        cached) or misses (copied)."""
        with self._lock:
            values = self._values
            if hit:
                values[_HITS] += files
                values[_HIT_BYTES] += size
            else:
                values[_MISSES] += files
                values[_MISS_BYTES] += size
        self._maybe_flush()

    def _maybe_flush(self) -> None:
        if time.monotonic_ns() - self._written >= _FLUSH_NS:
            self.flush()

    def flush(self, _exiting: Callable[[], bool] = exiting) -> None:
        """Write the counters out now (at interpreter exit: already written by
        the atexit handler, and the modules this needs may be gone: the
        default holds its own reference to :func:`ucstage.shutdown.exiting`,
        as this module's globals may be cleared first)."""
        if _exiting():
            return
        self._write()

    def _write(self) -> None:
        with self._lock:
            self._written = time.monotonic_ns()
            with contextlib.suppress(OSError):  # counting must never stop a training run
                os.pwrite(self._fd, _RECORD.pack(*self._values), 0)


_LIVE: weakref.WeakSet[Counters] = weakref.WeakSet()


@atexit.register
def _write_live() -> None:
    """The last counts of every live counter, while the interpreter still works."""
    for live in list(_LIVE):
        with contextlib.suppress(Exception):  # exiting: nothing left to report to
            live._write()


def _unpack(raw: bytes) -> list[int] | None:
    """A counters record (one written by an older version too), or None."""
    if len(raw) in _OLD_SIZES:
        raw += bytes(_RECORD.size - len(raw))
    return list(_RECORD.unpack(raw)) if len(raw) == _RECORD.size else None


_open: dict[tuple[str, str, int, int], Counters] = {}
_open_lock = threading.Lock()


def counters(root: str, run: str, rank: int) -> Counters | None:
    """This process's counters for ``run`` and ``rank`` under the cache ``root``
    (one file per process, shared by its readers); None when they cannot be
    created. Creating a run's first file removes the oldest runs."""
    key = (root, run, rank, os.getpid())  # a forked worker must not write its parent's file
    with _open_lock:
        found = _open.get(key)
        if found is not None:
            return found
        runs = _runs_dir(root)
        folder = os.path.join(runs, run)
        try:
            fresh = not os.path.isdir(folder)
            os.makedirs(folder, mode=0o700, exist_ok=True)
            if fresh and len(os.listdir(runs)) > KEEP_RUNS:
                _prune(root, keep=run)
            found = _open[key] = Counters(os.path.join(folder, f"r{rank}-{os.getpid()}.counters"))
        except (OSError, CacheOwnershipError):  # a link at its path: no counters either
            return None
        return found


def _prune(root: str, keep: str) -> None:
    runs = _runs(root)
    for _, name in runs[:-KEEP_RUNS]:
        if name != keep:
            shutil.rmtree(os.path.join(_runs_dir(root), name), ignore_errors=True)


def _runs(root: str) -> list[tuple[int, str]]:
    """(last change in ns, run name), oldest first."""
    folder = _runs_dir(root)
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found = []
    for name in names:
        newest = 0
        try:
            with os.scandir(os.path.join(folder, name)) as it:
                for e in it:
                    newest = max(newest, e.stat().st_mtime_ns)
        except OSError:
            continue
        found.append((newest, name))
    return sorted(found)


@dataclass(frozen=True)
class RunStats:
    """What the files a run read looked like in the cache (summed over processes)."""

    run: str
    hits: int = 0
    """Files already in the cache when a reader asked for them."""
    misses: int = 0
    """Files copied for a reader (or being copied by another process then)."""
    hit_bytes: int = 0
    miss_bytes: int = 0
    evictions: int = 0
    """Cached files this run's fetches evicted to stay under the cap."""
    evicted_bytes: int = 0
    wait_s: float = 0.0
    """Time fetches waited for room under the cap (readers holding files)."""
    waits: int = 0
    """Fetches that had to wait for room."""
    updated: float = 0.0
    """When a counter last changed (Unix time)."""
    processes: int = 0
    checked_md5: int = 0
    """Files copied whose bytes matched the store's MD5 (the ETag)."""
    checked_size: int = 0
    """Files copied checked by size only (the store gave no usable checksum)."""
    mismatches: int = 0
    """Copies whose bytes differed from the store's checksum (retried, not cached)."""
    checked_crc32c: int = 0
    """Files copied whose bytes matched the store's CRC32C (GCS composite objects)."""
    checked_page_crc: int = 0
    """Row groups copied whose every page matched the CRC32 it carries."""

    @property
    def hit_rate(self) -> float | None:
        """hits / (hits + misses); None before any file was read."""
        total = self.hits + self.misses
        return self.hits / total if total else None

    def minus(self, before: RunStats) -> RunStats:
        """What happened between ``before`` and this reading."""
        return RunStats(self.run, self.hits - before.hits, self.misses - before.misses,
                        self.hit_bytes - before.hit_bytes, self.miss_bytes - before.miss_bytes,
                        self.evictions - before.evictions,
                        self.evicted_bytes - before.evicted_bytes,
                        self.wait_s - before.wait_s, self.waits - before.waits, self.updated,
                        self.processes, self.checked_md5 - before.checked_md5,
                        self.checked_size - before.checked_size,
                        self.mismatches - before.mismatches,
                        self.checked_crc32c - before.checked_crc32c,
                        self.checked_page_crc - before.checked_page_crc)

    def to_json(self) -> dict[str, Any]:
        """The ``last_run`` object of docs/json-cache.md#status."""
        rate = self.hit_rate
        return {"run": self.run, "hits": self.hits, "misses": self.misses,
                "hit_rate": round(rate, 4) if rate is not None else None,
                "hit_bytes": self.hit_bytes, "miss_bytes": self.miss_bytes,
                "evictions": self.evictions, "evicted_bytes": self.evicted_bytes,
                "waits": self.waits, "wait_s": round(self.wait_s, 3),
                "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.updated)),
                "processes": self.processes}


def read_run(root: str, run: str, rank: int | None = None) -> RunStats:
    """The counters of ``run`` summed over its processes (of one ``rank``, or all)."""
    folder = os.path.join(_runs_dir(root), run)
    totals = [0] * len(_FIELDS)
    newest = 0
    count = 0
    try:
        entries = list(os.scandir(folder))
    except OSError:
        entries = []
    prefix = f"r{rank}-" if rank is not None else "r"
    for e in entries:
        if not (e.name.startswith(prefix) and e.name.endswith(".counters")):
            continue
        try:
            with open(e.path, "rb") as fh:
                values = _unpack(fh.read(_RECORD.size))
            newest = max(newest, e.stat().st_mtime_ns)
        except OSError:
            continue
        if values is None:
            continue
        count += 1
        for i, value in enumerate(values):
            totals[i] += value
    v = dict(zip(_FIELDS, totals, strict=True))
    return RunStats(run, v["hits"], v["misses"], v["hit_bytes"], v["miss_bytes"],
                    v["evictions"], v["evicted_bytes"], v["wait_ns"] / 1e9, v["waits"],
                    newest / 1e9, count, v["checked_md5"], v["checked_size"], v["mismatches"],
                    v["checked_crc32c"], v["checked_page_crc"])


def last_run(root: str) -> RunStats | None:
    """The run whose counters changed last, or None when none was recorded."""
    runs = _runs(root)
    return read_run(root, runs[-1][1]) if runs else None
