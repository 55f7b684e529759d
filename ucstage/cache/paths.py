"""The cache folder's paths: where the root is, who may own it, and the names in it.

The tree (docs/cache.md)::

    <root>/                         0700, owned by this user
      <namespace>/<relative path>   cached files, path-mirrored per source
      <namespace>/.../.NNNN.<name>.ucstage-part   a copy in progress
      .ucstage/namespaces/<ns>.json which source a namespace holds
      .ucstage/locks/<ns>/NNNN.lock single-flight lock stripes
      .ucstage/usage(.lock)         byte ledger for the cap
      .ucstage/trash/               eviction staging (same filesystem)
      .ucstage/manifests/           listings VolumeDataset froze (LISTINGS_DIR)

Each cached file carries its validity stamp in the ``user.ucstage.v1`` xattr
(``size NUL version`` of the source it was copied from). The stamp is set on
the temp file before the rename, so data and stamp appear together or not at
all.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import grp
import hashlib
import os
import pwd
import re
import stat
import zlib
from collections.abc import Iterator
from types import TracebackType
from typing import cast

from ..errors import CacheError, CacheOwnershipError, CacheUnusable
from ..volumes.entry import NAME_MAX, PART_SUFFIX, part_stripe  # the listing refuses such names too

__all__ = ["CACHE_DIR_ENV", "CONTROL", "LISTINGS_DIR", "PART_SUFFIX", "STAMP_XATTR", "STRIPES", "FileLock", "create_fresh", "default_root", "flocked", "lock_dir", "locked", "md5_evidence", "namespace_name", "open_private", "open_root", "part_lock", "part_name", "part_stripe", "read_stamp", "record_path", "stripe_path", "take_exclusive", "take_lock", "unusable_reason", "user_root", "write_stamp"]

CACHE_DIR_ENV = "UCSTAGE_CACHE_DIR"
CONTROL = ".ucstage"
LISTINGS_DIR = os.path.join(CONTROL, "manifests")
"""Where :class:`ucstage.VolumeDataset` keeps the listings it froze, relative
to the root; ``clear`` of every source removes them."""
STAMP_XATTR = "user.ucstage.v1"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def default_root() -> str:
    """``$UCSTAGE_CACHE_DIR``, else :func:`user_root`."""
    env = os.environ.get(CACHE_DIR_ENV, "").strip()
    if env:
        return os.path.abspath(os.path.expanduser(env))
    return user_root()


def user_root() -> str:
    """The root without ``$UCSTAGE_CACHE_DIR``: a private per-user folder under /tmp."""
    return f"/tmp/ucstage-{os.getuid()}"


def _check_private(root: str, st: os.stat_result) -> None:
    # Never suggest deleting it: the folder may be the user's own data (a
    # mistyped $UCSTAGE_CACHE_DIR) or another user's cache.
    hint = (f"set {CACHE_DIR_ENV} to a folder only you can write (a new one: ucstage "
            "creates it private)")
    if stat.S_ISLNK(st.st_mode):
        raise CacheOwnershipError(f"cache root {root} is a symlink; refusing to follow it", hint)
    if not stat.S_ISDIR(st.st_mode):
        raise CacheUnusable(root, "exists and is not a folder", hint)
    if st.st_uid != os.getuid():
        raise CacheOwnershipError(
            f"cache root {root} is owned by uid {st.st_uid}, not by you (uid {os.getuid()})",
            hint)
    if st.st_mode & 0o022:
        raise CacheOwnershipError(
            f"cache root {root} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o})",
            f"`chmod 700 {root}`, or {hint}")


def _owner(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def _group_only_mine(gid: int) -> bool:
    """Whether the group ``gid`` has this user as its one member (a user
    private group, as Fedora/RHEL give every user with umask 002): a folder
    only that group may write is as private as one only the user may write.
    Checks primary and supplementary members, as Debian's sshd StrictModes
    does; a group nobody is in is not counted as private (setgid tools use
    such groups)."""
    me = os.getuid()
    try:
        group = grp.getgrgid(gid)
        my_name = pwd.getpwuid(me).pw_name
    except KeyError:
        return False
    if any(member != my_name for member in group.gr_mem):
        return False
    primary = [user.pw_uid for user in pwd.getpwall() if user.pw_gid == gid]
    if any(uid != me for uid in primary):
        return False
    return bool(primary) or bool(group.gr_mem)


def _exposure(st: os.stat_result) -> str | None:
    """Why another user could rename or replace what is in a folder with this
    stat, or None. Root and this user may own it; a sticky folder (``/tmp``)
    only lets each user rename their own entries, so it may be open to all."""
    if st.st_uid not in (0, os.getuid()):
        return f"is owned by {_owner(st.st_uid)}, not by you or root"
    mode = stat.S_IMODE(st.st_mode)
    if mode & stat.S_ISVTX or not mode & 0o022:
        return None
    if mode & 0o002:
        return f"is writable by every user (mode {mode:04o}) and not sticky"
    if _group_only_mine(st.st_gid):
        return None
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    return f"is writable by group {group} (mode {mode:04o}), which has other members"


def _prefixes(path: str) -> list[str]:
    """``/``, ``/a``, ``/a/b`` for ``/a/b``."""
    out, head = [], path
    while True:
        out.append(head)
        up = os.path.dirname(head)
        if up == head:
            return out[::-1]
        head = up


def _check_parents(root: str) -> None:
    """Refuse a root under a folder another user could change (sshd's StrictModes).

    Everything under the root is then worked on by path, so whoever may
    rename entries in a folder above it could, mid-run, swap the root for a
    tree of their own (files with valid stamps, links at temp-file names):
    training would read their bytes, and our writes would land in their
    files. ``O_NOFOLLOW`` on each create guards only a path's last part; this
    check is what guards the rest. Folders above a symlink in the path are
    checked along its target too, since the link's own folder decides who may
    repoint it, and the target's who may swap what it points at. Folders not
    made yet are skipped (:func:`open_root` checks again once it made them).
    """
    seen: set[str] = set()
    for literal in _prefixes(os.path.dirname(root)):
        for folder in _prefixes(os.path.realpath(literal)):
            if folder in seen:
                continue
            seen.add(folder)
            try:
                st = os.stat(folder)
            except OSError:
                break  # not made yet
            why = _exposure(st)
            if why is not None:
                raise CacheOwnershipError(
                    f"cache root {root} is under {folder}, which {why}: another user could "
                    "swap the cache for files of their own",
                    f"use a folder only you (and root) can write, all the way up, e.g. the "
                    f"default {user_root()} (unset {CACHE_DIR_ENV} to use it)")


def open_root(root: str) -> str:
    """Create ``root`` 0700, or check that an existing one is private; return it.

    Refuses a symlink, a folder owned by another user, and a group- or
    world-writable folder: in a shared /tmp another user could otherwise plant
    files that training would read as data. Refuses, too, a root under a
    folder another user may write (unless sticky, as /tmp is) or owns: that
    user could rename the root mid-run and put their own in its place
    (:func:`_check_parents`).

    Raises:
        CacheOwnershipError: the folder, or one above it, is not private to
            this user (and root).
    """
    root = os.path.abspath(root)
    _check_parents(root)  # before making anything in a folder another user controls
    try:
        try:
            os.mkdir(root, 0o700)
        except FileExistsError:
            pass
        except FileNotFoundError:
            os.makedirs(os.path.dirname(root), exist_ok=True)
            os.mkdir(root, 0o700)
    except OSError as exc:
        raise _unusable(root, exc, creating=True) from exc
    _check_private(root, os.lstat(root))
    _check_parents(root)  # the folders just made, as the umask left them
    why = unusable_reason(root)
    if why is not None:
        raise CacheUnusable(root, why)
    try:
        for sub in ("", "locks", "namespaces", "trash"):
            os.makedirs(os.path.join(root, CONTROL, sub), mode=0o700, exist_ok=True)
    except OSError as exc:
        raise _unusable(root, exc) from exc
    return root


_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def open_private(path: str, flags: int, mode: int = 0o600) -> int:
    """``os.open`` of a file of the cache's own (a lock, the ledger, counters),
    never through a symlink at ``path``.

    Only :func:`open_root`'s checks keep other users from planting one, so a
    link there was put by this user or root: refused rather than followed, as
    a write through it could land anywhere.

    Raises:
        CacheOwnershipError: ``path`` is a symlink.
    """
    try:
        return os.open(path, flags | _NOFOLLOW, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CacheOwnershipError(
                f"{path} in the cache is a symlink; refusing to follow it",
                "remove it: ucstage never puts links in its cache") from exc
        raise


def create_fresh(path: str, mode: int = 0o600) -> int:
    """Create ``path`` new and empty, open for writing (a copy's temp file).

    ``O_EXCL`` makes sure the file is one this call made, never a file or
    link already there. The caller holds the name's lock stripe, so what is
    there is a killed copy's leftover (or something planted): it is removed,
    never written through, and the create tried once more.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW
    try:
        return os.open(path, flags, mode)
    except FileExistsError:
        os.unlink(path)  # a link is removed, not what it points at
        return os.open(path, flags, mode)


def unusable_reason(root: str) -> str | None:
    """Why an existing cache folder cannot be written, or None: checked when
    the cache opens, so the error names the root, not the first file a copy
    or a ``cache status`` happened to touch."""
    try:
        if os.statvfs(root).f_flag & os.ST_RDONLY:
            return "is on a read-only file system"
    except OSError:
        pass
    # The effective ids, as the writes will be made (root without
    # CAP_DAC_OVERRIDE is refused like anyone else).
    for folder in (root, os.path.join(root, CONTROL)):
        if os.path.isdir(folder) and not os.access(folder, os.W_OK | os.X_OK, effective_ids=True):
            where = "" if folder == root else f" (its {CONTROL} folder)"
            return f"is not writable by you{where} (uid {os.geteuid()})"
    return None


def _first_file(path: str) -> str:
    """The first part of ``path`` that exists and is not a folder."""
    parts = path.split(os.sep)
    for i in range(2, len(parts) + 1):
        head = os.sep.join(parts[:i])
        if os.path.lexists(head) and not os.path.isdir(head):
            return head
    return path


def _unusable(root: str, exc: OSError, *, creating: bool = False) -> CacheUnusable:
    """A failed mkdir under the root as :class:`CacheUnusable`, saying why."""
    verb = "cannot be created" if creating else "cannot be written"
    if exc.errno == errno.EROFS:
        return CacheUnusable(root, f"{verb}: it is on a read-only file system")
    if exc.errno in (errno.EACCES, errno.EPERM):
        folder = os.path.dirname(str(exc.filename)) if creating else str(exc.filename)
        return CacheUnusable(root, f"{verb}: {folder} is not writable by you "
                                   f"(uid {os.geteuid()})")
    if exc.errno in (errno.ENOTDIR, errno.EEXIST):
        return CacheUnusable(root, f"{verb}: {_first_file(root)} is a file, not a folder")
    return CacheUnusable(root, f"{verb}: {exc.strerror or exc}")


def namespace_name(url: str) -> str:
    """A readable, collision-free folder name for a source URL or path.

    The sanitised URL keeps people oriented (``s3_bucket_prefix-1a2b3c4d``);
    the hash of the exact URL keeps two sources that sanitise alike apart.
    """
    digest = hashlib.sha256(url.encode()).hexdigest()[:8]
    readable = _UNSAFE.sub("_", url.replace("://", "_")).strip("._-") or "source"
    return f"{readable[-60:].lstrip('._-')}-{digest}"


def md5_evidence(root: str, source: str) -> str:
    """Where the cache at ``root`` keeps the evidence that ``source`` served
    an MD5 ETag (:data:`ucstage.engines.checks.Evidence`): a file of
    ``.ucstage/md5-etags/``, passed to the engine's checks by the cache."""
    return os.path.join(root, CONTROL, "md5-etags", namespace_name(source))


def part_name(stripe: int, name: str) -> str:
    """Temp file name for ``name``: hidden, and carrying the lock stripe so a
    later run can tell whether anyone is still writing it."""
    candidate = f".{stripe:04d}.{name}{PART_SUFFIX}"
    if len(candidate.encode()) > NAME_MAX:
        candidate = f".{stripe:04d}.{hashlib.sha256(name.encode()).hexdigest()[:32]}{PART_SUFFIX}"
    return candidate


def lock_dir(root: str, ns_dir: str) -> str:
    """The folder of a namespace's lock stripes (``.ucstage/locks/<ns>``)."""
    return os.path.join(root, CONTROL, "locks", os.path.basename(ns_dir))


def part_lock(ns_lock_dir: str, stripe: int) -> str:
    """The stripe lock a temp file's name points at (see :func:`part_name`)."""
    return os.path.join(ns_lock_dir, f"{stripe:04d}.lock")


def record_path(root: str, ns_dir: str) -> str:
    """The record of which source a namespace holds (``.ucstage/namespaces/<ns>.json``)."""
    return os.path.join(root, CONTROL, "namespaces", os.path.basename(ns_dir) + ".json")


def write_stamp(path: str, size: int, version: str) -> None:
    """Record which source state the (temp) file at ``path`` holds."""
    try:
        os.setxattr(path, STAMP_XATTR, f"{size}\0{version}".encode())
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            raise CacheError(
                f"the cache folder's filesystem does not support user xattrs ({path})",
                hint=f"set {CACHE_DIR_ENV} to a folder on ext4, xfs, btrfs or tmpfs",
            ) from exc
        raise


def read_stamp(path: str) -> tuple[int, str] | None:
    """``(size, version)`` recorded on a cached file, or None when absent."""
    try:
        raw = os.getxattr(path, STAMP_XATTR)
    except OSError:
        return None
    size, _, version = raw.decode("utf-8", "replace").partition("\0")
    try:
        return int(size), version
    except ValueError:
        return None


# -- the entry locks ----------------------------------------------------------------
#
# File locks for the cache: ``flock`` on small lock files that never move.
#
# Why ``flock`` and not ``fcntl.lockf``: POSIX record locks belong to the
# process, so two threads of one ``warm`` would both "get" the same lock; an
# ``flock`` lock belongs to the open file description, so each acquisition opens
# its own descriptor and threads exclude each other too. Either kind is dropped
# by the kernel when the process dies, so a SIGKILLed run never leaves a lock
# that hangs the next one.
#
# Entries are mapped onto a fixed number of stripes per namespace, so the
# number of lock files stays bounded however many entries are cached. Lock
# files are deleted only with their namespace (``cache clear``), and only by a
# holder of the lock (:meth:`FileLock.unlink`). Unlinking a lock file that
# others wait on would let two processes hold "the same" lock on different
# inodes, so every acquisition checks, once it holds the lock, that the path
# still names the file it locked; a waiter that won the lock on an unlinked
# file starts over on the path's new file.

STRIPES = 1024
"""Lock files per namespace. Two entries share a stripe with probability
1/STRIPES, which only makes them fetch one after the other."""


def stripe_path(lock_dir: str, relpath: str) -> str:
    """The lock file that guards ``relpath`` inside one namespace."""
    return os.path.join(lock_dir, f"{zlib.crc32(relpath.encode()) % STRIPES:04d}.lock")


def take_lock(path: str, blocking: bool = True) -> int | None:
    """A descriptor holding an exclusive ``flock`` on ``path`` (created 0600 if
    missing; close the descriptor to let go); with ``blocking=False``, None
    instead of waiting when another holds it.

    Once it holds the lock it checks that ``path`` still names the file it
    locked: a holder may have unlinked it meanwhile (:meth:`FileLock.unlink`),
    and then the path's new file is locked instead."""
    while True:
        try:
            fd = open_private(path, os.O_RDWR | os.O_CREAT)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            continue
        if not flocked(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB)):
            return None
        try:
            same = os.path.samestat(os.stat(path), os.fstat(fd))
        except FileNotFoundError:
            same = False
        except BaseException:
            os.close(fd)
            raise
        if same:
            return fd
        os.close(fd)  # its holder unlinked it meanwhile: lock the path's new file


def flocked(fd: int, how: int) -> bool:
    """Whether ``flock(fd, how)`` was granted: False when ``how`` has
    ``LOCK_NB`` and another holds the file. Unless it was granted, ``fd``
    is closed (on an error too)."""
    try:
        fcntl.flock(fd, how)
    except BlockingIOError:
        os.close(fd)
        return False
    except BaseException:
        os.close(fd)
        raise
    return True


def take_exclusive(path: str) -> int | None:
    """A descriptor holding an exclusive ``flock`` on the cached file ``path``
    (close it to let go); None when a reader holds the file (its shared
    ``flock``: :mod:`ucstage.cache.leases`); -1 when it is gone. What an
    eviction takes before it removes a file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return -1
    return fd if flocked(fd, fcntl.LOCK_EX | fcntl.LOCK_NB) else None


@contextlib.contextmanager
def locked(path: str) -> Iterator[None]:
    """``with locked(path):`` the lock ``path`` is held (waiting for it)."""
    fd = cast(int, take_lock(path))  # blocking: never None
    try:
        yield
    finally:
        os.close(fd)


class FileLock:
    """An exclusive ``flock`` on ``path`` (:func:`take_lock`), as an object:
    usable as a context manager (blocking) or through :meth:`acquire` with
    ``blocking=False`` to test whether anyone else holds it, and the one
    holder that may :meth:`unlink` the lock file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self, blocking: bool = True) -> bool:
        """Take the lock; with ``blocking=False`` return False instead of waiting."""
        self._fd = take_lock(self.path, blocking)
        return self._fd is not None

    def unlink(self) -> None:
        """Delete the lock file; call while holding the lock. Waiters on it
        start over on a new file when they get it (see :func:`take_lock`)."""
        if self._fd is None:
            raise RuntimeError(f"unlink of {self.path} without holding its lock")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def release(self) -> None:
        """Drop the lock (closing the descriptor releases it)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()
