"""The local cache: lazy fetch, eager warm, validation, eviction and locking.

How it works is documented in docs/cache.md. In short:

* Files are path-mirrored under ``<root>/<namespace>/``, one namespace per
  source, and appear only complete (temp file in the same folder, then
  ``os.replace``).
* A cached file is valid while the ``(size, version)`` stamped on it (an
  xattr set before the rename) equals the listing entry's.
* One ``flock`` stripe per entry makes concurrent processes copy each file
  once; locks die with their process.
* With a byte cap, the least recently used files are evicted first; a file's
  atime is its last hand-out time, and files handed out in the last
  ``lease_seconds`` are never evicted. A copy reserves its bytes by creating
  its preallocated temp file under the ledger lock, so usage, copies in
  flight included, stays within the cap.

This module holds the hot path (lookup, fetch, warm). The ledger, the tree
walk and eviction live in :mod:`ucstage.cache.space`; status, verify, clear
and prune in :mod:`ucstage.cache.maintenance`. ``LocalCache`` keeps every method
and delegates to them.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from datetime import datetime, timezone

from ..errors import CacheError, CacheFull, FetchFailed, UcstageError, UnsafePath
from ..sharding import effective_workers, read_order, slot_files
from ..units import format_bytes, parse_size
from ..volumes import FileEntry, Volume, safe_relpath
from . import layout as cd
from . import maintenance as maint
from . import space as space
from .copy import copy_to
from .locks import FileLock, stripe_path
from .reports import (
    CacheStatus,
    ClearReport,
    NamespaceStatus,
    PruneReport,
    VerifyReport,
    WarmCallback,
    WarmReport,
    _Cached,
    _Ledger,
)
from .space import free_bytes, unlink_if_exists

__all__ = [
    "CACHE_DIR_ENV",
    "MAX_BYTES_ENV",
    "CacheStatus",
    "ClearReport",
    "LocalCache",
    "NamespaceStatus",
    "PruneReport",
    "VerifyReport",
    "WarmCallback",
    "WarmReport",
    "rank_entries",
]

CACHE_DIR_ENV = cd.CACHE_DIR_ENV
MAX_BYTES_ENV = "UCSTAGE_CACHE_MAX_BYTES"
_TOUCH_NS = 1_000_000_000
"""Hand-outs refresh a file's atime at most once a second: the LRU clock has
one-second resolution, and hot lookups cost one stat, not a stat and a write."""
_LOW_WATER = 0.95
"""Eviction goes down to 95% of the cap so a full cache does not walk its
tree on every fetch."""
_MEMO_MAX = 1 << 18
"""Stamps remembered per process; past this the memo starts over (bounded memory
in every DataLoader worker, at the cost of one xattr read per file)."""
_PERMANENT = (UcstageError, FileNotFoundError, PermissionError, IsADirectoryError,
              NotADirectoryError, FileExistsError)


def rank_entries(
    entries: Sequence[FileEntry], *, ranks: Sequence[int], world_size: int, num_workers: int,
    shuffle: bool = False, seed: int = 0, epoch: int = 0,
) -> list[FileEntry]:
    """The entries that ``ranks`` read under the slot rule, in listing order.

    Calls :func:`ucstage.sharding.slot_files` for every worker of every rank,
    the same function ``shard-plan`` and the dataset use.
    """
    n = len(entries)
    order = read_order(n, shuffle=shuffle, seed=seed, epoch=epoch)
    wanted: set[int] = set()
    for rank in ranks:
        for worker in range(effective_workers(num_workers)):
            wanted.update(slot_files(n, rank=rank, world_size=world_size,
                                     num_workers=num_workers, worker=worker, order=order))
    return [entries[i] for i in sorted(wanted)]


class LocalCache:
    """A private, path-mirrored cache of source files on local disk.

    Args:
        root: the cache folder; default ``$UCSTAGE_CACHE_DIR``, else
            ``/tmp/ucstage-<uid>``. Created 0700; refused when it is a
            symlink, owned by someone else, or writable by others.
        max_bytes: byte cap for the whole root; default ``$UCSTAGE_CACHE_MAX_BYTES``
            (``500M``, ``20G``), else no cap.
        lease_seconds: a file handed to a reader is not evicted for this long.
        retries: extra attempts for transient source errors.
        backoff: first retry delay in seconds (doubles each attempt, jittered).
    """

    def __init__(self, root: str | os.PathLike[str] | None = None, *,
                 max_bytes: int | None = None, lease_seconds: float = 60.0,
                 retries: int = 3, backoff: float = 0.2) -> None:
        self.root: str = cd.open_root(os.fspath(root) if root is not None else cd.default_root())
        if max_bytes is None and os.environ.get(MAX_BYTES_ENV, "").strip():
            max_bytes = parse_size(os.environ[MAX_BYTES_ENV])
        if max_bytes is not None and max_bytes < 1:
            raise CacheError(f"the byte cap must be positive, got {max_bytes}")
        self.max_bytes = max_bytes
        self.lease_ns = int(lease_seconds * 1e9)
        self.retries = retries
        self.backoff = backoff
        self._control = os.path.join(self.root, cd.CONTROL)
        self._ns_dirs: dict[str, str] = {}
        self._prepared: set[str] = set()
        # path -> (ino, ctime_ns, stamped size, stamped version): lets a hot
        # lookup skip the xattr read; any rewrite changes ino or ctime.
        self._memo: dict[str, tuple[int, int, int, str]] = {}
        self._lock = threading.Lock()
        self._last: tuple[Volume, str] | None = None

    # -- layout -----------------------------------------------------------

    def namespace_dir(self, volume: Volume) -> str:
        """``<root>/<namespace>`` for a source (not created; see :meth:`prepare`)."""
        url = volume.url
        path = self._ns_dirs.get(url)
        if path is None:
            path = self._ns_dirs[url] = os.path.join(self.root, cd.namespace_name(url))
        return path

    def _lock_dir(self, ns_dir: str) -> str:
        return space.lock_dir(self._control, ns_dir)

    def prepare(self, volume: Volume) -> str:
        """Create the namespace folder and record which source it holds; return it."""
        ns_dir = self.namespace_dir(volume)
        if ns_dir in self._prepared:
            return ns_dir
        os.makedirs(ns_dir, mode=0o700, exist_ok=True)
        os.makedirs(self._lock_dir(ns_dir), mode=0o700, exist_ok=True)
        record = os.path.join(self._control, "namespaces", os.path.basename(ns_dir) + ".json")
        if not os.path.exists(record):
            os.makedirs(os.path.dirname(record), mode=0o700, exist_ok=True)
            tmp = f"{record}.{uuid.uuid4().hex}.tmp"
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump({"namespace": os.path.basename(ns_dir), "url": volume.url,
                           "source": volume.source,
                           "created": datetime.now(timezone.utc).isoformat(timespec="seconds")},
                          fh)
            os.replace(tmp, record)
        self._prepared.add(ns_dir)
        return ns_dir

    def _namespaces(self, volume: Volume | None) -> list[str]:
        if volume is not None:
            return [self.namespace_dir(volume)]
        return space.namespace_dirs(self.root)

    # -- the hot path -------------------------------------------------------

    def lookup(self, volume: Volume, entry: FileEntry) -> str | None:
        """The cached file's path if it is valid for ``entry``, else None. Never copies.

        Handing out a path refreshes its LRU time (and so its lease).
        """
        last = self._last
        if last is None or last[0] is not volume:
            last = self._last = (volume, self.namespace_dir(volume) + "/")
        rel = entry.path
        # Cheap screen first; only paths that might be unsafe pay for the full check.
        if rel[:1] in ("", ".", "/") or "/." in rel or "//" in rel or "\\" in rel \
                or "\0" in rel or rel[-1:] == "/":
            safe_relpath(rel)
        local = last[1] + rel
        try:
            st = os.stat(local)
        except OSError:
            return None
        memo = self._memo.get(local)
        if memo is None or memo[0] != st.st_ino or memo[1] != st.st_ctime_ns:
            stamp = cd.read_stamp(local)
            if stamp is None:
                return None
            memo = (st.st_ino, st.st_ctime_ns, stamp[0], stamp[1])
            if len(self._memo) >= _MEMO_MAX:
                self._memo.clear()
            self._memo[local] = memo
        if memo[2] != entry.size or memo[3] != entry.version or st.st_size != entry.size:
            return None
        now = time.time_ns()
        if now - st.st_atime_ns > _TOUCH_NS:
            try:
                os.utime(local, ns=(now, st.st_mtime_ns))
            except OSError:  # evicted between the stat and the touch
                return None
        return local

    # -- fetching -----------------------------------------------------------

    def fetch(self, volume: Volume, entry: FileEntry) -> str:
        """A valid local path for ``entry``, copying it on a miss.

        Concurrent callers (threads or processes) wait for one copy. If the
        source changed since it was listed, the current bytes are cached and
        returned, stamped with what was actually copied.

        Raises:
            FetchFailed: the source could not be read after retries.
            CacheFull: no room on disk or under the cap.
            UnsafePath: the entry points outside the volume or the cache.
        """
        return self.lookup(volume, entry) or self._fetch_retrying(volume, entry)[0]

    def _fetch_retrying(self, volume: Volume, entry: FileEntry) -> tuple[str, bool]:
        delay = self.backoff
        for attempt in range(self.retries + 1):
            try:
                return self._fetch_once(volume, entry)
            except _PERMANENT as exc:
                if isinstance(exc, UcstageError):
                    raise
                raise FetchFailed(f"cannot copy {entry.path}: {_reason(exc)}") from exc
            except Exception as exc:
                if attempt == self.retries:
                    raise FetchFailed(f"cannot copy {entry.path} after {attempt + 1} attempts: "
                                      f"{_reason(exc)}") from exc
                time.sleep(delay * (1 + random.random() / 4))
                delay *= 2
        raise AssertionError("unreachable")  # pragma: no cover

    def _fetch_once(self, volume: Volume, entry: FileEntry) -> tuple[str, bool]:
        rel = safe_relpath(entry.path)
        if cd.part_stripe(rel.rsplit("/", 1)[-1]) is not None:
            raise UnsafePath(f"{rel}: the name looks like one of ucstage's temp files")
        ns_dir = self.prepare(volume)
        local = os.path.join(ns_dir, *rel.split("/"))
        lock_path = stripe_path(self._lock_dir(ns_dir), rel)
        with FileLock(lock_path):
            hit = self.lookup(volume, entry)
            if hit is not None:
                return hit, False
            folder = os.path.dirname(local)
            os.makedirs(folder, mode=0o700, exist_ok=True)
            stripe = int(os.path.basename(lock_path)[:4])
            tmp = os.path.join(folder, cd.part_name(stripe, os.path.basename(local)))
            fd, reserved = self._reserve(tmp, entry.size, rel, ns_dir)
            try:
                try:
                    copied = copy_to(volume, rel, fd)
                finally:
                    os.close(fd)
                cd.write_stamp(tmp, copied.size, copied.version or entry.version)
                now = time.time_ns()
                os.utime(tmp, ns=(now, copied.mtime_ns if copied.mtime_ns is not None else now))
                with self._ledger() as ledger:
                    # Renames happen under the ledger lock, so an eviction walk
                    # never runs while a file changes its name (readdir could
                    # miss it under both names).
                    try:
                        old = os.stat(local).st_size
                    except FileNotFoundError:
                        old = 0
                    os.replace(tmp, local)
                    ledger.write(ledger.read() + copied.size - old - reserved)
            except BaseException as exc:
                if reserved:
                    with self._ledger() as ledger:
                        unlink_if_exists(tmp)
                        ledger.write(ledger.read() - reserved)
                else:
                    unlink_if_exists(tmp)
                if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise self._disk_full(ns_dir, rel, entry.size) from exc
                raise
        return local, True

    def _disk_full(self, ns_dir: str, rel: str, need: int) -> CacheFull:
        return CacheFull(
            f"no space left in the cache folder {ns_dir}: {rel} needs {format_bytes(need)}, "
            f"{format_bytes(free_bytes(ns_dir))} free",
            hint=f"free space or point {CACHE_DIR_ENV} at a larger disk")

    def warm(self, volume: Volume, entries: Sequence[FileEntry], *, jobs: int = 8,
             callback: WarmCallback | None = None) -> WarmReport:
        """Copy every entry not already valid, ``jobs`` at a time (threads).

        Files that still fail after retries are listed in the report's
        ``failed``; the rest are cached. Stale temp files of killed runs are
        removed first.

        Raises:
            CacheFull: the files cannot fit on the disk or under the cap; checked
                before copying, and again if the disk fills up meanwhile.
        """
        cb = callback or WarmCallback()
        start = time.monotonic()
        ns_dir = self.prepare(volume)
        self._sweep(ns_dir)
        report = WarmReport(files=len(entries), bytes=sum(e.size for e in entries))
        todo: list[FileEntry] = []
        for e in entries:
            try:
                hit = self.lookup(volume, e)
            except UcstageError as exc:
                report.failed.append((e.path, str(exc)))
                continue
            if hit is None:
                todo.append(e)
            else:
                report.already_cached += 1
                report.already_cached_bytes += e.size
        self._check_room(ns_dir, todo, report.bytes)
        cb.set_size(report.files, report.bytes)
        cb.relative_update(report.already_cached_bytes)
        with ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="ucstage-warm") as pool:
            futures: dict[Future[tuple[str, bool]], FileEntry] = {
                pool.submit(self._fetch_retrying, volume, e): e for e in todo}
            for fut in as_completed(futures):
                e = futures[fut]
                try:
                    _, fetched = fut.result()
                except CacheFull as exc:
                    left = sum(x.size for f, x in futures.items() if not f.done() or f is fut)
                    for other in futures:
                        other.cancel()
                    raise CacheFull(f"{exc.message}; this warm still needs {format_bytes(left)}",
                                    exc.hint) from exc
                except UcstageError as exc:
                    report.failed.append((e.path, str(exc)))
                    cb.file_done(e.path, "failed", str(exc))
                    continue
                if fetched:
                    report.fetched += 1
                    report.fetched_bytes += e.size
                else:
                    report.already_cached += 1
                    report.already_cached_bytes += e.size
                cb.relative_update(e.size)
                cb.file_done(e.path, "fetched" if fetched else "cached")
        report.seconds = time.monotonic() - start
        return report

    def _check_room(self, ns_dir: str, todo: Sequence[FileEntry], total: int) -> None:
        need = sum(e.size for e in todo)
        free = free_bytes(ns_dir)
        if need > free:
            raise CacheFull(
                f"not enough space in the cache folder {ns_dir}: {len(todo):,} files need "
                f"{format_bytes(need)}, {format_bytes(free)} free",
                hint=f"free space, point {CACHE_DIR_ENV} at a larger disk, or warm fewer "
                     "files (--include, --rank)")
        if self.max_bytes is not None and total > self.max_bytes:
            raise CacheFull(
                f"these files total {format_bytes(total)}, more than the cache cap "
                f"{format_bytes(self.max_bytes)}",
                hint="raise --max-bytes, or warm fewer files (--include, --rank)")

    # -- byte ledger and eviction (bodies in _cachespace) ---------------------

    def _ledger(self) -> contextlib.AbstractContextManager[_Ledger]:
        """The byte ledger, locked (one file is both the lock and the value)."""
        return space.ledger(self.root, self._control)

    def _walk(self, ns_dirs: Sequence[str]) -> Iterator[_Cached]:
        return space.walk(self._control, ns_dirs)

    def _reserve(self, tmp: str, need: int, rel: str, ns_dir: str) -> tuple[int, int]:
        """Create ``tmp`` preallocated to ``need`` bytes; under a cap, evict
        first if needed and count it in the ledger. Return the open descriptor
        and the bytes reserved in the ledger.

        Under a cap this happens under the ledger lock: a reservation *is* its
        temp file, so every eviction walk sees the bytes in flight in every
        process, and usage (temp files included) stays within the cap. Without
        a cap there is nothing to reserve (a capped process's walk still counts
        the temp file, at worst twice: on the safe side).
        """
        cap = self.max_bytes
        if cap is None:
            return self._create_tmp(tmp, need, rel, ns_dir), 0
        if need > cap:
            raise CacheFull(f"{rel} is {format_bytes(need)}, larger than the whole cache cap "
                            f"{format_bytes(cap)}", hint="raise --max-bytes / max_bytes")
        with self._ledger() as ledger:
            used = ledger.read()
            if used + need > cap:
                low = int(cap * _LOW_WATER) - need
                used = self._evict_lru(ledger, low if low >= 0 else cap - need)
                if used + need > cap:
                    raise CacheFull(
                        f"the cache cap {format_bytes(cap)} is full of files handed to readers "
                        f"in the last {self.lease_ns / 1e9:g} s ({format_bytes(used)} cached); "
                        f"{rel} needs {format_bytes(need)}",
                        hint="raise --max-bytes, or read fewer files at once")
            fd = self._create_tmp(tmp, need, rel, ns_dir)
            ledger.write(used + need)
        return fd, need

    def _create_tmp(self, tmp: str, need: int, rel: str, ns_dir: str) -> int:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            # Preallocating makes a full disk fail here, before any byte is copied.
            if need:
                os.posix_fallocate(fd, 0, need)
        except BaseException as exc:
            os.close(fd)
            unlink_if_exists(tmp)
            if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise self._disk_full(ns_dir, rel, need) from exc
            raise
        return fd

    def _evict_lru(self, ledger: _Ledger, target: int) -> int:
        """Evict least recently used, unleased files until usage <= target.

        Call with the ledger lock held. Returns the usage after, and resets
        the ledger to it (the walk is the truth).
        """
        return space.evict_lru(ledger, target, root=self.root, control=self._control,
                               lease_ns=self.lease_ns, memo=self._memo)

    def _sweep(self, ns_dir: str) -> int:
        """Remove temp files left by killed runs (nobody holds their stripe)."""
        return space.sweep(self._control, ns_dir)

    # -- maintenance (bodies in _cachemaint) --------------------------------------

    def status(self, volume: Volume | None = None) -> CacheStatus:
        """Entries and bytes per namespace (one source, or all), cap and free disk."""
        return maint.status(self, volume)

    def verify(self, volume: Volume, entries: Sequence[FileEntry] | None = None, *,
               checksum: bool = False) -> VerifyReport:
        """Check cached copies of ``entries`` (default: a fresh listing) against the source.

        Stale: the source's size or version changed since the copy. Corrupt:
        no stamp, a size on disk that differs from the stamp, or (with
        ``checksum``) bytes that differ from the source's. Corrupt copies are
        deleted (listed in ``removed``) so they are never handed out again and
        the next fetch or warm copies them afresh. Files not cached count as
        missing, which is not an error.
        """
        return maint.verify(self, volume, entries, checksum)

    def clear(self, volume: Volume | None = None) -> ClearReport:
        """Remove one source's namespace, or every namespace. Files already open
        stay readable to whoever opened them (POSIX unlink semantics)."""
        return maint.clear(self, volume)

    def prune(self, max_bytes: int) -> PruneReport:
        """Evict least recently used files until the cache holds at most ``max_bytes``.

        Files handed to a reader within the lease stay; the report says how
        many bytes that kept.
        """
        return maint.prune(self, max_bytes)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
