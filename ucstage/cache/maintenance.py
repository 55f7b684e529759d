"""Cache maintenance: status, verify, clear and prune.

The bodies of the :class:`ucstage.cache.LocalCache` methods of the same names;
nothing on the fetch path uses them. Each takes the cache's
:class:`~ucstage.cache.space.CacheSpace` and the plain settings it needs (the
byte cap, the lease), and reaches the disk only through the space's public
methods.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import posixpath
from collections.abc import Sequence
from typing import Any

from ..engines.checks import file_checksum, recorded
from ..errors import CacheError, InvalidArgument, SourceNotFound
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
from .reports import (
    CacheStatus,
    ClearReport,
    NamespaceStatus,
    PruneReport,
    SourceCheck,
    VerifyReport,
    show_version,
)
from .space import CacheSpace, free_bytes

__all__ = ["Volumes", "clear", "find", "prune", "status", "verify"]

Volumes = Volume | Sequence[Volume] | None
"""What status and clear cover: one volume, several (:func:`find`'s), or every
cached source (None)."""


def _namespaces(space: CacheSpace, volumes: Volumes) -> dict[str, Volume | None]:
    """namespace folder -> its volume: the given volumes' folders, or every one."""
    if volumes is None:
        return dict.fromkeys(space.namespace_dirs())
    if isinstance(volumes, Volume):
        volumes = [volumes]
    return {space.namespace_dir(v.url): v for v in volumes}


def find(space: CacheSpace, source: str) -> list[Volume]:
    """See :meth:`ucstage.cache.LocalCache.find`."""
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


def status(space: CacheSpace, volumes: Volumes, *, max_bytes: int | None,
           locked: bool = True) -> CacheStatus:
    """See :meth:`ucstage.cache.LocalCache.status`; ``max_bytes`` is the cache's
    cap; without ``locked``, counted without the ledger lock (a root that
    cannot be written)."""
    sources = space.sources()
    rows = []
    for ns_dir, volume in _namespaces(space, volumes).items():
        name = os.path.basename(ns_dir)
        found = space.tally([ns_dir], locked=locked)
        given, url = sources.get(name, (volume.source, volume.url) if volume else ("", ""))
        rows.append(NamespaceStatus(name, given, url, ns_dir, found.files, found.bytes,
                                    found.partial_files))
    return CacheStatus(space.root, sum(r.entries for r in rows), sum(r.bytes for r in rows),
                       max_bytes, free_bytes(space.root), rows, runstats.last_run(space.root))


def verify(space: CacheSpace, volume: Volume | None, entries: Sequence[FileEntry] | None, *,
           checksum: bool, complete: bool | None = None, fix: bool = False) -> VerifyReport:
    """See :meth:`ucstage.cache.LocalCache.verify`."""
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


def clear(space: CacheSpace, volumes: Volumes) -> ClearReport:
    """See :meth:`ucstage.cache.LocalCache.clear`."""
    ns_dirs = list(_namespaces(space, volumes))
    found = space.tally(ns_dirs)
    names = space.remove_namespaces(ns_dirs)
    if volumes is None:
        # Listings VolumeDataset froze belong to the whole cache, and so do the
        # lock folders and records older clears left: clearing everything must
        # not leave them to pile up.
        space.remove_frozen_listings()
        space.remove_orphans()
    return ClearReport(names, found.files, found.bytes)


def prune(space: CacheSpace, max_bytes: int, *, lease_ns: int) -> PruneReport:
    """See :meth:`ucstage.cache.LocalCache.prune`; files handed out within
    ``lease_ns`` nanoseconds stay."""
    if max_bytes < 0:
        raise CacheError(f"max_bytes must be 0 or more, got {max_bytes}")
    return PruneReport(max_bytes, *space.evict_to(max_bytes, lease_ns))


def _content_problem(volume: Volume, relpath: str, local: str) -> str:
    """Why a cached copy's bytes are wrong ('' when they are right): against
    the checksum recorded when it was copied (checked against the store
    then), else against the source's bytes, read again."""
    kept = recorded(local)
    if kept:
        kind = kept.partition(":")[0]
        if file_checksum(local, kind) != kept:
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
