"""``ucstage bench --loader``: the VolumeDataset + DataLoader path, end to end.

Kept apart from :mod:`ucstage.bench.modes`, which imports it only when the
loader mode runs, because it imports torch at module level (its dataset class
must be importable by DataLoader worker processes).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch.utils.data as tud

from ..cache.local import LocalCache
from ..data import DataLoader, VolumeDataset
from ..manifest import Manifest, fingerprint
from ..sharding import DEFAULT_SHUFFLE_SCOPE
from ..volumes import FileEntry
from .measure import BUFFER_BYTES, Meter, ReadTally

__all__ = ["ReadEach", "loader_run"]


class ReadEach(tud.IterableDataset):  # type: ignore[type-arg]
    """Reads every byte of each path a VolumeDataset yields, in the worker.

    Yields ``(bytes read, seconds, path)`` per file, so no file's bytes cross
    the process boundary; the seconds run from asking the VolumeDataset for
    the next path (its fetch, possibly already done by read-ahead) to the last
    byte, and the path names the file for progress.
    """

    def __init__(self, dataset: VolumeDataset) -> None:
        self.dataset = dataset

    def __iter__(self) -> Iterator[tuple[int, float, str]]:
        buf = bytearray(BUFFER_BYTES)
        view = memoryview(buf)
        paths = iter(self.dataset)
        while True:
            start = time.perf_counter()
            path = next(paths, None)
            if path is None:
                return
            total = 0
            with open(path, "rb", buffering=0) as fh:
                while n := fh.readinto(view):
                    total += n
            yield total, time.perf_counter() - start, path


def loader_run(
    manifest: Manifest, entries: Sequence[FileEntry], workers: int, batch_size: int,
    cache_root: str, deadline: float | None, meter: Meter,
    shuffle: tuple[bool, int, str, int | None] = (False, 0, DEFAULT_SHUFFLE_SCOPE, None),
) -> tuple[ReadTally, float, bool]:
    """Read ``entries`` through a fresh private cache with ``workers`` DataLoader workers.

    Returns:
        (what was counted, wall seconds, complete), as :func:`~ucstage.bench.measure.measure`.
    """
    sample = Manifest(source=manifest.source, entries=list(entries),
                      fingerprint=fingerprint(entries))
    on, seed, scope, nproc = shuffle
    dataset = VolumeDataset(sample, cache=LocalCache(os.path.join(cache_root, "cache")),
                            shuffle=on, seed=seed, shuffle_scope=scope, nproc_per_node=nproc)
    loader = DataLoader(ReadEach(dataset), batch_size=batch_size, num_workers=workers,
                        log_mlflow=False, guard=False, volume_dataset=dataset)
    tally = ReadTally()
    complete = True
    started = time.perf_counter()
    iterator: Any = iter(loader)
    try:
        for sizes, seconds, paths in iterator:
            tally.files += len(sizes)
            tally.bytes += int(sizes.sum())
            tally.latencies.extend(float(s) for s in seconds)
            tally.done.extend(paths)
            meter.update(tally.bytes, paths)
            if deadline is not None and time.monotonic() >= deadline:
                complete = False
                break
    finally:
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if callable(shutdown):
            shutdown()
    wall = time.perf_counter() - started
    return tally, wall, complete and tally.files >= len(entries)
