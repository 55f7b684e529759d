""":class:`ShardDataset`: samples inside shard files (WebDataset tar shards,
JSON Lines, text line files), sharded by the slot rule down to ranges of
samples within a shard.

The third kind of the sharded-dataset base, built as
:class:`~ucstage.data.table.TableDataset` is: at :meth:`freeze` (rank 0 in a
job, broadcast) every shard is fetched whole into the cache and indexed once
(:mod:`ucstage.shardfiles`) into a shard manifest
(:class:`~ucstage.manifest.shardsamples.ShardManifest`), whose *blocks* (runs
of at most ``block_samples`` samples of one shard) are what the slot rule
deals, as a table's row groups are. Each slot reads its blocks' shards
through the cache (``read_ahead`` blocks ahead), samples window by window
(:mod:`ucstage.data.shardread`); checkpoint state is exact to the sample
(:mod:`ucstage.data.tablestate`, unit ``"sample-block"``).

Usage and every argument: docs/training.md, "Samples inside files".
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from .. import params
from ..errors import InvalidArgument
from ..manifest.shardsamples import ShardManifest
from ..shardfiles.shardformat import format_of
from ..shardfiles.shardindex import ON_ERROR
from ..shardfiles.sourceindex import DEFAULT_BLOCK_SAMPLES, index_source
from ..sharding import DEFAULT_SHUFFLE_SCOPE, ReadOrder
from ..tables.rowplan import equal_batches
from .frozen import Freezable, Request
from .sharded import ShardedDataset, rule_order
from .shardread import IndexedShards, slot_samples
from .tablebatches import slot_totals
from .tablestate import TableTracker
from .unitcounts import UnitCounts

if TYPE_CHECKING:
    from ..cache import LocalCache
    from ..volumes import Volume
    from .looppos import LoopView

__all__ = ["ShardDataset"]


DEFAULT_BUFFER = 2048
DEFAULT_READ_AHEAD = 2


class ShardDataset(UnitCounts, Freezable, ShardedDataset):
    """Samples inside shard files, sharded over ranks and workers by sample ranges.

    Args:
        source: a volume path (``/Volumes/...``), an ``s3://``/``gs://``/
            ``az://`` URL or other fsspec URL, a local folder, or a manifest.
        format: ``"tar"``, ``"jsonl"`` or ``"lines"`` for every file; default:
            by each file's suffix (``.tar``, ``.tar.gz``, ``.tgz``; ``.jsonl``,
            ``.jsonl.gz``, ``.ndjson``; ``.txt``, ``.txt.gz``), other files
            left out (one warning).
        include, exclude: globs, as for ``VolumeDataset``.
        block_samples: samples per block, the unit the slot rule deals
            (a shard is cut into blocks from its first sample).
        shuffle, seed, shuffle_scope, nproc_per_node: as for ``VolumeDataset``,
            over shards: a seeded order of shards, each shard's blocks kept
            together (under ``"node"`` a node keeps whole shards every
            epoch); with ``shuffle`` a slot's samples are also shuffled
            within windows of ``shuffle_buffer`` samples (whole blocks), the
            buffer across the shards the slot has open.
        shuffle_buffer: samples held and shuffled together (rounded up to
            whole blocks).
        read_ahead: blocks whose shards are fetched ahead of the consumer.
        equal_length: ``"pad"`` (or True) or ``"drop"``: every slot yields the
            same number of samples.
        on_error: ``"raise"`` (default) or ``"skip"``: a JSON line that does
            not parse is counted and warned of instead of raising.
        cache, cache_dir, max_bytes: the local cache, as for ``VolumeDataset``.
    """

    state_unit = "sample-block"
    tracker_kind = TableTracker
    batch_rows = 1
    """The unit the shared counts count per item yielded: one sample
    (:mod:`ucstage.data.unitcounts`)."""
    audit_by_unit = True
    """The exactly-once audit (and ``epoch_files``) counts samples."""
    grouped_order = True
    """Its read order has ``groups`` (each shard's blocks), which a saved state
    does not hold: a loaded state's order gets them back
    (:func:`ucstage.data.state.with_groups`)."""

    def __init__(self, source: str | os.PathLike[str], *, format: str | None = None,
                 include: str | Sequence[str] = (), exclude: str | Sequence[str] = (),
                 block_samples: int = DEFAULT_BLOCK_SAMPLES, shuffle: bool = False, seed: int = 0,
                 shuffle_scope: str = DEFAULT_SHUFFLE_SCOPE,
                 shuffle_buffer: int = DEFAULT_BUFFER, nproc_per_node: int | None = None,
                 read_ahead: int = DEFAULT_READ_AHEAD, equal_length: bool | str | None = False,
                 on_error: str = "raise", cache: LocalCache | None = None,
                 cache_dir: str | os.PathLike[str] | None = None,
                 max_bytes: int | str | None = None) -> None:
        self.block_samples = params.whole(block_samples, "block_samples", minimum=1)
        self.shuffle_buffer = params.whole(shuffle_buffer, "shuffle_buffer", minimum=1)
        self.read_ahead = params.whole(read_ahead, "read_ahead")
        if format is not None:
            format_of("", format)  # checks the name
        if on_error not in ON_ERROR:
            raise InvalidArgument(f"on_error must be one of {', '.join(map(repr, ON_ERROR))}, "
                                  f"got {on_error!r}")
        self.format, self.on_error = format, on_error
        self.include = params.strings(include, "include")
        self.exclude = params.strings(exclude, "exclude")
        self._use_cache(cache, cache_dir, max_bytes)
        super().__init__(rule_order(shuffle, seed, shuffle_scope, equal_length), nproc_per_node)
        self._source = os.fspath(source)
        self._manifest: ShardManifest | None = None
        self._manifest_path: str | None = None
        self._fingerprint: str | None = None
        self._volume = None

    @property
    def shuffle_window(self) -> int:
        """Blocks per shuffle window: ``shuffle_buffer`` samples, rounded up."""
        return max(1, -(-self.shuffle_buffer // self.block_samples))

    # -- the frozen index -------------------------------------------------------

    _kind = ShardManifest
    _changed = ("the shards of {source} changed since they were indexed "
                "(fingerprint {found}, expected {expected})")
    _freeze_hint = ("freeze once and pass the same listing to every rank (the ucstage "
                    "DataLoader broadcasts rank 0's)")

    def _request(self) -> Request:
        return (("source", self._source), ("format", self.format),
                ("include", self.include), ("exclude", self.exclude),
                ("block_samples", self.block_samples))

    def _list(self) -> ShardManifest:
        """The source listed, every shard fetched into the cache and indexed."""
        return index_source(self._source, fetch=self.cache().fetch, format=self.format,
                            include=self.include, exclude=self.exclude,
                            block_samples=self.block_samples)

    def _get_volume(self) -> Volume:
        return self.freeze().volume()

    def _item_count(self) -> int:
        return len(self.freeze())

    def read_order(self) -> ReadOrder:
        """This epoch's read order over the frozen blocks (freezes them): the
        manifest's, which ``shard-plan --unit sample`` deals too."""
        return self.freeze().read_order(super().read_order())

    @property
    def _dealt_equal(self) -> str | None:
        # Blocks are dealt whole, none padded or dropped: equal_length counts samples.
        return None

    # -- length ----------------------------------------------------------------

    def __len__(self) -> int:
        """Samples this process yields per epoch: a worker's slot, or the
        rank's slots in the main process (for :attr:`num_workers` workers)."""
        if self._fingerprint is None:
            raise TypeError("len(ShardDataset) needs the indexed shards: call freeze() "
                            "first (the ucstage DataLoader does it), or iterate once")
        return self.unit_length()

    def __repr__(self) -> str:
        frozen = f"fingerprint={self._fingerprint[:12]}" if self._fingerprint else "not frozen"
        return (f"ShardDataset({self._source!r}, format={self.format!r}, "
                f"shuffle={self.shuffle}, seed={self.seed}, epoch={self.epoch}, {frozen})")

    def indexed(self) -> IndexedShards:
        """A map-style ``torch.utils.data.Dataset`` over the same samples:
        ``len()`` and ``[i]``, sample ``i`` of the frozen order read through
        the cache, for evaluation, torch samplers and ``DataLoader(shuffle=True)``
        (freezes the shards)."""
        self.freeze()
        return IndexedShards(self)

    # -- as a Mix source: its items are samples ---------------------------------

    def mix_items(self) -> int:
        """Items a :class:`~ucstage.Mix` deals of it: its samples (freezes)."""
        return int(self.freeze().samples)

    def iter_rows(self, rows: Any, rank: int, *, sharers: int = 1) -> Iterator[Any]:
        """Samples ``rows`` (numbers in the frozen order), in order, for a
        :class:`~ucstage.Mix`: each read through the cache from its block
        (:class:`IndexedShards`, which keeps the last block read, so a run of
        one block's samples reads it once). The mix permutes samples across
        the source, so most samples cost their block's range read: shards
        are on local disk, but prefer a small ``block_samples`` in a mix."""
        view = IndexedShards(self)
        for row in rows.tolist() if hasattr(rows, "tolist") else rows:
            yield view[int(row)]

    # -- iteration ---------------------------------------------------------------

    def _slot_items(self, tracker: TableTracker, share: Any,  # type: ignore[override]
                    loop: LoopView | None) -> Iterator[Any]:
        count = None
        if self.equal_length is not None:
            totals, _ = slot_totals(self, tracker.layout, tracker)
            count = equal_batches(totals, 1, self.equal_length)
        return slot_samples(self, self.freeze(), tracker, tracker.rank, count)
