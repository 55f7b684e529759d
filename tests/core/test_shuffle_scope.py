"""The shuffle scope (node | global) against a brute-force simulation (hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ucstage.errors import InvalidArgument
from ucstage.sharding import (
    Layout,
    Permutation,
    ReadOrder,
    Slot,
    forecast,
    rank_length,
    shard_plan,
    slot_array,
    slot_length,
    slot_plan,
)
from ucstage.sharding.rule import node_order, slot_dealing


def simulate(n: int, world: int, k: int, nproc: int | None, scope: str, seed: int,
             epoch: int) -> dict[tuple[int, int], list[int]]:
    """What every (rank, worker) slot reads, the naive way: lists, loops, no arithmetic
    shortcuts. Node scope: cut the seeded node assignment into balanced blocks (the
    first n % nodes one longer), permute each block for (seed, epoch, node), deal it
    round-robin over the node's slots. Global: deal the epoch's permutation over all."""
    k = max(k, 1)
    per_node = nproc or world
    nodes = world // per_node
    reads: dict[tuple[int, int], list[int]] = {(r, w): [] for r in range(world) for w in range(k)}
    if scope == "global" or nodes == 1:
        order = list(Permutation(n, seed=seed, epoch=epoch))
        for position, row in enumerate(order):
            slot = position % (world * k)
            reads[(slot // k, slot % k)].append(row)
        return reads
    assign = list(Permutation(n, seed=seed, stream="nodes"))
    blocks, start = [], 0
    for node in range(nodes):
        size = n // nodes + (1 if node < n % nodes else 0)
        blocks.append(assign[start:start + size])
        start += size
    for node, block in enumerate(blocks):
        within = list(Permutation(len(block), seed=seed, epoch=epoch, stream=f"node{node}"))
        for position, p in enumerate(within):
            slot = position % (per_node * k)
            reads[(node * per_node + slot // k, slot % k)].append(block[p])
    return reads


def node_files(reads: dict[tuple[int, int], list[int]], node: int, per_node: int) -> set[int]:
    return {i for (r, _), files in reads.items() if r // per_node == node for i in files}


shape = st.tuples(st.integers(1, 4), st.integers(1, 3)).map(lambda t: (t[0] * t[1], t[1]))


@settings(max_examples=150, deadline=None)
@given(n=st.integers(0, 250), shape=shape, k=st.integers(0, 4), seed=st.integers(0, 5),
       scope=st.sampled_from(["node", "global"]), epoch=st.integers(0, 3))
def test_plan_and_slots_equal_the_simulation(n, shape, k, seed, scope, epoch) -> None:  # type: ignore[no-untyped-def]
    world, nproc = shape
    expected = simulate(n, world, k, nproc, scope, seed, epoch)
    layout = Layout(world, k, nproc)
    order = ReadOrder(n, shuffle=True, seed=seed, epoch=epoch, shuffle_scope=scope)
    p = shard_plan(list(range(n)), layout, order)
    got = {(s.rank, s.worker): s.files for s in p.slots}
    assert got == {key: v for key, v in expected.items() if v}
    assert all(s.node == s.rank // nproc for s in p.slots)
    # Every file exactly once in the epoch, every slot accounted for.
    assert sorted(i for files in got.values() for i in files) == list(range(n))
    assert p.consistent and p.empty.count == p.layout.slots - len(p.slots)
    for (rank, worker), files in expected.items():
        assert slot_array(order, layout, Slot(rank, worker)).tolist() == files
        assert slot_length(ReadOrder(n, shuffle=True, shuffle_scope=scope),
                           Layout(world, k, nproc), Slot(rank, worker)) == len(files)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(0, 250), shape=shape, k=st.integers(0, 4), seed=st.integers(0, 5))
def test_node_scope_keeps_each_nodes_files_and_reorders_them(n, shape, k, seed) -> None:  # type: ignore[no-untyped-def]
    world, nproc = shape
    nodes = world // nproc
    epochs = []
    for e in range(3):  # the implementation's slots, as the simulation keys them
        p = shard_plan(list(range(n)), Layout(world, k, nproc),
                       ReadOrder(n, shuffle=True, seed=seed, epoch=e))
        reads = {(r, w): [] for r in range(world) for w in range(max(k, 1))}
        reads.update({(s.rank, s.worker): s.files for s in p.slots})
        epochs.append(reads)
    sets = [[node_files(r, node, nproc) for node in range(nodes)] for r in epochs]
    assert sets[0] == sets[1] == sets[2]
    sizes = [len(s) for s in sets[0]]
    assert max(sizes) - min(sizes) <= 1  # balanced to within one file
    for rank in range(world):
        orders = [[i for w in range(max(k, 1)) for i in r[(rank, w)]] for r in epochs]
        if len(orders[0]) >= 6:  # a few files: the same order twice would be a coincidence
            assert orders[0] != orders[1] and orders[1] != orders[2]


@settings(max_examples=100, deadline=None)
@given(n=st.integers(0, 200), shape=shape, k=st.integers(0, 3), seed=st.integers(0, 5),
       scope=st.sampled_from(["node", "global"]), epochs=st.integers(1, 4),
       data=st.data())
def test_forecast_equals_the_simulation(n, shape, k, seed, scope, epochs, data) -> None:  # type: ignore[no-untyped-def]
    world, nproc = shape
    nodes = world // nproc
    sizes = data.draw(st.lists(st.integers(0, 1000), min_size=n, max_size=n))
    f = forecast(sizes, Layout(world, k, nproc),
                 ReadOrder(len(sizes), shuffle=True, seed=seed, shuffle_scope=scope), epochs=epochs)
    seen: list[set[int]] = [set() for _ in range(nodes)]
    rows = []
    for epoch in range(epochs):
        reads = simulate(n, world, k, nproc, scope, seed, epoch)
        for node in range(nodes):
            files = node_files(reads, node, nproc)
            new = files - seen[node]
            seen[node] |= files
            rows.append((epoch, node, len(files), sum(sizes[i] for i in files), len(new),
                         sum(sizes[i] for i in new)))
    assert [(r.epoch, r.node, r.files, r.bytes, r.new_files, r.new_bytes) for r in f.rows] == rows
    assert f.share_files == [len(s) for s in seen]
    if scope == "node":
        assert all(r.new_files == 0 for r in f.rows if r.epoch > 0)
        assert f.new_files == n


@settings(max_examples=150, deadline=None)
@given(n=st.integers(0, 200), world=st.integers(1, 6), k=st.integers(0, 4),
       seed=st.integers(0, 5), epoch=st.integers(0, 3), explicit=st.booleans(),
       shuffle=st.booleans())
def test_one_node_reduces_exactly_to_the_global_rule(n, world, k, seed, epoch, explicit,
                                                      shuffle) -> None:  # type: ignore[no-untyped-def]
    """Single-node plans and orders do not change: the node scope with one node
    (no nproc_per_node, or nproc_per_node == world_size) is today's rule."""
    nproc = world if explicit else None
    old_rule = {(r, w): [] for r in range(world) for w in range(max(k, 1))}
    order = list(Permutation(n, seed=seed, epoch=epoch)) if shuffle else list(range(n))
    for position, row in enumerate(order):
        slot = position % (world * max(k, 1))
        old_rule[(slot // max(k, 1), slot % max(k, 1))].append(row)
    p = shard_plan(list(range(n)), Layout(world, k, nproc),
                   ReadOrder(n, shuffle=shuffle, seed=seed, epoch=epoch, shuffle_scope="node"))
    assert {(s.rank, s.worker): s.files for s in p.slots} == {a: v for a, v in old_rule.items() if v}
    assert list(node_order(ReadOrder(n, shuffle=shuffle, seed=seed, epoch=epoch),
                           Layout(world, 0, nproc), 0)) == order
    for mode in ("pad", "drop"):
        for (rank, worker) in old_rule:
            node_scope = ReadOrder(n, shuffle, seed, epoch, mode, "node")
            global_scope = ReadOrder(n, shuffle, seed, epoch, mode, "global")
            assert slot_array(node_scope, Layout(world, k, nproc), Slot(rank, worker)).tolist() == \
                slot_array(global_scope, Layout(world, k), Slot(rank, worker)).tolist()


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 200), shape=shape, k=st.integers(0, 3), seed=st.integers(0, 3),
       mode=st.sampled_from(["pad", "drop"]))
def test_equal_length_under_node_scope(n, shape, k, seed, mode) -> None:  # type: ignore[no-untyped-def]
    world, nproc = shape
    nodes = world // nproc
    if mode == "pad" and n < nodes:
        return  # a node without files cannot pad (tested below)
    reads = simulate(n, world, k, nproc, "node", seed, 0)
    counts = set()
    for rank in range(world):
        mine = node_files(reads, rank // nproc, nproc)
        for worker in range(max(k, 1)):
            files = slot_array(ReadOrder(n, shuffle=True, seed=seed, equal_length=mode),
                               Layout(world, k, nproc), Slot(rank, worker)).tolist()
            counts.add(len(files))
            assert set(files) <= mine  # padding re-reads the node's own files
            assert slot_length(ReadOrder(n, shuffle=True, equal_length=mode),
                               Layout(world, k, nproc), Slot(rank, worker)) == len(files)
    assert len(counts) == 1  # every rank of every node: the same count (DDP needs it)


def test_bytes_per_node_and_node_field() -> None:
    sizes = list(range(1, 11))
    p = shard_plan(sizes, Layout(4, 1, 2), ReadOrder(len(sizes), shuffle=True, seed=1))
    assert [(nd.node, nd.first_rank, nd.last_rank, nd.files) for nd in p.nodes] == \
        [(0, 0, 1, 5), (1, 2, 3, 5)]
    assert sum(nd.bytes for nd in p.nodes) == sum(sizes)
    for nd in p.nodes:
        assert nd.bytes == sum(s.bytes for s in p.slots if s.node == nd.node)
    doc = p.to_json([str(i) for i in range(10)], source="s", fingerprint="f")
    assert {s["node"] for s in doc["slots"]} == {0, 1}
    assert doc["shuffle_scope"] == "node" and doc["nproc_per_node"] == 2
    one = slot_plan(sizes, Layout(4, 1, 2), ReadOrder(len(sizes), shuffle=True, seed=1), Slot(3, 0))
    assert one.node == 1 and one.files == next(s.files for s in p.slots if s.rank == 3)


def test_more_nodes_than_files_leaves_whole_nodes_empty() -> None:
    p = shard_plan([5, 6, 7], Layout(8, 2, 2), ReadOrder(3, shuffle=True))
    assert sorted(i for s in p.slots for i in s.files) == [0, 1, 2]
    assert p.empty.count == 16 - 3 and p.empty.ranks == 5
    with pytest.raises(InvalidArgument, match="pad"):
        slot_array(ReadOrder(3, shuffle=True, equal_length="pad"), Layout(8, 2, 2), Slot(7, 0))


def test_world_size_must_be_a_multiple_of_nproc_per_node() -> None:
    with pytest.raises(InvalidArgument, match="world_size 6 is not a multiple of nproc_per_node 4"):
        shard_plan([1, 2], Layout(6, 1, 4), ReadOrder(2, shuffle=True))
    with pytest.raises(InvalidArgument, match="nproc_per_node must be"):
        Layout(4, 0, 0)
    with pytest.raises(InvalidArgument, match="shuffle_scope must be one of"):
        slot_array(ReadOrder(4, shuffle=True, shuffle_scope="rack"), Layout(1, 0), Slot(0, 0))
    assert Layout(8).nodes == 1 and Layout(8, 0, 2).nodes == 4


def test_a_slot_costs_its_own_positions() -> None:
    """Node scope keeps the numpy arithmetic: a slot of a 10^9-file job takes no list."""
    deal = slot_dealing(ReadOrder(10**9, shuffle=True, seed=2, epoch=1), Layout(8, 4, 4), Slot(5, 3))
    assert (deal.node, deal.nodes, deal.start, deal.step) == (1, 2, 7, 16)
    first = deal.order.take(np.arange(deal.start, deal.start + 5 * deal.step, deal.step))  # type: ignore[attr-defined]
    assert len(set(first.tolist())) == 5 and all(0 <= i < 10**9 for i in first)
    assert rank_length(ReadOrder(10**9, shuffle=True), Layout(8, 4, 4), 5) == 10**9 // 8
