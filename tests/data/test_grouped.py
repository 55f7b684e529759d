"""Grouped samples in one process over the rclone FUSE volume: members cached
before a sample is yielded (with and without a cap), incomplete samples
dropped or refused, equal_length by sample, resume on another layout."""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from torch.utils.data import IterableDataset

from tests.common.parts import unique, wait_synced
from tests.common.resume import RankedDataset
from ucstage import merge_states
from ucstage.data import DataLoader, VolumeDataset
from ucstage.errors import GroupingError, InvalidArgument, ResumeMismatch

pytestmark = [pytest.mark.fuse]

N = 61


@pytest.fixture(scope="module")
def volume(fuse_volume):  # type: ignore[no-untyped-def]
    backing, mnt = fuse_volume
    key = unique("groups")
    for i in range(N + 2):
        suffixes = ("jpg", "json", "seg.png") if i < N else ("json",)
        for suffix in suffixes:
            name = f"s{i % 3}/{i:04d}.{suffix}"
            path = os.path.join(backing, key, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(name * 20)
    wait_synced(os.path.join(backing, key), os.path.join(mnt, key))
    return os.path.join(mnt, key)


class Decode(IterableDataset):  # type: ignore[type-arg]
    """One item per sample: its key, read from every member's cached file."""

    def __init__(self, samples: VolumeDataset) -> None:
        self.samples = samples

    def __iter__(self) -> Iterator[str]:
        for sample in self.samples:
            texts = {}
            for suffix, local in sample.items():
                with open(local, encoding="utf-8") as fh:
                    texts[suffix] = fh.read()
            key = texts["json"][:len(texts["json"]) // 20].rsplit(".", 1)[0]
            assert all(t == f"{key}.{s}" * 20 for s, t in texts.items()), texts
            yield key


def keys(n: int = N) -> list[str]:
    return [f"s{i % 3}/{i:04d}" for i in range(n)]


@pytest.mark.parametrize("max_bytes", [None, 20_000])
@pytest.mark.parametrize("read_ahead", [0, 2])
def test_every_sample_whole_and_cached(volume, tmp_path, max_bytes, read_ahead) -> None:  # type: ignore[no-untyped-def]
    ds = VolumeDataset(volume, group="key", require=("jpg", "json"), read_ahead=read_ahead,
                       cache_dir=tmp_path / "c", max_bytes=max_bytes)
    for _ in range(2):  # cold, then warm (the warm path of data/slotread.py without a cap)
        items = []
        for sample in ds:  # every member is in the cache when the sample arrives
            assert all(os.path.exists(p) for p in sample.values())
            items.append(sorted(sample))
        assert items == [["jpg", "json", "seg.png"]] * N
    # Under the cap, each worker's batches in flight (2 prefetched and the
    # loop's, of 2 samples) must fit beside its read-ahead.
    loader = DataLoader(Decode(ds), batch_size=2, prefetch_factor=2, num_workers=2,
                        audit=False)
    assert Counter(k for batch in loader for k in batch) == Counter(keys())
    assert len(ds) == N
    first = ds.slot_entries(rank=0, world_size=1, num_workers=0, worker=0)[0]
    assert first.suffixes == ("jpg", "json", "seg.png") and first.path == "s0/0000"
    assert [e.path for e in first] == ["s0/0000.jpg", "s0/0000.json", "s0/0000.seg.png"]


def test_incomplete_samples_are_dropped_with_one_warning_or_refused(volume, tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    with caplog.at_level(logging.WARNING, logger="ucstage"):
        ds = VolumeDataset(volume, group="key", require=("jpg",), cache_dir=tmp_path / "c")
        ds.freeze()
    drops = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert len(drops) == 1 and "dropped 2 of 63 samples" in drops[0] and "lacks jpg" in drops[0]
    assert len(ds) == N
    kept = VolumeDataset(volume, group="key", cache_dir=tmp_path / "c")
    kept.freeze()
    assert len(kept) == N + 2
    refused = VolumeDataset(volume, group="key", require=("jpg",), on_incomplete="error",
                            cache_dir=tmp_path / "c")
    with pytest.raises(GroupingError, match="2 samples lack a required member"):
        refused.freeze()
    with pytest.raises(InvalidArgument, match="group"):
        VolumeDataset(volume, require=("jpg",))


def test_equal_length_counts_samples(volume, tmp_path) -> None:  # type: ignore[no-untyped-def]
    counts = []
    for rank in range(2):
        ds = RankedDataset(volume, rank=rank, world=2, group="key", require=("jpg", "json"),
                           equal_length="pad", cache_dir=tmp_path / "c")
        loader = DataLoader(Decode(ds), batch_size=1, num_workers=2, audit=False)
        got = [k for batch in loader for k in batch]
        counts.append(len(got))
    assert counts == [32, 32]  # ceil(61 / 4) samples per slot, 4 slots


def run(volume: str, tmp: Any, *, rank: int, world: int, workers: int,
        state: dict[str, Any] | None, stop_after: int | None = None
        ) -> tuple[list[str], dict[str, Any]]:
    ds = RankedDataset(volume, rank=rank, world=world, group="key", require=("jpg", "json"),
                       shuffle=True, seed=5, read_ahead=1, cache_dir=tmp / "c")
    loader = DataLoader(Decode(ds), batch_size=3, num_workers=workers, audit=False)
    if state is not None:
        loader.load_state_dict(state)
    ds.set_epoch(ds.epoch)
    items: list[str] = []
    for n, batch in enumerate(loader, 1):
        items += batch
        if n == stop_after:
            break
    return items, loader.state_dict()


def test_resume_on_another_layout_delivers_each_sample_once(volume, tmp_path) -> None:  # type: ignore[no-untyped-def]
    before, states = [], []
    for rank in range(2):
        got, state = run(volume, tmp_path, rank=rank, world=2, workers=2, state=None,
                         stop_after=3)
        before += got
        states.append(state)
    assert len(before) == 2 * 3 * 3
    merged = merge_states(states)
    assert merged["files"] == N  # the state counts samples
    for world, workers in [(3, 1), (1, 0)]:
        after = []
        for rank in range(world):
            got, _ = run(volume, tmp_path, rank=rank, world=world, workers=workers,
                         state=merged)
            after += got
        assert Counter(before + after) == Counter(keys()), (world, workers)
    # A state of the ungrouped listing does not fit the grouped one.
    plain = VolumeDataset(volume, cache_dir=tmp_path / "c")
    with pytest.raises(ResumeMismatch):
        plain.load_state_dict(merged)


def test_the_rank_guard_compares_the_grouping() -> None:
    from ucstage.data.loader import _check_listings, _GuardInfo
    from ucstage.errors import RankMismatch

    same = [_GuardInfo(2, "f" * 64, 10, True, True, grouping="a" * 64)] * 2
    _check_listings(same)
    other = [same[0], _GuardInfo(2, "f" * 64, 10, True, True, grouping="b" * 64)]
    with pytest.raises(RankMismatch, match="grouping bbbbbbbbbbbb"):
        _check_listings(other)


def test_the_readers_window_is_sized_by_the_largest_sample(volume, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from ucstage.errors import CacheFull

    # A sample is 3 files of about 190-200 bytes: 7 samples (read_ahead 4 + 3) do not fit in
    # 3,000 bytes, though 7 of its largest files would.
    ds = VolumeDataset(volume, group="key", require=("jpg",), cache_dir=tmp_path / "c",
                       max_bytes=3000, read_ahead=4)  # "auto" would shrink to fit first
    with pytest.raises(CacheFull, match=r"7 samples held each .* the largest sample 760 B"):
        next(iter(ds))
