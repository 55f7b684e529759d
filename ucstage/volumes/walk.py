"""The parallel walk under a listing: ``find -L`` over a local folder, fsspec's
``ls`` walk over a store, folders listed several at a time.

A folder that cannot be read is recorded (never dropped silently);
:func:`ucstage.volumes.listing.list_files` decides what that means.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
import sys
import threading
from collections.abc import Callable
from typing import Any

from ..errors import UnsafePath
from .entry import FileEntry, local_version
from .location import safe_relpath

__all__ = ["LIST_THREADS", "Walk", "walk_folders", "walk_fsspec", "walk_local", "walks_by_ls"]

LIST_THREADS = 32
"""Folders listed at once by a walk. On a mount or store each folder costs a
round trip; a bounded pool overlaps them (the result does not depend on it)."""


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"{type(exc).__name__}: {exc}"


class Walk:
    """What a walk found: files (relative path -> size and version, or an
    fsspec info dict), refused entries and unreadable folders ("" = the root).

    Folders are visited by several threads at once; each visit collects into
    a :class:`Walk` of its own and :meth:`merge` adds it here under a lock.
    Every result is sorted afterwards, so the visiting order never shows."""

    def __init__(self, include_hidden: bool) -> None:
        self.include_hidden = include_hidden
        self.entries: list[FileEntry] = []
        self.found: dict[str, dict[str, Any]] = {}
        self.refused: list[tuple[str, str]] = []
        self.unreadable: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def part(self) -> Walk:
        """An empty walk for one folder's findings, to :meth:`merge` later."""
        return Walk(self.include_hidden)

    def merge(self, part: Walk) -> None:
        with self._lock:
            self.entries.extend(part.entries)
            self.found.update(part.found)
            self.refused.extend(part.refused)
            self.unreadable.extend(part.unreadable)

    def enter(self, rel: str, name: str) -> bool:
        """Whether to look at a child at all: refuse unsafe names (before the
        hidden filter, so an escaping name is reported, not hidden) and prune
        hidden ones (so an unreadable ``_delta_log`` never stops a listing)."""
        try:
            safe_relpath(rel)
        except UnsafePath as exc:
            self.refused.append((rel, str(exc)))
            return False
        return self.include_hidden or name[:1] not in ("_", ".")


_Folder = Any
"""A folder to visit, as the walk that queued it describes it."""


def walk_folders(top: _Folder, visit: Callable[[_Folder], list[_Folder]],
                  threads: int | None = None) -> None:
    """Visit ``top`` and every folder ``visit`` returns, ``threads`` (default
    :data:`LIST_THREADS`) at a time.

    ``visit(folder)`` lists one folder, records what it found, and returns the
    folders to visit below it. Threads start only as folders queue up (a flat
    folder needs none but the first) and are daemons, so a read hung on a dead
    mount never holds up the interpreter's exit after Ctrl-C. The first
    exception a visit raises stops the walk and is raised here.
    """
    threads = max(1, threads or LIST_THREADS)
    cond = threading.Condition()
    queue: list[_Folder] = [top]
    state = {"busy": 0, "idle": 0, "threads": 0}
    failed: list[BaseException] = []

    def work() -> None:
        while True:
            with cond:
                state["idle"] += 1
                while not queue and state["busy"] and not failed:
                    cond.wait()
                state["idle"] -= 1
                if not queue or failed:
                    cond.notify_all()  # the walk is over: wake the others and the caller
                    return
                folder = queue.pop()
                state["busy"] += 1
            try:
                below = visit(folder)
            except BaseException as exc:
                below = []
                with cond:
                    failed.append(exc)
            with cond:
                state["busy"] -= 1
                queue.extend(below)
                # Enough threads for what is queued (this one takes the next),
                # up to the bound.
                for _ in range(min(len(queue) - state["idle"] - 1, threads - state["threads"])):
                    state["threads"] += 1
                    threading.Thread(target=work, name="ucstage-list", daemon=True).start()
                cond.notify_all()

    with cond:
        state["threads"] = 1
    threading.Thread(target=work, name="ucstage-list", daemon=True).start()
    try:
        with cond:
            while (queue or state["busy"]) and not failed:
                cond.wait()
    except BaseException as exc:  # Ctrl-C: the threads start no other folder
        with cond:
            failed.append(exc)
            queue.clear()
            cond.notify_all()
        raise
    if failed:
        raise failed[0]


def walk_local(root: str, walk: Walk) -> None:
    """``find -L`` over a local folder (FUSE mounts included), folders in parallel.

    Links are followed: a link to a folder inside the volume lists the files
    under the link's path, so each path is listed once and the same file may
    appear under two paths, as with ``find -L``. A folder reached again below
    itself (a loop) is not entered; a link resolving outside the volume, a
    broken link and anything that is neither a file nor a folder are refused.
    A folder that cannot be read is recorded in ``walk.unreadable``.
    """
    real_root = os.path.realpath(root)
    inside = real_root.rstrip(os.sep) + os.sep
    top = os.stat(root)

    def visit(task: tuple[str, str, frozenset[tuple[int, int]]]) -> list[_Folder]:
        folder, prefix, above = task
        found = walk.part()
        below: list[_Folder] = []
        try:
            with os.scandir(folder) as it:
                items = list(it)
        except FileNotFoundError:
            return below  # removed while we listed: it holds nothing now
        except OSError as exc:
            found.unreadable.append((prefix.rstrip("/"), _reason(exc)))
            walk.merge(found)
            return below
        blocked = False
        for item in items:
            rel = prefix + item.name
            if not found.enter(rel, item.name):
                continue
            try:
                st = item.stat()  # through links, as find -L
            except OSError as exc:
                if exc.errno == errno.ENOENT and item.is_symlink():
                    found.refused.append((rel, f"broken symlink to {os.readlink(item.path)}"))
                elif exc.errno == errno.ELOOP:
                    found.refused.append((rel, "symlink loop"))
                elif exc.errno != errno.ENOENT and not blocked:
                    # Names readable, entries not (a folder without x): the
                    # folder's content is unknown, as if it could not be read.
                    blocked = True
                    found.unreadable.append((prefix.rstrip("/"), _reason(exc)))
                continue
            real = ""
            if item.is_symlink():
                real = os.path.realpath(item.path)
                if real != real_root and not real.startswith(inside):
                    found.refused.append((rel, f"symlink to {real}, outside the volume"))
                    continue
            if stat.S_ISDIR(st.st_mode):
                key = (st.st_dev, st.st_ino)
                if key in above:
                    found.refused.append(
                        (rel, f"symlink loop: {real or item.path} is a folder above it"))
                    continue
                below.append((item.path, rel + "/", above | {key}))
            elif stat.S_ISREG(st.st_mode):
                found.entries.append(FileEntry(rel, st.st_size, local_version(st.st_mtime)))
            else:
                found.refused.append((rel, "not a regular file"))
        walk.merge(found)
        return below

    walk_folders((root, "", frozenset({(top.st_dev, top.st_ino)})), visit)


def walks_by_ls(fs: Any) -> bool:
    """Whether ``fs.find`` is fsspec's own walk over ``ls``, which drops every
    folder it fails to list (``on_error="omit"``). Backends with their own
    ``find`` list an object store flat in one request, and raise."""
    spec = sys.modules.get("fsspec.spec")
    if spec is None or not isinstance(fs, spec.AbstractFileSystem):
        # Not an fsspec filesystem (obstore's ObjectFS lists flat with its own
        # find); looked up, not imported: fsspec costs start-up time.
        return False
    from fsspec.asyn import AsyncFileSystem

    cls = type(fs)
    if cls.find is not spec.AbstractFileSystem.find:
        return False
    return not isinstance(fs, AsyncFileSystem) or cls._find is AsyncFileSystem._find


def walk_fsspec(fs: Any, root: str, walk: Walk) -> None:
    """fsspec's walk done here, folders in parallel, so that a folder ``ls``
    fails on is recorded."""
    base = root.rstrip("/")

    def visit(folder: str) -> list[_Folder]:
        found = walk.part()
        below: list[_Folder] = []
        try:
            infos = fs.ls(folder, detail=True)
        except FileNotFoundError:
            if folder == root:
                raise
            return below  # removed while we listed
        except Exception as exc:
            if folder == root:
                raise
            found.unreadable.append((folder[len(base) + 1:], _reason(exc)))
            walk.merge(found)
            return below
        for info in infos:
            name = str(info["name"]).rstrip("/")
            if name == folder.rstrip("/"):
                if info.get("type") != "directory":
                    found.found[name] = info
                continue
            if info.get("type") != "directory":
                found.found[name] = info
                continue
            rel = name[len(base) + 1:] if name.startswith(base + "/") else name
            if found.enter(rel, posixpath.basename(name)):
                below.append(name)
        walk.merge(found)
        return below

    walk_folders(root, visit)

