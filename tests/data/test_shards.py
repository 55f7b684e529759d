"""ShardDataset in one process: tar shards written by the `webdataset` package
read back with WebDataset's bytes, 8 shards dealt over 64 slots with every
sample once, exact resume by sample on the same and another layout, JSON
Lines by pandas, and the refusals (a shard replaced after the freeze, no
shard file, bad arguments)."""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from typing import Any

import pandas as pd
import pytest
import webdataset as wds

from tests.common.shards import write_shards
from ucstage import DataLoader, ShardDataset
from ucstage.errors import EmptySource, InvalidArgument, ShardChanged
from ucstage.sharding import World


def members(sample: dict[str, Any]) -> dict[str, bytes]:
    return {k: v for k, v in sample.items() if not k.startswith("__")}


def keys(batch: list[dict[str, Any]]) -> list[str]:
    return [s["__key__"] for s in batch]


def test_every_sample_once_with_webdatasets_bytes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    want = write_shards(str(tmp_path / "src"), 95, 30)
    ds = ShardDataset(str(tmp_path / "src"), block_samples=7, shuffle=True, seed=1,
                      shuffle_buffer=20, cache_dir=str(tmp_path / "cache"))
    got = list(ds)
    assert len(got) == len(ds) == 95
    assert {s["__key__"]: members(s) for s in got} == want
    assert [s["__key__"] for s in got] != sorted(want)  # shuffled...
    first = [s["__key__"] for s in got[:15]]
    assert len({s["__shard__"] for s in got[:15]}) > 1 or first != sorted(first)
    # ...and as WebDataset reads the same files (its own order, its own bytes).
    theirs = wds.WebDataset(sorted(str(p) for p in (tmp_path / "src").iterdir()),
                            shardshuffle=False)
    assert {s["__key__"]: members(s) for s in theirs} == want
    ds.set_epoch(1)
    assert [s["__key__"] for s in ds] != [s["__key__"] for s in got]  # another epoch


def test_a_dataloader_with_workers_gives_every_sample_once(tmp_path) -> None:  # type: ignore[no-untyped-def]
    want = write_shards(str(tmp_path / "src"), 61, 20)
    ds = ShardDataset(str(tmp_path / "src"), block_samples=6, shuffle=True,
                      cache_dir=str(tmp_path / "cache"))
    loader = DataLoader(ds, batch_size=4, num_workers=2, collate_fn=keys)
    got = [k for batch in loader for k in batch]
    assert Counter(got) == Counter(list(want))
    audit = loader.audits[-1]  # the exactly-once audit counts samples, not blocks
    assert (audit.files, audit.duplicates, audit.gaps) == (61, 0, 0)
    assert len(ds.freeze()) == 13  # the blocks: 4 + 4 + 4 + 1


@pytest.mark.parametrize("mode", ["drop", "pad"])
def test_the_audit_counts_samples_under_equal_length(tmp_path, mode) -> None:  # type: ignore[no-untyped-def]
    write_shards(str(tmp_path / "src"), 61, 20)  # blocks of 6: 4 + 4 + 4 + 1
    ds = ShardDataset(str(tmp_path / "src"), block_samples=6, shuffle=True, seed=2,
                      equal_length=mode, cache_dir=str(tmp_path / "cache"))
    loader = DataLoader(ds, batch_size=4, num_workers=2, collate_fn=keys)
    got = [k for batch in loader for k in batch]
    audit = loader.audits[-1]
    assert audit.coverage_ok
    if mode == "pad":  # re-reads are not counted as deliveries: every sample once
        assert (audit.files, audit.duplicates, audit.gaps) == (61, 0, 0)
        return
    # drop: each slot yields as many samples as the smallest; the blocks a slot
    # leaves unfinished are the planned gaps, counted in samples.
    assert len(got) == len(set(got)) < 61
    assert audit.files + audit.gaps == 61 and audit.gaps == audit.expected_gaps > 0
    assert audit.files <= len(got)


def test_eight_shards_feed_sixty_four_slots(tmp_path) -> None:  # type: ignore[no-untyped-def]
    want = write_shards(str(tmp_path / "src"), 8 * 40, 40)
    assert len(os.listdir(tmp_path / "src")) == 8
    ds = ShardDataset(str(tmp_path / "src"), block_samples=5, shuffle=True,
                      cache_dir=str(tmp_path / "cache"))
    ds.freeze()
    ds.num_workers = 0  # each rank reads its one slot itself (what len() counts)
    got: list[str] = []
    per_slot = []
    for rank in range(64):
        ds.world = lambda rank=rank: World(rank, 64, 0, 0, None, None)  # type: ignore[method-assign]
        slot = [s["__key__"] for s in ds]
        assert len(slot) == len(ds)
        per_slot.append(len(slot))
        got += slot
    assert Counter(got) == Counter(list(want))
    assert min(per_slot) == 5 and max(per_slot) == 5  # 64 blocks of 5: one each


def test_resume_mid_shard_replays_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    want = write_shards(str(tmp_path / "src"), 70, 35)
    cache = str(tmp_path / "cache")

    def loader(workers: int) -> DataLoader:
        ds = ShardDataset(str(tmp_path / "src"), block_samples=16, shuffle=True, seed=4,
                          shuffle_buffer=32, cache_dir=cache)
        return DataLoader(ds, batch_size=5, num_workers=workers, collate_fn=keys)

    first = loader(0)
    it = iter(first)
    before = [k for _ in range(3) for k in next(it)]  # 15 samples: inside the first block
    state = first.state_dict()
    del it
    assert state["unit"] == "sample-block" and state["partial"]
    json.dumps(state)  # JSON-serialisable
    for workers in (0, 2):  # the same layout, and another one
        again = loader(workers)
        again.load_state_dict(state)
        after = [k for batch in again for k in batch]
        assert Counter(before + after) == Counter(list(want)), workers
        audit = again.audits[-1]
        assert (audit.files, audit.duplicates, audit.gaps) == (70, 0, 0)
        assert audit.resumed_files <= 15  # samples of blocks delivered whole before


def test_jsonl_by_pandas_and_bad_lines_skipped_with_a_warning(tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    src = tmp_path / "src"
    src.mkdir()
    frame = pd.DataFrame({"id": range(300), "text": [f"t{i}" for i in range(300)]})
    frame.to_json(src / "a.jsonl", orient="records", lines=True)
    (src / "b.ndjson").write_text('{"id": 300}\nnot json\n{"id": 301}\n')
    (src / "README.md").write_text("not a shard")
    caplog.set_level(logging.WARNING, logger="ucstage")
    ds = ShardDataset(str(src), block_samples=50, on_error="skip",
                      cache_dir=str(tmp_path / "cache"))
    got = list(ds)
    assert [r["id"] for r in got] == list(range(302))
    text = caplog.text
    assert "left out 1 of 3 files" in text and "README.md" in text
    assert "skipped 1 JSON lines" in text and "b.ndjson line 2" in text


def test_a_shard_replaced_after_the_freeze_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    src = str(tmp_path / "src")
    write_shards(src, 20, 10)
    ds = ShardDataset(src, block_samples=5, cache_dir=str(tmp_path / "cache"))
    assert [s["__key__"] for s in ds][:3] == ["k00000", "k00001", "k00002"]
    other = str(tmp_path / "other")
    write_shards(other, 20, 10)  # the same names, other bytes
    os.replace(os.path.join(other, "part-001.tar"), os.path.join(src, "part-001.tar"))
    # The cached copies are the shards indexed, so they are read as indexed...
    assert len(list(ds)) == 20
    # ...but a node that must copy a shard again gets the new bytes: refused.
    ds.cache().clear(ds.freeze().volume())
    with pytest.raises(ShardChanged, match=r"shard part-001\.tar changed since its samples"):
        list(ds)


def test_refusals(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "a.bin").write_bytes(b"x")
    with pytest.raises(EmptySource, match="holds no shard file"):
        ShardDataset(str(tmp_path), cache_dir=str(tmp_path / "c")).freeze()
    with pytest.raises(InvalidArgument, match="format must be one of"):
        ShardDataset(str(tmp_path), format="parquet")
    with pytest.raises(InvalidArgument, match="on_error must be one of"):
        ShardDataset(str(tmp_path), on_error="ignore")
    with pytest.raises(InvalidArgument):
        ShardDataset(str(tmp_path), block_samples=0)
    with pytest.raises(TypeError, match="needs the indexed shards"):
        len(ShardDataset(str(tmp_path)))


def test_indexed_reads_sample_i_of_the_frozen_order(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import torch.utils.data as tud

    want = write_shards(str(tmp_path / "src"), 47, 20)
    ds = ShardDataset(str(tmp_path / "src"), block_samples=6, shuffle=True,
                      cache_dir=str(tmp_path / "cache"))
    view = ds.indexed()
    assert isinstance(view, tud.Dataset) and len(view) == 47
    order = sorted(want)  # shards in listing order, samples in file order
    for i in (0, 5, 6, 46, -1, 20, 19):
        sample = view[i]
        assert sample["__key__"] == order[i] and members(sample) == want[order[i]]
    with pytest.raises(IndexError):
        view[47]
    loader = tud.DataLoader(view, batch_size=5, shuffle=True, num_workers=2, collate_fn=keys)
    assert Counter(k for batch in loader for k in batch) == Counter(order)


def test_cache_warm_warms_the_shards_that_freeze_then_indexes(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    from ucstage.cache import LocalCache

    src = str(tmp_path / "src")
    write_shards(src, 40, 10)
    env = dict(os.environ, UCSTAGE_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=os.getcwd())
    proc = subprocess.run([sys.executable, "-m", "ucstage", "cache", "warm", src, "--json"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["fetched"] == 4
    misses = []
    fetch = LocalCache.fetch

    def counting(self: LocalCache, volume: Any, entry: Any, **kw: Any) -> str:
        if self.lookup(volume, entry) is None:
            misses.append(entry.path)
        return fetch(self, volume, entry, **kw)

    monkeypatch.setattr(LocalCache, "fetch", counting)
    ds = ShardDataset(src, cache_dir=str(tmp_path / "cache"))
    assert len(ds.freeze()) == 4 and misses == []
    assert len(list(ds)) == 40


def test_a_mix_of_files_and_shards_reads_every_item_once(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from ucstage import Mix, VolumeDataset

    want = write_shards(str(tmp_path / "shards"), 45, 20)  # 20 + 20 + 5 samples
    files = tmp_path / "files"
    files.mkdir()
    for i in range(30):
        (files / f"f{i:02d}.bin").write_bytes(f"file{i}".encode())
    cache = str(tmp_path / "cache")
    vol = VolumeDataset(str(files), cache_dir=cache)
    shards = ShardDataset(str(tmp_path / "shards"), block_samples=4, cache_dir=cache)
    mix = Mix({"files": vol, "shards": shards}, seed=3)
    assert mix.counts == {"files": 30, "shards": 45}  # the shards' items are samples
    loader = DataLoader(mix, batch_size=5, num_workers=0, collate_fn=list)
    got = [x for batch in loader for x in batch]
    samples = [s for s in got if isinstance(s, dict)]
    assert len(got) == 75
    assert Counter(s["__key__"] for s in samples) == Counter(list(want))  # each sample once
    assert {s["__key__"]: members(s) for s in samples} == want  # with its bytes
    assert len(got) - len(samples) == 30
    order = [isinstance(x, dict) for x in got]
    assert order != sorted(order) and order != sorted(order, reverse=True)  # interleaved
    audit = loader.audits[-1]
    assert (audit.duplicates, audit.gaps) == (0, 0)
    assert {src.name: src.items for src in audit.sources} == {"files": 30, "shards": 45}
