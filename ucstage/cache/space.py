"""The cache folder's on-disk state, owned by one object: :class:`CacheSpace`.

What it holds is in docs/design.md (section 6, "The on-disk state", and
"Crash safety"); the two kinds of lock that guard it in :class:`CacheSpace`.
Here are the namespaces and their records (:meth:`CacheSpace.prepare`,
:meth:`CacheSpace.sources`), the byte ledger (:class:`Ledger`, its
threads' :class:`Turns`), the tree
walk and the sweep of dead temp files (:func:`walk`, :func:`sweep`), this
process's memo of validity stamps (:class:`StampMemo`), and what needs
several of them at once: reserving room for a copy under the cap and
committing it, discarding a file, and eviction (:mod:`.policy`'s order).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, NamedTuple, Protocol, TypeVar

from ..atomic import write_atomic
from ..errors import CacheFull
from ..units import format_bytes
from . import paths, policy
from .inflight import Inflight
from .paths import FileLock, stripe_path, take_exclusive

__all__ = ["CacheSpace", "Cached", "Charge", "Eviction", "Evictions", "Ledger", "StampMemo",
           "Tally", "Turns", "charge_eviction", "charge_wait", "charging", "free_bytes",
           "locked_ledger", "no_room", "reader", "sweep", "sweep_one", "unlink_if_exists", "walk"]

_LOW_WATER = 0.99
"""Eviction makes room for the copy and goes down to 99% of the cap at least,
so a full cache does not walk its tree on every fetch (one walk per 1% of the
cap copied, or per file when a file is more). No lower: a dataset's resident
set (cache/policy.py) loses every file evicted beyond the need, each a hit
lost in the next epoch (at "95%, less the need", a cap a quarter of the data
hit 0.20-0.215 of its reads instead of 0.215-0.25)."""


_FOLDERS_MAX = 1 << 16
"""Cache folders remembered as existing per process."""


class Eviction(NamedTuple):
    """What :meth:`CacheSpace.evict_to` did, in the terms of a prune report."""

    bytes_before: int
    bytes_after: int
    files_removed: int
    bytes_removed: int
    bytes_in_use: int
    """Bytes kept because they were handed to a reader within the lease."""


class CacheSpace:
    """The on-disk state of one cache root, and this process's memory of it.

    Two kinds of lock, two scopes:

    * **The ledger lock** (an ``flock`` on ``.ucstage/usage``, shared by every
      process; :func:`locked_ledger`) guards the byte count and the tree's names:
      files are renamed into place, evicted, discarded and walked for
      counting only while it is held, so a walk never sees a file twice or
      misses one, and copies in flight (their preallocated temp files) are
      counted exactly.
    * **This process's memory** (the stamp memo, :class:`StampMemo`,
      and which namespaces it has named and prepared) is guarded by a lock of each object,
      held only for the dictionary update itself, never while waiting for
      the ledger lock or doing I/O, so the two never nest.

    Args:
        root: a cache root already opened by :func:`ucstage.cache.paths.open_root`.
        max_bytes: the byte cap (None: no cap).
        lease_ns: a file handed out within this many nanoseconds is not evicted.
        wait_s: how long a copy waits for room under a full cap.
    """

    def __init__(self, root: str, *, max_bytes: int | None = None, lease_ns: int = 0,
                 wait_s: float = 0.0) -> None:
        self.root = root
        self.max_bytes = max_bytes
        """The byte cap every reservation respects (None: no cap)."""
        self.lease_ns = lease_ns
        """A file handed out within this many nanoseconds is not evicted."""
        self.wait_s = wait_s
        """How long a reservation waits for a reader to make room."""
        self._control = os.path.join(root, paths.CONTROL)
        self._dirs: dict[str, str] = {}
        """Namespace folders by source URL, named once per process."""
        self.prepared: set[str] = set()
        """Namespace folders this process prepared (asked of the disk once;
        a copy tests it, and prepares one that is not in it)."""
        # Writes to those two happen under it; reads (a dict lookup, a set test)
        # take none: they are atomic in CPython and a missed entry only costs a
        # recompute.
        self._names_lock = threading.Lock()
        self.stamps = StampMemo()
        """This process's memo of validity stamps."""
        self._folders: set[str] = set()
        """Cache folders this process made or found (no ``makedirs`` per copy)."""
        self._ledger: Callable[[], AbstractContextManager[Ledger]] = functools.partial(
            locked_ledger, root, self._recount)
        """The byte ledger, locked; recounted from the whole tree when unreadable."""
        self.turns = Turns(self._ledger)
        """This process's threads' turns at the ledger lock, batched
        (reserving without a cap, committing, giving back)."""

    # -- namespaces: a folder per source, its record, its locks, the trash -------

    def namespace_dir(self, url: str) -> str:
        """``<root>/<namespace>`` for a source's resolved URL (not created)."""
        path = self._dirs.get(url)
        if path is None:
            path = os.path.join(self.root, paths.namespace_name(url))
            with self._names_lock:
                self._dirs[url] = path
        return path

    def namespace_dirs(self) -> list[str]:
        """Every namespace folder under the root, by name (the control folder is hidden)."""
        return [e.path for e in sorted(os.scandir(self.root), key=lambda e: e.name)
                if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")]

    def prepare(self, ns_dir: str, *, url: str, source: str) -> str:
        """Create a namespace folder and its lock folder, and record which
        source it holds (once; the record is written atomically). Return it."""
        if ns_dir in self.prepared:
            return ns_dir
        os.makedirs(ns_dir, mode=0o700, exist_ok=True)
        os.makedirs(paths.lock_dir(self.root, ns_dir), mode=0o700, exist_ok=True)
        record = paths.record_path(self.root, ns_dir)
        if not os.path.exists(record):
            os.makedirs(os.path.dirname(record), mode=0o700, exist_ok=True)
            write_atomic(record, json.dumps(
                {"namespace": os.path.basename(ns_dir), "url": url, "source": source,
                 "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}))
        with self._names_lock:
            self.prepared.add(ns_dir)
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

    def _remove_namespace(self, ns_dir: str) -> bool:
        """Delete one namespace folder, its record and its lock files; False
        when it was not there. The folder is renamed into the trash first, so
        it disappears at once; files already open stay readable (POSIX unlink)."""
        if not os.path.isdir(ns_dir):
            return False
        staged = self.trash_name()
        os.rename(ns_dir, staged)
        shutil.rmtree(staged, ignore_errors=True)
        with self._names_lock:
            self.prepared.discard(ns_dir)
        unlink_if_exists(paths.record_path(self.root, ns_dir))
        self._remove_locks(os.path.basename(ns_dir))
        return True

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

    def trash_name(self) -> str:
        """A fresh path in the trash folder: renaming there makes a file or folder
        disappear at once (same filesystem) before it is deleted."""
        trash = os.path.join(self._control, "trash")
        os.makedirs(trash, mode=0o700, exist_ok=True)
        return os.path.join(trash, uuid.uuid4().hex)

    def _remove_locks(self, namespace: str) -> None:
        """Delete a namespace's lock stripes. Each is taken before it is unlinked
        (waiting for a copy that holds it), so no two holders ever share one:
        see :class:`ucstage.cache.paths.FileLock`."""
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

    def remove_namespaces(self, ns_dirs: Sequence[str]) -> list[str]:
        """Delete these namespaces, their records and their lock files; return
        the names removed.

        Each folder is renamed into the trash first, so it disappears at once;
        files already open stay readable (POSIX unlink). The stamp memo is
        forgotten and the ledger recounted from what is left.
        """
        names = [os.path.basename(d) for d in ns_dirs if self._remove_namespace(d)]
        self.stamps.clear()
        with self._ledger() as ledger:
            ledger.write(sum(c.size for c in self._walk(self.namespace_dirs())))
        return names

    def remove_frozen_listings(self) -> None:
        """Delete the listings :class:`ucstage.VolumeDataset` froze under the
        control folder (:data:`ucstage.cache.paths.LISTINGS_DIR`); they belong
        to the whole cache."""
        shutil.rmtree(os.path.join(self.root, paths.LISTINGS_DIR), ignore_errors=True)

    # -- copies: lock, reserve, commit ---------------------------------------------

    def entry_lock(self, ns_dir: str, rel: str) -> str:
        """The lock stripe that guards the entry ``rel`` of a namespace."""
        return stripe_path(paths.lock_dir(self.root, ns_dir), rel)

    def make_folder(self, folder: str, *, again: bool = False) -> None:
        """Make a copy's cache folder, once per process (``again``: it was
        removed since, by a clear)."""
        if folder in self._folders and not again:
            return
        os.makedirs(folder, mode=0o700, exist_ok=True)
        if len(self._folders) >= _FOLDERS_MAX:
            self._folders.clear()  # bounded memory; the next copies just ask again
        self._folders.add(folder)

    @staticmethod
    def temp_path(local: str, entry_lock: str) -> str:
        """Where a copy of ``local`` is written first: beside it, hidden, and
        named after the stripe of ``entry_lock`` so a later run can tell whether
        its writer is still alive."""
        stripe = int(os.path.basename(entry_lock)[:4])
        return os.path.join(os.path.dirname(local),
                            paths.part_name(stripe, os.path.basename(local)))

    def reserve(self, tmp: str, need: int, *, name: str,
                inflight: Inflight | None = None) -> tuple[int, int]:
        """Create ``tmp`` preallocated to ``need`` bytes and count it in the
        ledger, under the cap (a cache without one reserves with
        :meth:`reserve_many`), evicting first if needed. Return the open
        descriptor and the bytes reserved in the ledger (``need``). Files
        evicted to make room are charged to the thread's sink (:func:`charging`).

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
        move on, up to :attr:`wait_s` seconds (polling, without the ledger lock
        held in between; ``inflight`` stopping ends the wait with ``Stopped``).
        The time waited is charged to the thread's sink too.

        Raises:
            CacheFull: ``need`` is larger than the cap, at once; or it
                still did not fit after :attr:`wait_s` (``name`` says which file
                in the message).
            OSError: the temp file cannot be created or preallocated
                (ENOSPC when the disk is full); nothing is left behind.
        """
        max_bytes, lease_ns, wait_s = self.max_bytes, self.lease_ns, self.wait_s
        assert max_bytes is not None, "without a cap, reserve_many"
        if need > max_bytes:
            raise CacheFull(f"{name} is {format_bytes(need)}, larger than the whole cache cap "
                            f"{format_bytes(max_bytes)}", hint="raise max_bytes")
        fd = paths.create_fresh(tmp)
        started: float | None = None
        pause = 0.005
        try:
            while True:
                with self._ledger() as ledger:
                    used = ledger.read()
                    if used + need > max_bytes:
                        # Room for this copy, and at least the low water's
                        # share of the cap: not both added (a small cap would
                        # lose a file more than it needs at each walk).
                        room = max(need, max_bytes - int(max_bytes * _LOW_WATER))
                        used = self._evict_lru(ledger, max(0, max_bytes - room), lease_ns)
                    if used + need <= max_bytes:
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
                    charge_wait(None)
                if now - started >= wait_s:
                    charge_wait(now - started)
                    raise CacheFull(
                        f"the cache cap {format_bytes(max_bytes)} is full of files handed to "
                        f"readers (held by a reader, or handed out in the last "
                        f"{lease_ns / 1e9:g} s) or being copied ({format_bytes(used)}); "
                        f"{name} needs {format_bytes(need)}; waited {now - started:.1f} s "
                        "for a reader to move on",
                        hint="raise max_bytes, or read fewer files at once (num_workers, "
                             "read_ahead): the readers' window must fit well within the cap")
                if inflight is not None:
                    inflight.sleep(pause)
                else:
                    time.sleep(pause)
                pause = min(pause * 2, 0.1)
        except BaseException:
            os.close(fd)
            unlink_if_exists(tmp)
            raise
        if started is not None:
            charge_wait(time.monotonic() - started)
        return fd, need

    def reserve_many(self, wanted: Sequence[tuple[str, int]]
                     ) -> list[tuple[int, int] | BaseException]:
        """:meth:`reserve` without a cap, of several temp files (``(tmp,
        need)`` each) under one hold of the ledger lock: each is created
        empty first, then preallocated and counted with the others. Returns
        each one's ``(descriptor, bytes reserved)``, or its error (nothing of
        it left behind: ENOSPC when the disk is full)."""
        out: list[tuple[int, int] | BaseException] = []
        for tmp, _ in wanted:
            try:
                out.append((paths.create_fresh(tmp), 0))
            except OSError as exc:
                out.append(exc)
        def grow(ledger: Ledger) -> None:
            # Read before preallocating: a recount (an unreadable ledger)
            # would count the grown temp files too.
            used, added = ledger.read(), 0
            for i, (tmp, need) in enumerate(wanted):
                got = out[i]
                if isinstance(got, BaseException):
                    continue
                try:
                    if need:
                        # Preallocating makes a full disk fail here, before
                        # any byte is copied.
                        os.posix_fallocate(got[0], 0, need)
                except OSError as exc:
                    os.close(got[0])
                    unlink_if_exists(tmp)
                    out[i] = exc
                    continue
                out[i] = (got[0], need)
                added += need
            if added:
                ledger.write(used + added)

        try:
            self.turns.run(grow)
        except BaseException:
            for (tmp, _), got in zip(wanted, out, strict=True):
                if not isinstance(got, BaseException):
                    os.close(got[0])
                    unlink_if_exists(tmp)
            raise
        return out

    def commit(self, tmp: str, local: str, size: int, reserved: int) -> None:
        """Rename the finished temp file over ``local`` and settle the ledger:
        ``size`` bytes are now cached there instead of the ``reserved`` ones
        (and instead of whatever ``local`` held before)."""
        failed = self.commit_many([(tmp, local, size, reserved)])[0]
        if failed is not None:
            raise failed

    def commit_many(self, done: Sequence[tuple[str, str, int, int]]
                    ) -> list[BaseException | None]:
        """:meth:`commit` of several finished temp files (``(tmp, local, size,
        reserved)`` each) under one hold of the ledger lock: a warm commits
        what finished in one pass of its loop together, so the lock, the
        ledger's read and its write cost once per batch, not per file.
        Returns each one's error (None: committed); a failed one is left as
        it was, its reservation still counted, for its caller to drop."""
        errors: list[BaseException | None] = []

        def rename(ledger: Ledger) -> None:
            # Renames happen under the ledger lock, so an eviction walk never
            # runs while a file changes its name (readdir could miss it under
            # both names).
            used, change = ledger.read(), 0
            for tmp, local, size, reserved in done:
                try:
                    try:
                        old = os.stat(local).st_size
                    except FileNotFoundError:
                        old = 0
                    os.replace(tmp, local)
                except OSError as exc:
                    errors.append(exc)
                    continue
                change += size - old - reserved
                errors.append(None)
            if change:
                ledger.write(used + change)

        self.turns.run(rename)
        return errors

    def abandon(self, tmp: str, reserved: int) -> None:
        """Delete an unfinished temp file and give its reservation back."""
        if not reserved:
            unlink_if_exists(tmp)
            return

        def give_back(ledger: Ledger) -> None:
            unlink_if_exists(tmp)
            ledger.write(ledger.read() - reserved)

        self.turns.run(give_back)

    def discard(self, ns_dir: str, rel: str, local: str, seen: os.stat_result) -> bool:
        """Delete the cached file ``local`` (entry ``rel``) if it is still the
        one ``seen``; True when it is gone.

        Takes the entry's stripe (no copy of it is running) and the ledger lock
        (renames happen under it, and the byte count drops with the file).
        """
        with paths.locked(self.entry_lock(ns_dir, rel)), self._ledger() as ledger:
            try:
                st = os.stat(local)
            except FileNotFoundError:
                return True
            if (st.st_ino, st.st_dev) != (seen.st_ino, seen.st_dev):
                return False  # refetched meanwhile: a new copy, not the one checked
            used = ledger.read()  # before the rename: a recount must still see the file
            staged = self.trash_name()
            os.rename(local, staged)
            os.unlink(staged)
            ledger.write(used - st.st_size)
        self.stamps.forget(local)
        return True

    # -- counting, eviction, sweeping -----------------------------------------------

    def tally(self, ns_dirs: Sequence[str], *, locked: bool = True) -> Tally:
        """Files and bytes under ``ns_dirs``, cached and temp, counted under the
        ledger lock (so no file is seen twice or missed mid-rename); without
        ``locked`` (a root this process cannot write, where no copy runs
        either), without it."""
        files = size = partial = partial_size = 0
        with self._ledger() if locked else contextlib.nullcontext():
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

    def evict_to(self, target: int) -> Eviction:
        """Sweep dead temp files, then evict files in the eviction order
        (:mod:`ucstage.cache.policy`), none handed out within the lease nor
        held by a reader, until the cache holds at most ``target`` bytes (or
        nothing evictable is left)."""
        lease_ns = self.lease_ns
        kept: list[Cached] = []
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
        return sweep(self.root, ns_dir)

    # -- internals ------------------------------------------------------------

    def _recount(self) -> int:
        """The bytes of every file under the root, cached or temp: what the
        ledger says when it is unreadable."""
        return sum(c.size for c in self._walk(self.namespace_dirs()))

    def _walk(self, ns_dirs: Sequence[str]) -> Iterator[Cached]:
        """Every file under ``ns_dirs``, cached or temp, with the lock that guards it."""
        return walk(self.root, ns_dirs)

    def _evict_lru(self, ledger: Ledger, target: int, lease_ns: int,
                   kept: list[Cached] | None = None) -> int:
        """Evict unprotected files in :func:`ucstage.cache.policy.eviction_order`
        until usage <= target, charging each to the thread's sink
        (:func:`charge_eviction`). Files found held or
        being fetched go to ``kept``.

        Call with the ledger lock held. Returns the usage after, and resets
        the ledger to it (the walk is the truth).
        """
        # Copies in flight are their preallocated temp files, created and
        # renamed only under this lock: the walk counts them exactly. Temp
        # files of dead runs are deleted on the way (nobody holds their stripe).
        found = list(self._walk(self.namespace_dirs()))
        used = sum(c.size for c in found)
        for c in found:
            if c.partial and sweep_one(c.path, c.lock):
                used -= c.size
        for c in policy.eviction_order(found, time.time_ns(), lease_ns):
            if used <= target:
                break
            if self._evict(c):
                used -= c.size
                charge_eviction(c.namespace, c.size)
            elif kept is not None:
                kept.append(c)
        ledger.write(used)
        return used

    def _evict(self, c: Cached) -> bool:
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
            staged = self.trash_name()
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
        self.stamps.forget(c.path)
        return True


def no_room(exc: BaseException) -> bool:
    """Whether ``exc`` says the disk (or the user's quota) is full."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def free_bytes(path: str) -> int:
    """Free bytes on the filesystem holding ``path``; 0 when it cannot be asked."""
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return 0


# -- the charge sink: whom an eviction or a wait for room is counted for --------
#
# One sink, the calling thread's (set by :func:`charging`): a dataset's reader
# (:class:`Charge`, its run counters) or a warm's :class:`Evictions` (per
# source). A fetch goes through the ordinary ``LocalCache.fetch`` and carries
# no counter argument; the reservation that evicts or waits charges the sink.

class Charge(Protocol):
    """What a dataset reader counts of the cache's work on its behalf."""

    def evicted(self, files: int, nbytes: int) -> None: ...

    def waiting(self) -> None: ...

    def waited(self, seconds: float) -> None: ...


class Evictions:
    """Files and bytes evicted per namespace: what a warm's copies pushed out
    (its threads fetch under ``charging(evictions)``). Thread-safe."""

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


_local = threading.local()


def reader() -> Charge | Evictions | None:
    """The sink the calling thread fetches for (see :func:`charging`), if any."""
    return getattr(_local, "charge", None)


def charge_eviction(namespace: str, size: int) -> None:
    """One file of ``size`` bytes was evicted from ``namespace`` by the
    calling thread: counted in its sink (a reader counts totals, a warm
    counts per namespace)."""
    charge = reader()
    if isinstance(charge, Evictions):
        charge.add(namespace, size)
    elif charge is not None:
        charge.evicted(1, size)


def charge_wait(seconds: float | None) -> None:
    """The calling thread starts waiting for room (``None``), or waited
    ``seconds`` for it: counted in its reader, if it has one."""
    charge = reader()
    if charge is None or isinstance(charge, Evictions):
        return
    if seconds is None:
        charge.waiting()
    else:
        charge.waited(seconds)


@contextlib.contextmanager
def charging(charge: Charge | Evictions | None) -> Iterator[None]:
    """``with charging(sink):`` the cache's evictions and waits in this
    thread are counted in ``sink``."""
    before = getattr(_local, "charge", None)
    _local.charge = charge
    try:
        yield
    finally:
        _local.charge = before


# -- the tree: walking it, sweeping dead temp files -----------------------------

class Tally(NamedTuple):
    """What a walk of some namespaces found."""

    files: int
    """Cached files (temp files not included)."""
    bytes: int
    """Bytes of those files."""
    partial_files: int
    """Temp files: copies in flight, or left by killed runs."""
    partial_bytes: int


@dataclass(frozen=True)
class Cached:
    """One file a walk found."""

    atime_ns: int
    size: int
    path: str
    lock: str
    partial: bool = False
    """A copy in flight (or left by a killed run): counted, never evicted."""
    namespace: str = ""
    """The namespace folder's name."""


def walk(root: str, ns_dirs: Sequence[str]) -> Iterator[Cached]:
    """Every file under ``ns_dirs`` (namespaces of ``root``), cached or temp,
    with the lock that guards it."""
    for ns_dir in ns_dirs:
        ns_lock_dir = paths.lock_dir(root, ns_dir)
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
                    stripe = paths.part_stripe(d.name)
                    lock = (stripe_path(ns_lock_dir, prefix + d.name) if stripe is None
                            else paths.part_lock(ns_lock_dir, stripe))
                    yield Cached(st.st_atime_ns, st.st_size, d.path, lock,
                                 stripe is not None, namespace)


def sweep(root: str, ns_dir: str) -> int:
    """Remove temp files left by killed runs (nobody holds their stripe) in
    the namespace ``ns_dir`` of ``root``; return how many."""
    removed = 0
    ns_lock_dir = paths.lock_dir(root, ns_dir)
    for folder, _, names in os.walk(ns_dir):
        for name in names:
            stripe = paths.part_stripe(name)
            if stripe is None:
                continue
            if sweep_one(os.path.join(folder, name), paths.part_lock(ns_lock_dir, stripe)):
                removed += 1
    return removed


def sweep_one(path: str, lock_path: str) -> bool:
    """Delete the temp file ``path`` unless its copy is running (holds
    ``lock_path``); True when it is gone."""
    lock = FileLock(lock_path)
    if not lock.acquire(blocking=False):
        return False  # its copy is running
    try:
        unlink_if_exists(path)
        return True
    finally:
        lock.release()


def unlink_if_exists(path: str) -> None:
    """Delete ``path``; a file already gone is what was wanted."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


# -- the byte ledger: the bytes a cache root holds, copies in flight included ----
#
# One small file, ``.ucstage/usage``, is both the value and the lock
# (:func:`locked_ledger`): an ``flock`` on it, shared by every process, guards
# the byte count and the tree's names (see :class:`CacheSpace`). A process's
# threads take turns at it through one :class:`Turns`.

T = TypeVar("T")


class Ledger:
    """Bytes the cache holds (plus reservations), as a fixed-width number in
    one small file, seen by the holder of its lock: read once, and written
    once when the lock is let go (:func:`locked_ledger`). Rewritten in place:
    that needs no new disk block (it must work on a full disk), and a torn
    write fails to parse, which makes the next reader recount from the tree."""

    __slots__ = ("_dirty", "_value", "fd", "recount")

    def __init__(self, fd: int, recount: Callable[[], int]) -> None:
        self.fd = fd
        self.recount = recount
        self._value: int | None = None
        self._dirty = False

    def read(self) -> int:
        """The recorded bytes; recounted (and rewritten) when unreadable."""
        if self._value is None:
            try:
                self._value = int(os.pread(self.fd, 64, 0).decode("ascii").strip())
            except (OSError, ValueError, UnicodeDecodeError):
                self.write(self.recount())
        return self._value  # type: ignore[return-value]

    def write(self, value: int) -> None:
        """Record ``value`` bytes (never below 0), on disk when the lock is let go."""
        self._value, self._dirty = max(0, value), True


@contextlib.contextmanager
def locked_ledger(root: str, recount: Callable[[], int]) -> Iterator[Ledger]:
    """The byte ledger of ``root``, locked for the ``with`` block (what it
    wrote is written out as the block ends, even by an error: as a write in
    place would have been); ``recount()`` counts the tree when the file
    cannot be read."""
    fd = paths.open_private(os.path.join(root, paths.CONTROL, "usage"), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        ledger = Ledger(fd, recount)
        try:
            yield ledger
        finally:
            if ledger._dirty and ledger._value is not None:
                os.pwrite(fd, b"%20d\n" % ledger._value, 0)
    finally:
        os.close(fd)


class Turns:
    """This process's turns at the ledger: :meth:`run` an operation under
    the lock, batched with the other threads' that are waiting.

    Why: every copy settles the ledger twice (reserve, commit), and the lock
    is shared by every process. A DataLoader worker's read-ahead threads each
    took it on their own, and a holder that then waited for the GIL behind
    its own process's threads held every other process up (on 2 cores, 55%
    of the workers' samples of a lazy epoch waited on it). Here a process
    queues on a thread lock instead; the thread whose turn it is runs the
    whole queue under one hold (flat combining), reading the value once and
    writing it once. Each operation sees the ledger as if it ran alone, in
    queue order; one that raises fails alone.

    An operation must not depend on its thread (thread-local state): it may
    run in another thread of the process. Forked children start with fresh
    turns.
    """

    def __init__(self, locked: Callable[[], AbstractContextManager[Ledger]]) -> None:
        self._locked = locked
        self._fresh()

    def _fresh(self) -> None:
        self._pid = os.getpid()
        self._turn = threading.Lock()
        self._queue_lock = threading.Lock()
        self._queue: list[list[Any]] = []
        """Operations waiting for a turn: ``[fn, done, value, error]`` each."""

    def run(self, fn: Callable[[Ledger], T]) -> T:
        """``fn(ledger)`` under the ledger lock (in this thread or another's
        turn); its result, or its exception raised here."""
        if self._pid != os.getpid():
            self._fresh()  # a forked child: the parent's locks may be held
        op: list[Any] = [fn, False, None, None]
        with self._queue_lock:
            self._queue.append(op)
        with self._turn:
            if not op[1]:
                batch: list[list[Any]] = []
                try:
                    with self._locked() as ledger:
                        # Taken once the lock is held: what queued while this
                        # thread waited for it joins the batch.
                        with self._queue_lock:
                            batch, self._queue = self._queue, []
                        for one in batch:
                            # An Exception is this operation's alone; a
                            # KeyboardInterrupt (only ever the main thread's)
                            # stops the whole turn, below.
                            try:
                                one[2] = one[0](ledger)
                            except Exception as exc:
                                one[3] = exc
                            one[1] = True
                except BaseException as exc:
                    # The lock could not be taken, or Ctrl-C reached the main
                    # thread during its turn: every operation not run fails
                    # (an interrupt as an OSError in the other threads, which
                    # were not interrupted), and the thread whose turn it was
                    # raises.
                    failed = exc if isinstance(exc, Exception) else InterruptedError(
                        "interrupted while another thread settled the cache's byte ledger")
                    with self._queue_lock:
                        batch, self._queue = batch + self._queue, []
                    for one in batch:
                        if not one[1]:
                            one[3], one[1] = failed, True
                    raise
        if op[3] is not None:
            raise op[3]
        return op[2]  # type: ignore[no-any-return]


# -- this process's memo of validity stamps ------------------------------------

_MEMO_MAX = 1 << 18
"""Stamps remembered per process; past this the memo starts over (bounded memory
in every DataLoader worker, at the cost of one xattr read per file)."""

Memo = tuple[int, int, tuple[int, str]]
"""(inode, ctime_ns, (size, version))."""


class StampMemo:
    """path -> (inode, ctime, stamp) of cached files this process read.

    Every write (insert, pop, clear) happens under the object's lock; reads
    take no lock, because a ``dict.get`` is atomic in CPython and a read that
    races a write is harmless (an entry is checked against the file's inode
    and ctime before it is trusted). The lock makes compound writes (the
    bound check, then the insert) whole; it is held for the dictionary
    update only, never during I/O.
    """

    def __init__(self) -> None:
        self._memo: dict[str, Memo] = {}
        self._lock = threading.Lock()
        self.entries: Mapping[str, Memo] = self._memo
        """The memo, read-only: path -> (inode, ctime_ns, (size, version)).
        For a lookup's hot path, which reads it without a call per file; an
        entry is trusted only while the file's inode and ctime match, and
        every path in it passed a lookup's path-safety check."""

    def stamp(self, path: str, st: os.stat_result) -> tuple[int, str] | None:
        """The ``(size, version)`` stamped on the cached file ``path``, whose
        ``stat`` is ``st``; None when it has none. Read once per file and
        process, then remembered while the inode and ctime stay the same."""
        memo = self._memo.get(path)
        if memo is None or memo[0] != st.st_ino or memo[1] != st.st_ctime_ns:
            found = paths.read_stamp(path)
            if found is None:
                return None
            memo = (st.st_ino, st.st_ctime_ns, found)
            self._put(path, memo)
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
            self._put(path, (st.st_ino, st.st_ctime_ns, stamp))

    def committed(self, path: str, stamp: tuple[int, str]) -> None:
        """``path`` was just stamped ``stamp`` and renamed into place by this
        process, under its entry's lock: remember it as read, so its next
        lookup reads no stamp."""
        try:
            st = os.stat(path)
        except OSError:
            return
        self._put(path, (st.st_ino, st.st_ctime_ns, stamp))

    def forget(self, path: str) -> None:
        """Drop ``path``'s entry (the file was removed)."""
        with self._lock:
            self._memo.pop(path, None)

    def clear(self) -> None:
        """Forget every entry (namespaces were removed)."""
        with self._lock:
            self._memo.clear()

    def _put(self, path: str, memo: Memo) -> None:
        with self._lock:
            if len(self._memo) >= _MEMO_MAX:
                self._memo.clear()
            self._memo[path] = memo
