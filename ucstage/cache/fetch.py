"""The fetch protocol: copying one entry into the cache, once, whoever asks.

A copy takes the entry's lock stripe (:mod:`ucstage.cache.locks`), looks
again (another process may have copied it meanwhile), reserves its
preallocated temp file in the ledger (:meth:`ucstage.cache.space.CacheSpace.reserve`),
has the volume's engine copy the source's bytes into it
(:meth:`ucstage.engines.engine.Engine.copy`; a row group's chunks:
:func:`ucstage.engines.engine.copy_ranges`), stamps
it and renames it into place; on any failure it removes the temp file and
gives its bytes back. Transient source errors are retried: throttling with a
jittered backoff (on the object-store engine, a GET its source's pace
throttled, :exc:`~ucstage.engines.pace.Paced`, after a short jittered delay and
without spending a retry: the pace does the waiting), other errors (resets,
truncated bodies, checksum mismatches, timeouts) at once the first time and
with the backoff after. A job's :class:`~ucstage.cache.inflight.Inflight` can stop its
copies at every step (see :mod:`ucstage.cache.inflight`).

:class:`Fetcher` holds these steps for one :class:`ucstage.LocalCache` (the
threaded fetch); :mod:`ucstage.cache.loopwarm` runs the same steps with the
GET awaited on the object-store engine's loop.

The copy itself is the engine's (:mod:`ucstage.engines.engine`), given what
it reads by in one value (:class:`~ucstage.engines.context.FetchContext`:
this cache's request settings and MD5 evidence, the entry's listed
size and version, the job that may stop it). The temp file is created 0600
by us.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import os
import random
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, NoReturn, Protocol

from ..engines import engine
from ..engines.context import Copied, FetchContext, Requests
from ..engines.engine import copy_ranges
from ..engines.pace import FREE_RETRIES, Paced, pause, throttled
from ..errors import CacheFull, FetchFailed, UcstageError, UnsafePath
from ..units import format_bytes
from ..volumes import FileEntry, RangeEntry, Volume, is_range_path, safe_relpath
from ..volumes.entry import uncacheable
from . import paths
from .inflight import Inflight, Stopped
from .locks import FileLock
from .space import CacheSpace, Evicted, free_bytes, no_room

__all__ = ["Copy", "Fetcher", "FetchingCache", "Pending", "Retries", "disk_full", "permanent",
           "retryable", "slows_down", "throttled"]

_PERMANENT = (UcstageError, FileNotFoundError, PermissionError, IsADirectoryError,
              NotADirectoryError, FileExistsError)
_PERMANENT_ERRNOS = frozenset({errno.ENAMETOOLONG, errno.EISDIR, errno.ENOTDIR})
"""Errors of the cache's own file system that a retry meets again: the name
is too long for it, or the path is a folder on one side and a file on the other."""
_FOLDERS_MAX = 1 << 16
"""Cache folders remembered as existing per process."""


class FetchingCache(Protocol):
    """What a fetch (and a warm) reads of its cache (:class:`ucstage.LocalCache`):
    its settings, read at each copy, its on-disk state, and its lookup."""

    root: str
    space: CacheSpace
    max_bytes: int | None
    lease_ns: int
    wait_seconds: float
    retries: int
    backoff: float
    requests: Requests

    def lookup(self, volume: Volume, entry: FileEntry, *, touch: bool = True) -> str | None:
        """The cached file's path if it is valid for ``entry``, else None."""

    def prepare(self, volume: Volume) -> str:
        """Create the namespace folder and record which source it holds; return it."""


@dataclass(frozen=True)
class Copy:
    """One copy of an entry into the cache, as its steps (reserve, copy,
    commit or drop) pass it on: where it goes, and which job it belongs to."""

    volume: Volume
    entry: FileEntry
    rel: str
    """The entry's path, checked safe."""
    ns_dir: str
    """The namespace folder."""
    local: str
    """Where the cached file goes."""
    lock: str
    """The entry's lock stripe (held while the copy runs)."""
    inflight: Inflight | None = None
    """The job that may stop this copy (a warm, a read-ahead), or None."""
    token: int = -1
    """The copy's token in ``inflight`` (:meth:`Inflight.begin`)."""
    evicted: Evicted | None = None
    """Where files evicted to make room are counted."""


class Pending(NamedTuple):
    """A copy's reserved temp file: open, preallocated, counted in the ledger."""

    tmp: str
    fd: int
    reserved: int
    """Bytes reserved in the ledger for it."""


class Fetcher:
    """The fetch protocol of one cache (see the module docstring).

    Args:
        cache: whose settings, space and lookup the copies use.
    """

    def __init__(self, cache: FetchingCache) -> None:
        self.cache = cache
        self._folders: set[str] = set()
        """Cache folders this process made or found (no ``makedirs`` per copy)."""

    def fetch_retrying(self, volume: Volume, entry: FileEntry,
                       inflight: Inflight | None = None,
                       evicted: Evicted | None = None) -> tuple[str, bool]:
        """``(local path, copied)`` for ``entry``, retrying transient errors.

        Raises:
            FetchFailed: permanent errors, or retries ran out.
            Stopped: ``inflight`` was stopped.
        """
        state = Retries(self.cache.backoff)
        while True:
            try:
                return self.fetch_once(volume, entry, inflight, evicted)
            except Stopped:
                raise
            except Exception as exc:
                pause, slow_down = state.next(self, exc, entry)
                if inflight is not None:
                    # A stopping warm does not wait out the backoff; only
                    # throttling and timeouts tell ``--jobs auto`` to back off.
                    inflight.sleep(pause, slow_down=slow_down)
                elif pause:
                    time.sleep(pause)

    def retry_pause(self, exc: Exception, entry: FileEntry, attempt: int,
                    delay: float) -> float:
        """The backoff before retrying a copy that raised ``exc`` on attempt
        ``attempt`` (from 0), ``delay`` being the attempt's base delay.

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
        if attempt == self.cache.retries:
            raise FetchFailed(f"cannot copy {entry.path} after {attempt + 1} attempts: "
                              f"{_reason(exc)}") from exc
        if attempt == 0 and not throttled(exc):
            return 0.0
        return delay * (1 + random.random() / 4)

    def fetch_once(self, volume: Volume, entry: FileEntry, inflight: Inflight | None = None,
                   evicted: Evicted | None = None) -> tuple[str, bool]:
        """One copy attempt. With ``inflight`` (a warm), no copy starts once it
        has stopped, and a copy it abandons is left to it (see :mod:`.inflight`)."""
        copy = self.where(volume, entry, inflight, evicted)
        if inflight is not None:
            inflight.check()
        with FileLock(copy.lock):
            hit = self.cache.lookup(volume, entry)
            if hit is not None:
                return hit, False
            copy = self.begin(copy)
            try:
                self.copy_locked(copy)
            finally:
                if inflight is not None:
                    inflight.release(copy.token)
        return copy.local, True

    def where(self, volume: Volume, entry: FileEntry, inflight: Inflight | None = None,
              evicted: Evicted | None = None) -> Copy:
        """The copy of an entry (its token not taken yet: :meth:`begin`);
        refuses unsafe paths."""
        rel = safe_relpath(entry.path)
        why = uncacheable(rel)  # the listing's rule, checked again here
        if why is not None and not (isinstance(entry, RangeEntry) and is_range_path(rel)):
            raise UnsafePath(f"{rel}: {why}")
        ns_dir = self.cache.prepare(volume)
        local = os.path.join(ns_dir, *rel.split("/"))
        return Copy(volume, entry, rel, ns_dir, local, self.cache.space.entry_lock(ns_dir, rel),
                    inflight, -1, evicted)

    @staticmethod
    def begin(copy: Copy) -> Copy:
        """``copy`` with its token in its job taken (its stripe is held)."""
        if copy.inflight is None:
            return copy
        return dataclasses.replace(copy, token=copy.inflight.begin())

    def context(self, copy: Copy) -> FetchContext:
        """What the copy reads its source with: this cache's request settings
        and where it keeps its MD5 evidence (``.ucstage/md5-etags/``), the
        entry's listed size and version, the job that may stop it."""
        return FetchContext(functools.partial(paths.md5_evidence, self.cache.root),
                            self.cache.requests, copy.entry.size, copy.entry.version,
                            copy.inflight)

    def copy_locked(self, copy: Copy) -> None:
        """Copy the entry to its local path through a temp file; its stripe is held."""
        pending = self.reserve_tmp(copy)
        try:
            try:
                if isinstance(copy.entry, RangeEntry):  # a row group's chunks: ranged reads
                    copied = copy_ranges(copy.volume, copy.entry, pending.fd, self.context(copy))
                else:  # a whole file, by the volume's engine
                    copied = engine.of(copy.volume).copy(copy.volume, copy.rel, pending.fd,
                                                         self.context(copy))
            finally:
                os.close(pending.fd)
            self.commit_tmp(copy, pending, copied)
        except BaseException as exc:
            self.drop_tmp(copy, pending, exc)

    def reserve_tmp(self, copy: Copy) -> Pending:
        """Create the entry's preallocated temp file and reserve its bytes.
        Its stripe is held.

        Raises:
            Stopped: the copy's job stopped meanwhile (nothing is left behind).
            CacheFull: no room on disk or under the cap.
        """
        cache, space, entry = self.cache, self.cache.space, copy.entry
        tmp = self._temp_for(copy)
        for attempt in (1, 2):
            try:
                fd, reserved = space.reserve(tmp, entry.size, max_bytes=cache.max_bytes,
                                             lease_ns=cache.lease_ns, name=copy.rel,
                                             evicted=copy.evicted, wait_s=cache.wait_seconds,
                                             inflight=copy.inflight)
                break
            except OSError as exc:
                if not self._again(copy, exc) or attempt == 2:
                    raise
        return self._copying(copy, Pending(tmp, fd, reserved))

    def reserve_tmps(self, copies: Sequence[Copy]) -> list[Pending | BaseException]:
        """:meth:`reserve_tmp` of several copies (their stripes held) of a
        cache without a cap, counted in the ledger under one hold of its lock
        (:meth:`~ucstage.cache.space.CacheSpace.reserve_many`). Returns each
        one's temp file, or the error :meth:`reserve_tmp` would raise."""
        space = self.cache.space
        tmps = [self._temp_for(copy) for copy in copies]
        got = space.reserve_many([(tmp, copy.entry.size) for tmp, copy in zip(tmps, copies,
                                                                              strict=True)])
        out: list[Pending | BaseException] = []
        for copy, tmp, one in zip(copies, tmps, got, strict=True):
            try:
                if isinstance(one, OSError) and self._again(copy, one):
                    one = space.reserve_many([(tmp, copy.entry.size)])[0]
                    if isinstance(one, OSError):
                        self._again(copy, one)  # raises its error
                if isinstance(one, BaseException):
                    raise one
                out.append(self._copying(copy, Pending(tmp, one[0], one[1])))
            except BaseException as exc:
                out.append(exc)
        return out

    def _temp_for(self, copy: Copy) -> str:
        """The copy's temp file path, its folder made (once per process)."""
        folder = os.path.dirname(copy.local)
        if folder not in self._folders:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            self._remember_folder(folder)
        return self.cache.space.temp_path(copy.local, copy.lock)

    def _again(self, copy: Copy, exc: OSError) -> bool:
        """Whether a reservation that failed with ``exc`` may be tried once
        more: its folder was removed since it was made (a clear), and is made
        again. A full disk raises :exc:`CacheFull`; other errors answer False."""
        if isinstance(exc, FileNotFoundError):
            folder = os.path.dirname(copy.local)
            self._folders.discard(folder)
            os.makedirs(folder, mode=0o700, exist_ok=True)
            return True
        if no_room(exc):
            raise disk_full(copy.ns_dir, copy.rel, copy.entry.size) from exc
        return False

    def _copying(self, copy: Copy, pending: Pending) -> Pending:
        """``pending``, reserved, handed to the copy's job; removed and
        :exc:`Stopped` raised if the job stopped meanwhile."""
        if copy.inflight is not None and not copy.inflight.copying(copy.token, pending.tmp,
                                                                   pending.reserved):
            os.close(pending.fd)  # stopped while reserving: copy nothing
            self.cache.space.abandon(pending.tmp, pending.reserved)
            raise Stopped()
        return pending

    def commit_tmp(self, copy: Copy, pending: Pending, copied: Copied) -> None:
        """Stamp the copied temp file and rename it into place."""
        failed = self.commit_tmps([(copy, pending, copied)])[0]
        if failed is not None:
            raise failed

    def commit_tmps(self, done: Sequence[tuple[Copy, Pending, Copied]]
                    ) -> list[BaseException | None]:
        """:meth:`commit_tmp` of several copies (their stripes held), the
        renames under one hold of the ledger lock
        (:meth:`~ucstage.cache.space.CacheSpace.commit_many`). Returns each
        one's error (None: committed); a failed one is the caller's to drop
        (:meth:`drop_tmp`), as when :meth:`commit_tmp` raises."""
        errors: list[BaseException | None] = [None] * len(done)
        ready: list[int] = []
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
        if ready:
            renamed = self.cache.space.commit_many(
                [(done[i][1].tmp, done[i][0].local, done[i][2].size, done[i][1].reserved)
                 for i in ready])
            for i, failed in zip(ready, renamed, strict=True):
                errors[i] = failed
        return errors

    def drop_tmp(self, copy: Copy, pending: Pending, exc: BaseException) -> NoReturn:
        """A copy failed (or stopped): remove its temp file unless the job
        already did, and raise (a full disk as :exc:`CacheFull`)."""
        if copy.inflight is None or copy.inflight.release(copy.token):
            # else the warm removed it already
            self.cache.space.abandon(pending.tmp, pending.reserved)
        if no_room(exc):
            raise disk_full(copy.ns_dir, copy.rel, copy.entry.size) from exc
        raise exc

    def _remember_folder(self, folder: str) -> None:
        if len(self._folders) >= _FOLDERS_MAX:
            self._folders.clear()  # bounded memory; the next copies just ask again
        self._folders.add(folder)


class Retries:
    """One copy's retries so far: which attempt it is, the backoff's next
    delay, and the throttled attempts its pace took (which spend no retry)."""

    def __init__(self, backoff: float) -> None:
        self.attempt, self.delay, self.paced = 0, backoff, 0

    def next(self, fetcher: Fetcher, exc: Exception, entry: FileEntry) -> tuple[float, bool]:
        """``(pause, slow_down)`` before the next attempt after ``exc``.

        Raises:
            UcstageError: as :meth:`Fetcher.retry_pause`.
        """
        if isinstance(exc, Paced) and self.paced < FREE_RETRIES:
            # The pace already slowed the source's requests: the copies in
            # flight stay (fewer would not send less), the GET goes again soon.
            self.paced += 1
            return pause(), False
        wait = fetcher.retry_pause(exc, entry, self.attempt, self.delay)
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
