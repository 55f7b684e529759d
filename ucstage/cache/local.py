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

This module holds the front: :class:`LocalCache`, its settings, and the hot
path (lookup and the one validity rule). Copying an entry is the fetch
protocol of :mod:`ucstage.cache.fetch`, copying many at once
:mod:`ucstage.cache.warm`. The on-disk state it shares with the maintenance
commands (the ledger, the stamp memo, the tree walk, eviction, the namespace
records) is a :class:`ucstage.cache.space.CacheSpace`; status, verify, clear
and prune are in :mod:`ucstage.cache.maintenance`. ``LocalCache`` keeps every
method and delegates to them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from .. import params
from ..engines.context import Requests
from ..errors import CacheError, InvalidArgument
from ..progress import NO_PROGRESS, Callback
from ..sharding import rank_entries
from ..units import SIZE_HELP, parse_size
from ..volumes import FileEntry, Volume, safe_relpath
from . import maintenance as maint
from . import paths
from .fetch import Fetcher
from .inflight import Inflight
from .reports import (
    CacheStatus,
    ClearReport,
    PruneReport,
    VerifyReport,
    WarmReport,
)
from .space import CacheSpace
from .tuning import AUTO
from .warm import WARM_FEWER, warm_entries

__all__ = ["CACHE_DIR_ENV", "DEFAULT_LEASE_SECONDS", "DEFAULT_WAIT_SECONDS", "MAX_BYTES_ENV",
           "WARM_FEWER", "Bound", "LocalCache", "rank_entries"]

CACHE_DIR_ENV = paths.CACHE_DIR_ENV
MAX_BYTES_ENV = "UCSTAGE_CACHE_MAX_BYTES"
_TOUCH_NS = 1_000_000_000
"""Hand-outs refresh a file's atime at most once a second: the LRU clock has
one-second resolution, and hot lookups cost one stat, not a stat and a write."""
DEFAULT_LEASE_SECONDS = 10.0
"""The time lease of paths handed out by ``lookup``/``fetch`` (and ``warm``)."""
DEFAULT_WAIT_SECONDS = 120.0
"""How long a copy waits for readers to make room under a full cap."""


class LocalCache:
    """A private, path-mirrored cache of source files on local disk.

    Args:
        root: the cache folder; default ``$UCSTAGE_CACHE_DIR``, else
            ``/tmp/ucstage-<uid>``. Created 0700; refused when it is a
            symlink, owned by someone else, or writable by others.
        max_bytes: byte cap for the whole root, in bytes or as a size string
            (``"500M"``, ``"20G"``; powers of 1024); default
            ``$UCSTAGE_CACHE_MAX_BYTES``, else no cap.
        lease_seconds: a file handed out by :meth:`lookup` or :meth:`fetch` is
            not evicted for this long (files a VolumeDataset reads are held
            until its reader moves on instead).
        wait_seconds: how long a copy waits for room when everything under
            the cap is held by readers, before it fails with ``CacheFull``.
        retries: extra attempts for transient source errors.
        backoff: first retry delay in seconds (doubles each attempt, jittered).
        hedge: hedge late GETs on the object-store engine (default
            ``$UCSTAGE_HEDGE``, on unless ``0``/``off``).
        request_deadline: seconds one GET may take at most (default
            ``$UCSTAGE_REQUEST_DEADLINE``, else 30).
    """

    def __init__(self, root: str | os.PathLike[str] | None = None, *,
                 max_bytes: int | str | None = None, lease_seconds: float = DEFAULT_LEASE_SECONDS,
                 retries: int = 3, backoff: float = 0.2,
                 wait_seconds: float = DEFAULT_WAIT_SECONDS,
                 hedge: bool | None = None, request_deadline: float | None = None) -> None:
        self.root: str = paths.open_root(os.fspath(root) if root is not None
                                         else paths.default_root())
        self.max_bytes = env_max_bytes() if max_bytes is None else \
            params.size(max_bytes, "max_bytes")
        self.lease_ns = int(lease_seconds * 1e9)
        if wait_seconds < 0:
            raise CacheError(f"wait_seconds must be 0 or more, got {wait_seconds}")
        self.wait_seconds = float(wait_seconds)
        self.retries = retries
        self.backoff = backoff
        self.requests = Requests.of(hedge, request_deadline)
        """The object-store engine's hedging and per-request deadline for this
        cache's copies (given, else ``$UCSTAGE_HEDGE``, ``$UCSTAGE_REQUEST_DEADLINE``)."""
        self.space = CacheSpace(self.root)
        """The cache's on-disk state (ledger, stamp memo, walk, eviction)."""
        self._fetcher = Fetcher(self)
        """The fetch protocol's steps, with this cache's settings."""
        # The last volume bound: one attribute, replaced whole, so threads
        # never see half of it.
        self._last: Bound | None = None

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
        return self.at(volume).lookup(entry, touch=touch)

    def lookup_run(self, volume: Volume, entries: Sequence[FileEntry], *,
                   touch: bool = True) -> list[str]:
        """The cached paths of the leading run of ``entries`` that are valid,
        in order: it stops at the first entry that is not (so its length is
        that entry's index). Never copies; touches as :meth:`lookup` does.

        :meth:`lookup_rows` over the entries' fields; :meth:`lookup` is this
        with one entry; a run saves a warm epoch the per-call work.

        Raises:
            UnsafePath: the first entry's path is unsafe (a later unsafe one
                ends the run before it).
        """
        return self.at(volume).lookup_run(entries, touch=touch)

    def lookup_rows(self, volume: Volume, rels: Sequence[str], sizes: Sequence[int],
                    versions: Sequence[str], *, touch: bool = True) -> list[str]:
        """:meth:`lookup_run` of the entries whose paths, sizes and versions
        are ``rels``, ``sizes`` and ``versions`` (:meth:`Bound.lookup_rows`)."""
        return self.at(volume).lookup_rows(rels, sizes, versions, touch=touch)

    def at(self, volume: Volume) -> Bound:
        """This cache bound to one volume's namespace: what a reader of that
        volume calls (:class:`Bound`), so the pair never travels apart."""
        last = self._last
        if last is None or last.volume is not volume:
            last = self._last = Bound(self, volume)
        return last

    # -- fetching -----------------------------------------------------------

    def fetch(self, volume: Volume, entry: FileEntry, *,
              inflight: Inflight | None = None) -> str:
        """A valid local path for ``entry``, copying it on a miss.

        Concurrent callers (threads or processes) wait for one copy. If the
        source changed since it was listed, the current bytes are cached and
        returned, stamped with what was actually copied.

        ``inflight`` (a :class:`ucstage.cache.inflight.Inflight` shared by the
        fetches of one job) lets the job stop them: once ``inflight.stop()`` is
        called no copy starts, copies in flight end at their next chunk and
        remove their temp files, and :meth:`abandon` removes those of copies
        still blocked in a read.

        Raises:
            FetchFailed: the source could not be read after retries.
            CacheFull: no room on disk or under the cap.
            UnsafePath: the entry points outside the volume or the cache.
            Stopped: ``inflight`` was stopped (a valid cached copy is still returned).
        """
        return self.at(volume).fetch(entry, inflight=inflight)

    def abandon(self, inflight: Inflight) -> int:
        """Stop ``inflight`` and give up its copies still in flight (blocked in a
        read): remove their temp files and give their bytes back to the ledger
        now; their threads find out when the read returns and leave the cache
        alone. Returns how many copies were given up."""
        return inflight.abandon(self.space.abandon)

    def warm(self, volume: Volume, entries: Sequence[FileEntry], *, jobs: int | str = AUTO,
             callback: Callback = NO_PROGRESS) -> WarmReport:
        """Copy every entry not already valid, ``jobs`` at a time.

        ``jobs="auto"`` (the default) tunes the copies in flight as the warm
        runs (:mod:`ucstage.cache.tuning`): from a first guess for the kind of
        source (local folder, FUSE or network mount, object store, other fsspec
        remote), up while throughput rises, down on
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
        return warm_entries(self._fetcher, volume, entries, jobs=jobs, callback=callback)

    # -- maintenance (bodies in ucstage.cache.maintenance) --------------------

    def status(self, volume: maint.Volumes = None) -> CacheStatus:
        """Entries and bytes per namespace (of one volume, of a list of them such
        as :meth:`find` returns, or of every source), cap and free disk."""
        return maint.status(self.space, volume, max_bytes=self.max_bytes)

    def verify(self, volume: Volume | None = None, entries: Sequence[FileEntry] | None = None,
               *, checksum: bool = False, complete: bool | None = None,
               fix: bool = False) -> VerifyReport:
        """Check cached copies of ``entries`` (default: a fresh listing) against the source.

        Without ``volume``, every source the cache holds is checked against a
        fresh listing of it (found through the record each namespace keeps of
        its source), one :class:`~ucstage.cache.reports.SourceCheck` per source.

        Stale: the source's size or version changed since the copy. Corrupt:
        no stamp, a size on disk that differs from the stamp, or (with
        ``checksum``) bytes that differ from the source's. Corrupt copies are
        deleted (listed in ``removed``) so they are never handed out again and
        the next fetch or warm copies them afresh. Files not cached count as
        missing, which is not an error. Row-group copies are counted apart
        (``ranges_checked``, ``ranges_ok``).

        Orphans: cached files whose source file the listing lacks, reported
        when the listing is ``complete`` (default: when verify lists the
        source itself) and deleted with ``fix``. A cached source (without
        ``volume``) that no longer exists is reported ``vanished``; the others
        are still checked.

        Raises:
            SourceNotFound: ``volume`` no longer exists (and no ``entries``).
            InvalidArgument: ``entries`` without ``volume``.
        """
        return maint.verify(self.space, volume, entries, checksum=checksum, complete=complete,
                            fix=fix)

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


class Bound:
    """A :class:`LocalCache` bound to one volume's namespace.

    What a dataset's reader, a warm and an export call: :meth:`lookup`,
    :meth:`lookup_run`, :meth:`lookup_rows` and :meth:`fetch` take entries of
    this volume only. Made by :meth:`LocalCache.at`.
    """

    __slots__ = ("_memo", "_stamps", "cache", "prefix", "volume")

    def __init__(self, cache: LocalCache, volume: Volume) -> None:
        self.cache = cache
        self.volume = volume
        self.prefix = cache.namespace_dir(volume) + "/"
        """``<root>/<namespace>/``: a cached file's path is this plus its relpath."""
        self._memo = cache.space.stamps.entries
        self._stamps = cache.space.stamps

    def lookup(self, entry: FileEntry, *, touch: bool = True) -> str | None:
        """:meth:`LocalCache.lookup` of this volume's ``entry``."""
        found = self.lookup_rows((entry.path,), (entry.size,), (entry.version,), touch=touch)
        return found[0] if found else None

    def lookup_run(self, entries: Sequence[FileEntry], *, touch: bool = True) -> list[str]:
        """:meth:`LocalCache.lookup_run` of this volume's ``entries``."""
        return self.lookup_rows([e.path for e in entries], [e.size for e in entries],
                                [e.version for e in entries], touch=touch)

    def lookup_rows(self, rels: Sequence[str], sizes: Sequence[int],
                    versions: Sequence[str], *, touch: bool = True) -> list[str]:
        """The cached paths of the leading run of entries whose paths, sizes
        and versions are ``rels``, ``sizes`` and ``versions`` that are valid
        (a manifest's columns: a warm epoch makes no object per entry).

        The one validity rule (docs/design.md, "Validity rule"): a ``stat``
        of each path against the stamp memo, the stamp read again when the
        memo does not vouch for the inode and ctime.

        Raises:
            UnsafePath: the first path is unsafe (a later unsafe one ends
                the run before it).
        """
        prefix, memos, stat, stamps = self.prefix, self._memo, os.stat, self._stamps
        now = time.time_ns()  # the touch's clock: a run takes far less than its 1 s step
        found: list[str] = []
        for rel, size, version in zip(rels, sizes, versions, strict=True):
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
                stamp = stamps.stamp(local, st)
            if stamp is None or stamp[0] != size or stamp[1] != version \
                    or st.st_size != size:
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
                stamps.touched(local, st, stamp)
            found.append(local)
        return found


    def fetch(self, entry: FileEntry, *, inflight: Inflight | None = None) -> str:
        """:meth:`LocalCache.fetch` of this volume's ``entry``."""
        return self.lookup(entry) or \
            self.cache._fetcher.fetch_retrying(self.volume, entry, inflight)[0]


def env_max_bytes() -> int | None:
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

