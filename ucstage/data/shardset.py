""":class:`ShardDataset`: samples inside shard files (WebDataset tar shards,
JSON Lines, text line files), sharded by the slot rule down to ranges of
samples within a shard.

The third kind of the sharded-dataset base, built as
:class:`~ucstage.data.table.TableDataset` is: at :meth:`~ucstage.data.frozen.Freezable.freeze` (rank 0 in a
job, broadcast) every shard is fetched whole into the cache and indexed once
(:mod:`ucstage.shardfiles`) into a shard manifest
(:class:`~ucstage.manifest.shardsamples.ShardManifest`), whose *blocks* (runs
of at most ``block_samples`` samples of one shard) are what the slot rule
deals, as a table's row groups are. Each slot reads its blocks' shards
through the cache (``read_ahead`` blocks ahead), samples window by window
(below); checkpoint state is exact to the sample
(:mod:`ucstage.data.tableslot`, unit ``"sample-block"``).

Usage and every argument: docs/training.md, "Samples inside files".
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch.utils.data as tud

from .. import params
from ..cache.leases import Reader
from ..errors import InvalidArgument, ShardChanged
from ..manifest.shardsamples import ShardManifest
from ..shardfiles.shardformat import format_of, shown
from ..shardfiles.shardindex import ON_ERROR, SKIPPED, read_block
from ..shardfiles.sourceindex import DEFAULT_BLOCK_SAMPLES, index_source
from ..sharding import DEFAULT_SHUFFLE_SCOPE, ReadOrder
from ..tables.rowplan import WindowPlan, equal_batches, windows
from . import slotread
from .frozen import Freezable, Request
from .sharded import ShardedDataset, rule_order
from .tableslot import TableTracker, UnitCounts, pending_positions, slot_totals

if TYPE_CHECKING:
    from ..cache import LocalCache
    from ..volumes import Volume
    from .channel import LoopView

__all__ = ["IndexedShards", "ShardDataset", "check_unchanged", "slot_samples"]


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
    (:mod:`ucstage.data.tableslot`)."""
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
    _changed = "the shards of {source} changed since they were indexed"
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

    def read_order(self) -> ReadOrder:
        """This epoch's read order over the frozen blocks (freezes them): the
        manifest's, which ``shard-plan --unit sample`` deals too."""
        return self.freeze().read_order(super().read_order())

    _len_needs = "the indexed shards"

    def __repr__(self) -> str:
        return self._repr(f"format={self.format!r}, shuffle={self.shuffle}, seed={self.seed}")

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

    def _slot_items(self, tracker: TableTracker, share: slotread.Share,  # type: ignore[override]
                    loop: LoopView | None) -> Iterator[Any]:
        count = None
        if self.equal_length is not None:
            totals, _ = slot_totals(self, tracker.layout, tracker)
            count = equal_batches(totals, 1, self.equal_length)
        return slot_samples(self, self.freeze(), tracker, tracker.rank, count)


# -- One slot's samples: its blocks' shards fetched whole through the cache
# in read order, each block's samples read from the local copy, taken window
# by window (tables.rowplan.windows: with shuffle, a window's samples are one
# seeded permutation, the shuffle buffer), each delivery counted by the slot's
# TableTracker just before it is handed out, so a resume skips exactly what
# was delivered.
_log = logging.getLogger("ucstage")
class _Blocks:
    """The samples of a slot's windows' blocks, read from the cache in order."""

    def __init__(self, dataset: ShardDataset, manifest: ShardManifest, run: Any, start: int,
                 skip: dict[int, int], slot_key: tuple[int, ...], reader: Reader,
                 errors: list[tuple[str, int]]) -> None:
        self.dataset, self.manifest, self.errors = dataset, manifest, errors
        size = dataset.shuffle_window if dataset.shuffle else 1
        rows = manifest.rows_per_group
        todo = pending_positions(run, start, rows, skip, size)
        self.entries = [manifest.files[manifest.block_file(int(run[p]))] for p in todo]
        self.paths = slotread.read(self.entries, slotread.FILES, reader,
                                   dataset.cache().at(manifest.volume()), int(dataset.read_ahead))
        self.plans = windows(run, start, rows, skip, window=dataset.shuffle_window,
                             shuffle=dataset.shuffle, seed=dataset.seed, epoch=dataset.epoch,
                             slot_key=slot_key)
        self._at = 0
        self._checked: set[str] = set()

    def _read(self, block: int) -> list[Any]:
        entry = self.entries[self._at]
        path = next(self.paths)
        self._at += 1
        if path not in self._checked:
            check_unchanged(self.dataset, self.manifest, entry, path)
            self._checked.add(path)
        return read_block(self.manifest, block, path, on_error=self.dataset.on_error,
                          errors=self.errors)

    def __iter__(self) -> Iterator[tuple[WindowPlan, list[Any], Any, Any]]:
        """(plan, each block's samples (None: none left), samples each block
        had delivered, sizes)."""
        import numpy as np

        rows = self.manifest.rows_per_group
        for plan in self.plans:
            sizes = rows[plan.groups].astype(np.int64)
            left = np.array([plan.count]) if len(plan.groups) == 1 else \
                np.bincount(plan.label, minlength=len(plan.groups))
            blocks = [self._read(int(g)) if left[i] else None
                      for i, g in enumerate(plan.groups.tolist())]
            yield plan, blocks, sizes - left, sizes

    def close(self) -> None:
        self.paths.close()  # type: ignore[attr-defined]  # a generator


def check_unchanged(dataset: ShardDataset, manifest: ShardManifest, entry: Any, path: str) -> None:
    """Refuse a local copy that is not the shard indexed at freeze: the cache
    copies a source file's current bytes, so a shard replaced since the
    freeze comes back as another version (or size)."""
    import os

    same = os.path.getsize(path) == entry.size
    if same:
        same = dataset.cache().at(manifest.volume()).lookup(entry, touch=False) is not None
    if not same:
        raise ShardChanged(f"shard {shown(entry.path)} changed since its samples were indexed "
                           "(freeze): its samples are not where the index says",
                           hint="build a new ShardDataset (or freeze again) to index the "
                                "shards as they are now")


def slot_samples(dataset: ShardDataset, manifest: ShardManifest, tracker: TableTracker, rank: int,
                 count: int | None) -> Iterator[Any]:
    """The slot's samples, in order (see the module docstring); ``count``: the
    equal-length number of samples (``"drop"`` stops there, ``"pad"``
    re-reads the slot's samples from its start until there)."""
    import numpy as np

    reader = slotread.open_reader(dataset, rank)
    key = (tracker.slot, tracker.segment)
    yielded = 0
    errors: list[tuple[str, int]] = []
    streams: list[_Blocks] = []

    def take(stream: _Blocks, counted: bool) -> Iterator[Any]:
        nonlocal yielded
        for plan, blocks, done, sizes in stream:
            got = done.copy()
            if counted:
                tracker.delivered(plan.first, done, sizes, before=True)  # what a resume left
            if not plan.count:
                continue
            labels = plan.label.tolist() if len(plan.groups) > 1 else [0] * plan.count
            for label, row in zip(labels, plan.row.tolist(), strict=True):
                if count is not None and yielded >= count:
                    return
                sample = blocks[label][row]  # the block is read whole
                if counted:
                    got[label] += 1
                    tracker.delivered(plan.first, got, sizes)
                if sample is SKIPPED:
                    continue
                yielded += 1
                yield sample

    try:
        real = _Blocks(dataset, manifest, tracker.run, tracker.start, tracker.skip, key,
                       reader, errors)
        streams.append(real)
        yield from take(real, True)
        if dataset.equal_length == "pad" and count is not None:
            while yielded < count and int(np.asarray(manifest.rows_per_group)[tracker.run].sum()):
                pad = _Blocks(dataset, manifest, tracker.run, 0, {}, key, reader, errors)
                streams.append(pad)
                yield from take(pad, False)
        tracker.end()
    finally:
        for stream in streams:
            stream.close()
        reader.close()
        if errors:
            examples = ", ".join(f"{shown(n)} line {line:,}" for n, line in errors[:3])
            _log.warning("skipped %d JSON lines that do not parse (on_error=\"skip\"), e.g. %s",
                         len(errors), examples)


class IndexedShards(tud.Dataset):  # type: ignore[type-arg]
    """A map-style view of a :class:`~ucstage.data.shardset.ShardDataset`
    (``ds.indexed()``): ``len()`` samples, ``[i]`` sample ``i`` of the frozen
    order (shards in listing order, samples in file order), its shard
    fetched through the cache and its block read (the last block read is
    kept, so consecutive indices read each block once). A JSON line that does
    not parse raises ``CorruptShard`` here whatever ``on_error`` says: an
    index must give a sample."""

    def __init__(self, dataset: ShardDataset) -> None:
        self.dataset = dataset
        self._last: tuple[int, list[Any]] | None = None
        self._checked: set[str] = set()

    def __getstate__(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "_last": None, "_checked": set()}

    def __len__(self) -> int:
        return int(self.dataset.freeze().samples)

    def __getitem__(self, index: int) -> Any:
        import numpy as np

        manifest: ShardManifest = self.dataset.freeze()
        n = manifest.samples
        i = int(index)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sample {index} is out of range: {n} samples")
        block = int(np.searchsorted(manifest.block_first, i, side="right")) - 1
        if self._last is None or self._last[0] != block:
            entry = manifest.files[manifest.block_file(block)]
            path = self.dataset.cache().at(manifest.volume()).fetch(entry)
            if path not in self._checked:
                check_unchanged(self.dataset, manifest, entry, path)
                self._checked.add(path)
            self._last = (block, read_block(manifest, block, path))
        return self._last[1][i - int(manifest.block_first[block])]
