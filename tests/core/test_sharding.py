"""The slot rule against an independent brute-force simulation (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ucstage.cli.args import num_workers_list
from ucstage.errors import InvalidArgument
from ucstage.sharding import (
    Layout,
    ReadOrder,
    Slot,
    rank_length,
    shard_plan,
    slot_array,
    slot_length,
    slot_plan,
)
from ucstage.sharding.order import read_order
from ucstage.sharding.stats import MAX_RANGES, EmptySlots


def simulate(n: int, world_size: int, workers: list[int], order: list[int]) -> dict:
    """What each rank would read, computed the naive way: deal files round-robin
    to that rank's view of the slots and keep the ones that are its own."""
    reads: dict[tuple[int, int], list[int]] = {}
    for rank, k in enumerate(workers):
        k = max(k, 1)
        total = world_size * k
        for position, index in enumerate(order):
            slot = position % total
            if slot // k == rank:
                reads.setdefault((rank, slot % k), []).append(index)
        for w in range(k):
            reads.setdefault((rank, w), [])
    return reads


def expand(empty: EmptySlots, workers: list[int]) -> list[tuple[int, int]]:
    """Every slot the listed ranges cover, in (rank, worker) order."""
    slots = [(r, w) for r, k in enumerate(workers) for w in range(max(k, 1))]
    covered = []
    for (first, last), size in zip(empty.ranges, empty.range_sizes, strict=True):
        inside = [s for s in slots if first <= s <= last]
        assert len(inside) == size
        covered.extend(inside)
    return covered


sizes_st = st.lists(st.integers(min_value=0, max_value=10_000), max_size=300)


@settings(max_examples=200, deadline=None)
@given(sizes=sizes_st, world_size=st.integers(1, 9), k=st.integers(0, 7),
       shuffle=st.booleans(), seed=st.integers(0, 3), epoch=st.integers(0, 3))
def test_agreeing_workers_read_every_file_exactly_once(sizes, world_size, k, shuffle, seed, epoch):
    p = shard_plan(sizes, Layout(world_size, k),
                   ReadOrder(len(sizes), shuffle=shuffle, seed=seed, epoch=epoch))
    seen = sorted(i for s in p.slots for i in s.files)
    assert seen == list(range(len(sizes)))
    assert p.consistent and not p.duplicated and not p.skipped
    assert p.layout.slots == world_size * max(k, 1)
    # Only slots that read something are listed; the rest are counted.
    assert all(s.files for s in p.slots)
    assert len(p.slots) == min(p.layout.slots, len(sizes))
    assert p.empty.count == p.layout.slots - len(p.slots)
    assert sum(s.bytes for s in p.slots) == sum(sizes)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 200), world_size=st.integers(1, 6), data=st.data(),
       shuffle=st.booleans(), seed=st.integers(0, 5))
def test_plan_equals_brute_force(n, world_size, data, shuffle, seed):
    workers = data.draw(st.lists(st.integers(0, 5), min_size=world_size, max_size=world_size))
    sizes = list(range(n))
    order = list(read_order(n, shuffle=shuffle, seed=seed, epoch=1))
    p = shard_plan(sizes, Layout(world_size, workers),
                   ReadOrder(len(sizes), shuffle=shuffle, seed=seed, epoch=1))
    expected = simulate(n, world_size, workers, order)
    assert {(s.rank, s.worker): s.files for s in p.slots} == {
        slot: files for slot, files in expected.items() if files}
    empty = sorted(slot for slot, files in expected.items() if not files)
    assert p.empty.count == len(empty)
    assert p.empty.ranks == sum(1 for r, k in enumerate(workers)
                                if all(not expected[(r, w)] for w in range(max(k, 1))))
    if p.empty.range_count <= MAX_RANGES:
        assert expand(p.empty, workers) == empty
    assert [r.rank for r in p.ranks] == sorted({r for (r, _), f in expected.items() if f})
    counts = [0] * n
    for files in expected.values():
        for i in files:
            counts[i] += 1
    assert p.duplicated == [i for i in range(n) if counts[i] > 1]
    assert p.skipped == [i for i in range(n) if counts[i] == 0]


@settings(max_examples=100, deadline=None)
@given(n=st.integers(0, 100), world_size=st.integers(1, 5), k=st.integers(0, 4),
       batch=st.integers(1, 8))
def test_batches_are_per_worker_ceilings(n, world_size, k, batch):
    p = shard_plan([1] * n, Layout(world_size, k), ReadOrder(n), batch_size=batch)
    for rank in p.ranks:
        mine = [s for s in p.slots if s.rank == rank.rank]
        assert rank.batches == sum(-(-len(s.files) // batch) for s in mine)
    # A rank with no file has 0 batches: unequal as soon as another has one.
    assert p.batches_equal == (len({r.batches for r in p.ranks} | ({0} if p.empty.ranks else
                                                                      set())) <= 1)


def test_shuffle_is_deterministic_and_changes_per_epoch():
    a = read_order(1000, shuffle=True, seed=7, epoch=0)
    assert list(a) == list(read_order(1000, shuffle=True, seed=7, epoch=0))
    assert list(a) != list(read_order(1000, shuffle=True, seed=7, epoch=1))
    assert list(a) != list(read_order(1000, shuffle=True, seed=8, epoch=0))
    assert sorted(a) == list(range(1000))
    # A pinned value: the order must not drift between Python versions or releases,
    # or ranks running different builds would disagree.
    assert list(read_order(10, shuffle=True, seed=0, epoch=0)) == PINNED


# The keyed-bijection order (issue 15); the random.Random shuffle before it gave
# [9, 2, 4, 7, 8, 0, 1, 6, 3, 5].
PINNED = [1, 7, 4, 9, 0, 3, 5, 2, 6, 8]


def test_known_mismatch_example():
    # 12 files, 2 ranks; rank 0 thinks K=3 (6 slots), rank 1 thinks K=2 (4 slots).
    p = shard_plan([1] * 12, Layout(2, [3, 2]), ReadOrder(12))
    files = {(s.rank, s.worker): s.files for s in p.slots}
    assert files[(0, 0)] == [0, 6] and files[(0, 2)] == [2, 8]
    assert files[(1, 0)] == [2, 6, 10] and files[(1, 1)] == [3, 7, 11]
    assert p.duplicated == [2, 6, 7]
    assert p.skipped == [4, 5, 9]


def test_slot_array_matches_plan_for_one_slot():
    layout, order = Layout(3, 2), ReadOrder(50, shuffle=True, seed=1, epoch=2)
    p = shard_plan([1] * 50, layout, order)
    for s in p.slots:
        assert s.files == slot_array(order, layout, Slot(s.rank, s.worker)).tolist()


@pytest.mark.parametrize(("value", "world"), [("1,2", 3), ("", 2), ("a", 1), ("-1", 1), ("2", 0)])
def test_bad_num_workers_on_the_command_line(value, world):
    with pytest.raises(InvalidArgument):
        Layout(world, num_workers_list(value)).workers_per_rank()


@pytest.mark.parametrize("value", ["6,4", "6", 2.0, [], [1, "2"], True])
def test_library_takes_ints_not_comma_strings(value):
    """The library speaks Python: comma strings are the CLI's to parse."""
    with pytest.raises(InvalidArgument, match="num_workers must be an int"):
        shard_plan([1, 2], Layout(2, value), ReadOrder(2))


def test_library_errors_name_parameters_not_flags():
    for call in (lambda: shard_plan([1], Layout(0, 1), ReadOrder(1)),
                 lambda: shard_plan([1], Layout(1, 1), ReadOrder(1), batch_size=0),
                 lambda: shard_plan([1], Layout(2, [1, 2, 3]), ReadOrder(1)),
                 lambda: Layout(4, 0, 0).node_ranks(0)):
        with pytest.raises(InvalidArgument) as info:
            call()
        assert "--" not in str(info.value)


def test_slot_count_and_node_ranks():
    assert Layout(4, 6).slots == 24
    assert Layout(2, [0, 3]).slots == 4  # num_workers=0: the main process reads
    assert list(Layout(8, 0, 4).node_ranks(1)) == [4, 5, 6, 7]
    with pytest.raises(InvalidArgument, match="outside world_size 8"):
        Layout(8, 0, 4).node_ranks(2)


def test_bad_rank_or_worker():
    with pytest.raises(InvalidArgument):
        slot_array(ReadOrder(10), Layout(2, 1), Slot(2, 0)).tolist()
    with pytest.raises(InvalidArgument):
        slot_array(ReadOrder(10), Layout(2, 0), Slot(0, 1)).tolist()
    with pytest.raises(InvalidArgument):
        shard_plan([1], Layout(1, 1), ReadOrder(1), batch_size=0)


def test_more_slots_than_files_costs_the_files_not_the_slots():
    """-w 100000 -k 10 on 250 files: 999,750 empty slots, counted and not listed."""
    import tracemalloc

    tracemalloc.start()
    try:
        p = shard_plan([7] * 250, Layout(100_000, 10), ReadOrder(250), batch_size=4)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20, f"planning 250 files took {peak:,} bytes"
    assert p.consistent and not p.ok and not p.batches_equal
    assert p.layout.slots == 1_000_000 and len(p.slots) == 250
    assert p.empty.count == 999_750 and p.empty.ranks == 100_000 - 25
    assert p.empty.ranges == [((25, 0), (99_999, 9))] and p.empty.range_sizes == [999_750]
    assert [r.rank for r in p.ranks] == list(range(25))
    spread = p.files_per_slot()
    assert (spread.min, spread.max, spread.mean) == (0, 1, 250 / 1_000_000)
    doc = p.to_json([f"f{i}" for i in range(250)], source="s", fingerprint="x")
    assert doc["empty_slots"] == {"count": 999_750, "ranks": 99_975, "ranges_not_listed": 0,
                                  "ranges": [{"first": [25, 0], "last": [99_999, 9],
                                              "slots": 999_750}]}
    assert doc["summary"]["slots"] == 1_000_000 and len(doc["slots"]) == 250
    assert doc["num_workers"] == [10] * 25 and doc["batches"] == [10] * 25  # 10 workers x 1 file, batch 4


def test_a_hundred_million_ranks_plan_in_little_memory():
    """-w 100000000 -k 100 once grew to all the RAM; run it under a 1 GiB address cap."""
    import subprocess
    import sys

    code = ("import resource; resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30)); "
            "from ucstage.sharding import Layout, ReadOrder, shard_plan; "
            "p = shard_plan([1] * 250, Layout(100_000_000, 100), ReadOrder(250)); "
            "print(p.layout.slots, len(p.slots), p.empty.count, p.empty.ranks, p.empty.ranges)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split(" ", 4) == [
        "10000000000", "250", str(10**10 - 250), str(10**8 - 3),
        "[((2, 50), (99999999, 99))]\n"]


def test_mismatched_ranks_with_empty_slots_keep_their_diagnosis():
    # 10 files; rank 0 thinks K=4 (8 slots), rank 1 thinks K=8 (16 slots).
    p = shard_plan([1] * 10, Layout(2, [4, 8]), ReadOrder(10))
    files = {(s.rank, s.worker): s.files for s in p.slots}
    assert files == {(0, 0): [0, 8], (0, 1): [1, 9], (0, 2): [2], (0, 3): [3],
                     (1, 0): [8], (1, 1): [9]}
    assert p.skipped == [4, 5, 6, 7] and p.duplicated == [8, 9]
    assert p.empty.count == 6 and p.empty.ranks == 0
    assert p.empty.ranges == [((1, 2), (1, 7))]
    assert p.readers(8) == [(0, 0), (1, 0)]


def test_empty_ranges_are_capped_but_all_counted():
    # Every other rank has many workers and reads 1 file: one range per such rank.
    workers = [1, 50] * 30
    p = shard_plan([1] * 200, Layout(60, workers), ReadOrder(200))
    assert p.empty.range_count > MAX_RANGES == len(p.empty.ranges)
    assert p.empty.to_json()["ranges_not_listed"] == p.empty.range_count - MAX_RANGES
    assert p.empty.count == p.layout.slots - len(p.slots)


def test_slot_plan_is_the_plans_slot_without_planning_the_rest():
    sizes = [i * 3 for i in range(41)]
    for workers in (3, [3, 1]):
        p = shard_plan(sizes, Layout(2, workers), ReadOrder(len(sizes), shuffle=True, seed=4))
        for s in p.slots:
            assert slot_plan(sizes, Layout(2, workers), ReadOrder(len(sizes), shuffle=True, seed=4),
                             Slot(s.rank, s.worker)) == s
    empty = slot_plan([1] * 3, Layout(4, 1), ReadOrder(len([1] * 3)), Slot(1, 0))
    assert (empty.files, empty.bytes) == ([1], 1)
    assert slot_plan([1] * 3, Layout(4, 1), ReadOrder(len([1] * 3)), Slot(3, 0)).files == []
    with pytest.raises(InvalidArgument, match=r"no slot 4:0: ranks are 0\.\.3"):
        slot_plan([1], Layout(4, 1), ReadOrder(1), Slot(4, 0))
    with pytest.raises(InvalidArgument, match=r"no slot 1:1: rank 1 has workers 0\.\.0"):
        slot_plan([1], Layout(2, [3, 0]), ReadOrder(1), Slot(1, 1))


@settings(max_examples=150, deadline=None)
@given(n=st.integers(0, 120), world=st.integers(1, 5), k=st.integers(0, 4),
       mode=st.sampled_from([None, "pad", "drop"]))
def test_lengths_are_the_lengths_of_the_slots(n, world, k, mode):
    order, layout = ReadOrder(n, equal_length=mode), Layout(world, k)
    for rank in range(world):
        total = 0
        for w in range(max(1, k)):
            files = slot_array(order, layout, Slot(rank, w))
            assert slot_length(order, layout, Slot(rank, w)) == len(files)
            total += len(files)
        assert rank_length(order, layout, rank) == total


def test_the_values_are_checked_once_when_built():
    from ucstage.sharding.rule import stride

    Invalid = InvalidArgument

    layout = Layout(4, 3, 2)
    assert (layout.slots, layout.nodes, layout.node_of(3), layout.ranks_per_node) == (12, 2, 1, 2)
    assert Layout(2, [1, 2]).num_workers == (1, 2) and Layout(2, [3]).num_workers == 3
    assert (stride(layout, Slot(3, 1), per_node=True).start, stride(layout, Slot(3, 1),
            per_node=False).start) == (4, 10)
    with pytest.raises(Invalid, match="world_size 6 is not a multiple of nproc_per_node 4") \
            as info:
        Layout(6, 1, 4)
    assert "torchrun's nproc-per-node option" in info.value.hint  # in words, never a flag
    with pytest.raises(Invalid, match=r"worker 3 is outside 0\.\.2"):
        layout.slot(0, 3)
    with pytest.raises(Invalid, match="equal_length must be one of"):
        ReadOrder(3, equal_length="wrap")
    with pytest.raises(Invalid, match="shuffle_scope must be one of"):
        ReadOrder(3, shuffle_scope="rack")
