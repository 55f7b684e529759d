"""The local cache's front: :class:`LocalCache` and its settings; its
volume-taking methods are one-liners over the cache bound to one volume
(:meth:`LocalCache.at`, a :class:`ucstage.cache.fetch.Bound`).

How the cache works (namespaces, stamps, locks, the cap and its eviction
order, leases) is documented in docs/cache.md and docs/design.md; the
modules that do it are named there. ``LocalCache`` also holds the bodies of
the maintenance commands (status, verify, clear, prune) and ``find``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import posixpath
from collections.abc import Sequence
from typing import Any

from .. import params
from ..engines import checks
from ..engines.context import Requests
from ..errors import CacheError, InvalidArgument, SourceNotFound
from ..progress import NO_PROGRESS, Callback
from ..sharding import rank_entries
from ..volumes import (
    RANGES_DIR,
    FileEntry,
    Volume,
    is_volumes_path,
    list_files,
    resolve,
    safe_relpath,
)
from . import paths, runstats
from .fetch import WARM_FEWER, Bound, warm_entries
from .inflight import Inflight
from .reports import (
    CacheStatus,
    ClearReport,
    NamespaceStatus,
    PruneReport,
    SourceCheck,
    VerifyReport,
    WarmReport,
    show_version,
)
from .space import CacheSpace, free_bytes
from .tuning import AUTO

__all__ = ["CACHE_DIR_ENV", "DEFAULT_LEASE_SECONDS", "DEFAULT_WAIT_SECONDS", "MAX_BYTES_ENV",
           "WARM_FEWER", "Bound", "LocalCache", "Volumes", "rank_entries"]

CACHE_DIR_ENV = paths.CACHE_DIR_ENV
MAX_BYTES_ENV = "UCSTAGE_CACHE_MAX_BYTES"
DEFAULT_LEASE_SECONDS = 10.0
"""The time lease of paths handed out by ``lookup``/``fetch`` (and ``warm``)."""
DEFAULT_WAIT_SECONDS = 120.0
"""How long a copy waits for readers to make room under a full cap."""

Volumes = Volume | Sequence[Volume] | None
"""What status and clear cover: one volume, several (:meth:`LocalCache.find`'s),
or every cached source (None)."""


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
        self._setup(paths.open_root(os.fspath(root) if root is not None
                                    else paths.default_root()),
                    max_bytes, lease_seconds, wait_seconds)
        if not os.path.exists(os.path.join(self.root, paths.CONTROL, "usage")):
            # A root without a byte ledger (new, or made by an old version) is
            # counted when it opens, not by the first copy into it.
            self.space.recorded_bytes()
        self.retries = retries
        self.backoff = backoff
        self.requests = Requests.of(hedge, request_deadline)
        """The object-store engine's hedging and per-request deadline for this
        cache's copies (given, else ``$UCSTAGE_HEDGE``, ``$UCSTAGE_REQUEST_DEADLINE``)."""

    def _setup(self, root: str, max_bytes: int | str | None, lease_seconds: float,
               wait_seconds: float, *, writable: bool = True) -> None:
        self.root: str = root
        cap = env_max_bytes() if max_bytes is None else params.size(max_bytes, "max_bytes")
        if wait_seconds < 0:
            raise CacheError(f"wait_seconds must be 0 or more, got {wait_seconds}")
        self.space = CacheSpace(root, max_bytes=cap, lease_ns=int(lease_seconds * 1e9),
                                wait_s=float(wait_seconds))
        """The cache's on-disk state (ledger, stamp memo, walk, eviction), with its cap."""
        self._writable = writable
        """False for :meth:`unopened`: counted without the ledger lock."""
        # The last volume bound: one attribute, replaced whole, so threads
        # never see half of it.
        self._last: Bound | None = None

    @classmethod
    def unopened(cls, root: str, *, max_bytes: int | None = None) -> LocalCache:
        """A cache over a root :func:`ucstage.cache.paths.open_root` refused
        (``cache status`` of an unusable root): for :meth:`find` and
        :meth:`status` only, which then count without writing or locking."""
        cache = cls.__new__(cls)
        cache._setup(root, max_bytes, DEFAULT_LEASE_SECONDS, 0.0, writable=False)
        return cache

    @property
    def max_bytes(self) -> int | None:
        """The byte cap (None: no cap)."""
        return self.space.max_bytes

    @property
    def lease_ns(self) -> int:
        """The time lease of handed-out paths, in nanoseconds."""
        return self.space.lease_ns

    @property
    def wait_seconds(self) -> float:
        """How long a copy waits for room under a full cap."""
        return self.space.wait_s

    # -- layout -----------------------------------------------------------

    def namespace_dir(self, volume: Volume) -> str:
        """``<root>/<namespace>`` for a source (not created; see :meth:`prepare`)."""
        return self.space.namespace_dir(volume.url)

    def prepare(self, volume: Volume) -> str:
        """Create the namespace folder and record which source it holds; return it."""
        return self.at(volume).prepare()

    def find(self, source: str) -> list[Volume]:
        """The cached volumes that hold ``source``, by the records the cache keeps.

        A ``/Volumes/...`` source (``dbfs:`` dropped) matches every namespace
        cached under that string, whatever ``$UCSTAGE_VOLUMES_ROOT`` was then
        or is now, and each returned volume reads from where its files were
        cached from; any source also matches the namespace of where it
        resolves now. Empty when nothing is cached for it.
        """
        space = self.space
        current = resolve(source, must_exist=False)
        here = space.namespace_dir(current.url)
        # Only a /Volumes path means different places under different settings of
        # $UCSTAGE_VOLUMES_ROOT; any other string resolves alike every time (a
        # relative path recorded as given would match the wrong folder elsewhere).
        wanted = posixpath.normpath(current.source) if is_volumes_path(current.source) else None
        records = space.sources()
        found: list[Volume] = []
        for ns_dir in space.namespace_dirs():
            given, url = records.get(os.path.basename(ns_dir), ("", ""))
            if ns_dir == here:
                found.append(current)
            elif wanted is not None and url and is_volumes_path(given) \
                    and posixpath.normpath(given) == wanted:
                found.append(dataclasses.replace(resolve(url, must_exist=False), source=given))
        return found

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
            last = self._last = Bound(self.space, volume, requests=self.requests,
                                      retries=self.retries, backoff=self.backoff)
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
        return warm_entries(self.at(volume), entries, jobs=jobs, callback=callback)

    # -- maintenance ------------------------------------------------------------

    def status(self, volume: Volumes = None) -> CacheStatus:
        """Entries and bytes per namespace (of one volume, of a list of them such
        as :meth:`find` returns, or of every source), cap and free disk."""
        space = self.space
        sources = space.sources()
        rows = []
        for ns_dir, vol in _namespaces(space, volume).items():
            name = os.path.basename(ns_dir)
            found = space.tally([ns_dir], locked=self._writable)
            given, url = sources.get(name, (vol.source, vol.url) if vol else ("", ""))
            rows.append(NamespaceStatus(name, given, url, ns_dir, found.files, found.bytes,
                                        found.partial_files))
        return CacheStatus(space.root, sum(r.entries for r in rows), sum(r.bytes for r in rows),
                           self.max_bytes, free_bytes(space.root), rows,
                           runstats.last_run(space.root))

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
        space = self.space
        if volume is not None:
            return VerifyReport([_verify_source(space, volume, entries, checksum, volume.source,
                                                complete, fix)], checksum)
        if entries is not None:
            raise InvalidArgument("entries need the volume they were listed from",
                                  hint="pass volume too, or neither to check every cached source")
        # Every source the cache holds, as its record names it, listed afresh. A
        # namespace without a record cannot be traced back to a source: skipped.
        # One source that is gone is reported as such; the others are still checked.
        sources = space.sources()
        checks = []
        for ns_dir in space.namespace_dirs():
            given, url = sources.get(os.path.basename(ns_dir), ("", ""))
            if url:
                try:
                    checks.append(_verify_source(space, resolve(url), None, checksum, given,
                                                 complete, fix))
                except SourceNotFound as exc:
                    checks.append(SourceCheck(given, vanished=exc.message))
        return VerifyReport(checks, checksum)

    def clear(self, volume: Volumes = None) -> ClearReport:
        """Remove the namespaces of one volume, of a list of them (such as
        :meth:`find` returns), or every namespace, with their lock files.
        Clearing everything also removes the frozen listings and whatever
        earlier clears left of namespaces. Files already open stay readable to
        whoever opened them (POSIX unlink semantics)."""
        space = self.space
        ns_dirs = list(_namespaces(space, volume))
        found = space.tally(ns_dirs)
        names = space.remove_namespaces(ns_dirs)
        if volume is None:
            # Listings VolumeDataset froze belong to the whole cache, and so do the
            # lock folders and records older clears left: clearing everything must
            # not leave them to pile up.
            space.remove_frozen_listings()
            space.remove_orphans()
        return ClearReport(names, found.files, found.bytes)

    def prune(self, max_bytes: int) -> PruneReport:
        """Evict files, in the eviction order of :mod:`ucstage.cache.policy`,
        until the cache holds at most ``max_bytes``.

        Files handed to a reader within the lease, and files a dataset reader
        holds, stay; the report says how many bytes that kept.
        """
        if max_bytes < 0:
            raise CacheError(f"max_bytes must be 0 or more, got {max_bytes}")
        return PruneReport(max_bytes, *self.space.evict_to(max_bytes))


def env_max_bytes() -> int | None:
    """The cap ``$UCSTAGE_CACHE_MAX_BYTES`` sets, or None; a bad value names the variable."""
    raw = os.environ.get(MAX_BYTES_ENV, "")
    if not raw.strip():
        return None
    value = params.size_string(raw, MAX_BYTES_ENV, "set it to e.g. 500M or 20G, or unset it")
    if value < 1:
        raise InvalidArgument(f"{MAX_BYTES_ENV}={raw!r}: the byte cap must be positive",
                              hint="set it to e.g. 500M or 20G, or unset it for no cap")
    return value


# -- the maintenance commands' pieces ----------------------------------------------

def _namespaces(space: CacheSpace, volumes: Volumes) -> dict[str, Volume | None]:
    """namespace folder -> its volume: the given volumes' folders, or every one."""
    if volumes is None:
        return dict.fromkeys(space.namespace_dirs())
    if isinstance(volumes, Volume):
        volumes = [volumes]
    return {space.namespace_dir(v.url): v for v in volumes}


def _verify_source(space: CacheSpace, volume: Volume, entries: Sequence[FileEntry] | None,
                   checksum: bool, label: str, complete: bool | None, fix: bool) -> SourceCheck:
    if complete is None:
        complete = entries is None  # a listing made here is the whole source
    if entries is None:
        entries = list_files(volume).entries
    ns_dir = space.namespace_dir(volume.url)
    report = SourceCheck(label, removed_partial_files=space.sweep(ns_dir))
    for e in entries:
        report.checked += 1
        rel = safe_relpath(e.path)
        local = os.path.join(ns_dir, *rel.split("/"))
        try:
            st = os.stat(local)
        except FileNotFoundError:
            report.missing += 1
            continue
        # Read from the file, not the memo: verify must see what is on disk now.
        stamp = paths.read_stamp(local)
        problem = ""
        if stamp is None:
            problem = "no validity stamp"
        elif stamp[0] != st.st_size:
            problem = f"{st.st_size} bytes on disk, {stamp[0]} copied"
        elif stamp != (e.size, e.version):
            report.stale.append((e.path, f"source is now {e.size} bytes, "
                                         f"{show_version(e.version)}; cached {stamp[0]} bytes, "
                                         f"{show_version(stamp[1])}"))
        elif checksum and (problem := _content_problem(volume, e.path, local)):
            pass  # corrupt: handled below
        else:
            report.ok += 1
        if problem:
            report.corrupt.append((e.path, problem))
            # A copy known to be corrupt must not be handed out again; its stamp
            # may still match the source, so only deleting it makes warm refetch it.
            if space.discard(ns_dir, rel, local, st):
                report.removed.append(e.path)
    _verify_ranges(space, ns_dir, entries, report)
    if complete:
        _find_orphans(space, ns_dir, entries, report, fix)
    return report


def _find_orphans(space: CacheSpace, ns_dir: str, entries: Sequence[FileEntry],
                  report: SourceCheck, fix: bool) -> None:
    """Cached files (and row-group copies) whose source file the complete
    listing ``entries`` no longer has; deleted with ``fix``. Hidden names are
    left out: a listing without hidden files says nothing about them. Not
    deleted otherwise: a manifest frozen before the deletion still reads them."""
    listed = {safe_relpath(e.path) for e in entries}
    for folder, dirs, names in os.walk(ns_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")
                         or (folder == ns_dir and d == RANGES_DIR))
        rel_dir = os.path.relpath(folder, ns_dir).replace(os.sep, "/")
        if rel_dir == RANGES_DIR or rel_dir.startswith(RANGES_DIR + "/"):
            source = rel_dir[len(RANGES_DIR) + 1:]
            if not source or source in listed:
                continue
        for name in sorted(names):
            if name.startswith("."):
                continue  # hidden, or a copy in flight (swept above when dead)
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if rel in listed:
                continue
            local = os.path.join(folder, name)
            try:
                st = os.stat(local)
            except FileNotFoundError:
                continue
            report.orphans.append(rel)
            if fix and space.discard(ns_dir, rel, local, st):
                report.orphans_removed.append(rel)


def _verify_ranges(space: CacheSpace, ns_dir: str, entries: Sequence[FileEntry],
                   report: SourceCheck) -> None:
    """The byte-range entries (a table's row groups) of the listed files: each
    is stamped with its file's version, so a changed file makes them stale.
    (``checksum`` does not apply: a range has no whole-file digest.)"""
    top = os.path.join(ns_dir, RANGES_DIR)
    if not os.path.isdir(top):
        return
    by_path = {e.path: e for e in entries}
    for folder, _, names in os.walk(top):
        source = os.path.relpath(folder, top).replace(os.sep, "/")
        e = by_path.get(source)
        for name in names:
            if paths.part_stripe(name) is not None:
                continue  # a copy in flight (swept above when dead)
            if e is None:
                continue  # a file this check was not asked about (or gone: prune evicts)
            local = os.path.join(folder, name)
            rel = f"{RANGES_DIR}/{source}/{name}"
            report.ranges_checked += 1
            try:
                st = os.stat(local)
            except FileNotFoundError:
                continue
            stamp = paths.read_stamp(local)
            if stamp is None or stamp[0] != st.st_size:
                problem = "no validity stamp" if stamp is None else \
                    f"{st.st_size} bytes on disk, {stamp[0]} copied"
                report.corrupt.append((rel, problem))
                if space.discard(ns_dir, rel, local, st):
                    report.removed.append(rel)
            elif stamp[1] != e.version:
                report.stale.append((rel, f"source file is now {show_version(e.version)}; "
                                          f"cached ranges of {show_version(stamp[1])}"))
            else:
                report.ranges_ok += 1


def _content_problem(volume: Volume, relpath: str, local: str) -> str:
    """Why a cached copy's bytes are wrong ('' when they are right): against
    the checksum recorded when it was copied (checked against the store
    then), else against the source's bytes, read again."""
    recorded = checks.recorded(local)
    if recorded:
        kind = recorded.partition(":")[0]
        if checks.file_checksum(local, kind) != recorded:
            return f"content differs from the checksum recorded when it was copied ({kind})"
        return ""
    if _digest_local(local) != _digest_source(volume, relpath):
        return "content differs from the source (sha256)"
    return ""


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
