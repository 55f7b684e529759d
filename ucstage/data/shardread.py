"""One slot's samples of a :class:`~ucstage.data.shardset.ShardDataset`: its
blocks' shards fetched whole through the cache in read order, each block's
samples read from the local copy, taken window by window
(:func:`ucstage.tables.rowplan.windows`: with ``shuffle`` a window's samples
are one seeded permutation, the shuffle buffer), each sample's delivery
counted by the slot's :class:`~ucstage.data.tablestate.TableTracker` just
before it is handed out, so a resume skips exactly what was delivered."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import torch.utils.data as tud

from ..cache.leases import Reader
from ..errors import ShardChanged
from ..manifest.shardsamples import ShardManifest
from ..shardfiles.shardformat import shown
from ..shardfiles.shardindex import SKIPPED, read_block
from ..tables.rowplan import WindowPlan, windows
from . import slotread
from .tablebatches import pending_positions
from .tablestate import TableTracker

__all__ = ["IndexedShards", "check_unchanged", "slot_samples"]

_log = logging.getLogger("ucstage")


class _Blocks:
    """The samples of a slot's windows' blocks, read from the cache in order."""

    def __init__(self, dataset: Any, manifest: ShardManifest, run: Any, start: int,
                 skip: dict[int, int], slot_key: tuple[int, ...], reader: Reader,
                 errors: list[tuple[str, int]]) -> None:
        self.dataset, self.manifest, self.errors = dataset, manifest, errors
        size = dataset.shuffle_window if dataset.shuffle else 1
        rows = manifest.rows_per_group
        todo = pending_positions(run, start, rows, skip, size)
        self.entries = [manifest.files[manifest.block_file(int(run[p]))] for p in todo]
        self.paths = slotread.read(self.entries, slotread.FILES, reader,
                                   dataset.cache().at(manifest.volume()), dataset.read_ahead)
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


def check_unchanged(dataset: Any, manifest: ShardManifest, entry: Any, path: str) -> None:
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


def slot_samples(dataset: Any, manifest: ShardManifest, tracker: TableTracker, rank: int,
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

    def __init__(self, dataset: Any) -> None:
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
