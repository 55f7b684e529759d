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

import logging
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from .. import params
from ..errors import EmptySource, InvalidArgument
from ..manifest.shardsamples import ShardManifest
from ..shardfiles.packindex import indexed_samples
from ..shardfiles.shardformat import format_of, shown
from ..shardfiles.shardindex import ON_ERROR, index_shard
from ..sharding import DEFAULT_SHUFFLE_SCOPE
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

_log = logging.getLogger("ucstage")

DEFAULT_BLOCK = 256
DEFAULT_BUFFER = 2048
DEFAULT_READ_AHEAD = 2
INDEX_THREADS = 8
"""Shards fetched and indexed at once by the freeze."""


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
            over blocks; with ``shuffle`` a slot's samples are also shuffled
            within windows of ``shuffle_buffer`` samples (whole blocks).
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

    def __init__(self, source: str | os.PathLike[str], *, format: str | None = None,
                 include: str | Sequence[str] = (), exclude: str | Sequence[str] = (),
                 block_samples: int = DEFAULT_BLOCK, shuffle: bool = False, seed: int = 0,
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
        from ..source import snapshot

        files = snapshot(self._source, include=self.include, exclude=self.exclude)
        kinds = [format_of(e.path, self.format) for e in files.entries]
        keep = [i for i, k in enumerate(kinds) if k is not None]
        if not keep:
            raise EmptySource(f"{self._source} holds no shard file (.tar, .tar.gz, .tgz, "
                              ".jsonl, .jsonl.gz, .ndjson, .txt, .txt.gz)",
                              hint="pass format= to read files of another name as shards")
        if len(keep) < len(kinds):
            left = [shown(files.entries[i].path) for i in range(len(kinds)) if kinds[i] is None]
            _log.warning("left out %d of %d files of %s whose names say no shard format, "
                         "e.g. %s", len(left), len(kinds), self._source, ", ".join(left[:3]))
        entries = [files.entries[i] for i in keep]
        formats = [kinds[i] for i in keep]
        volume = files.volume()
        cache = self.cache()
        packed = indexed_samples(volume, entries, formats)  # `ucstage pack`'s: no fetch, no scan

        def index(i: int) -> Any:
            if i in packed:
                return packed[i]
            entry = entries[i]
            path = cache.fetch(volume, entry)
            k, gz = formats[i]  # type: ignore[misc]
            return index_shard(path, entry.path, k, gz)

        with ThreadPoolExecutor(min(INDEX_THREADS, len(entries)),
                                thread_name_prefix="ucstage-index") as pool:
            found = list(pool.map(index, range(len(entries))))
        manifest = ShardManifest.build(files.source, volume.url, entries,
                                       [k for k in formats if k is not None], found,
                                       self.block_samples)
        if not len(manifest):
            raise EmptySource(f"the shards of {self._source} hold no sample")
        return manifest

    def _get_volume(self) -> Volume:
        return self.freeze().volume()

    def _item_count(self) -> int:
        return len(self.freeze())

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

    # -- iteration ---------------------------------------------------------------

    def _slot_items(self, tracker: TableTracker, share: Any,  # type: ignore[override]
                    loop: LoopView | None) -> Iterator[Any]:
        count = None
        if self.equal_length is not None:
            totals, _ = slot_totals(self, tracker.layout, tracker)
            count = equal_batches(totals, 1, self.equal_length)
        return slot_samples(self, self.freeze(), tracker, tracker.rank, count)
