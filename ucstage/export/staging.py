"""A Delta table on an object store, staged for Spark through ucstage's cache.

Spark here has no ``s3a``, ``gs`` or ``abfs`` connector (docs/design.md,
"Delta without Maven"), so export reads such a table from local files: the
version's live data files are copied into the cache (:meth:`LocalCache.warm
<ucstage.cache.LocalCache.warm>`: whole files, each checked against the
store's checksums, hedged, under the cap, Ctrl-C stopping it within about
2 s) and Spark is handed the cached copies in place of the store's URLs. The
cache is the only local copy. Each copy is *held*
(:class:`ucstage.cache.leases.Reader`: a shared ``flock``, which eviction
skips) until the export is over, so nothing evicts a file Spark is reading;
files that cannot all fit under the cap at once are refused before Spark
starts.

The state Spark reads (:func:`ucstage.export.deltaread.delta_dataframe`)
keeps every list in the version's file order, so file ``i``'s partition
values and deletion vector (inlined: fetched through the same cache and
checked) still belong to file ``i``, now named by its cached path.
"""

from __future__ import annotations

import dataclasses
import resource
from collections.abc import Iterator
from contextlib import contextmanager

from ..cache import LocalCache
from ..cache.leases import Reader
from ..cache.paths import CACHE_DIR_ENV
from ..cache.space import free_bytes
from ..errors import CacheError, CacheFull, FetchFailed
from ..progress import Callback
from ..tables.delta import TableState
from ..tables.logpaths import shown
from ..tables.resolve import StoreDelta
from ..tables.storedelta import inline_vectors
from ..units import format_bytes

__all__ = ["staged"]

_SPARE_FDS = 256
"""Descriptors left for everything else once the holds are open (Spark's
client, the cache's locks, the store's connections)."""


def _check_room(found: StoreDelta, cache: LocalCache) -> None:
    """Refuse at once a table whose live files cannot all sit in the cache
    together: over the cap, or over the free disk (what is not cached yet)."""
    label, entries = found.store.label, found.entries
    total = sum(e.size for e in entries)
    if cache.max_bytes is not None and total > cache.max_bytes:
        raise CacheFull(
            f"table {shown(label)}: its {len(entries):,} live data files total "
            f"{format_bytes(total)}, more than the cache cap {format_bytes(cache.max_bytes)}; "
            "export holds them all in the cache while Spark reads them",
            hint=f"raise the cap (UCSTAGE_CACHE_MAX_BYTES) to at least {format_bytes(total)}; "
                 "nothing was written")
    volume = found.store.volume
    need = sum(e.size for e in entries if cache.lookup(volume, e, touch=False) is None)
    free = free_bytes(cache.root)
    if need > free:
        raise CacheFull(
            f"table {shown(label)}: its live data files need {format_bytes(need)} more in the "
            f"cache folder {shown(cache.root)}, which has {format_bytes(free)} free",
            hint=f"free space, or point {CACHE_DIR_ENV} at a larger disk; nothing was written")


def _check_descriptors(files: int) -> None:
    """One open descriptor holds each file: raise the soft limit as far as
    needed (up to the hard one), else refuse before fetching anything."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = files + _SPARE_FDS
    if soft == resource.RLIM_INFINITY or want <= soft:
        return
    if hard == resource.RLIM_INFINITY or want <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        return
    raise CacheError(
        f"the table has {files:,} live data files; export holds each one open while Spark "
        f"reads it, and this process may open at most {hard:,} files",
        hint="raise the open-files limit (ulimit -n), or compact the table (OPTIMIZE)")


@contextmanager
def staged(found: StoreDelta, cache: LocalCache, callback: Callback) -> Iterator[TableState]:
    """The version of ``found`` with its files copied into ``cache`` and held
    there while the block runs: a :class:`TableState` naming the cached
    copies (``path``: the table's folder in the cache), vectors inlined.

    ``callback`` hears the copying as :meth:`LocalCache.warm
    <ucstage.cache.LocalCache.warm>` reports it, after a description.

    Raises:
        CacheFull: the files cannot all fit under the cap or on the disk
            (before anything is fetched), or no room could be made meanwhile.
        FetchFailed: files could not be copied after retries.
        CacheError: more files than this process may hold open.
        MissingDataFiles, UnreadableDeltaLog: a deletion vector that is gone
            or does not match its descriptor.
        KeyboardInterrupt: stopped; copies in flight are finished or removed.
    """
    state, volume, entries = found.state, found.store.volume, found.entries
    _check_room(found, cache)
    _check_descriptors(len(entries))
    total = sum(e.size for e in entries)
    vectors = inline_vectors(found.store, found.rel,
                             state.deletion_vectors or [None] * len(entries), cache.fetch)
    callback.set_description(f"fetching the table's {len(entries):,} live files "
                             f"({format_bytes(total)}) into the cache")
    report = cache.warm(volume, entries, callback=callback)
    if report.failed:
        path, why = report.failed[0]
        more = f" (and {len(report.failed) - 1:,} more)" if len(report.failed) > 1 else ""
        raise FetchFailed(f"table {shown(found.store.label)}: data file {shown(path)} could not "
                          f"be fetched: {why}{more}",
                          hint="nothing was written; rerun to retry (the files fetched stay "
                               "cached)")
    reader = Reader(None, holding=True)
    try:
        # A hit is held at once; a file evicted since the warm copied it
        # (only when everything else under the cap was held) is copied again.
        bound = cache.at(volume)
        held = reader.fetcher(bound, bound.fetch_missing)
        local = [held(e) for e in entries]
        yield dataclasses.replace(state, path=cache.namespace_dir(volume), files=local,
                                  deletion_vectors=vectors)
    finally:
        reader.close()
