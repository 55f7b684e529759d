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
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import random
import shutil
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from datetime import datetime, timezone
from typing import Any

from . import _cachedir as cd
from ._cachetypes import (
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
from ._copy import copy_to
from ._locks import FileLock, stripe_path
from .errors import CacheError, CacheFull, FetchFailed, UcstageError, UnsafePath
from .sharding import effective_workers, read_order, slot_files
from .units import format_bytes, parse_size
from .volumes import FileEntry, Volume, safe_relpath

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
        return os.path.join(self._control, "locks", os.path.basename(ns_dir))

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

    def _sources(self) -> dict[str, tuple[str, str]]:
        """namespace -> (source as given, resolved URL), from :meth:`prepare`'s records."""
        found: dict[str, tuple[str, str]] = {}
        folder = os.path.join(self._control, "namespaces")
        for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            try:
                with open(os.path.join(folder, name), encoding="utf-8") as fh:
                    record = json.load(fh)
                found[name[:-5]] = (str(record.get("source") or record["url"]), str(record["url"]))
            except (OSError, ValueError, KeyError, AttributeError):
                continue
        return found

    def _namespaces(self, volume: Volume | None) -> list[str]:
        if volume is not None:
            return [self.namespace_dir(volume)]
        return [e.path for e in sorted(os.scandir(self.root), key=lambda e: e.name)
                if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")]

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
                        _unlink(tmp)
                        ledger.write(ledger.read() - reserved)
                else:
                    _unlink(tmp)
                if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise self._disk_full(ns_dir, rel, entry.size) from exc
                raise
        return local, True

    def _disk_full(self, ns_dir: str, rel: str, need: int) -> CacheFull:
        return CacheFull(
            f"no space left in the cache folder {ns_dir}: {rel} needs {format_bytes(need)}, "
            f"{format_bytes(_free(ns_dir))} free",
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
        free = _free(ns_dir)
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

    # -- byte ledger and eviction -----------------------------------------------

    @contextlib.contextmanager
    def _ledger(self) -> Iterator[_Ledger]:
        """The byte ledger, locked (one file is both the lock and the value)."""
        fd = os.open(os.path.join(self._control, "usage"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                     0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield _Ledger(fd, lambda: sum(c.size for c in self._walk(self._namespaces(None))))
        finally:
            os.close(fd)

    def _walk(self, ns_dirs: Sequence[str]) -> Iterator[_Cached]:
        for ns_dir in ns_dirs:
            lock_dir = self._lock_dir(ns_dir)
            stack = [(ns_dir, "")]
            while stack:
                folder, prefix = stack.pop()
                try:
                    it = os.scandir(folder)
                except FileNotFoundError:
                    continue
                with it:
                    for d in it:
                        if d.is_dir(follow_symlinks=False):
                            stack.append((d.path, prefix + d.name + "/"))
                        else:
                            try:
                                st = d.stat(follow_symlinks=False)
                            except FileNotFoundError:
                                continue
                            stripe = cd.part_stripe(d.name)
                            lock = (stripe_path(lock_dir, prefix + d.name) if stripe is None
                                    else os.path.join(lock_dir, f"{stripe:04d}.lock"))
                            yield _Cached(st.st_atime_ns, st.st_size, d.path, lock,
                                          stripe is not None)

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
            _unlink(tmp)
            if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise self._disk_full(ns_dir, rel, need) from exc
            raise
        return fd

    def _evict_lru(self, ledger: _Ledger, target: int) -> int:
        """Evict least recently used, unleased files until usage <= target.

        Call with the ledger lock held. Returns the usage after, and resets
        the ledger to it (the walk is the truth).
        """
        # Copies in flight are their preallocated temp files, created and
        # renamed only under this lock: the walk counts them exactly. Temp
        # files of dead runs are deleted on the way (nobody holds their stripe).
        found = sorted(self._walk(self._namespaces(None)), key=lambda c: c.atime_ns)
        used = sum(c.size for c in found)
        for c in found:
            if c.partial and self._sweep_one(c.path, c.lock):
                used -= c.size
        cutoff = time.time_ns() - self.lease_ns
        for c in found:
            if used <= target or c.atime_ns > cutoff:
                break
            if not c.partial and self._evict(c):
                used -= c.size
        ledger.write(used)
        return used

    def _evict(self, c: _Cached) -> bool:
        lock = FileLock(c.lock)
        if not lock.acquire(blocking=False):
            return False  # being fetched right now
        try:
            trash = os.path.join(self._control, "trash")
            os.makedirs(trash, mode=0o700, exist_ok=True)
            staged = os.path.join(trash, uuid.uuid4().hex)
            try:
                os.rename(c.path, staged)
            except FileNotFoundError:
                return True
            # A reader touches atime before it gets the path; if that happened
            # after our walk, the file was just handed out: put it back.
            if os.stat(staged).st_atime_ns != c.atime_ns:
                os.rename(staged, c.path)
                return False
            os.unlink(staged)
            self._memo.pop(c.path, None)
            return True
        finally:
            lock.release()

    def _sweep_one(self, path: str, lock_path: str) -> bool:
        lock = FileLock(lock_path)
        if not lock.acquire(blocking=False):
            return False  # its copy is running
        try:
            _unlink(path)
            return True
        finally:
            lock.release()

    def _sweep(self, ns_dir: str) -> int:
        """Remove temp files left by killed runs (nobody holds their stripe)."""
        removed = 0
        lock_dir = self._lock_dir(ns_dir)
        for folder, _, names in os.walk(ns_dir):
            for name in names:
                stripe = cd.part_stripe(name)
                if stripe is None:
                    continue
                lock = FileLock(os.path.join(lock_dir, f"{stripe:04d}.lock"))
                if lock.acquire(blocking=False):
                    try:
                        _unlink(os.path.join(folder, name))
                        removed += 1
                    finally:
                        lock.release()
        return removed

    # -- maintenance ------------------------------------------------------------

    def status(self, volume: Volume | None = None) -> CacheStatus:
        """Entries and bytes per namespace (one source, or all), cap and free disk."""
        sources = self._sources()
        rows = []
        for ns_dir in self._namespaces(volume):
            name = os.path.basename(ns_dir)
            found = list(self._walk([ns_dir]))
            files = [c for c in found if not c.partial]
            given, url = sources.get(name, (volume.source, volume.url) if volume else ("", ""))
            rows.append(NamespaceStatus(
                name, given, url, ns_dir,
                len(files), sum(c.size for c in files), len(found) - len(files)))
        total = sum(r.bytes for r in rows)
        return CacheStatus(self.root, sum(r.entries for r in rows), total, self.max_bytes,
                           _free(self.root), rows)

    def verify(self, volume: Volume, entries: Sequence[FileEntry] | None = None, *,
               checksum: bool = False) -> VerifyReport:
        """Check cached copies of ``entries`` (default: a fresh listing) against the source.

        Stale: the source's size or version changed since the copy. Corrupt:
        no stamp, a size on disk that differs from the stamp, or (with
        ``checksum``) bytes that differ from the source's. Files not cached
        count as missing, which is not an error.
        """
        if entries is None:
            from .volumes import list_files

            entries = list_files(volume).entries
        ns_dir = self.namespace_dir(volume)
        report = VerifyReport(removed_partial_files=self._sweep(ns_dir))
        for e in entries:
            report.checked += 1
            local = os.path.join(ns_dir, *safe_relpath(e.path).split("/"))
            try:
                st = os.stat(local)
            except FileNotFoundError:
                report.missing += 1
                continue
            stamp = cd.read_stamp(local)
            if stamp is None:
                report.corrupt.append((e.path, "no validity stamp"))
            elif stamp[0] != st.st_size:
                report.corrupt.append((e.path, f"{st.st_size} bytes on disk, {stamp[0]} copied"))
            elif stamp != (e.size, e.version):
                report.stale.append((e.path, f"source is now {e.size} bytes version "
                                             f"{e.version!r}; cached {stamp[0]} bytes version "
                                             f"{stamp[1]!r}"))
            elif checksum and _digest_local(local) != _digest_source(volume, e.path):
                report.corrupt.append((e.path, "content differs from the source (sha256)"))
            else:
                report.ok += 1
        return report

    def clear(self, volume: Volume | None = None) -> ClearReport:
        """Remove one source's namespace, or every namespace. Files already open
        stay readable to whoever opened them (POSIX unlink semantics)."""
        ns_dirs = self._namespaces(volume)
        found = [c for c in self._walk(ns_dirs) if not c.partial]
        trash = os.path.join(self._control, "trash")
        os.makedirs(trash, mode=0o700, exist_ok=True)
        names = []
        for ns_dir in ns_dirs:
            if not os.path.isdir(ns_dir):
                continue
            staged = os.path.join(trash, uuid.uuid4().hex)
            os.rename(ns_dir, staged)  # disappears at once, then is deleted
            shutil.rmtree(staged, ignore_errors=True)
            names.append(os.path.basename(ns_dir))
            self._prepared.discard(ns_dir)
            _unlink(os.path.join(self._control, "namespaces", names[-1] + ".json"))
        with self._lock:
            self._memo.clear()
        with self._ledger() as ledger:
            ledger.write(sum(c.size for c in self._walk(self._namespaces(None))))
        return ClearReport(names, len(found), sum(c.size for c in found))

    def prune(self, max_bytes: int) -> PruneReport:
        """Evict least recently used files until the cache holds at most ``max_bytes``.

        Files handed to a reader within the lease stay; the report says how
        many bytes that kept.
        """
        if max_bytes < 0:
            raise CacheError(f"--max-bytes must be 0 or more, got {max_bytes}")
        with self._ledger() as ledger:
            for ns_dir in self._namespaces(None):
                self._sweep(ns_dir)
            found = [c for c in self._walk(self._namespaces(None)) if not c.partial]
            before = sum(c.size for c in found)
            after = self._evict_lru(ledger, max_bytes)
            remaining = {c.path for c in self._walk(self._namespaces(None))}
        removed = [c for c in found if c.path not in remaining]
        cutoff = time.time_ns() - self.lease_ns
        in_use = sum(c.size for c in found if c.path in remaining and c.atime_ns > cutoff)
        return PruneReport(max_bytes, before, after, len(removed),
                           sum(c.size for c in removed), in_use)


def _free(path: str) -> int:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return 0


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _digest_local(path: str) -> str:
    with open(path, "rb") as fh:
        return _digest_stream(fh)


def _digest_source(volume: Volume, relpath: str) -> str:
    with volume.open(relpath) as fh:
        return _digest_stream(fh)


def _digest_stream(fh: Any) -> str:
    digest = hashlib.sha256()
    while True:
        block = fh.read(8 * 1024 * 1024)
        if not block:
            return digest.hexdigest()
        digest.update(block)
