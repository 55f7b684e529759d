"""ShardDataset's shuffle: a seeded order of shards (each shard's blocks kept
together, node-stable under the ``"node"`` scope), then the shuffle buffer
across the slot's open shards; deterministic per (seed, epoch, slot)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace

from tests.common.shards import write_shards
from ucstage import DataLoader, ShardDataset
from ucstage.sharding import Layout, World, slot_array
from ucstage.sharding.rule import Slot


def _dataset(tmp_path, **kw) -> ShardDataset:  # type: ignore[no-untyped-def]
    return ShardDataset(str(tmp_path / "src"), cache_dir=str(tmp_path / "cache"), **kw)


def _slot(ds: ShardDataset, rank: int, world_size: int, local: str | None = None
          ) -> list[dict]:
    """What rank ``rank`` of ``world_size`` reads in its main process (its one slot)."""
    ds.num_workers = 0
    ds.world = lambda: World(rank, world_size, 0, 0, local, None)  # type: ignore[method-assign]
    return list(ds)


def _open_at_once(shards: list[str]) -> int:
    """The most shards whose spans (first to last sample read) overlap at one point."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, s in enumerate(shards):
        first.setdefault(s, i)
        last[s] = i
    return max(sum(first[s] <= i <= last[s] for s in first) for i in range(len(shards)))


def test_the_order_is_deterministic_per_seed_epoch_and_slot(tmp_path) -> None:  # type: ignore[no-untyped-def]
    want = write_shards(str(tmp_path / "src"), 120, 20)

    def run(seed: int, epoch: int) -> list[list[str]]:
        ds = _dataset(tmp_path, block_samples=5, shuffle=True, seed=seed, shuffle_buffer=10)
        ds.set_epoch(epoch)
        return [[s["__key__"] for s in _slot(ds, rank, 2)] for rank in range(2)]

    first = run(3, 0)
    assert Counter(first[0] + first[1]) == Counter(list(want))
    assert run(3, 0) == first  # a new dataset, the same (seed, epoch): the same slots
    assert run(3, 1) != first and run(4, 0) != first
    assert run(3, 1) == run(3, 1)


def test_under_the_node_scope_each_node_opens_only_its_shards(tmp_path) -> None:  # type: ignore[no-untyped-def]
    write_shards(str(tmp_path / "src"), 16 * 40, 40)  # 16 shards of 8 blocks of 5
    ds = _dataset(tmp_path, block_samples=5, shuffle=True, seed=7, nproc_per_node=2)
    manifest = ds.freeze()
    layout = Layout(4, 0, 2)  # 2 nodes of 2 ranks

    def node_shards(epoch: int) -> list[set[str]]:
        ds.set_epoch(epoch)
        read = [{s["__shard__"] for s in _slot(ds, rank, 4, "2")} for rank in range(4)]
        return [read[0] | read[1], read[2] | read[3]]

    nodes = node_shards(0)
    assert [len(n) for n in nodes] == [8, 8]  # 64 blocks each: 8 whole shards
    assert not nodes[0] & nodes[1]
    assert node_shards(1) == nodes  # a node keeps its shards in every epoch
    # Before (the blocks themselves permuted): a node read blocks of nearly every shard.
    ds.set_epoch(0)
    blocks = replace(ds.read_order(), groups=None)
    before = [{manifest.block_file(int(b)) for r in node for b in
               slot_array(blocks, layout, Slot(r, 0))} for node in ((0, 1), (2, 3))]
    assert min(len(n) for n in before) > 8


def test_a_slots_samples_come_from_its_few_open_shards_mixed_by_the_buffer(tmp_path) -> None:  # type: ignore[no-untyped-def]
    want = write_shards(str(tmp_path / "src"), 6 * 30, 30)  # 6 shards of 3 blocks of 10
    orders = set()
    for epoch in range(4):
        ds = _dataset(tmp_path, block_samples=10, shuffle=True, seed=1, shuffle_buffer=20)
        ds.set_epoch(epoch)
        got = list(ds)
        assert Counter(s["__key__"] for s in got) == Counter(list(want))
        shards = [s["__shard__"] for s in got]
        assert _open_at_once(shards) <= 2  # a shard is read through before the next but one
        windows = [shards[i:i + 20] for i in range(0, len(shards), 20)]
        assert all(len(set(w)) <= 2 for w in windows)  # the buffer: 2 blocks
        # A window holding two shards' blocks mixes them (not one block then the other).
        mixed = [w for w in windows if len(set(w)) == 2]
        assert mixed and any(w != sorted(w, key=w.index) for w in mixed)
        keys = [s["__key__"] for s in got]
        assert any(keys[i:i + 10] != sorted(keys[i:i + 10]) for i in range(0, len(keys), 10))
        orders.add(tuple(dict.fromkeys(shards)))
    assert len(orders) > 1  # the shard order is seeded by the epoch


def test_resume_mid_shard_continues_the_grouped_order_exactly(tmp_path) -> None:  # type: ignore[no-untyped-def]
    want = write_shards(str(tmp_path / "src"), 90, 30)

    def loader(workers: int) -> DataLoader:
        ds = _dataset(tmp_path, block_samples=10, shuffle=True, seed=5, shuffle_buffer=20)
        return DataLoader(ds, batch_size=5, num_workers=workers,
                          collate_fn=lambda b: [s["__key__"] for s in b])

    full = [k for batch in loader(0) for k in batch]
    first = loader(0)
    it = iter(first)
    before = [k for _ in range(5) for k in next(it)]  # 25 samples: inside the second shard
    state = json.loads(json.dumps(first.state_dict()))
    del it
    assert before == full[:25]
    again = loader(0)  # the same layout: the rest of the same order, sample for sample
    again.load_state_dict(state)
    assert [k for batch in again for k in batch] == full[25:]
    other = loader(2)  # another layout: every sample once
    other.load_state_dict(state)
    after = [k for batch in other for k in batch]
    assert Counter(before + after) == Counter(list(want))
    audit = other.audits[-1]
    assert (audit.files, audit.duplicates, audit.gaps) == (90, 0, 0)
