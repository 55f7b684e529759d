"""A cache root's namespaces: one folder per source, the record of which
source each holds, their lock folders, and the trash they are deleted through.

The records (``.ucstage/namespaces/<ns>.json``) are what ``cache status``,
``verify`` and ``clear`` find sources by (:func:`ucstage.cache.maintenance.find`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import uuid
from datetime import datetime, timezone

from ..atomic import write_atomic
from . import paths
from .locks import FileLock
from .scan import unlink_if_exists

__all__ = ["Namespaces"]


class Namespaces:
    """The namespaces of one cache root, and which of them this process has
    named and prepared (remembered so a copy asks the disk once per process).

    Args:
        root: a cache root already opened by :func:`ucstage.cache.paths.open_root`.
    """

    def __init__(self, root: str) -> None:
        self.root = root
        self._control = os.path.join(root, paths.CONTROL)
        self._dirs: dict[str, str] = {}
        self._prepared: set[str] = set()
        # Writes happen under it; reads (a dict lookup, a set test) take none:
        # they are atomic in CPython and a missed entry only costs a recompute.
        self._lock = threading.Lock()

    def dir(self, url: str) -> str:
        """``<root>/<namespace>`` for a source's resolved URL (not created)."""
        path = self._dirs.get(url)
        if path is None:
            path = os.path.join(self.root, paths.namespace_name(url))
            with self._lock:
                self._dirs[url] = path
        return path

    def dirs(self) -> list[str]:
        """Every namespace folder under the root, by name (the control folder is hidden)."""
        return [e.path for e in sorted(os.scandir(self.root), key=lambda e: e.name)
                if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")]

    def prepare(self, ns_dir: str, *, url: str, source: str) -> str:
        """Create a namespace folder and its lock folder, and record which
        source it holds (once; the record is written atomically). Return it."""
        if ns_dir in self._prepared:
            return ns_dir
        os.makedirs(ns_dir, mode=0o700, exist_ok=True)
        os.makedirs(paths.lock_dir(self.root, ns_dir), mode=0o700, exist_ok=True)
        record = paths.record_path(self.root, ns_dir)
        if not os.path.exists(record):
            os.makedirs(os.path.dirname(record), mode=0o700, exist_ok=True)
            write_atomic(record, json.dumps(
                {"namespace": os.path.basename(ns_dir), "url": url, "source": source,
                 "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}))
        with self._lock:
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

    def remove(self, ns_dir: str) -> bool:
        """Delete one namespace folder, its record and its lock files; False
        when it was not there. The folder is renamed into the trash first, so
        it disappears at once; files already open stay readable (POSIX unlink)."""
        if not os.path.isdir(ns_dir):
            return False
        staged = self.trash_name()
        os.rename(ns_dir, staged)
        shutil.rmtree(staged, ignore_errors=True)
        with self._lock:
            self._prepared.discard(ns_dir)
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
