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

This module holds the hot path (lookup, fetch, warm). The on-disk state it
shares with the maintenance commands (the ledger, the stamp memo, the tree
walk, eviction, the namespace records) is a :class:`ucstage.cache.space.CacheSpace`;
status, verify, clear and prune are in :mod:`ucstage.cache.maintenance`.
``LocalCache`` keeps every method and delegates to them.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed

from ..errors import CacheError, CacheFull, FetchFailed, UcstageError, UnsafePath
from ..progress import NO_PROGRESS, Callback
from ..sharding import effective_workers, read_order, slot_files
from ..units import format_bytes, parse_size
from ..volumes import FileEntry, Volume, safe_relpath
from . import layout as cd
from . import maintenance as maint
from .copy import copy_to
from .locks import FileLock
from .reports import CacheStatus, ClearReport, PruneReport, VerifyReport, WarmReport
from .space import CacheSpace, free_bytes, no_room

__all__ = ["CACHE_DIR_ENV", "MAX_BYTES_ENV", "WARM_FEWER", "LocalCache", "rank_entries"]

CACHE_DIR_ENV = cd.CACHE_DIR_ENV
MAX_BYTES_ENV = "UCSTAGE_CACHE_MAX_BYTES"
_TOUCH_NS = 1_000_000_000
"""Hand-outs refresh a file's atime at most once a second: the LRU clock has
one-second resolution, and hot lookups cost one stat, not a stat and a write."""
WARM_FEWER = "warm fewer files"
"""How a :exc:`CacheFull` hint of :meth:`LocalCache.warm` ends when warming
fewer files would help; the library cannot name the CLI flags that choose
them, so the CLI adds them."""
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
        self.space = CacheSpace(self.root)
        """The cache's on-disk state (ledger, stamp memo, walk, eviction)."""
        # The last volume looked up and its namespace prefix: one attribute,
        # replaced whole, so threads never see half of it.
        self._last: tuple[Volume, str] | None = None

    # -- layout -----------------------------------------------------------

    def namespace_dir(self, volume: Volume) -> str:
        """``<root>/<namespace>`` for a source (not created; see :meth:`prepare`)."""
        return self.space.namespace_dir(volume.url)

    def prepare(self, volume: Volume) -> str:
        """Create the namespace folder and record which source it holds; return it."""
        return self.space.prepare(self.namespace_dir(volume), url=volume.url,
                                  source=volume.source)

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
        stamp = self.space.stamp(local, st)
        if stamp is None or stamp[0] != entry.size or stamp[1] != entry.version \
                or st.st_size != entry.size:
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
        space = self.space
        lock = space.entry_lock(ns_dir, rel)
        with FileLock(lock):
            hit = self.lookup(volume, entry)
            if hit is not None:
                return hit, False
            os.makedirs(os.path.dirname(local), mode=0o700, exist_ok=True)
            tmp = space.temp_path(local, lock)
            try:
                fd, reserved = space.reserve(tmp, entry.size, max_bytes=self.max_bytes,
                                             lease_ns=self.lease_ns, name=rel)
            except OSError as exc:
                if no_room(exc):
                    raise self._disk_full(ns_dir, rel, entry.size) from exc
                raise
            try:
                try:
                    copied = copy_to(volume, rel, fd)
                finally:
                    os.close(fd)
                cd.write_stamp(tmp, copied.size, copied.version or entry.version)
                now = time.time_ns()
                os.utime(tmp, ns=(now, copied.mtime_ns if copied.mtime_ns is not None else now))
                space.commit(tmp, local, copied.size, reserved)
            except BaseException as exc:
                space.abandon(tmp, reserved)
                if no_room(exc):
                    raise self._disk_full(ns_dir, rel, entry.size) from exc
                raise
        return local, True

    def _disk_full(self, ns_dir: str, rel: str, need: int) -> CacheFull:
        return CacheFull(
            f"no space left in the cache folder {ns_dir}: {rel} needs {format_bytes(need)}, "
            f"{format_bytes(free_bytes(ns_dir))} free",
            hint=f"free space or point {CACHE_DIR_ENV} at a larger disk")

    def warm(self, volume: Volume, entries: Sequence[FileEntry], *, jobs: int = 8,
             callback: Callback = NO_PROGRESS) -> WarmReport:
        """Copy every entry not already valid, ``jobs`` at a time (threads).

        Files that still fail after retries are listed in the report's
        ``failed``; the rest are cached. Stale temp files of killed runs are
        removed first.

        ``callback`` (a :class:`ucstage.progress.Callback`, called from worker
        threads) hears, once the files are known to fit,
        ``set_size(total bytes, items=total files)``, then
        ``relative_update(nbytes)`` as bytes become valid in the cache (all
        the already valid ones at once first), and ``item_done(path, status,
        error)`` once per file with status ``fetched``, ``cached`` or ``failed``.

        Raises:
            CacheFull: the files cannot fit on the disk or under the cap; checked
                before copying, and again if the disk fills up meanwhile.
        """
        cb = callback if callback is not None else NO_PROGRESS
        start = time.monotonic()
        ns_dir = self.prepare(volume)
        self.space.sweep(ns_dir)
        report = WarmReport(files=len(entries), bytes=sum(e.size for e in entries),
                            source=volume.source, cache_dir=self.root, namespace=ns_dir)
        todo: list[FileEntry] = []
        valid: list[str] = []
        for e in entries:
            try:
                hit = self.lookup(volume, e)
            except UcstageError as exc:
                report.failed.append((e.path, str(exc)))
                continue
            if hit is None:
                todo.append(e)
            else:
                valid.append(e.path)
                report.already_cached += 1
                report.already_cached_bytes += e.size
        self._check_room(ns_dir, todo, report.bytes)
        cb.set_size(report.bytes, items=report.files)
        cb.relative_update(report.already_cached_bytes)
        for path in valid:
            cb.item_done(path, "cached")
        for path, reason in report.failed:
            cb.item_done(path, "failed", reason)
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
                    cb.item_done(e.path, "failed", str(exc))
                    continue
                if fetched:
                    report.fetched += 1
                    report.fetched_bytes += e.size
                else:
                    report.already_cached += 1
                    report.already_cached_bytes += e.size
                cb.relative_update(e.size)
                cb.item_done(e.path, "fetched" if fetched else "cached")
        report.seconds = time.monotonic() - start
        return report

    def _check_room(self, ns_dir: str, todo: Sequence[FileEntry], total: int) -> None:
        need = sum(e.size for e in todo)
        free = free_bytes(ns_dir)
        if need > free:
            raise CacheFull(
                f"not enough space in the cache folder {ns_dir}: {len(todo):,} files need "
                f"{format_bytes(need)}, {format_bytes(free)} free",
                hint=f"free space, point {CACHE_DIR_ENV} at a larger disk, or {WARM_FEWER}")
        if self.max_bytes is not None and total > self.max_bytes:
            raise CacheFull(
                f"these files total {format_bytes(total)}, more than the cache cap "
                f"{format_bytes(self.max_bytes)}",
                hint=f"raise max_bytes, or {WARM_FEWER}")

    # -- maintenance (bodies in ucstage.cache.maintenance) --------------------

    def status(self, volume: Volume | None = None) -> CacheStatus:
        """Entries and bytes per namespace (one source, or all), cap and free disk."""
        return maint.status(self.space, volume, max_bytes=self.max_bytes)

    def verify(self, volume: Volume | None = None, entries: Sequence[FileEntry] | None = None,
               *, checksum: bool = False) -> VerifyReport:
        """Check cached copies of ``entries`` (default: a fresh listing) against the source.

        Without ``volume``, every source the cache holds is checked against a
        fresh listing of it (found through the record each namespace keeps of
        its source), one :class:`~ucstage.cache.reports.SourceCheck` per source.

        Stale: the source's size or version changed since the copy. Corrupt:
        no stamp, a size on disk that differs from the stamp, or (with
        ``checksum``) bytes that differ from the source's. Corrupt copies are
        deleted (listed in ``removed``) so they are never handed out again and
        the next fetch or warm copies them afresh. Files not cached count as
        missing, which is not an error.

        Raises:
            SourceNotFound: a cached source (without ``volume``) no longer exists.
            InvalidArgument: ``entries`` without ``volume``.
        """
        return maint.verify(self.space, volume, entries, checksum=checksum)

    def clear(self, volume: Volume | None = None) -> ClearReport:
        """Remove one source's namespace, or every namespace. Files already open
        stay readable to whoever opened them (POSIX unlink semantics)."""
        return maint.clear(self.space, volume)

    def prune(self, max_bytes: int) -> PruneReport:
        """Evict least recently used files until the cache holds at most ``max_bytes``.

        Files handed to a reader within the lease stay; the report says how
        many bytes that kept.
        """
        return maint.prune(self.space, max_bytes, lease_ns=self.lease_ns)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
