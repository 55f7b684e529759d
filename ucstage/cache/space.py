"""The cache folder's on-disk state, owned by one object: :class:`CacheSpace`.

The byte ledger, the tree walk, eviction, sweeping of dead temp files, the
namespace records, the trash folder, and the per-process memo of validity
stamps all live here. :class:`ucstage.cache.local.LocalCache` (the fetch path)
and :mod:`ucstage.cache.maintenance` (status, verify, clear, prune) both call
it through its public methods only. The layout it works on is
:mod:`ucstage.cache.layout`'s; its locks are the stripes of
:mod:`ucstage.cache.locks`: a cached file or temp file whose stripe is held is
being written right now and is left alone.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import NamedTuple

from ..atomic import write_atomic
from ..errors import CacheFull
from ..units import format_bytes
from . import layout as cd
from . import policy
from .inflight import Inflight
from .leases import take_exclusive
from .locks import FileLock, stripe_path

__all__ = ["CacheSpace", "Evicted", "Eviction", "Tally", "free_bytes", "no_room",
           "unlink_if_exists"]

_LOW_WATER = 0.95
"""Eviction goes down to 95% of the cap so a full cache does not walk its
tree on every fetch."""
_MEMO_MAX = 1 << 18
"""Stamps remembered per process; past this the memo starts over (bounded memory
in every DataLoader worker, at the cost of one xattr read per file)."""


class Tally(NamedTuple):
    """What a walk of some namespaces found."""

    files: int
    """Cached files (temp files not included)."""
    bytes: int
    """Bytes of those files."""
    partial_files: int
    """Temp files: copies in flight, or left by killed runs."""
    partial_bytes: int


class Eviction(NamedTuple):
    """What :meth:`CacheSpace.evict_to` did, in the terms of a prune report."""

    bytes_before: int
    bytes_after: int
    files_removed: int
    bytes_removed: int
    bytes_in_use: int
    """Bytes kept because they were handed to a reader within the lease."""


class Evicted:
    """Files and bytes that evictions removed, per namespace: what one caller's
    copies pushed out (a warm passes one to every :meth:`CacheSpace.reserve`).
    Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_namespace: dict[str, tuple[int, int]] = {}

    def add(self, namespace: str, size: int) -> None:
        """One file of ``size`` bytes was evicted from ``namespace`` (a folder name)."""
        with self._lock:
            files, nbytes = self._by_namespace.get(namespace, (0, 0))
            self._by_namespace[namespace] = (files + 1, nbytes + size)

    def by_namespace(self) -> dict[str, tuple[int, int]]:
        """namespace name -> (files, bytes), namespaces by name."""
        with self._lock:
            return dict(sorted(self._by_namespace.items()))


@dataclass(frozen=True)
class _Cached:
    atime_ns: int
    size: int
    path: str
    lock: str
    partial: bool = False
    """A copy in flight (or left by a killed run): counted, never evicted."""
    namespace: str = ""
    """The namespace folder's name."""


class _Ledger:
    """Bytes the cache holds (plus reservations), as a fixed-width number in
    one small file. Rewritten in place: that needs no new disk block (it must
    work on a full disk), and a torn write fails to parse, which makes the next
    reader recount from the tree."""

    def __init__(self, fd: int, recount: Callable[[], int]) -> None:
        self.fd = fd
        self.recount = recount

    def read(self) -> int:
        try:
            return int(os.pread(self.fd, 64, 0).decode("ascii").strip())
        except (OSError, ValueError, UnicodeDecodeError):
            total = self.recount()
            self.write(total)
            return total

    def write(self, value: int) -> None:
        os.pwrite(self.fd, b"%20d\n" % max(0, value), 0)


class CacheSpace:
    """The on-disk state of one cache root, and this process's memory of it.

    Two locks, two scopes:

    * **The ledger lock** (an ``flock`` on ``.ucstage/usage``, shared by every
      process) guards the byte count and the tree's names: files are renamed
      into place, evicted, discarded and walked for counting only while it is
      held, so a walk never sees a file twice or misses one, and copies in
      flight (their preallocated temp files) are counted exactly.
    * **The memo lock** (``_memo_lock``, one per object) guards this process's
      memory: the stamp memo (path -> inode, ctime and stamp, so a hot lookup
      skips the xattr read) and which namespaces it has named and prepared.
      Every write (insert, pop, clear) happens under it; reads take no lock,
      because a ``dict.get`` or a set membership test is atomic in CPython and
      a read that races a write is harmless: a memo entry is trusted only
      while the file's inode and ctime still match, which any rewrite changes.
      The lock makes compound writes (the bound check, then the insert) whole.

    The memo lock is held only for the dictionary update itself, never while
    waiting for the ledger lock or doing I/O, so the two never nest.

    Args:
        root: a cache root already opened by :func:`ucstage.cache.layout.open_root`.
    """

    def __init__(self, root: str) -> None:
        self.root = root
        self._control = os.path.join(root, cd.CONTROL)
        self._memo: dict[str, tuple[int, int, tuple[int, str]]] = {}
        self._ns_dirs: dict[str, str] = {}
        self._prepared: set[str] = set()
        self._memo_lock = threading.Lock()

    # -- namespaces ---------------------------------------------------------

    def namespace_dir(self, url: str) -> str:
        """``<root>/<namespace>`` for a source's resolved URL (not created)."""
        path = self._ns_dirs.get(url)
        if path is None:
            path = os.path.join(self.root, cd.namespace_name(url))
            with self._memo_lock:
                self._ns_dirs[url] = path
        return path

    def namespace_dirs(self) -> list[str]:
        """Every namespace folder under the root, by name (the control folder is hidden)."""
        return [e.path for e in sorted(os.scandir(self.root), key=lambda e: e.name)
                if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")]

    def prepare(self, ns_dir: str, *, url: str, source: str) -> str:
        """Create a namespace folder and its lock folder, and record which
        source it holds (once; the record is written atomically). Return it."""
        if ns_dir in self._prepared:
            return ns_dir
        os.makedirs(ns_dir, mode=0o700, exist_ok=True)
        os.makedirs(self._lock_dir(ns_dir), mode=0o700, exist_ok=True)
        record = self._record(ns_dir)
        if not os.path.exists(record):
            os.makedirs(os.path.dirname(record), mode=0o700, exist_ok=True)
            write_atomic(record, json.dumps(
                {"namespace": os.path.basename(ns_dir), "url": url, "source": source,
                 "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}))
        with self._memo_lock:
            self._prepared.add(ns_dir)
        return ns_dir

    def sources(self) -> dict[str, tuple[str, str]]:
        """namespace name -> (source as given, resolved URL), from the records
        :meth:`prepare` wrote. Unreadable records are skipped."""
        found: dict[str, tuple[str, str]] = {}
        folder = os.path.join(self._control, "namespaces")
        for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            if name.startswith(".") or not name.endswith(".json"):
                continue  # a record being written (write_atomic's hidden temp file)
            try:
                with open(os.path.join(folder, name), encoding="utf-8") as fh:
                    record = json.load(fh)
                found[name[:-5]] = (str(record.get("source") or record["url"]),
                                    str(record["url"]))
            except (OSError, ValueError, KeyError, AttributeError):
                continue
        return found

    def remove_namespaces(self, ns_dirs: Sequence[str]) -> list[str]:
        """Delete these namespaces, their records and their lock files; return
        the names removed.

        Each folder is renamed into the trash first, so it disappears at once;
        files already open stay readable (POSIX unlink). The stamp memo is
        forgotten and the ledger recounted from what is left.
        """
        names = []
        for ns_dir in ns_dirs:
            if not os.path.isdir(ns_dir):
                continue
            staged = self._trash_name()
            os.rename(ns_dir, staged)
            shutil.rmtree(staged, ignore_errors=True)
            names.append(os.path.basename(ns_dir))
            with self._memo_lock:
                self._prepared.discard(ns_dir)
            unlink_if_exists(self._record(ns_dir))
            self._remove_locks(os.path.basename(ns_dir))
        with self._memo_lock:
            self._memo.clear()
        with self._ledger() as ledger:
            ledger.write(sum(c.size for c in self._walk(self.namespace_dirs())))
        return names

    def remove_orphans(self) -> None:
        """Delete lock folders and records of namespaces whose folder is gone
        (left by clears of older versions, or by a clear that was killed), and
        whatever a killed clear, verify or eviction left in the trash."""
        trash = os.path.join(self._control, "trash")
        # Everything in the trash was renamed there to be deleted; a process
        # deleting one right now and this one both ignore what the other took.
        for name in sorted(os.listdir(trash)) if os.path.isdir(trash) else []:
            path = os.path.join(trash, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                unlink_if_exists(path)

        def gone(name: str) -> bool:  # asked just before each removal: a warm may start now
            return not os.path.isdir(os.path.join(self.root, name))

        locks = os.path.join(self._control, "locks")
        for name in sorted(os.listdir(locks)) if os.path.isdir(locks) else []:
            if gone(name):
                self._remove_locks(name)
        records = os.path.join(self._control, "namespaces")
        for name in sorted(os.listdir(records)) if os.path.isdir(records) else []:
            if name.endswith(".json") and not name.startswith(".") and gone(name[:-5]):
                unlink_if_exists(os.path.join(records, name))

    def _remove_locks(self, namespace: str) -> None:
        """Delete a namespace's lock stripes. Each is taken before it is unlinked
        (waiting for a copy that holds it), so no two holders ever share one:
        see :mod:`ucstage.cache.locks`."""
        folder = os.path.join(self._control, "locks", namespace)
        try:
            names = sorted(os.listdir(folder))
        except FileNotFoundError:
            return
        for name in names:
            lock = FileLock(os.path.join(folder, name))
            lock.acquire()
            try:
                lock.unlink()
            finally:
                lock.release()
        with contextlib.suppress(FileNotFoundError, OSError):
            os.rmdir(folder)  # not empty: a new copy of this source started meanwhile

    def remove_frozen_listings(self) -> None:
        """Delete the listings :class:`ucstage.VolumeDataset` froze under the
        control folder (:data:`ucstage.cache.layout.LISTINGS_DIR`); they belong
        to the whole cache."""
        shutil.rmtree(os.path.join(self.root, cd.LISTINGS_DIR), ignore_errors=True)

    # -- the stamp memo -------------------------------------------------------

    def stamp(self, path: str, st: os.stat_result) -> tuple[int, str] | None:
        """The ``(size, version)`` stamped on the cached file ``path``, whose
        ``stat`` is ``st``; None when it has none. Read once per file and
        process, then remembered while the inode and ctime stay the same."""
        memo = self._memo.get(path)
        if memo is None or memo[0] != st.st_ino or memo[1] != st.st_ctime_ns:
            found = cd.read_stamp(path)
            if found is None:
                return None
            memo = (st.st_ino, st.st_ctime_ns, found)
            with self._memo_lock:
                if len(self._memo) >= _MEMO_MAX:
                    self._memo.clear()
                self._memo[path] = memo
        return memo[2]

    def touched(self, path: str, before: os.stat_result, stamp: tuple[int, str]) -> None:
        """``path`` (whose ``stat`` was ``before`` and stamp ``stamp``) just had
        its atime set by this process, which moved its ctime: remember the new
        ctime with the same stamp, if ``path`` still names the same file (a
        touch changes no stamp; a replacement is a new inode)."""
        try:
            st = os.stat(path)
        except OSError:
            return
        if st.st_ino == before.st_ino and st.st_dev == before.st_dev:
            with self._memo_lock:
                if len(self._memo) >= _MEMO_MAX:
                    self._memo.clear()
                self._memo[path] = (st.st_ino, st.st_ctime_ns, stamp)

    @property
    def memo(self) -> Mapping[str, tuple[int, int, tuple[int, str]]]:
        """The stamp memo, read-only: path -> (inode, ctime_ns, (size, version)).
        For a lookup's hot path, which reads it without a call per file; an
        entry is trusted only while the file's inode and ctime match, and
        every path in it passed a lookup's path-safety check."""
        return self._memo

    def _forget(self, path: str) -> None:
        with self._memo_lock:
            self._memo.pop(path, None)

    # -- copies: lock, reserve, commit ---------------------------------------------

    def entry_lock(self, ns_dir: str, rel: str) -> str:
        """The lock stripe that guards the entry ``rel`` of a namespace."""
        return stripe_path(self._lock_dir(ns_dir), rel)

    @staticmethod
    def temp_path(local: str, entry_lock: str) -> str:
        """Where a copy of ``local`` is written first: beside it, hidden, and
        named after the stripe of ``entry_lock`` so a later run can tell whether
        its writer is still alive."""
        stripe = int(os.path.basename(entry_lock)[:4])
        return os.path.join(os.path.dirname(local), cd.part_name(stripe, os.path.basename(local)))

    def reserve(self, tmp: str, need: int, *, max_bytes: int | None, lease_ns: int,
                name: str, evicted: Evicted | None = None, wait_s: float = 0.0,
                run: Inflight | None = None) -> tuple[int, int]:
        """Create ``tmp`` preallocated to ``need`` bytes and count it in the
        ledger; under a cap, evict first if needed. Return the open descriptor
        and the bytes reserved in the ledger (``need``). Files evicted to make
        room are counted in ``evicted``.

        This happens under the ledger lock: a reservation *is* its temp file,
        so every eviction walk sees the bytes in flight in every process, and
        usage (temp files included) stays within the cap. Copies reserve with
        or without a cap, so that the ledger always counts what a recount from
        the tree counts (temp files included) and the two never disagree.
        The temp file is created empty before the lock is taken (creating a
        file is the slowest step, and an empty one counts 0 bytes in any
        walk); it grows to ``need`` and the ledger by ``need`` together,
        under the lock. Its stripe is held, so no sweep removes it meanwhile.

        When everything cached is protected (held by a reader, in its time
        lease, or a copy in flight), the reservation waits for a reader to
        move on, up to ``wait_s`` seconds (polling, without the ledger lock
        held in between; ``run`` stopping ends the wait with ``Stopped``).
        The time waited is charged to the thread's reader
        (:func:`ucstage.cache.policy.reader`).

        Raises:
            CacheFull: ``need`` is larger than ``max_bytes``, at once; or it
                still did not fit after ``wait_s`` (``name`` says which file
                in the message).
            OSError: the temp file cannot be created or preallocated
                (ENOSPC when the disk is full); nothing is left behind.
        """
        if max_bytes is not None and need > max_bytes:
            raise CacheFull(f"{name} is {format_bytes(need)}, larger than the whole cache cap "
                            f"{format_bytes(max_bytes)}", hint="raise max_bytes")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        started: float | None = None
        pause = 0.005
        try:
            while True:
                with self._ledger() as ledger:
                    used = ledger.read()
                    if max_bytes is not None and used + need > max_bytes:
                        low = int(max_bytes * _LOW_WATER) - need
                        used = self._evict_lru(ledger, low if low >= 0 else max_bytes - need,
                                               lease_ns, evicted)
                    if max_bytes is None or used + need <= max_bytes:
                        # Preallocating makes a full disk fail here, before any
                        # byte is copied.
                        if need:
                            os.posix_fallocate(fd, 0, need)
                        ledger.write(used + need)
                        break
                # Full of protected files: wait for a reader to move on (a lease
                # to end), polling; the ledger lock is free meanwhile.
                now = time.monotonic()
                if started is None:
                    started = now
                    charge = policy.reader()
                    if charge is not None:
                        charge.waiting()
                if now - started >= wait_s:
                    _charge_wait(now - started)
                    raise CacheFull(
                        f"the cache cap {format_bytes(max_bytes)} is full of files handed to "
                        f"readers (held by a reader, or handed out in the last "
                        f"{lease_ns / 1e9:g} s) or being copied ({format_bytes(used)}); "
                        f"{name} needs {format_bytes(need)}; waited {now - started:.1f} s "
                        "for a reader to move on",
                        hint="raise max_bytes, or read fewer files at once (num_workers, "
                             "read_ahead): the readers' window must fit well within the cap")
                if run is not None:
                    run.sleep(pause)
                else:
                    time.sleep(pause)
                pause = min(pause * 2, 0.1)
        except BaseException:
            os.close(fd)
            unlink_if_exists(tmp)
            raise
        if started is not None:
            _charge_wait(time.monotonic() - started)
        return fd, need

    def commit(self, tmp: str, local: str, size: int, reserved: int) -> None:
        """Rename the finished temp file over ``local`` and settle the ledger:
        ``size`` bytes are now cached there instead of the ``reserved`` ones
        (and instead of whatever ``local`` held before)."""
        with self._ledger() as ledger:
            # Renames happen under the ledger lock, so an eviction walk never
            # runs while a file changes its name (readdir could miss it under
            # both names).
            try:
                old = os.stat(local).st_size
            except FileNotFoundError:
                old = 0
            os.replace(tmp, local)
            ledger.write(ledger.read() + size - old - reserved)

    def abandon(self, tmp: str, reserved: int) -> None:
        """Delete an unfinished temp file and give its reservation back."""
        if not reserved:
            unlink_if_exists(tmp)
            return
        with self._ledger() as ledger:
            unlink_if_exists(tmp)
            ledger.write(ledger.read() - reserved)

    def discard(self, ns_dir: str, rel: str, local: str, seen: os.stat_result) -> bool:
        """Delete the cached file ``local`` (entry ``rel``) if it is still the
        one ``seen``; True when it is gone.

        Takes the entry's stripe (no copy of it is running) and the ledger lock
        (renames happen under it, and the byte count drops with the file).
        """
        with FileLock(self.entry_lock(ns_dir, rel)), self._ledger() as ledger:
            try:
                st = os.stat(local)
            except FileNotFoundError:
                return True
            if (st.st_ino, st.st_dev) != (seen.st_ino, seen.st_dev):
                return False  # refetched meanwhile: a new copy, not the one checked
            used = ledger.read()  # before the rename: a recount must still see the file
            staged = self._trash_name()
            os.rename(local, staged)
            os.unlink(staged)
            ledger.write(used - st.st_size)
        self._forget(local)
        return True

    # -- counting, eviction, sweeping -----------------------------------------------

    def tally(self, ns_dirs: Sequence[str]) -> Tally:
        """Files and bytes under ``ns_dirs``, cached and temp, counted under the
        ledger lock (so no file is seen twice or missed mid-rename)."""
        files = size = partial = partial_size = 0
        with self._ledger():
            for c in self._walk(ns_dirs):
                if c.partial:
                    partial += 1
                    partial_size += c.size
                else:
                    files += 1
                    size += c.size
        return Tally(files, size, partial, partial_size)

    def recorded_bytes(self) -> int:
        """The byte ledger's value: what the cap counts (recounted from the
        tree when the ledger is unreadable)."""
        with self._ledger() as ledger:
            return ledger.read()

    def evict_to(self, target: int, lease_ns: int) -> Eviction:
        """Sweep dead temp files, then evict files in the eviction order
        (:mod:`ucstage.cache.policy`), none handed out within ``lease_ns`` nor
        held by a reader, until the cache holds at most ``target`` bytes (or
        nothing evictable is left)."""
        kept: list[_Cached] = []
        with self._ledger() as ledger:
            for ns_dir in self.namespace_dirs():
                self.sweep(ns_dir)
            found = [c for c in self._walk(self.namespace_dirs()) if not c.partial]
            after = self._evict_lru(ledger, target, lease_ns, kept=kept)
            remaining = {c.path for c in self._walk(self.namespace_dirs())}
        removed = [c for c in found if c.path not in remaining]
        now = time.time_ns()
        held = {c.path for c in kept}
        in_use = sum(c.size for c in found if c.path in remaining and (
            c.path in held or policy.time_leased(c.atime_ns, now, lease_ns)))
        return Eviction(sum(c.size for c in found), after, len(removed),
                        sum(c.size for c in removed), in_use)

    def sweep(self, ns_dir: str) -> int:
        """Remove temp files left by killed runs (nobody holds their stripe);
        return how many."""
        removed = 0
        ns_lock_dir = self._lock_dir(ns_dir)
        for folder, _, names in os.walk(ns_dir):
            for name in names:
                stripe = cd.part_stripe(name)
                if stripe is None:
                    continue
                if _sweep_one(os.path.join(folder, name), _part_lock(ns_lock_dir, stripe)):
                    removed += 1
        return removed

    # -- internals ------------------------------------------------------------

    def _lock_dir(self, ns_dir: str) -> str:
        return os.path.join(self._control, "locks", os.path.basename(ns_dir))

    def _record(self, ns_dir: str) -> str:
        return os.path.join(self._control, "namespaces", os.path.basename(ns_dir) + ".json")

    def _trash_name(self) -> str:
        """A fresh path in the trash folder: renaming there makes a file or folder
        disappear at once (same filesystem) before it is deleted."""
        trash = os.path.join(self._control, "trash")
        os.makedirs(trash, mode=0o700, exist_ok=True)
        return os.path.join(trash, uuid.uuid4().hex)

    @contextlib.contextmanager
    def _ledger(self) -> Iterator[_Ledger]:
        """The byte ledger, locked (one file is both the lock and the value)."""
        fd = os.open(os.path.join(self._control, "usage"),
                     os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield _Ledger(fd, lambda: sum(c.size for c in self._walk(self.namespace_dirs())))
        finally:
            os.close(fd)

    def _walk(self, ns_dirs: Sequence[str]) -> Iterator[_Cached]:
        """Every file under ``ns_dirs``, cached or temp, with the lock that guards it."""
        for ns_dir in ns_dirs:
            ns_lock_dir = self._lock_dir(ns_dir)
            namespace = os.path.basename(ns_dir)
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
                            continue
                        try:
                            st = d.stat(follow_symlinks=False)
                        except FileNotFoundError:
                            continue
                        stripe = cd.part_stripe(d.name)
                        lock = (stripe_path(ns_lock_dir, prefix + d.name) if stripe is None
                                else _part_lock(ns_lock_dir, stripe))
                        yield _Cached(st.st_atime_ns, st.st_size, d.path, lock,
                                      stripe is not None, namespace)

    def _evict_lru(self, ledger: _Ledger, target: int, lease_ns: int,
                   evicted: Evicted | None = None, kept: list[_Cached] | None = None) -> int:
        """Evict unprotected files in :func:`ucstage.cache.policy.eviction_order`
        (ordinary files least recently used first, then files a dataset
        consumed, most recently consumed first) until usage <= target,
        counting each in ``evicted`` (and in the thread's reader). Files found
        held or being fetched go to ``kept``.

        Call with the ledger lock held. Returns the usage after, and resets
        the ledger to it (the walk is the truth).
        """
        # Copies in flight are their preallocated temp files, created and
        # renamed only under this lock: the walk counts them exactly. Temp
        # files of dead runs are deleted on the way (nobody holds their stripe).
        found = list(self._walk(self.namespace_dirs()))
        used = sum(c.size for c in found)
        for c in found:
            if c.partial and _sweep_one(c.path, c.lock):
                used -= c.size
        charge = policy.reader()
        for c in policy.eviction_order(found, time.time_ns(), lease_ns):
            if used <= target:
                break
            if self._evict(c):
                used -= c.size
                if evicted is not None:
                    evicted.add(c.namespace, c.size)
                if charge is not None:
                    charge.evicted(1, c.size)
            elif kept is not None:
                kept.append(c)
        ledger.write(used)
        return used

    def _evict(self, c: _Cached) -> bool:
        lock = FileLock(c.lock)
        if not lock.acquire(blocking=False):
            return False  # being fetched right now
        hold: int | None = -1
        try:
            hold = take_exclusive(c.path)
            if hold is None:
                return False  # a reader holds it (see ucstage.cache.leases)
            if hold < 0:
                return True  # gone meanwhile
            staged = self._trash_name()
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
        finally:
            if hold is not None and hold >= 0:
                os.close(hold)  # the exclusive hold, kept over the rename and the check
            lock.release()
        self._forget(c.path)
        return True


def _part_lock(ns_lock_dir: str, stripe: int) -> str:
    """The stripe lock a temp file's name points at (see :func:`layout.part_name`)."""
    return os.path.join(ns_lock_dir, f"{stripe:04d}.lock")


def _sweep_one(path: str, lock_path: str) -> bool:
    lock = FileLock(lock_path)
    if not lock.acquire(blocking=False):
        return False  # its copy is running
    try:
        unlink_if_exists(path)
        return True
    finally:
        lock.release()


def _charge_wait(seconds: float) -> None:
    charge = policy.reader()
    if charge is not None:
        charge.waited(seconds)


def no_room(exc: BaseException) -> bool:
    """Whether ``exc`` says the disk (or the user's quota) is full."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def free_bytes(path: str) -> int:
    """Free bytes on the filesystem holding ``path``; 0 when it cannot be asked."""
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return 0


def unlink_if_exists(path: str) -> None:
    """Delete ``path``; a file already gone is what was wanted."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
