"""The warm path (issue 11, warm epochs): without a cap, runs of hits are
looked up in blocks and handed out without per-file layers, while every path
is still proven valid by the cache's lookup, positions stay exact for resume,
and a loader without workers counts deliveries without tagging batches."""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterator
from typing import Any

import pytest
from torch.utils.data import IterableDataset

from ucstage.cache.local import Bound
from ucstage.data import DataLoader, VolumeDataset
from ucstage.data import state as state_
from ucstage.data.slotread import BLOCK

N = 3 * BLOCK + 5


def write_files(root: str, n: int = N) -> list[str]:
    names = [f"d{i % 3}/f{i:03d}.bin" for i in range(n)]
    for i, name in enumerate(names):
        os.makedirs(os.path.join(root, os.path.dirname(name)), exist_ok=True)
        with open(os.path.join(root, name), "wb") as fh:
            fh.write(bytes([i % 256]) * (100 + i))
    return sorted(names)


class Names(IterableDataset):  # type: ignore[type-arg]
    """Reads every path whole and yields (name, bytes): one item per path."""

    def __init__(self, paths: VolumeDataset) -> None:
        self.paths = paths

    def __iter__(self) -> Iterator[tuple[str, bytes]]:
        for path in self.paths:
            with open(path, "rb") as fh:
                yield os.path.basename(path), fh.read()


def warm_dataset(tmp_path: Any, **options: Any) -> tuple[VolumeDataset, list[str], str]:
    src = str(tmp_path / "vol")
    names = write_files(src)
    ds = VolumeDataset(src, cache_dir=str(tmp_path / "cache"), **options)
    for _ in ds:  # copies everything
        pass
    return ds, names, src


def delivered(state: dict[str, Any]) -> int:
    return sum(d or 0 for d in state["segments"][-1]["delivered"])


@pytest.mark.parametrize("read_ahead", [0, 4])
def test_a_warm_epoch_is_looked_up_a_block_ahead_and_every_position_is_exact(
        tmp_path, read_ahead, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    ds, names, _ = warm_dataset(tmp_path, read_ahead=read_ahead)
    cache = ds.cache()
    lookups = [0]
    lookup_rows = Bound.lookup_rows

    def counted(bound, rels, sizes, versions, **kwargs):  # type: ignore[no-untyped-def]
        found = lookup_rows(bound, rels, sizes, versions, **kwargs)
        lookups[0] += len(rels)
        return found

    monkeypatch.setattr(Bound, "lookup_rows", counted)
    got = []
    for i, path in enumerate(ds, 1):
        got.append(os.path.relpath(path, cache.namespace_dir(ds.freeze().volume())))
        # Each path's proof is at most one block old; the position is what was pulled.
        assert i <= lookups[0] < i + BLOCK
        assert delivered(ds.state_dict()) == i
        if i == 1:
            assert lookups[0] == BLOCK
    assert got == names and lookups[0] == N
    assert ds.state_dict()["finished"]


def test_a_copy_replaced_after_the_epoch_started_is_never_handed_out(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Every path of a later block is proven when its block is looked up: a
    cached copy changed meanwhile (its stamp no longer matches) is fetched
    again, and the files after it are still handed out, in order."""
    ds, names, src = warm_dataset(tmp_path)
    root = ds.cache().namespace_dir(ds.freeze().volume())
    victim = names[2 * BLOCK + 1]
    seen = []
    for i, path in enumerate(ds):
        if i == 0:
            # Replaced by another tool: a new file without the stamp.
            tmp = os.path.join(root, victim + ".new")
            with open(tmp, "wb") as fh:
                fh.write(b"x" * os.path.getsize(os.path.join(src, victim)))
            os.replace(tmp, os.path.join(root, victim))
        with open(path, "rb") as fh:
            seen.append((os.path.relpath(path, root), fh.read()))
    assert [name for name, _ in seen] == names
    for name, data in seen:
        with open(os.path.join(src, name), "rb") as fh:
            assert data == fh.read(), name
    assert ds.state_dict()["finished"]


def test_a_loader_without_workers_tags_no_batch_and_counts_each_delivery(
        tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    ds, names, _ = warm_dataset(tmp_path)
    tags = []
    original = state_.Tagged.__init__

    def traced(self, batch, tag):  # type: ignore[no-untyped-def]
        tags.append(tag)
        original(self, batch, tag)

    monkeypatch.setattr(state_.Tagged, "__init__", traced)
    loader = DataLoader(Names(ds), batch_size=None, num_workers=0)
    for epoch in range(2):
        batches = iter(loader)
        # Before the first batch (of the second epoch too), an earlier
        # iteration's end must not show through.
        assert delivered(loader.state_dict()) == 0
        seen = []
        for i, (name, _) in enumerate(batches, 1):
            seen.append(name)
            assert delivered(loader.state_dict()) == i, (epoch, i)
        assert seen == [os.path.basename(n) for n in names]
        assert loader.state_dict()["finished"]
        audit = loader.audits[-1]
        assert (audit.files, audit.duplicates, audit.gaps) == (N, 0, 0)
    assert tags == []


def test_a_loader_without_workers_resumes_where_its_batches_stopped(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ds, names, src = warm_dataset(tmp_path)
    loader = DataLoader(Names(ds), batch_size=3, num_workers=0)
    before = []
    for i, batch in enumerate(loader, 1):
        before += batch[0]
        if i == BLOCK // 3 + 2:  # inside the second block
            break
    state = loader.state_dict()
    assert delivered(state) == len(before)
    again = VolumeDataset(src, cache_dir=str(tmp_path / "cache"))
    resumed = DataLoader(Names(again), batch_size=3, num_workers=0)
    resumed.load_state_dict(state)
    after = [name for batch in resumed for name in batch[0]]
    assert sorted(before + after) == sorted(os.path.basename(n) for n in names)
    assert resumed.audits[-1].duplicates == 0 and resumed.audits[-1].gaps == 0


def test_a_small_batch_tag_travels_as_a_few_bytes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Workers pickle a tag per batch to the main process: with batch_size=None
    every file is a batch, so its rows go as a list of ints, not a numpy array
    (whose pickle is about 200 bytes and 20 times slower)."""
    ds, _, _ = warm_dataset(tmp_path)
    it = iter(ds)
    next(it)
    tag = ds._link.tracker.take()
    assert tag[1] == 1 and list(tag[2]) == [0]
    assert len(pickle.dumps(tag, protocol=pickle.HIGHEST_PROTOCOL)) < 40
