"""The fetch protocol: copying one entry into the cache, once, whoever asks.

Its steps, and why each is where it is, are in docs/design.md ("Crash
safety", and section 6 on the fetch protocol and a warm): under the entry's
lock stripe (:func:`ucstage.cache.paths.locked`) the entry is checked once more, a
preallocated temp file is reserved in the ledger
(:meth:`ucstage.cache.space.CacheSpace.reserve`), the source's bytes are
copied into it by the volume's engine
(:meth:`ucstage.engines.engine.Engine.copy`; a row group's chunks:
:func:`ucstage.engines.engine.copy_ranges`), and it is stamped
and renamed into place, or removed with its bytes given back. The retry
rule is :func:`retry_pause`; a job's stop is its
:class:`~ucstage.cache.inflight.Inflight`.

Here are the cache bound to one volume (:class:`Bound`, what
``LocalCache.at`` returns: lookup, the validity rule, fetch); the steps, as
functions of one :class:`Copy`, which carries its :class:`Bound`; and the
two drivers that run them, side by side: the threads' (:func:`fetch_retrying`,
what ``fetch`` calls, and a warm's :class:`WarmCopies`) and the event loop's
(:class:`LoopWarm`, a warm on the object-store engine). The copy itself is the
engine's (:mod:`ucstage.engines.engine`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import functools
import os
import queue
import random
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, NoReturn, TypeVar

from ..engines import checks, engine, objget, objstore
from ..engines.context import Copied, FetchContext, Requests
from ..engines.engine import copy_ranges
from ..engines.pace import FREE_RETRIES, Paced, pause, throttled
from ..errors import CacheFull, FetchFailed, InvalidArgument, UcstageError, UnsafePath
from ..progress import NO_PROGRESS, Callback
from ..units import format_bytes
from ..volumes import FileEntry, RangeEntry, Volume, is_range_path, safe_relpath
from ..volumes.entry import PLAIN, uncacheable
from . import paths
from .inflight import Inflight, Stopped
from .paths import FileLock
from .reports import EvictedSource, WarmReport
from .space import CacheSpace, Evictions, charging, free_bytes, no_room
from .tuning import AUTO, THREAD_CEILING, Jobs, ceiling, check_jobs, first_guess

__all__ = ["GRACE", "WARM_FEWER", "Bound", "Copy", "LoopWarm", "Pending",
           "Retries", "WarmCopies", "commit_tmps", "copy_locked",
           "disk_full", "drop_tmp", "fetch_once", "fetch_retrying",
           "permanent", "reserve_tmps", "retry_pause", "retryable", "slows_down",
           "throttled", "warm_entries", "where"]

_PERMANENT = (UcstageError, FileNotFoundError, PermissionError, IsADirectoryError,
              NotADirectoryError, FileExistsError)
_PERMANENT_ERRNOS = frozenset({errno.ENAMETOOLONG, errno.EISDIR, errno.ENOTDIR})
"""Errors of the cache's own file system that a retry meets again: the name
is too long for it, or the path is a folder on one side and a file on the other."""
_TOUCH_NS = 1_000_000_000
"""Hand-outs refresh a file's atime at most once a second: the LRU clock has
one-second resolution, and hot lookups cost one stat, not a stat and a write."""


@dataclass
class Copy:
    """One copy of an entry into the cache, as its steps (reserve, copy,
    commit or drop) pass it on: where it goes, and which job it belongs to."""

    at: Bound
    """The cache bound to the entry's volume: its settings, space and check."""
    entry: FileEntry
    rel: str
    """The entry's path, checked safe."""
    ns_dir: str
    """The namespace folder."""
    local: str
    """Where the cached file goes."""
    lock: str
    """The entry's lock stripe (held while the copy runs)."""
    tmp: str
    """Its temp file, beside ``local`` (:meth:`CacheSpace.temp_path`)."""
    ctx: FetchContext
    """What the engine reads the source with: the cache's request settings,
    where it keeps its MD5 evidence (``.ucstage/md5-etags/``), the entry's
    listed size and version, the job that may stop it."""
    inflight: Inflight | None = None
    """The job that may stop this copy (a warm, a read-ahead), or None."""
    token: int = -1
    """The copy's token in ``inflight`` (:meth:`Inflight.begin`), taken
    once its stripe is held and the check under it missed."""


class Pending(NamedTuple):
    """A copy's reserved temp file: open, preallocated, counted in the ledger."""

    tmp: str
    fd: int
    reserved: int
    """Bytes reserved in the ledger for it."""


# -- the cache bound to one volume ------------------------------------------------

class Bound:
    """A :class:`~ucstage.cache.local.LocalCache` bound to one volume's namespace.

    What a dataset's reader, a warm and an export call: :meth:`lookup`,
    :meth:`lookup_run`, :meth:`lookup_rows` and :meth:`fetch` take entries of
    this volume only. Made by :meth:`~ucstage.cache.local.LocalCache.at`, with the cache's space
    and its copy settings (here, not in ``local``: the fetch protocol below
    reads them, and ``local`` imports this module).
    """

    __slots__ = ("_memo", "_stamps", "backoff", "evidence", "locks", "ns_dir", "prefix",
                 "requests", "retries", "space", "volume")

    def __init__(self, space: CacheSpace, volume: Volume, *, requests: Requests,
                 retries: int, backoff: float) -> None:
        self.space = space
        self.volume = volume
        self.requests = requests
        """The object-store engine's hedging and per-request deadline."""
        self.retries = retries
        """Extra attempts for transient source errors."""
        self.backoff = backoff
        """First retry delay in seconds."""
        self.ns_dir = space.namespace_dir(volume.url)
        """``<root>/<namespace>``, the volume's namespace folder."""
        self.prefix = self.ns_dir + "/"
        """A cached file's path is this plus its relpath."""
        self.locks = paths.lock_dir(space.root, self.ns_dir)
        """The folder of the namespace's lock stripes."""
        self.evidence = functools.partial(paths.md5_evidence, space.root)
        """Where a copy's checks keep which sources serve MD5 ETags."""
        self._memo = space.stamps.entries
        self._stamps = space.stamps

    def prepare(self) -> str:
        """:meth:`~ucstage.cache.local.LocalCache.prepare` of this volume: once
        per process, when a reader binds the namespace (a dataset freezing its
        listing), else by its first copy (:func:`where`)."""
        return self.space.prepare(self.ns_dir, url=self.volume.url, source=self.volume.source)

    def lookup(self, entry: FileEntry, *, touch: bool = True) -> str | None:
        """:meth:`~ucstage.cache.local.LocalCache.lookup` of this volume's ``entry``."""
        found = self.lookup_rows((entry.path,), (entry.size,), (entry.version,), touch=touch)
        return found[0] if found else None

    def lookup_run(self, entries: Sequence[FileEntry], *, touch: bool = True) -> list[str]:
        """:meth:`~ucstage.cache.local.LocalCache.lookup_run` of this volume's ``entries``."""
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
        """:meth:`~ucstage.cache.local.LocalCache.fetch` of this volume's ``entry``: the check
        before the lock (a hit takes no lock), then :meth:`fetch_missing`."""
        found = self.lookup_rows((entry.path,), (entry.size,), (entry.version,))
        return found[0] if found else self.fetch_missing(entry, inflight=inflight)

    def fetch_missing(self, entry: FileEntry, *, inflight: Inflight | None = None) -> str:
        """:meth:`fetch` of an entry the caller just found missing (its own
        lookup was the check before the lock): the entry's lock, the check
        under it, and the copy (:func:`ucstage.cache.fetch.fetch_retrying`)."""
        return fetch_retrying(self, entry, inflight)[0]


# -- the thread driver ------------------------------------------------------------

def fetch_retrying(at: Bound, entry: FileEntry,
                   inflight: Inflight | None = None) -> tuple[str, bool]:
    """``(local path, copied)`` for ``entry`` of ``at``'s volume, retrying
    transient errors (:func:`retry_pause`).

    Raises:
        FetchFailed: permanent errors, or retries ran out.
        Stopped: ``inflight`` was stopped.
    """
    state: Retries | None = None  # made by the first failure: most copies have none
    while True:
        try:
            return fetch_once(at, entry, inflight)
        except Stopped:
            raise
        except Exception as exc:
            if state is None:
                state = Retries(at.backoff)
            pause_s, slow_down = state.next(at.retries, exc, entry)
            if inflight is not None:
                # A stopping warm does not wait out the backoff; only
                # throttling and timeouts tell ``--jobs auto`` to back off.
                inflight.sleep(pause_s, slow_down=slow_down)
            elif pause_s:
                time.sleep(pause_s)


def fetch_once(at: Bound, entry: FileEntry,
               inflight: Inflight | None = None) -> tuple[str, bool]:
    """One copy attempt: the check under the entry's lock, then the copy.
    With ``inflight`` (a warm), no copy starts once it has stopped, and a
    copy it abandons is left to it (see :mod:`.inflight`)."""
    copy = where(at, entry, inflight)
    if inflight is not None:
        inflight.check()
    with paths.locked(copy.lock):
        # The check under the lock: another process may have copied it meanwhile.
        found = at.lookup_rows((entry.path,), (entry.size,), (entry.version,))
        if found:
            return found[0], False
        if inflight is not None:
            copy.token = inflight.begin()
        try:
            copy_locked(copy)
        finally:
            if inflight is not None:
                inflight.release(copy.token)
    return copy.local, True


def retry_pause(exc: Exception, entry: FileEntry, attempt: int, delay: float,
                retries: int) -> float:
    """The backoff before retrying a copy that raised ``exc`` on attempt
    ``attempt`` (from 0) of ``retries`` extra ones, ``delay`` being the
    attempt's base delay.

    The retry rule: throttling (503, 429, SlowDown) always backs off; any
    other transient error (a reset, a truncated body, a checksum
    mismatch, a timeout) is retried at once the first time, and backs off
    when it repeats.

    Raises:
        UcstageError: ``exc`` itself, or :exc:`FetchFailed` when it is
            permanent (a missing file, a refusal) or retries ran out.
    """
    if permanent(exc):
        if isinstance(exc, UcstageError):
            raise exc
        raise FetchFailed(f"cannot copy {entry.path}: {_reason(exc)}") from exc
    if attempt == retries:
        raise FetchFailed(f"cannot copy {entry.path} after {attempt + 1} attempts: "
                          f"{_reason(exc)}") from exc
    if attempt == 0 and not throttled(exc):
        return 0.0
    return delay * (1 + random.random() / 4)


# -- the steps ---------------------------------------------------------------------

def where(at: Bound, entry: FileEntry, inflight: Inflight | None = None) -> Copy:
    """The copy of an entry: its paths, its folder made (its token not
    taken yet); refuses unsafe paths, and names the cache cannot hold (the
    listing's rule, checked again here)."""
    rel = entry.path
    if PLAIN.fullmatch(rel) is None:  # a plain path is safe and cacheable
        safe_relpath(rel)
        why = uncacheable(rel)
        if why is not None and not (isinstance(entry, RangeEntry) and is_range_path(rel)):
            raise UnsafePath(f"{rel}: {why}")
    space, ns_dir = at.space, at.ns_dir
    if ns_dir not in space.prepared:  # no reader bound it, or a clear removed it since
        at.prepare()
    local = os.path.join(ns_dir, *rel.split("/"))
    if "/" in rel:  # the namespace's own folder is prepare's
        space.make_folder(os.path.dirname(local))
    lock = paths.stripe_path(at.locks, rel)
    return Copy(at, entry, rel, ns_dir, local, lock, space.temp_path(local, lock),
                FetchContext(at.evidence, at.requests, entry.size, entry.version, inflight),
                inflight)


def copy_locked(copy: Copy) -> None:
    """Copy the entry to its local path through a temp file; its stripe is held."""
    pending = reserve_tmps([copy])[0]
    if isinstance(pending, BaseException):
        raise pending
    try:
        try:
            volume = copy.at.volume
            if isinstance(copy.entry, RangeEntry):  # a row group's chunks: ranged reads
                copied = copy_ranges(volume, copy.entry, pending.fd, copy.ctx)
            else:  # a whole file, by the volume's engine
                copied = engine.of(volume).copy(volume, copy.rel, pending.fd, copy.ctx)
        finally:
            os.close(pending.fd)
        failed = commit_tmps([(copy, pending, copied)])[0]
        if failed is not None:
            raise failed
    except BaseException as exc:
        drop_tmp(copy, pending, exc)
    # The stamp just written vouches for the file this process renamed into
    # place (its stripe is still held, so no other copy replaced it): the
    # next lookup of it (the next epoch) needs no read of the stamp.
    copy.at.space.stamps.committed(copy.local, (copied.size,
                                               copied.version or copy.entry.version))


def reserve_tmps(copies: Sequence[Copy]) -> list[Pending | BaseException]:
    """Create each copy's preallocated temp file and reserve its bytes:
    copies of one cache, their stripes held (the thread driver's one copy,
    or a loop's pass of them). Without a cap they are counted in the ledger
    under one hold of its lock (:meth:`~ucstage.cache.space.CacheSpace.reserve_many`);
    under a cap one at a time, which may evict or wait
    (:meth:`~ucstage.cache.space.CacheSpace.reserve`). A folder a clear removed
    since is made again and the reservation tried once more.

    Returns each one's temp file, or its error: :exc:`Stopped` (its job
    stopped meanwhile), :exc:`CacheFull` (no room on disk or under the cap),
    or what creating the file raised. Nothing of a failed one is left behind.
    """
    if not copies:
        return []
    space = copies[0].at.space

    def reserve(copy: Copy) -> tuple[int, int] | BaseException:
        if space.max_bytes is None:
            return space.reserve_many([(copy.tmp, copy.entry.size)])[0]
        try:
            return space.reserve(copy.tmp, copy.entry.size, name=copy.rel,
                                 inflight=copy.inflight)
        except Exception as exc:
            return exc

    got = (space.reserve_many([(copy.tmp, copy.entry.size) for copy in copies])
           if space.max_bytes is None else [reserve(copy) for copy in copies])
    out: list[Pending | BaseException] = []
    for copy, one in zip(copies, got, strict=True):
        try:
            if isinstance(one, OSError) and _again(copy, one):
                one = reserve(copy)
                if isinstance(one, OSError):
                    _again(copy, one)  # a full disk raises CacheFull
            if isinstance(one, BaseException):
                raise one
            pending = Pending(copy.tmp, one[0], one[1])
            if copy.inflight is not None and not copy.inflight.copying(
                    copy.token, pending.tmp, pending.reserved):
                os.close(pending.fd)  # stopped while reserving: copy nothing
                space.abandon(pending.tmp, pending.reserved)
                raise Stopped()
            out.append(pending)
        except BaseException as exc:
            out.append(exc)
    return out


def _again(copy: Copy, exc: OSError) -> bool:
    """Whether a reservation that failed with ``exc`` may be tried once
    more: its folder was removed since it was made (a clear), and is made
    again. A full disk raises :exc:`CacheFull`; other errors answer False."""
    if isinstance(exc, FileNotFoundError):
        copy.at.space.make_folder(os.path.dirname(copy.local), again=True)
        return True
    if no_room(exc):
        raise disk_full(copy.ns_dir, copy.rel, copy.entry.size) from exc
    return False


def commit_tmps(done: Sequence[tuple[Copy, Pending, Copied]]) -> list[BaseException | None]:
    """Stamp each copied temp file and rename it into place: several copies
    of one cache (their stripes held), the renames under one hold of the
    ledger lock (:meth:`~ucstage.cache.space.CacheSpace.commit_many`; the
    thread driver's one copy, a loop's pass of them). Returns each one's
    error (None: committed); a failed one is the caller's to drop
    (:func:`drop_tmp`)."""
    errors: list[BaseException | None] = [None] * len(done)
    ready: list[int] = []
    renames: list[tuple[str, str, int, int]] = []
    for i, (copy, pending, copied) in enumerate(done):
        try:
            if copy.inflight is not None and not copy.inflight.claim(copy.token):
                raise Stopped()  # abandoned: the temp file was removed, the path is not ours
            paths.write_stamp(pending.tmp, copied.size, copied.version or copy.entry.version)
            now = time.time_ns()
            os.utime(pending.tmp,
                     ns=(now, copied.mtime_ns if copied.mtime_ns is not None else now))
        except Exception as exc:
            errors[i] = exc
            continue
        ready.append(i)
        renames.append((pending.tmp, copy.local, copied.size, pending.reserved))
    if ready:
        renamed = done[ready[0]][0].at.space.commit_many(renames)
        for i, failed in zip(ready, renamed, strict=True):
            errors[i] = failed
    return errors


def drop_tmp(copy: Copy, pending: Pending, exc: BaseException) -> NoReturn:
    """A copy failed (or stopped): remove its temp file unless the job
    already did, and raise (a full disk as :exc:`CacheFull`)."""
    if copy.inflight is None or copy.inflight.release(copy.token):
        # else the warm removed it already
        copy.at.space.abandon(pending.tmp, pending.reserved)
    if no_room(exc):
        raise disk_full(copy.ns_dir, copy.rel, copy.entry.size) from exc
    raise exc


class Retries:
    """One copy's retries so far: which attempt it is, the backoff's next
    delay, and the throttled attempts its pace took (which spend no retry)."""

    def __init__(self, backoff: float) -> None:
        self.attempt, self.delay, self.paced = 0, backoff, 0

    def next(self, retries: int, exc: Exception, entry: FileEntry) -> tuple[float, bool]:
        """``(pause, slow_down)`` before the next attempt after ``exc``, of
        ``retries`` extra attempts at most.

        Raises:
            UcstageError: as :func:`retry_pause`.
        """
        if isinstance(exc, Paced) and self.paced < FREE_RETRIES:
            # The pace already slowed the source's requests: the copies in
            # flight stay (fewer would not send less), the GET goes again soon.
            self.paced += 1
            return pause(), False
        wait = retry_pause(exc, entry, self.attempt, self.delay, retries)
        self.attempt += 1
        if wait:
            self.delay *= 2
        return wait, slows_down(exc)


def disk_full(ns_dir: str, rel: str, need: int) -> CacheFull:
    """The error of a copy of ``rel`` (``need`` bytes) that found the disk full."""
    return CacheFull(
        f"no space left in the cache folder {ns_dir}: {rel} needs {format_bytes(need)}, "
        f"{format_bytes(free_bytes(ns_dir))} free",
        hint=f"free space or point {paths.CACHE_DIR_ENV} at a larger disk")


def permanent(exc: BaseException) -> bool:
    """Whether a copy that raised ``exc`` fails the same way however often it
    is tried: a missing file, a permission, a refused name (``UnsafePath``),
    a name too long for the cache's file system, a path that is a file on one
    side and a folder on the other. The one rule: a permanent error is never
    retried, and a warm reports it ``retryable: false``."""
    return isinstance(exc, _PERMANENT) or (
        isinstance(exc, OSError) and exc.errno in _PERMANENT_ERRNOS)


def retryable(exc: UcstageError) -> bool:
    """Whether a failed copy may succeed on a rerun: the source gave a transient
    error until retries ran out (not a :func:`permanent` one)."""
    return isinstance(exc, FetchFailed) and exc.__cause__ is not None \
        and not permanent(exc.__cause__)


_TIMED_OUT = re.compile(r"timed? ?out|timeout|deadline", re.I)


def slows_down(exc: BaseException) -> bool:
    """Whether ``exc`` tells ``--jobs auto`` to lower the copies in flight:
    throttling, or a timeout. A reset, a truncated body or a checksum
    mismatch does not: fewer requests would not have prevented it."""
    return throttled(exc) or isinstance(exc, TimeoutError) or bool(_TIMED_OUT.search(str(exc)))


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__



# -- a warm: many copies, jobs at a time, threads or the loop driver --------------

WARM_FEWER = "warm fewer files"
"""How a :exc:`CacheFull` hint of :meth:`ucstage.LocalCache.warm` ends when warming
fewer files would help; the library cannot name the CLI flags that choose
them, so the CLI's error mapper adds them (:func:`ucstage.cli.output.error_hint`)."""
GRACE = 1.0
"""Seconds a stopping warm lets its copies in flight finish before abandoning them."""
_LATE_REPORTS = 0.5
"""Seconds a stopped warm still listens, after abandoning, for copies that
committed meanwhile. It returns as soon as every copy has reported, so only a
copy stuck in a hung read costs the whole wait; GRACE plus this stays well
inside the 2 s a Ctrl-C may take. The margin is for a thread starved on a
loaded 2-core machine: without this wait, one fresh-clone test run counted a
file fewer than the cache held.)"""


def warm_entries(at: Bound, entries: Sequence[FileEntry], *,
                 jobs: int | str = AUTO, callback: Callback = NO_PROGRESS) -> WarmReport:
    """Copy every entry not already valid into ``at``'s namespace, ``jobs`` at a time.

    See :meth:`ucstage.LocalCache.warm`.
    """
    space, volume = at.space, at.volume
    cb = callback if callback is not None else NO_PROGRESS
    try:
        fixed = check_jobs(jobs)
    except ValueError as exc:
        raise InvalidArgument(str(exc), hint="pass a positive number, or 'auto'") from None
    reader = engine.of(volume)  # chosen once for the whole warm
    start = time.monotonic()
    checked = checks.TALLY.snapshot()
    hedges = dict(objget.STATS)
    new_namespace = not os.path.isdir(at.prefix)
    ns_dir = at.prepare()
    space.sweep(ns_dir)
    report = WarmReport(files=len(entries), bytes=sum(e.size for e in entries),
                        source=volume.source, cache_dir=space.root, namespace=ns_dir,
                        engine=reader.name, jobs_auto=fixed is None)
    todo: list[FileEntry] = []
    valid: list[str] = []
    for e in entries:
        try:
            hit = at.lookup(e)
        except UcstageError as exc:
            report.failed.append((e.path, str(exc)))
            continue
        if hit is None:
            todo.append(e)
        else:
            valid.append(e.path)
            report.already_cached += 1
            report.already_cached_bytes += e.size
    try:
        _check_room(ns_dir, todo, report.bytes, space.max_bytes)
    except CacheFull:
        # Refused before copying anything: a namespace made for this warm
        # would show in `cache status` as an empty source that was never cached.
        if new_namespace and not os.listdir(ns_dir):
            space.remove_namespaces([ns_dir])
        raise
    cb.set_size(report.bytes, items=report.files)
    cb.relative_update(report.already_cached_bytes)
    for path in valid:
        cb.item_done(path, "cached")
    for path, reason in report.failed:
        cb.item_done(path, "failed", reason)
    evicted = Evictions()
    start_at = first_guess(volume, reader) if fixed is None else None
    tuner = Jobs(fixed, ceiling=ceiling(reader), start=start_at)
    WarmCopies(at, todo, report, cb, evicted, tuner, reader.on_loop).run()
    report.jobs = tuner.settled
    checks.note(report, checked, volume.url)
    report.hedged = objget.STATS["hedges"] - hedges.get("hedges", 0)
    report.timeouts = objget.STATS["timeouts"] - hedges.get("timeouts", 0)
    sources = space.sources()
    report.evicted = [EvictedSource(name, sources.get(name, ("", ""))[0], files, nbytes)
                      for name, (files, nbytes) in evicted.by_namespace().items()]
    report.seconds = time.monotonic() - start
    return report


def _check_room(ns_dir: str, todo: Sequence[FileEntry], total: int, max_bytes: int | None) -> None:
    need = sum(e.size for e in todo)
    free = free_bytes(ns_dir)
    if need > free:
        raise CacheFull(
            f"not enough space in the cache folder {ns_dir}: {len(todo):,} files need "
            f"{format_bytes(need)}, {format_bytes(free)} free",
            hint=f"free space, point {paths.CACHE_DIR_ENV} at a larger disk, or {WARM_FEWER}")
    if max_bytes is not None and total > max_bytes:
        raise CacheFull(
            f"these files total {format_bytes(total)}, more than the cache cap "
            f"{format_bytes(max_bytes)}",
            hint=f"raise max_bytes, or {WARM_FEWER}")


class WarmCopies:
    """One warm's copy phase: ``jobs`` daemon threads copy (``on_loop``, an
    engine whose copies are coroutines on its event loop:
    :class:`ucstage.cache.fetch.LoopWarm`), the
    calling thread waits for their results and reports them (the report and
    the callback are touched by the calling thread only).

    Daemon threads, not a ``ThreadPoolExecutor``: leaving an executor waits for
    every queued copy, and the interpreter joins its threads at exit, so a
    thread stuck in a slow read would hold up Ctrl-C. On any exception in the
    calling thread (Ctrl-C, SIGTERM, a full cache) the warm stops: see
    :meth:`_stop`.
    """

    def __init__(self, at: Bound, todo: Sequence[FileEntry],
                 report: WarmReport, cb: Callback, evicted: Evictions, tuner: Jobs,
                 on_loop: bool = False) -> None:
        self.at, self.todo = at, todo
        self.report, self.cb, self.evicted = report, cb, evicted
        self.tuner = tuner
        self.inflight = Inflight(on_retry=tuner.error)
        self.threads = 0
        self.on_loop = on_loop
        """Copies run as coroutines on the engine's loop (:class:`LoopWarm`)."""
        self.results: queue.SimpleQueue[list[tuple[FileEntry, bool | BaseException]]] = \
            queue.SimpleQueue()
        """Outcomes of copies, in batches (a thread puts one; the event loop's
        driver puts what ended in one pass of the loop, so the waiting thread
        wakes once per batch, not once per file)."""
        self._pending = iter(todo)
        self._take = threading.Lock()
        self.taken = 0
        self._open: set[FileEntry] = set()
        """Entries taken whose outcome is not recorded yet (see :meth:`_settle`)."""
        self.received = 0
        self.done_bytes = 0

    def run(self) -> None:
        if not self.todo:
            return
        try:
            if self.on_loop:
                # Every copy a coroutine on the engine's event loop: no thread
                # per copy in flight.
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
                self.took(entry)
            outcome: bool | BaseException
            try:
                with charging(self.evicted):  # this warm's evictions, per source
                    outcome = fetch_retrying(self.at, entry, self.inflight)[1]
            except BaseException as exc:
                outcome = exc
            tuner.leave(entry.size if outcome is True else 0)
            self.results.put([(entry, outcome)])

    def fetch_once(self, entry: FileEntry) -> tuple[str, bool]:
        """:func:`ucstage.cache.fetch.fetch_once` of ``entry`` for this warm,
        in the calling thread (the loop driver's thread for a copy that may wait)."""
        with charging(self.evicted):
            return fetch_once(self.at, entry, self.inflight)

    def took(self, entry: FileEntry) -> None:
        """A copy of ``entry`` starts (called under ``_take``)."""
        self.taken += 1
        self._open.add(entry)

    def _record(self, e: FileEntry, outcome: bool | BaseException) -> None:
        self.received += 1
        with self._take:
            self._open.discard(e)
        report, cb = self.report, self.cb
        if isinstance(outcome, Stopped):
            return
        if isinstance(outcome, UcstageError) and not isinstance(outcome, CacheFull):
            report.failed.append((e.path, str(outcome)))
            if retryable(outcome):
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
        """Start no copy; give copies in flight :data:`GRACE` seconds to finish
        (reporting the ones that do), then abandon the rest."""
        self.inflight.stop()
        self.tuner.close()
        with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C: stop waiting, still clean up
            self._drain(time.monotonic() + GRACE)
        # A second Ctrl-C here leaves temp files that the next warm sweeps
        # (nobody holds their stripes once this process is gone).
        with contextlib.suppress(KeyboardInterrupt):
            self.inflight.abandon(self.at.space.abandon)
            # A copy that committed just as the grace ran out (abandon waited
            # for it) reports right after: count it, or the summary would
            # miss a file that is cached.
            self._drain(time.monotonic() + _LATE_REPORTS)
            self._settle()

    def _settle(self) -> None:
        """Count the copies still unreported that are in the cache now.

        A thread starved past the wait above, or an outcome taken off the
        queue just as Ctrl-C landed, would otherwise leave the summary a file
        short of what the cache holds (seen on a loaded 2-core machine). The
        cache itself is the truth: each open entry that is valid there now was
        copied since the warm started (by this warm, or by another process
        racing it, which the stop summary need not tell apart). At most the
        copies in flight are looked up."""
        with self._take:
            still = list(self._open)
        for entry in still:
            if self.at.lookup(entry, touch=False) is not None:
                with contextlib.suppress(BaseException):
                    self._record(entry, True)

    def _drain(self, until: float) -> None:
        """Record the copies that report until ``until`` or until none runs.
        Stopping already: the first error is the one raised, so each
        outcome's own error is dropped here."""
        while True:
            with self._take:
                running = self.taken - self.received
            left = until - time.monotonic()
            if running <= 0 or left <= 0:
                return
            try:
                batch = self.results.get(timeout=left)
            except queue.Empty:
                return
            for entry, outcome in batch:
                with contextlib.suppress(BaseException):
                    self._record(entry, outcome)


# -- the loop driver ---------------------------------------------------------------
#
# A warm's copies on the object-store engine: each a coroutine on the engine's
# event loop (:func:`ucstage.engines.objget.loop`), running the steps above; why,
# and what it batches, is in docs/design.md (section 6, "A warm"). A stripe
# another copy holds, a byte cap (reserving may evict or wait) and byte ranges
# go to a thread instead, which runs the threaded :func:`fetch_once`.

T = TypeVar("T")


class LoopWarm:
    """Drives one warm's copies (``warm.todo``) on the engine's loop and puts
    each outcome on ``warm.results``, as the warm's threads would."""

    def __init__(self, warm: WarmCopies) -> None:
        self.warm = warm
        self.at, self.volume, self.inflight = warm.at, warm.at.volume, warm.inflight
        self.threaded = 0
        """Copies handed to a thread (a contended stripe, a byte cap)."""
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._store: Any = None
        self._commits: _PassBatch[tuple[Copy, Pending, Copied], BaseException | None] = \
            _PassBatch(commit_tmps)
        """Copies whose bytes are in, committed together at the end of the pass."""
        self._reserves: _PassBatch[Copy, Pending | BaseException] = \
            _PassBatch(reserve_tmps)
        """Copies about to GET, reserved together at the end of the pass."""
        self._batch: list[tuple[FileEntry, bool | BaseException]] = []
        self._left = len(warm.todo)
        """Copies not ended yet: a large object's share of the places in
        flight is the limit over these (:func:`objget.split`)."""

    def start(self) -> None:
        """Start the driver on the loop; returns at once."""
        done = asyncio.run_coroutine_threadsafe(self._drive(), objget.loop())
        done.add_done_callback(self._failed)

    def _failed(self, done: concurrent.futures.Future[None]) -> None:
        """A driver that died (a bug) must not leave the waiting thread
        waiting forever: hand it the error, which stops the warm."""
        if not done.cancelled() and done.exception() is not None:
            self.warm.results.put([(FileEntry("", 0, ""), done.exception() or Exception())])

    async def _drive(self) -> None:
        warm = self.warm
        loop = asyncio.get_running_loop()
        tasks: set[asyncio.Task[None]] = set()
        room = asyncio.Event()

        def stop_all() -> None:
            for task in tasks:
                task.cancel()
            room.set()

        def wake() -> None:  # called by the thread that stops the warm
            loop.call_soon_threadsafe(stop_all)

        unwatch = self.inflight.watch(wake)
        try:
            pending = iter(warm.todo)
            while not self.inflight.stopped:
                started = self._start(pending, tasks, room)
                if started is None:
                    break  # every entry is started
                room.clear()
                await room.wait()  # a copy ended (the limit may have moved) or a stop
            if tasks:
                await asyncio.wait(tasks)
        finally:
            unwatch()
            if self._pool is not None:
                self._pool.shutdown(wait=False)

    def _start(self, pending: Any, tasks: set[asyncio.Task[None]],
               room: asyncio.Event) -> int | None:
        """Start copies while the tuner has room; None once none is left."""
        warm, tuner = self.warm, self.warm.tuner
        started = 0
        while tuner.try_enter():
            entry = next(pending, None)
            if entry is None or self.inflight.stopped:
                tuner.leave(0, counted=False)
                return None
            with warm._take:
                warm.took(entry)
            task = asyncio.ensure_future(self._one(entry))
            tasks.add(task)
            task.add_done_callback(self._ended(entry, tasks, room))
            started += 1
        return started

    def _ended(self, entry: FileEntry, tasks: set[asyncio.Task[None]],
               room: asyncio.Event) -> Callable[[asyncio.Task[None]], None]:
        def ended(task: asyncio.Task[None]) -> None:
            tasks.discard(task)
            if task.cancelled():  # cancelled before it ran: it reported nothing
                self._left -= 1
                self.warm.tuner.leave(0)
                self._report(entry, Stopped())
            room.set()
        return ended

    async def _one(self, entry: FileEntry) -> None:
        outcome: bool | BaseException
        try:
            outcome = (await self._fetch_retrying(entry))[1]
        except asyncio.CancelledError:
            outcome = Stopped()
        except BaseException as exc:
            outcome = exc
        self._left -= 1
        self.warm.tuner.leave(entry.size if outcome is True else 0)
        self._report(entry, outcome)

    def _report(self, entry: FileEntry, outcome: bool | BaseException) -> None:
        """Hand an outcome to the waiting thread with the others that end in
        this pass of the loop: one wake-up of that thread per batch."""
        self._batch.append((entry, outcome))
        if len(self._batch) == 1:
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        batch, self._batch = self._batch, []
        self.warm.results.put(batch)

    async def _fetch_retrying(self, entry: FileEntry) -> tuple[str, bool]:
        """:func:`fetch_retrying`, awaiting instead of sleeping."""
        at = self.at
        state = Retries(at.backoff)
        while True:
            try:
                return await self._fetch_once(entry)
            except Stopped:
                raise
            except Exception as exc:
                pause_s, slow_down = state.next(at.retries, exc, entry)
            await self.inflight.asleep(pause_s, slow_down=slow_down)

    async def _fetch_once(self, entry: FileEntry) -> tuple[str, bool]:
        """:func:`fetch_once` with the GET awaited on the loop."""
        at, inflight, volume = self.at, self.inflight, self.volume
        copy = where(at, entry, inflight)
        inflight.check()
        lock = FileLock(copy.lock)
        # Byte ranges (a table's row groups) are ranged reads: copy_ranges, in a thread.
        if isinstance(entry, RangeEntry) or at.space.max_bytes is not None or \
                not lock.acquire(blocking=False):
            self.threaded += 1
            return await self._in_thread(self.warm.fetch_once, entry)
        try:
            found = at.lookup_rows((entry.path,), (entry.size,), (entry.version,))
            if found:  # the check under the lock
                return found[0], False
            copy.token = inflight.begin()
            try:
                pending = await self._reserve(copy)
                try:
                    try:
                        got = await objget.fetch(
                            volume, volume.full_path(copy.rel), pending.fd, copy.ctx,
                            parts=objget.split(self.warm.tuner.limit, self._left),
                            client=self._client(copy))
                    finally:
                        os.close(pending.fd)
                    await self._commit(copy, pending, Copied(got.size, got.etag, got.mtime_ns))
                except BaseException as exc:
                    drop_tmp(copy, pending, exc)
            finally:
                inflight.release(copy.token)
        finally:
            lock.release()
        return copy.local, True

    async def _reserve(self, copy: Copy) -> Pending:
        """The reservation (:func:`reserve_tmps`), batched: the copies that
        start in one pass of the loop reserve their temp files together (one
        hold of the ledger lock), at the end of that pass (:class:`_PassBatch`).

        Raises:
            Exception: as :func:`reserve_tmps` returns it (nothing is left behind).
        """
        got, late = await self._reserves.wait(copy)
        if late:  # stopped after the batch ran: give back what it reserved for this copy
            if not isinstance(got, BaseException):
                os.close(got.fd)
                drop_tmp(copy, got, Stopped())
            raise asyncio.CancelledError()
        if isinstance(got, BaseException):
            raise got
        return got

    async def _commit(self, copy: Copy, pending: Pending, copied: Copied) -> None:
        """The commit (:func:`commit_tmps`), batched: the copies that finish
        in one pass of the loop are committed together (one hold of the
        ledger lock), at the end of that pass. Stopped before the batch ran,
        the copy drops its temp file as any stopped copy; stopped after it,
        the copy is in place, done.

        Raises:
            Exception: this copy's commit failed (the caller drops it).
        """
        failed, _ = await self._commits.wait((copy, pending, copied))
        if failed is not None:
            raise failed

    def _client(self, copy: Copy) -> Any:
        """The bucket's client, asked for once per warm (one volume, one bucket)."""
        if self._store is None:
            kind, bucket, _ = objstore.location(self.volume, self.volume.full_path(copy.rel))
            self._store = objstore.store(kind, bucket, copy.ctx.deadline)
        return self._store

    async def _in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn`` in this warm's thread pool. A stop cancels the caller
        but not the thread: it sees the stop itself (the threaded fetch checks
        it), and the caller waits for it so that it leaves the cache as it should."""
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                THREAD_CEILING, thread_name_prefix="ucstage-warm-wait")
        return await objget.unabandoned(
            asyncio.get_running_loop().run_in_executor(self._pool, fn, *args))


Item = TypeVar("Item")
Result = TypeVar("Result")


class _PassBatch(Generic[Item, Result]):
    """One step of the copies (reserving, committing) for everything that
    reaches it in one pass of the loop, run together at the end of that pass
    by ``run`` (items in, one result per item out, in order)."""

    def __init__(self, run: Callable[[list[Item]], Sequence[Result]]) -> None:
        self._run = run
        self._items: list[tuple[Item, asyncio.Future[Result]]] = []

    def add(self, item: Item) -> asyncio.Future[Result]:
        """Queue ``item``; the future gets its result when the batch runs.
        Cancelled before then, the item is left out of the batch."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Result] = loop.create_future()
        self._items.append((item, done))
        if len(self._items) == 1:
            loop.call_soon(self._flush)
        return done

    async def wait(self, item: Item) -> tuple[Result, bool]:
        """``item``'s result, once the batch ran, and whether the caller was
        cancelled after it ran (the result is still the caller's to settle).

        Raises:
            asyncio.CancelledError: cancelled before the batch ran (the batch
                leaves the item out: nothing was done for it).
        """
        done = self.add(item)
        try:
            return await done, False
        except asyncio.CancelledError:
            if not done.done() or done.cancelled():
                raise
            return done.result(), True

    def _flush(self) -> None:
        batch, self._items = self._items, []
        batch = [(item, done) for item, done in batch if not done.cancelled()]
        try:
            got: Sequence[Any] = self._run([item for item, _ in batch])
        except BaseException as exc:  # a bug: every item of the batch fails with it
            got = [exc] * len(batch)
        for (_, done), one in zip(batch, got, strict=True):
            done.set_result(one)
