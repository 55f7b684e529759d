"""A warm of some ranks' files: which ranks (one, or a node's), the slice of
the listing they read, and warming it.

The numbering is torchrun's (:meth:`ucstage.sharding.Layout.node_ranks`) and the
files are the slot rule's (:func:`ucstage.sharding.rank_entries`); this
module applies them to a warm. With ``shuffle`` under the ``"node"`` scope a
warm covers the whole share of the ranks' nodes, the same files every epoch,
and its errors say so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import CacheFull, InvalidArgument
from ..progress import NO_PROGRESS, Callback
from ..sharding import Layout, ReadOrder, rank_entries
from ..volumes import FileEntry, Volume
from .local import LocalCache
from .reports import RankSlice, WarmReport
from .tuning import AUTO

if TYPE_CHECKING:
    from ..manifest.groups import Groups

__all__ = ["rank_slice", "share_text", "warm_ranks", "warm_slice"]


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
