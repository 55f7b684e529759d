"""Helpers for the resume tests: a volume whose files hold their own names, a
decoding wrapper (one item per path), and a VolumeDataset with explicit ranks
so a whole layout matrix runs in one process."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from typing import Any

from torch.utils.data import IterableDataset

from tests.common.parts import unique, wait_synced
from ucstage.data import DataLoader, VolumeDataset
from ucstage.sharding import World

__all__ = ["Decode", "Ranked", "RankedDataset", "make_named_volume", "run_rank"]


def make_named_volume(fuse_volume: tuple[str, str], n: int) -> tuple[str, list[str]]:
    """``n`` files on the FUSE volume, each holding its own relative path."""
    backing, mnt = fuse_volume
    key = unique("resume")
    names = [f"d{i % 4}/f{i:03d}.txt" for i in range(n)]
    for name in names:
        path = os.path.join(backing, key, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(name)
    wait_synced(os.path.join(backing, key), os.path.join(mnt, key))
    return os.path.join(mnt, key), sorted(names)


class Decode(IterableDataset):  # type: ignore[type-arg]
    """The user's decoding wrapper: one item (the file's text) per path."""

    def __init__(self, paths: VolumeDataset) -> None:
        self.paths = paths

    def __iter__(self) -> Iterator[str]:
        for local in self.paths:
            with open(local, encoding="utf-8") as fh:
                yield fh.read()


class Ranked:
    """A sharded dataset (mixed in first) that is rank ``rank`` of ``world``
    without a process group."""

    def __init__(self, *args: Any, rank: int = 0, world: int = 1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ranked = (rank, world)

    def world(self) -> World:
        rank, world_size = self.ranked
        return dataclasses.replace(World.detect(), rank=rank, world_size=world_size)


class RankedDataset(Ranked, VolumeDataset):
    """A VolumeDataset that is rank ``rank`` of ``world`` without a process group."""


def run_rank(source: str, *, rank: int, world: int, workers: int, state: dict[str, Any] | None,
             stop_after: int | None = None, batch_size: int = 4, **options: Any
             ) -> tuple[list[str], dict[str, Any], int]:
    """One rank's loader: (items delivered, its state after them, batches)."""
    paths = RankedDataset(source, rank=rank, world=world, read_ahead=1, **options)
    loader = DataLoader(Decode(paths), batch_size=batch_size, num_workers=workers, audit=False)
    if state is not None:
        loader.load_state_dict(state)
    paths.set_epoch(paths.epoch)
    items: list[str] = []
    batches = 0
    for batch in loader:
        items += batch
        batches += 1
        if stop_after is not None and batches == stop_after:
            break
    return items, loader.state_dict(), batches
