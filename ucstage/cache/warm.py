"""What the cache commands of the CLI call on a SOURCE: a warm of some ranks'
files, and the cache seen from a SOURCE (what it holds, checking it, a lazy
job's environment).

The copies of a warm are :meth:`ucstage.LocalCache.warm`'s (its body,
:func:`ucstage.cache.fetch.warm_entries`, is beside the fetch protocol's two
drivers); here are the pieces above it: which ranks' files a warm covers
(:func:`rank_slice`, the slot rule applied to a warm; docs/cache.md,
"``ucstage cache warm SOURCE``") and what the cache holds for a SOURCE as
:func:`ucstage.source.open_source` decided it (:func:`cached_volumes`,
:func:`verify_source`, :func:`job_env`, :func:`unusable_status`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..errors import CacheFull, CacheUnusable, InvalidArgument, SourceNotFound
from ..manifest import Manifest
from ..progress import NO_PROGRESS, Callback
from ..sharding import Layout, ReadOrder, rank_entries
from ..source import ManifestSource, Source, VolumeSource, open_source
from ..volumes import VOLUMES_ROOT_ENV, FileEntry, Volume, is_volumes_path
from .fetch import WARM_FEWER
from .local import MAX_BYTES_ENV, LocalCache, env_max_bytes
from .paths import CACHE_DIR_ENV, user_root
from .reports import CacheStatus, RankSlice, SourceCheck, VerifyReport, WarmReport
from .space import free_bytes
from .tuning import AUTO

if TYPE_CHECKING:
    from ..manifest.groups import Groups

__all__ = ["WARM_FEWER", "cached_volumes", "job_env", "rank_slice", "share_text",
           "unusable_status", "verify_source", "warm_ranks", "warm_slice"]

# -- a warm of some ranks' files: which ranks, the slice of the listing ---------
#
# The numbering is torchrun's (:meth:`ucstage.sharding.Layout.node_ranks`), the
# files the slot rule's (:func:`ucstage.sharding.rank_entries`); with shuffle
# under the "node" scope a warm covers its nodes' whole share, and says so.

def warm_ranks(rank: int | None = None, node_rank: int | None = None, *,
               world_size: int | None = None, num_workers: int | None = None,
               nproc_per_node: int | None = None) -> list[int] | None:
    """The ranks a warm covers: ``[rank]``, every rank of node ``node_rank``
    (``nproc_per_node`` ranks each, as torchrun numbers them), or None (neither:
    the whole source).

    Raises:
        InvalidArgument: both ranks given, a job shape without a rank, a rank
            without ``world_size`` and ``num_workers``, ``node_rank`` without
            ``nproc_per_node``, or a node outside the job.
    """
    # Messages name the parameters; in backquotes where a plain word would read
    # as the thing (the CLI says each as its flag, ucstage.cli.output.flag_names).
    if rank is None and node_rank is None:
        if world_size is not None or num_workers is not None or nproc_per_node is not None:
            raise InvalidArgument("world_size/num_workers/nproc_per_node need `rank` "
                                  "or node_rank")
        return None
    if rank is not None and node_rank is not None:
        raise InvalidArgument("give `rank` or node_rank, not both")
    if world_size is None or num_workers is None:
        raise InvalidArgument("`rank` and node_rank need world_size and num_workers",
                              hint="e.g. `rank` 3 world_size 8 num_workers 6")
    if rank is not None:
        return [rank]
    if nproc_per_node is None:
        raise InvalidArgument("node_rank needs nproc_per_node P (ranks per node)")
    assert node_rank is not None
    return list(Layout(world_size, num_workers, nproc_per_node).node_ranks(node_rank))


def rank_slice(entries: Sequence[FileEntry], ranks: Sequence[int], layout: Layout,
               order: ReadOrder, groups: Groups | None = None
               ) -> tuple[list[FileEntry], RankSlice]:
    """The entries ``ranks`` read (:func:`ucstage.sharding.rank_entries`) and the
    :class:`RankSlice` that says so. With ``order.shuffle`` under the node
    scope, that is the whole share of the ranks' nodes (``RankSlice.nodes``).
    With ``groups`` (a grouped manifest's), the slot rule deals samples
    (``order.n`` is their count) and every member of each is taken."""
    share = order.shuffle and order.shuffle_scope == "node"
    nodes = sorted({layout.node_of(r) for r in ranks}) if share else None
    found = RankSlice(list(ranks), layout, order, nodes)
    if groups is None:
        return rank_entries(entries, ranks, layout, order), found
    picked = rank_entries(range(groups.count), ranks, layout, order)
    return [entries[int(r)] for r in groups.rows(picked)], found


def share_text(nodes: Sequence[int], layout: Layout) -> str:
    """``node 1's whole share (ranks 8..15)``: the nodes a node-scope warm covers."""
    if layout.nodes == 1:
        return "the whole share of the job's one node (every file)"
    ranks = ", ".join(f"{r[0]}..{r[-1]}" for r in map(layout.node_ranks, nodes))
    which = f"node {nodes[0]}'s" if len(nodes) == 1 else \
        "nodes " + ", ".join(str(n) for n in nodes) + "'"
    return f"{which} whole share (ranks {ranks})"


def warm_slice(cache: LocalCache, volume: Volume, entries: Sequence[FileEntry],
               rank_slice: RankSlice | None = None, *, jobs: int | str = AUTO,
               callback: Callback = NO_PROGRESS) -> WarmReport:
    """:meth:`LocalCache.warm` of the entries :func:`rank_slice` chose (or of a
    whole source, ``rank_slice`` None).

    Raises:
        CacheFull: as :meth:`LocalCache.warm`; for a node's whole share the
            message names the share and the hint what makes it fit, since the
            node reads those files every epoch.
    """
    try:
        return cache.warm(volume, entries, jobs=jobs, callback=callback)
    except CacheFull as exc:
        if rank_slice is None or rank_slice.nodes is None:
            raise
        raise CacheFull(
            f"{share_text(rank_slice.nodes, rank_slice.layout)} does not fit: {exc.message}",
            hint="the node reads these files every epoch; give it a cache that holds them "
                 "(raise max_bytes, a larger disk) or run on more nodes; shuffle_scope "
                 "global needs one epoch's slice but fetches again every epoch") from exc


# -- the cache seen from a SOURCE: the bodies of `ucstage cache status/clear/verify/lazy`,
# on the SOURCE as :func:`ucstage.source.open_source` decided it.

def unusable_status(exc: CacheUnusable, source: str | None = None) -> CacheStatus:
    """What ``cache status`` can still say of a root :class:`LocalCache` refused
    (``exc``): the namespaces found under it (of ``source``, or all), counted
    without writing or locking anything, and why it is unusable
    (:attr:`CacheStatus.unusable`). A root that is no folder holds nothing."""
    root = exc.root
    cap = env_max_bytes()
    if not os.path.isdir(root):
        parent = os.path.dirname(root)
        while parent and not os.path.isdir(parent):
            parent = os.path.dirname(parent)
        return CacheStatus(root, 0, 0, cap, free_bytes(parent or "/"), [],
                           unusable=exc.message)
    cache = LocalCache.unopened(root, max_bytes=cap)
    found = cache.status(cached_volumes(cache, source))
    return dataclasses.replace(found, unusable=exc.message)


def cached_volumes(cache: LocalCache, source: str | None) -> list[Volume] | None:
    """The cached volumes ``source`` names, or None (no ``source``) for every one.

    Found as the cache recorded them (:meth:`LocalCache.find`): a source that
    is gone still names its namespace (clearing the cache of a deleted volume
    works), and a ``/Volumes/...`` path is found whatever
    $UCSTAGE_VOLUMES_ROOT says now. A manifest names its source.

    Raises:
        SourceNotFound: ``source`` neither exists nor has anything cached
            (most likely a typo).
    """
    if source is None:
        return None
    opened = open_source(source)
    if isinstance(opened, ManifestSource):
        source = opened.manifest.source
    found = cache.find(source)
    if found:
        return found
    try:
        return [opened.volume()]
    except SourceNotFound as exc:
        raise SourceNotFound(f"nothing cached for {source} (and {source} does not exist)",
                             hint="`ucstage cache status` lists the cached sources") from exc


def verify_source(cache: LocalCache, source: Source | None, *, checksum: bool = False,
                  include: Sequence[str] = (), exclude: Sequence[str] = (),
                  include_hidden: bool = False, skip_unreadable: bool = False,
                  listed: Callable[[Manifest], None] | None = None,
                  fix: bool = False) -> VerifyReport:
    """:meth:`LocalCache.verify` of what the cache holds for ``source``, or
    (None) of every cached source, each against a fresh listing.

    A volume is checked against where the cache copied it from, as
    :meth:`LocalCache.find` finds it (a ``/Volumes`` path may map elsewhere
    now), one :class:`~ucstage.cache.reports.SourceCheck` per place; a
    manifest, or a volume with nothing cached, against its own listing. The
    filters apply to those listings; ``listed`` hears each one made (to
    warn of the entries and folders it skipped). Orphans (cached files the
    source no longer has) are reported against an unfiltered fresh listing
    only, and deleted with ``fix``; a cached place that no longer exists is
    reported ``vanished``.
    """
    if source is None:
        return cache.verify(checksum=checksum, fix=fix)
    found = cache.find(source.text) if isinstance(source, VolumeSource) else []
    # A manifest is the source as it was; a filtered listing a part of it.
    complete = isinstance(source, VolumeSource) and not (include or exclude or skip_unreadable)

    def snapshot(opened: Source) -> Manifest:
        m = opened.snapshot(include=include, exclude=exclude, include_hidden=include_hidden,
                            skip_unreadable=skip_unreadable)
        if listed is not None:
            listed(m)
        return m

    if not found:
        m = snapshot(source)
        return cache.verify(m.volume(), m.entries, checksum=checksum, complete=complete, fix=fix)
    report = VerifyReport([], checksum)
    for volume in found:
        try:
            m = snapshot(open_source(volume.url))
        except SourceNotFound as exc:
            report.sources.append(SourceCheck(volume.source, vanished=exc.message))
            continue
        label = volume.source if is_volumes_path(volume.source) else m.source
        checked = cache.verify(dataclasses.replace(m.volume(), source=label), m.entries,
                               checksum=checksum, complete=complete, fix=fix)
        report.sources.extend(checked.sources)
    return report


def job_env(manifest: Manifest, cache: LocalCache) -> dict[str, str]:
    """The variables a training job needs to read ``manifest`` through ``cache``:
    the ones this process used that differ from the defaults."""
    env = {}
    root = os.environ.get(VOLUMES_ROOT_ENV, "")
    if is_volumes_path(manifest.source) and root:
        env[VOLUMES_ROOT_ENV] = root  # the manifest names /Volumes/...; this maps it
    if cache.root != user_root():
        env[CACHE_DIR_ENV] = cache.root
    cap = MAX_BYTES_ENV
    if os.environ.get(cap, "").strip():
        env[cap] = os.environ[cap].strip()
    return env
