"""Cache maintenance: status, verify, clear and prune.

These are the bodies of the :class:`ucstage.cache.LocalCache` methods of the
same names, which call them; nothing on the fetch path uses them. They take
the cache itself because they read and reset its per-process state (the
prepared namespaces and the stamp memo). Call them through ``LocalCache``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import CacheError
from ..volumes import FileEntry, Volume, safe_relpath
from . import layout as cd
from .locks import FileLock, stripe_path
from .reports import CacheStatus, ClearReport, NamespaceStatus, PruneReport, VerifyReport
from .space import free_bytes, trash_name, unlink_if_exists

if TYPE_CHECKING:
    from .local import LocalCache

__all__ = ["clear", "prune", "status", "verify"]


def _sources(control: str) -> dict[str, tuple[str, str]]:
    """namespace -> (source as given, resolved URL), from ``LocalCache.prepare``'s records."""
    found: dict[str, tuple[str, str]] = {}
    folder = os.path.join(control, "namespaces")
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as fh:
                record = json.load(fh)
            found[name[:-5]] = (str(record.get("source") or record["url"]), str(record["url"]))
        except (OSError, ValueError, KeyError, AttributeError):
            continue
    return found


def status(cache: LocalCache, volume: Volume | None) -> CacheStatus:
    """See :meth:`LocalCache.status`."""
    sources = _sources(cache._control)
    rows = []
    for ns_dir in cache._namespaces(volume):
        name = os.path.basename(ns_dir)
        found = list(cache._walk([ns_dir]))
        files = [c for c in found if not c.partial]
        given, url = sources.get(name, (volume.source, volume.url) if volume else ("", ""))
        rows.append(NamespaceStatus(
            name, given, url, ns_dir,
            len(files), sum(c.size for c in files), len(found) - len(files)))
    total = sum(r.bytes for r in rows)
    return CacheStatus(cache.root, sum(r.entries for r in rows), total, cache.max_bytes,
                       free_bytes(cache.root), rows)


def verify(cache: LocalCache, volume: Volume, entries: Sequence[FileEntry] | None,
           checksum: bool) -> VerifyReport:
    """See :meth:`LocalCache.verify`."""
    if entries is None:
        from ..volumes import list_files

        entries = list_files(volume).entries
    ns_dir = cache.namespace_dir(volume)
    report = VerifyReport(removed_partial_files=cache._sweep(ns_dir))
    for e in entries:
        report.checked += 1
        rel = safe_relpath(e.path)
        local = os.path.join(ns_dir, *rel.split("/"))
        try:
            st = os.stat(local)
        except FileNotFoundError:
            report.missing += 1
            continue
        stamp = cd.read_stamp(local)
        problem = ""
        if stamp is None:
            problem = "no validity stamp"
        elif stamp[0] != st.st_size:
            problem = f"{st.st_size} bytes on disk, {stamp[0]} copied"
        elif stamp != (e.size, e.version):
            report.stale.append((e.path, f"source is now {e.size} bytes version "
                                         f"{e.version!r}; cached {stamp[0]} bytes version "
                                         f"{stamp[1]!r}"))
        elif checksum and _digest_local(local) != _digest_source(volume, e.path):
            problem = "content differs from the source (sha256)"
        else:
            report.ok += 1
        if problem:
            report.corrupt.append((e.path, problem))
            # A copy known to be corrupt must not be handed out again; its stamp
            # may still match the source, so only deleting it makes warm refetch it.
            if _discard(cache, ns_dir, rel, local, st):
                report.removed.append(e.path)
    return report


def _discard(cache: LocalCache, ns_dir: str, rel: str, local: str, seen: os.stat_result) -> bool:
    """Delete the cached file ``local`` if it is still the one ``seen``; True when gone.

    Takes the entry's stripe (no copy of it is running) and the ledger lock
    (renames happen under it, and the byte count drops with the file).
    """
    with FileLock(stripe_path(cache._lock_dir(ns_dir), rel)), cache._ledger() as ledger:
        try:
            st = os.stat(local)
        except FileNotFoundError:
            return True
        if (st.st_ino, st.st_dev) != (seen.st_ino, seen.st_dev):
            return False  # refetched meanwhile: a new copy, not the one checked
        used = ledger.read()  # before the rename: a recount must still see the file
        staged = trash_name(cache._control)
        os.rename(local, staged)
        os.unlink(staged)
        ledger.write(used - st.st_size)
    with cache._lock:
        cache._memo.pop(local, None)
    return True


def clear(cache: LocalCache, volume: Volume | None) -> ClearReport:
    """See :meth:`LocalCache.clear`."""
    ns_dirs = cache._namespaces(volume)
    found = [c for c in cache._walk(ns_dirs) if not c.partial]
    names = []
    for ns_dir in ns_dirs:
        if not os.path.isdir(ns_dir):
            continue
        staged = trash_name(cache._control)
        os.rename(ns_dir, staged)  # disappears at once, then is deleted
        shutil.rmtree(staged, ignore_errors=True)
        names.append(os.path.basename(ns_dir))
        cache._prepared.discard(ns_dir)
        unlink_if_exists(os.path.join(cache._control, "namespaces", names[-1] + ".json"))
    if volume is None:
        # Listings VolumeDataset froze (ucstage.data.dataset) belong to the whole cache:
        # clearing everything must not leave them to pile up.
        shutil.rmtree(os.path.join(cache._control, "manifests"), ignore_errors=True)
    with cache._lock:
        cache._memo.clear()
    with cache._ledger() as ledger:
        ledger.write(sum(c.size for c in cache._walk(cache._namespaces(None))))
    return ClearReport(names, len(found), sum(c.size for c in found))


def prune(cache: LocalCache, max_bytes: int) -> PruneReport:
    """See :meth:`LocalCache.prune`."""
    if max_bytes < 0:
        raise CacheError(f"--max-bytes must be 0 or more, got {max_bytes}")
    with cache._ledger() as ledger:
        for ns_dir in cache._namespaces(None):
            cache._sweep(ns_dir)
        found = [c for c in cache._walk(cache._namespaces(None)) if not c.partial]
        before = sum(c.size for c in found)
        after = cache._evict_lru(ledger, max_bytes)
        remaining = {c.path for c in cache._walk(cache._namespaces(None))}
    removed = [c for c in found if c.path not in remaining]
    cutoff = time.time_ns() - cache.lease_ns
    in_use = sum(c.size for c in found if c.path in remaining and c.atime_ns > cutoff)
    return PruneReport(max_bytes, before, after, len(removed),
                       sum(c.size for c in removed), in_use)


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
