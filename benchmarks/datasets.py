"""The reading datasets the loader benchmarks compare (benchmarks.epochs:
throttled, warm, small_cache, lazy, loaders, profile): both open and read
every file whole, so the only difference measured is how the paths are
produced; and ``keep``, the ``collate_fn`` that leaves a batch a list."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch.utils.data as tud


def keep(batch: list[Any]) -> list[Any]:
    """A ``collate_fn`` that keeps a batch a list: torch's default would send
    every batch as a shared-memory tensor, whose cost per batch is torch's,
    not the read's."""
    return batch


class ReadBytes(tud.IterableDataset):  # type: ignore[type-arg]
    """ucstage side, the usual decoding wrapper: open and read every path a
    VolumeDataset (or any iterable of paths) yields; yield its size."""

    def __init__(self, paths: Iterable[str]) -> None:
        self.paths = paths

    def __iter__(self) -> Iterator[int]:
        for path in self.paths:
            with open(path, "rb") as fh:
                yield len(fh.read())


class RawPaths(tud.Dataset):  # type: ignore[type-arg]
    """Plain side: open and read each of ``paths`` straight (no cache)."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> int:
        with open(self.paths[i], "rb") as fh:
            return len(fh.read())


class IterPaths(tud.IterableDataset):  # type: ignore[type-arg]
    """The plain side as an IterableDataset of paths: torch's cost of iterating one."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __iter__(self) -> Iterator[str]:
        return iter(self.paths)


class SampleSizes(tud.IterableDataset):  # type: ignore[type-arg]
    """The decoding wrapper over a ShardDataset of ``ucstage pack`` output: each
    tar sample's bytes (its ``bin`` member), as ReadBytes reads each loose file."""

    def __init__(self, samples: Iterable[dict[str, Any]]) -> None:
        self.samples = samples

    def __iter__(self) -> Iterator[int]:
        for sample in self.samples:
            yield len(sample["bin"])
