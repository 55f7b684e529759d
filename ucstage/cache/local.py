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
  ``lease_seconds`` are never evicted. Files a :class:`ucstage.VolumeDataset`
  reads are held while its reader needs them and, once consumed, evicted
  most recently consumed first (:mod:`ucstage.cache.policy`,
  :mod:`ucstage.cache.leases`); a full cap makes a copy wait for room. A
  copy reserves its bytes by creating its preallocated temp file under the
  ledger lock, so usage, copies in flight included, stays within the cap.

This module holds the hot path (lookup, fetch, warm). The on-disk state it
shares with the maintenance commands (the ledger, the stamp memo, the tree
walk, eviction, the namespace records) is a :class:`ucstage.cache.space.CacheSpace`;
status, verify, clear and prune are in :mod:`ucstage.cache.maintenance`.
``LocalCache`` keeps every method and delegates to them.
"""

from __future__ import annotations

import contextlib
import os
import queue
import random
import threading
import time
from collections.abc import Sequence
from typing import NoReturn

from .. import objstore
from ..errors import (
    CacheError,
    CacheFull,
    FetchFailed,
    InvalidArgument,
    UcstageError,
    UnsafePath,
)
from ..progress import NO_PROGRESS, Callback
from ..sharding import (
    DEFAULT_SHUFFLE_SCOPE,
    effective_workers,
    node_count,
    node_order,
    node_share,
    slot_files,
)
from ..units import SIZE_HELP, format_bytes, parse_size
from ..volumes import FileEntry, Volume, safe_relpath
from . import hedge, integrity
from . import layout as cd
from . import maintenance as maint
from .copy import Copied, copy_to
from .inflight import Inflight, Stopped
from .locks import FileLock
from .reports import (
    CacheStatus,
    ClearReport,
    EvictedSource,
    PruneReport,
    VerifyReport,
    WarmReport,
)
from .space import CacheSpace, Evicted, free_bytes, no_room
from .tuning import AUTO, OBJECT_STORE_CEILING, THREAD_CEILING, Jobs, check_jobs

__all__ = ["CACHE_DIR_ENV", "DEFAULT_LEASE_SECONDS", "DEFAULT_WAIT_SECONDS", "MAX_BYTES_ENV",
           "WARM_FEWER", "LocalCache", "rank_entries"]

CACHE_DIR_ENV = cd.CACHE_DIR_ENV
MAX_BYTES_ENV = "UCSTAGE_CACHE_MAX_BYTES"
_TOUCH_NS = 1_000_000_000
"""Hand-outs refresh a file's atime at most once a second: the LRU clock has
one-second resolution, and hot lookups cost one stat, not a stat and a write."""
DEFAULT_LEASE_SECONDS = 10.0
"""The time lease of paths handed out by ``lookup``/``fetch`` (and ``warm``)."""
DEFAULT_WAIT_SECONDS = 120.0
"""How long a copy waits for readers to make room under a full cap."""
WARM_FEWER = "warm fewer files"
"""How a :exc:`CacheFull` hint of :meth:`LocalCache.warm` ends when warming
fewer files would help; the library cannot name the CLI flags that choose
them, so the CLI adds them."""
_PERMANENT = (UcstageError, FileNotFoundError, PermissionError, IsADirectoryError,
              NotADirectoryError, FileExistsError)
_FOLDERS_MAX = 1 << 16
"""Cache folders remembered as existing per process."""
_GRACE = 1.0
"""Seconds a stopping warm lets its copies in flight finish before abandoning them."""


def rank_entries(
    entries: Sequence[FileEntry], *, ranks: Sequence[int], world_size: int, num_workers: int,
    shuffle: bool = False, seed: int = 0, epoch: int = 0,
    shuffle_scope: str = DEFAULT_SHUFFLE_SCOPE, nproc_per_node: int | None = None,
) -> list[FileEntry]:
    """The entries that ``ranks`` read under the slot rule, in listing order.

    Calls :func:`ucstage.sharding.slot_files` for every worker of every rank,
    the same function ``shard-plan`` and the dataset use. With ``shuffle``
    under the ``"node"`` scope, a node's files are the same every epoch: the
    whole share of every node holding one of ``ranks``
    (:func:`ucstage.sharding.node_share`), whatever ``epoch``.
    """
    n = len(entries)
    node_count(world_size, nproc_per_node)  # refuses a world size that is not a multiple
    per_node = nproc_per_node if nproc_per_node is not None else world_size
    wanted: set[int] = set()
    if shuffle and shuffle_scope == "node":
        for node in sorted({rank // per_node for rank in ranks}):
            wanted.update(node_share(n, node=node, world_size=world_size,
                                     nproc_per_node=nproc_per_node, seed=seed).tolist())
        return [entries[i] for i in sorted(wanted)]
    for rank in ranks:
        order = node_order(n, node=rank // per_node, world_size=world_size,
                           nproc_per_node=nproc_per_node, shuffle=shuffle, seed=seed,
                           epoch=epoch, shuffle_scope=shuffle_scope)
        for worker in range(effective_workers(num_workers)):
            wanted.update(slot_files(n, rank=rank, world_size=world_size,
                                     num_workers=num_workers, worker=worker, shuffle=shuffle,
                                     seed=seed, epoch=epoch, order=order,
                                     shuffle_scope=shuffle_scope,
                                     nproc_per_node=nproc_per_node))
    return [entries[i] for i in sorted(wanted)]


class LocalCache:
    """A private, path-mirrored cache of source files on local disk.

    Args:
        root: the cache folder; default ``$UCSTAGE_CACHE_DIR``, else
            ``/tmp/ucstage-<uid>``. Created 0700; refused when it is a
            symlink, owned by someone else, or writable by others.
        max_bytes: byte cap for the whole root; default ``$UCSTAGE_CACHE_MAX_BYTES``
            (``500M``, ``20G``; powers of 1024), else no cap.
        lease_seconds: a file handed out by :meth:`lookup` or :meth:`fetch` is
            not evicted for this long (files a VolumeDataset reads are held
            until its reader moves on instead).
        wait_seconds: how long a copy waits for room when everything under
            the cap is held by readers, before it fails with ``CacheFull``.
        retries: extra attempts for transient source errors.
        backoff: first retry delay in seconds (doubles each attempt, jittered).
    """

    def __init__(self, root: str | os.PathLike[str] | None = None, *,
                 max_bytes: int | None = None, lease_seconds: float = DEFAULT_LEASE_SECONDS,
                 retries: int = 3, backoff: float = 0.2,
                 wait_seconds: float = DEFAULT_WAIT_SECONDS) -> None:
        self.root: str = cd.open_root(os.fspath(root) if root is not None else cd.default_root())
        if max_bytes is None:
            max_bytes = _env_max_bytes()
        elif max_bytes < 1:
            raise CacheError(f"max_bytes must be positive, got {max_bytes}")
        self.max_bytes = max_bytes
        self.lease_ns = int(lease_seconds * 1e9)
        if wait_seconds < 0:
            raise CacheError(f"wait_seconds must be 0 or more, got {wait_seconds}")
        self.wait_seconds = float(wait_seconds)
        self.retries = retries
        self.backoff = backoff
        self.space = CacheSpace(self.root)
        """The cache's on-disk state (ledger, stamp memo, walk, eviction)."""
        self._memo = self.space.memo
        self._folders: set[str] = set()
        """Cache folders this process made or found (no ``makedirs`` per copy)."""
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

    def find(self, source: str) -> list[Volume]:
        """The cached volumes that hold ``source``, by the records the cache keeps.

        A ``/Volumes/...`` source (``dbfs:`` dropped) matches every namespace
        cached under that string, whatever ``$UCSTAGE_VOLUMES_ROOT`` was then
        or is now, and each returned volume reads from where its files were
        cached from; any source also matches the namespace of where it
        resolves now. Empty when nothing is cached for it.
        """
        return maint.find(self.space, source)

    # -- the hot path -------------------------------------------------------

    def lookup(self, volume: Volume, entry: FileEntry, *, touch: bool = True) -> str | None:
        """The cached file's path if it is valid for ``entry``, else None. Never copies.

        Handing out a path refreshes its LRU time (and so its lease), unless
        ``touch`` is False (a dataset reader, which holds the file instead).
        """
        found = self.lookup_run(volume, (entry,), touch=touch)
        return found[0] if found else None

    def lookup_run(self, volume: Volume, entries: Sequence[FileEntry], *,
                   touch: bool = True) -> list[str]:
        """The cached paths of the leading run of ``entries`` that are valid,
        in order: it stops at the first entry that is not (so its length is
        that entry's index). Never copies; touches as :meth:`lookup` does.

        The one validity rule (docs/design.md, "Validity rule"): a ``stat``
        of each path against the stamp memo, the stamp read again when the
        memo does not vouch for the inode and ctime. :meth:`lookup` is this
        with one entry; a run saves a warm epoch the per-call work.

        Raises:
            UnsafePath: the first entry's path is unsafe (a later unsafe one
                ends the run before it).
        """
        last = self._last
        if last is None or last[0] is not volume:
            last = self._last = (volume, self.namespace_dir(volume) + "/")
        prefix, memos, stat, space = last[1], self._memo, os.stat, self.space
        now = time.time_ns()  # the touch's clock: a run takes far less than its 1 s step
        found: list[str] = []
        for entry in entries:
            rel = entry.path
            local = prefix + rel
            # A path the memo knows passed this check before (the memo only holds
            # paths of lookups); others get the cheap screen first, and only
            # paths that might be unsafe pay for the full check.
            memo = memos.get(local)
            if memo is None and (rel[:1] in ("", ".", "/") or "/." in rel or "//" in rel
                                 or "\\" in rel or "\0" in rel or rel[-1:] == "/"):
                if found:
                    break  # the next run starts with it, and raises
                safe_relpath(rel)
            try:
                st = stat(local)
            except OSError:
                break
            if memo is not None and memo[0] == st.st_ino and memo[1] == st.st_ctime_ns:
                stamp: tuple[int, str] | None = memo[2]
            else:
                stamp = space.stamp(local, st)
            if stamp is None or stamp[0] != entry.size or stamp[1] != entry.version \
                    or st.st_size != entry.size:
                break
            # An atime in the future is a dataset's consumed mark (cache/policy.py):
            # handing the file to anyone else turns it back into an LRU file.
            if touch and not 0 <= now - st.st_atime_ns <= _TOUCH_NS:
                try:
                    os.utime(local, ns=(now, st.st_mtime_ns))
                except OSError:  # evicted between the stat and the touch
                    break
                # The touch moved the ctime: remember the new one, or the next
                # hand-out would read the stamp again.
                space.touched(local, st, stamp)
            found.append(local)
        return found

    # -- fetching -----------------------------------------------------------

    def fetch(self, volume: Volume, entry: FileEntry, *, run: Inflight | None = None) -> str:
        """A valid local path for ``entry``, copying it on a miss.

        Concurrent callers (threads or processes) wait for one copy. If the
        source changed since it was listed, the current bytes are cached and
        returned, stamped with what was actually copied.

        ``run`` (a :class:`ucstage.cache.inflight.Inflight` shared by the
        fetches of one job) lets the job stop them: once ``run.stop()`` is
        called no copy starts, copies in flight end at their next chunk and
        remove their temp files, and :meth:`abandon` removes those of copies
        still blocked in a read.

        Raises:
            FetchFailed: the source could not be read after retries.
            CacheFull: no room on disk or under the cap.
            UnsafePath: the entry points outside the volume or the cache.
            Stopped: ``run`` was stopped (a valid cached copy is still returned).
        """
        return self.lookup(volume, entry) or self._fetch_retrying(volume, entry, run)[0]

    def abandon(self, run: Inflight) -> int:
        """Stop ``run`` and give up its copies still in flight (blocked in a
        read): remove their temp files and give their bytes back to the ledger
        now; their threads find out when the read returns and leave the cache
        alone. Returns how many copies were given up."""
        return run.abandon(self.space.abandon)

    def _fetch_retrying(self, volume: Volume, entry: FileEntry, run: Inflight | None = None,
                        evicted: Evicted | None = None) -> tuple[str, bool]:
        delay = self.backoff
        for attempt in range(self.retries + 1):
            try:
                return self._fetch_once(volume, entry, run, evicted)
            except Stopped:
                raise
            except Exception as exc:
                pause = self._retry_pause(exc, entry, attempt, delay)
                if run is not None:
                    run.sleep(pause)  # a stopping warm does not wait out the backoff
                else:
                    time.sleep(pause)
                delay *= 2
        raise AssertionError("unreachable")  # pragma: no cover

    def _retry_pause(self, exc: Exception, entry: FileEntry, attempt: int,
                     delay: float) -> float:
        """The backoff before retrying a copy that raised ``exc`` on attempt
        ``attempt`` (from 0), ``delay`` being the attempt's base delay.

        Raises:
            UcstageError: ``exc`` itself, or :exc:`FetchFailed` when it is
                permanent (a missing file, a refusal) or retries ran out.
        """
        if isinstance(exc, _PERMANENT):
            if isinstance(exc, UcstageError):
                raise exc
            raise FetchFailed(f"cannot copy {entry.path}: {_reason(exc)}") from exc
        if attempt == self.retries:
            raise FetchFailed(f"cannot copy {entry.path} after {attempt + 1} attempts: "
                              f"{_reason(exc)}") from exc
        return delay * (1 + random.random() / 4)

    def _fetch_once(self, volume: Volume, entry: FileEntry, run: Inflight | None = None,
                    evicted: Evicted | None = None) -> tuple[str, bool]:
        """One copy attempt. With ``run`` (a warm), no copy starts once it has
        stopped, and a copy it abandons is left to it (see :mod:`.inflight`)."""
        rel, ns_dir, local, lock = self._where(volume, entry)
        if run is not None:
            run.check()
        with FileLock(lock):
            hit = self.lookup(volume, entry)
            if hit is not None:
                return hit, False
            token = run.begin() if run is not None else -1
            try:
                self._copy_locked(volume, entry, rel, ns_dir, local, lock, run, token, evicted)
            finally:
                if run is not None:
                    run.release(token)
        return local, True

    def _where(self, volume: Volume, entry: FileEntry) -> tuple[str, str, str, str]:
        """``(relpath, namespace folder, local path, stripe lock)`` of an entry
        to copy; refuses unsafe paths."""
        rel = safe_relpath(entry.path)
        if cd.part_stripe(rel.rsplit("/", 1)[-1]) is not None:
            raise UnsafePath(f"{rel}: the name looks like one of ucstage's temp files")
        ns_dir = self.prepare(volume)
        local = os.path.join(ns_dir, *rel.split("/"))
        return rel, ns_dir, local, self.space.entry_lock(ns_dir, rel)

    def _copy_locked(self, volume: Volume, entry: FileEntry, rel: str, ns_dir: str, local: str,
                     lock: str, run: Inflight | None, token: int,
                     evicted: Evicted | None) -> None:
        """Copy ``entry`` to ``local`` through a temp file; its stripe is held."""
        tmp, fd, reserved = self._reserve_tmp(entry, rel, ns_dir, local, lock, run, token,
                                              evicted)
        try:
            try:
                copied = copy_to(volume, rel, fd, run, entry.size)
            finally:
                os.close(fd)
            self._commit_tmp(entry, tmp, local, copied, reserved, run, token)
        except BaseException as exc:
            self._drop_tmp(exc, ns_dir, rel, entry, tmp, reserved, run, token)

    def _reserve_tmp(self, entry: FileEntry, rel: str, ns_dir: str, local: str, lock: str,
                     run: Inflight | None, token: int,
                     evicted: Evicted | None) -> tuple[str, int, int]:
        """Create the entry's preallocated temp file and reserve its bytes;
        returns ``(temp path, open descriptor, bytes reserved)``. Its stripe is held.

        Raises:
            Stopped: ``run`` stopped meanwhile (nothing is left behind).
            CacheFull: no room on disk or under the cap.
        """
        space = self.space
        folder = os.path.dirname(local)
        if folder not in self._folders:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            self._remember_folder(folder)
        tmp = space.temp_path(local, lock)
        for attempt in (1, 2):
            try:
                fd, reserved = space.reserve(tmp, entry.size, max_bytes=self.max_bytes,
                                             lease_ns=self.lease_ns, name=rel, evicted=evicted,
                                             wait_s=self.wait_seconds, run=run)
                break
            except FileNotFoundError:
                if attempt == 2:
                    raise
                # The folder was removed since we made it (a clear): make it again.
                self._folders.discard(folder)
                os.makedirs(folder, mode=0o700, exist_ok=True)
            except OSError as exc:
                if no_room(exc):
                    raise self._disk_full(ns_dir, rel, entry.size) from exc
                raise
        if run is not None and not run.copying(token, tmp, reserved):
            os.close(fd)  # stopped while reserving: copy nothing
            space.abandon(tmp, reserved)
            raise Stopped()
        return tmp, fd, reserved

    def _commit_tmp(self, entry: FileEntry, tmp: str, local: str, copied: Copied,
                    reserved: int, run: Inflight | None, token: int) -> None:
        """Stamp the copied temp file and rename it into place."""
        if run is not None and not run.claim(token):
            raise Stopped()  # abandoned: the temp file was removed, the path is not ours
        cd.write_stamp(tmp, copied.size, copied.version or entry.version)
        now = time.time_ns()
        os.utime(tmp, ns=(now, copied.mtime_ns if copied.mtime_ns is not None else now))
        self.space.commit(tmp, local, copied.size, reserved)

    def _drop_tmp(self, exc: BaseException, ns_dir: str, rel: str, entry: FileEntry, tmp: str,
                  reserved: int, run: Inflight | None, token: int) -> NoReturn:
        """A copy failed (or stopped): remove its temp file unless the job
        already did, and raise (a full disk as :exc:`CacheFull`)."""
        if run is None or run.release(token):  # else the warm removed it already
            self.space.abandon(tmp, reserved)
        if no_room(exc):
            raise self._disk_full(ns_dir, rel, entry.size) from exc
        raise exc

    def _remember_folder(self, folder: str) -> None:
        if len(self._folders) >= _FOLDERS_MAX:
            self._folders.clear()  # bounded memory; the next copies just ask again
        self._folders.add(folder)

    def _disk_full(self, ns_dir: str, rel: str, need: int) -> CacheFull:
        return CacheFull(
            f"no space left in the cache folder {ns_dir}: {rel} needs {format_bytes(need)}, "
            f"{format_bytes(free_bytes(ns_dir))} free",
            hint=f"free space or point {CACHE_DIR_ENV} at a larger disk")

    def warm(self, volume: Volume, entries: Sequence[FileEntry], *, jobs: int | str = AUTO,
             callback: Callback = NO_PROGRESS) -> WarmReport:
        """Copy every entry not already valid, ``jobs`` at a time.

        ``jobs="auto"`` (the default) tunes the copies in flight as the warm
        runs (:mod:`ucstage.cache.tuning`): up while throughput rises, down on
        errors or falling throughput, up to 256 requests for object stores read
        by the obstore engine and 64 threads otherwise; the report's ``jobs``
        is the value it settled on. An int is used as given.

        Files that still fail after retries are listed in the report's
        ``failed``; the rest are cached. Stale temp files of killed runs are
        removed first. Files evicted to stay under the byte cap are counted,
        per source, in the report's ``evicted``.

        ``callback`` (a :class:`ucstage.progress.Callback`, called from the
        calling thread) hears, once the files are known to fit,
        ``set_size(total bytes, items=total files)``, then
        ``relative_update(nbytes)`` as bytes become valid in the cache (all
        the already valid ones at once first), and ``item_done(path, status,
        error)`` once per file with status ``fetched``, ``cached`` or ``failed``.

        Stopping: when ``KeyboardInterrupt`` (Ctrl-C, or
        :exc:`ucstage.errors.Terminated`) reaches the calling thread, no copy
        starts any more, copies in flight get about a second to finish, the
        rest are abandoned (their temp files removed, their bytes given back
        to the ledger), and the exception goes on. Files finished before
        that are cached; ``callback`` has heard of each.

        Raises:
            CacheFull: the files cannot fit on the disk or under the cap; checked
                before copying, and again if the disk fills up meanwhile.
        """
        cb = callback if callback is not None else NO_PROGRESS
        try:
            fixed = check_jobs(jobs)
        except ValueError as exc:
            raise InvalidArgument(str(exc), hint="pass a positive number, or 'auto'") from None
        engine = objstore.engine(volume)
        start = time.monotonic()
        checked = integrity.TALLY.snapshot()
        hedges = dict(hedge.STATS)
        ns_dir = self.prepare(volume)
        self.space.sweep(ns_dir)
        report = WarmReport(files=len(entries), bytes=sum(e.size for e in entries),
                            source=volume.source, cache_dir=self.root, namespace=ns_dir,
                            engine=engine, jobs_auto=fixed is None)
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
        evicted = Evicted()
        ceiling = OBJECT_STORE_CEILING if engine == "obstore" else THREAD_CEILING
        tuner = Jobs(fixed, ceiling=ceiling)
        _Warm(self, volume, todo, report, cb, evicted, tuner).run()
        report.jobs = tuner.settled
        integrity.note(report, checked, volume.url)
        report.hedged = hedge.STATS["hedges"] - hedges.get("hedges", 0)
        report.timeouts = hedge.STATS["timeouts"] - hedges.get("timeouts", 0)
        sources = self.space.sources()
        report.evicted = [EvictedSource(name, sources.get(name, ("", ""))[0], files, nbytes)
                          for name, (files, nbytes) in evicted.by_namespace().items()]
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

    def status(self, volume: maint.Volumes = None) -> CacheStatus:
        """Entries and bytes per namespace (of one volume, of a list of them such
        as :meth:`find` returns, or of every source), cap and free disk."""
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

    def clear(self, volume: maint.Volumes = None) -> ClearReport:
        """Remove the namespaces of one volume, of a list of them (such as
        :meth:`find` returns), or every namespace, with their lock files.
        Clearing everything also removes the frozen listings and whatever
        earlier clears left of namespaces. Files already open stay readable to
        whoever opened them (POSIX unlink semantics)."""
        return maint.clear(self.space, volume)

    def prune(self, max_bytes: int) -> PruneReport:
        """Evict files, in the eviction order of :mod:`ucstage.cache.policy`,
        until the cache holds at most ``max_bytes``.

        Files handed to a reader within the lease, and files a dataset reader
        holds, stay; the report says how many bytes that kept.
        """
        return maint.prune(self.space, max_bytes, lease_ns=self.lease_ns)


class _Warm:
    """One warm's copy phase: ``jobs`` daemon threads copy (on the obstore
    engine, coroutines on its event loop instead: :mod:`.loopwarm`), the
    calling thread waits for their results and reports them (the report and
    the callback are touched by the calling thread only).

    Daemon threads, not a ``ThreadPoolExecutor``: leaving an executor waits for
    every queued copy, and the interpreter joins its threads at exit, so a
    thread stuck in a slow read would hold up Ctrl-C. On any exception in the
    calling thread (Ctrl-C, SIGTERM, a full cache) the warm stops: see
    :meth:`_stop`.
    """

    def __init__(self, cache: LocalCache, volume: Volume, todo: Sequence[FileEntry],
                 report: WarmReport, cb: Callback, evicted: Evicted, tuner: Jobs) -> None:
        self.cache, self.volume, self.todo = cache, volume, todo
        self.report, self.cb, self.evicted = report, cb, evicted
        self.tuner = tuner
        self.inflight = Inflight(on_retry=tuner.error)
        self.threads = 0
        self.on_loop = False
        """Copies run as coroutines on the engine's loop (:mod:`.loopwarm`)."""
        self.results: queue.SimpleQueue[list[tuple[FileEntry, bool | BaseException]]] = \
            queue.SimpleQueue()
        """Outcomes of copies, in batches (a thread puts one; the event loop's
        driver puts what ended in one pass of the loop, so the waiting thread
        wakes once per batch, not once per file)."""
        self._pending = iter(todo)
        self._take = threading.Lock()
        self.taken = 0
        self.received = 0
        self.done_bytes = 0

    def run(self) -> None:
        if not self.todo:
            return
        try:
            if self.report.engine == "obstore":
                # Every copy a coroutine on the engine's event loop: no thread
                # per copy in flight (see :mod:`.loopwarm`).
                from .loopwarm import LoopWarm

                self.on_loop = True
                LoopWarm(self).start()
            self._spawn()
            while self.received < len(self.todo):
                for entry, outcome in self.results.get():
                    self._record(entry, outcome)
                self._spawn()
        except BaseException as exc:
            self._stop()
            if isinstance(exc, CacheFull):
                left = sum(e.size for e in self.todo) - self.done_bytes
                raise CacheFull(f"{exc.message}; this warm still needs {format_bytes(left)}",
                                exc.hint) from exc
            raise

    def _spawn(self) -> None:
        """One thread per place in flight, started as the tuner raises the limit."""
        want = min(self.tuner.limit, len(self.todo))
        while not self.on_loop and self.threads < want:
            threading.Thread(target=self._work, name=f"ucstage-warm-{self.threads}",
                             daemon=True).start()
            self.threads += 1

    def _work(self) -> None:
        tuner = self.tuner
        while tuner.enter():
            with self._take:
                entry = None if self.inflight.stopped else next(self._pending, None)
                if entry is None:
                    tuner.leave(0, counted=False)
                    tuner.close()
                    return
                self.taken += 1
            outcome: bool | BaseException
            try:
                outcome = self.cache._fetch_retrying(self.volume, entry, self.inflight,
                                                     self.evicted)[1]
            except BaseException as exc:
                outcome = exc
            tuner.leave(entry.size if outcome is True else 0)
            self.results.put([(entry, outcome)])

    def _record(self, e: FileEntry, outcome: bool | BaseException) -> None:
        self.received += 1
        report, cb = self.report, self.cb
        if isinstance(outcome, Stopped):
            return
        if isinstance(outcome, UcstageError) and not isinstance(outcome, CacheFull):
            report.failed.append((e.path, str(outcome)))
            if _retryable(outcome):
                report.retryable.add(e.path)
            cb.item_done(e.path, "failed", str(outcome))
            return
        if isinstance(outcome, BaseException):
            raise outcome
        if outcome:
            report.fetched += 1
            report.fetched_bytes += e.size
        else:
            report.already_cached += 1
            report.already_cached_bytes += e.size
        self.done_bytes += e.size
        cb.relative_update(e.size)
        cb.item_done(e.path, "fetched" if outcome else "cached")

    def _stop(self) -> None:
        """Start no copy; give copies in flight :data:`_GRACE` seconds to finish
        (reporting the ones that do), then abandon the rest."""
        self.inflight.stop()
        self.tuner.close()
        deadline = time.monotonic() + _GRACE
        try:
            while True:
                with self._take:
                    running = self.taken - self.received
                left = deadline - time.monotonic()
                if running <= 0 or left <= 0:
                    break
                try:
                    batch = self.results.get(timeout=left)
                except queue.Empty:
                    break
                for entry, outcome in batch:
                    # Stopping already: the first error is the one raised.
                    with contextlib.suppress(BaseException):
                        self._record(entry, outcome)
        except KeyboardInterrupt:
            pass  # a second Ctrl-C: stop waiting, but still clean up
        # A second Ctrl-C here leaves temp files that the next warm sweeps
        # (nobody holds their stripes once this process is gone).
        with contextlib.suppress(KeyboardInterrupt):
            self.cache.abandon(self.inflight)


def _retryable(exc: UcstageError) -> bool:
    """Whether a failed copy may succeed on a rerun: the source gave a transient
    error until retries ran out (not a missing file, a permission, an unsafe path)."""
    return isinstance(exc, FetchFailed) and exc.__cause__ is not None \
        and not isinstance(exc.__cause__, _PERMANENT)


def _env_max_bytes() -> int | None:
    """The cap ``$UCSTAGE_CACHE_MAX_BYTES`` sets, or None; a bad value names the variable."""
    raw = os.environ.get(MAX_BYTES_ENV, "")
    if not raw.strip():
        return None
    try:
        value = parse_size(raw)
    except InvalidArgument:
        raise InvalidArgument(f"{MAX_BYTES_ENV}={raw!r} is not a size",
                              hint=f"set it to e.g. 500M or 20G, or unset it; "
                                   f"{SIZE_HELP}") from None
    if value < 1:
        raise InvalidArgument(f"{MAX_BYTES_ENV}={raw!r}: the byte cap must be positive",
                              hint="set it to e.g. 500M or 20G, or unset it for no cap")
    return value


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
