"""The shuffled read order: a keyed bijection, computed per slot without a list of every file."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from ucstage.sharding import Layout, Permutation, ReadOrder, Slot, slot_array
from ucstage.sharding.order import read_order


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 7, 8, 17, 100, 1000, 4097, 65537])
def test_is_a_permutation_of_every_size(n):
    order = Permutation(n, seed=3, epoch=1).array()
    assert sorted(order.tolist()) == list(range(n))


def test_depends_only_on_n_seed_epoch_and_is_pinned():
    a = Permutation(50, seed=7, epoch=2)
    assert a.array().tolist() == Permutation(50, seed=7, epoch=2).array().tolist()
    assert a.array().tolist() != Permutation(50, seed=7, epoch=3).array().tolist()
    assert a.array().tolist() != Permutation(50, seed=8, epoch=2).array().tolist()
    # Pinned: integer arithmetic only, so no numpy or Python release may change it.
    assert Permutation(20, seed=1, epoch=0).array().tolist() == PINNED_20


PINNED_20 = [5, 12, 6, 16, 15, 3, 13, 7, 2, 0, 10, 4, 19, 14, 8, 11, 1, 18, 17, 9]


def test_indexing_agrees_with_the_array():
    p = Permutation(1000, seed=5, epoch=0)
    full = p.array()
    assert [p[i] for i in (0, 1, 999, -1)] == [full[0], full[1], full[999], full[-1]]
    assert p[10:20] == full[10:20].tolist()
    assert list(p) == full.tolist()
    assert p.take([5, 3]).tolist() == [full[5], full[3]]
    with pytest.raises(IndexError):
        p[1000]


def test_shuffles_well_enough():
    """Not the identity, not a rotation: neighbours in the listing end up far apart."""
    order = Permutation(10_000, seed=0, epoch=0).array()
    assert (order == np.arange(10_000)).mean() < 0.01
    assert np.abs(np.diff(order)).mean() > 1000


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("mode", [None, "pad", "drop"])
def test_one_slot_matches_the_slot_rule_on_the_whole_order(shuffle, mode):
    n, world, k = 1003, 3, 4
    full = list(read_order(n, shuffle=shuffle, seed=9, epoch=4))
    for rank in range(world):
        for worker in range(k):
            s = rank * k + worker
            want = [full[p] for p in range(s, n, world * k)]
            if mode == "drop":
                want = want[: n // (world * k)]
            elif mode == "pad":
                want += [full[(s + i * world * k) % n]
                         for i in range(len(want), -(-n // (world * k)))]
            got = slot_array(ReadOrder(n, shuffle=shuffle, seed=9, epoch=4, equal_length=mode),
                             Layout(world, k), Slot(rank, worker))
            assert got.tolist() == want


def test_one_slot_of_a_million_costs_the_slot_not_the_files():
    """A worker's slot of 1M files over 1,024 slots allocates about its 977
    indices, not a million of anything."""
    tracemalloc.start()
    try:
        files = slot_array(ReadOrder(1_000_000, shuffle=True, seed=0, epoch=0), Layout(128, 8),
                           Slot(5, 3))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(files) == 977
    assert peak < 200_000  # a list or array of 1M ints would be 8 MB or more
