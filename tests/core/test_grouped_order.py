"""Grouped read orders (a shard's blocks shuffled as one run): a bijection
that keeps runs together, node shares of whole runs, and resumes over them."""

from __future__ import annotations

from collections import Counter

import numpy as np

from ucstage.sharding import Layout, ReadOrder, Segment, resume_slots, segment_runs, slot_array
from ucstage.sharding.order import GroupedOrder
from ucstage.sharding.rule import Slot, node_order, node_share

SIZES = np.array([3, 0, 5, 2, 4, 7, 1, 6], dtype=np.int64)  # a shard of no block too
N = int(SIZES.sum())
RUN_OF = np.repeat(np.arange(len(SIZES)), SIZES)


def _runs(items: np.ndarray) -> list[int]:
    """The runs ``items`` visit, each once per stretch."""
    runs = RUN_OF[items]
    return [int(r) for i, r in enumerate(runs) if i == 0 or r != runs[i - 1]]


def test_a_grouped_order_permutes_runs_and_keeps_each_together() -> None:
    orders = {}
    for epoch in range(4):
        items = GroupedOrder(SIZES, seed=2, epoch=epoch).array()
        assert sorted(items.tolist()) == list(range(N))
        visited = _runs(items)
        assert len(visited) == len(set(visited)) == int((SIZES > 0).sum())  # one stretch each
        for run in visited:  # a run's items in their own order
            mine = items[RUN_OF[items] == run]
            assert (np.diff(mine) == 1).all()
        orders[epoch] = tuple(visited)
        # take agrees with the whole array at any positions
        pos = np.array([N - 1, 0, 7, 3])
        assert GroupedOrder(SIZES, seed=2, epoch=epoch).take(pos).tolist() == items[pos].tolist()
    assert len(set(orders.values())) > 1


def test_node_shares_are_whole_runs_the_same_every_epoch() -> None:
    layout = Layout(4, 2, 2)
    shares = [node_share(N, layout, node, seed=9, groups=SIZES) for node in range(2)]
    assert sorted(np.concatenate(shares).tolist()) == list(range(N))
    cut = 0
    for share in shares:
        runs = set(RUN_OF[share].tolist())
        cut += sum(int((RUN_OF[share] == r).sum()) < SIZES[r] for r in runs)
    assert cut <= 2  # only the run at the boundary between the nodes may be cut
    for epoch in range(3):
        order = ReadOrder(N, True, 9, epoch, None, "node", groups=SIZES)
        for node in range(2):
            dealt = node_order(order, layout, node)
            assert sorted(dealt.array().tolist()) == shares[node].tolist()
            assert len(_runs(dealt.array())) == len(set(RUN_OF[shares[node]].tolist()))


def test_a_resume_on_another_layout_reads_every_block_once() -> None:
    order = ReadOrder(N, True, 4, 1, None, "node", groups=SIZES)
    before = Layout(4, 2, 2)
    runs = segment_runs(order, [Segment.start(before)])[0]
    assert sorted(np.concatenate([r.files for r in runs]).tolist()) == list(range(N))
    for s, run in enumerate(runs):  # what the rule deals the slot, in the grouped order
        assert run.files.tolist() == slot_array(order, before, before.slot_at(s)).tolist()
    delivered = tuple(min(1, len(r.files)) for r in runs)
    done = [int(f) for r, d in zip(runs, delivered, strict=True) for f in r.files[:d]]
    chain, rest = resume_slots(order, [Segment(before, delivered)], Layout(3, 1, None))
    assert len(chain) == 2
    left = [int(f) for r in rest if r is not None for f in r]
    assert Counter(done + left) == Counter(range(N))
    # Without groups the same state would deal another order.
    plain = ReadOrder(N, True, 4, 1, None, "node")
    assert any(a.files.tolist() != slot_array(plain, before, Slot(s // 2, s % 2)).tolist()
               for s, a in enumerate(runs))
