"""Resume under the node shuffle scope: with the same node count each node's
remainder stays on that node; with another, the remainder is re-split over
the whole job. Every file of the epoch is delivered once either way."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from ucstage.sharding import Layout, Segment, resume_slots, segment_runs
from ucstage.sharding.resplit import EpochOrder


def node_files(order: EpochOrder, seg: Segment) -> list[set[int]]:
    """The files each node of ``seg`` reads in a whole epoch."""
    runs = segment_runs(order, [seg])[0]
    k, per = seg.layout.workers, seg.layout.ranks_per_node
    nodes: list[set[int]] = [set() for _ in range(seg.layout.nodes)]
    for s, run in enumerate(runs):
        nodes[(s // k) // per] |= {int(f) for f in run.files}
    return nodes


@settings(max_examples=150, deadline=None)
@given(n=st.integers(0, 120), nodes=st.integers(2, 3), per=st.integers(1, 3),
       k=st.integers(0, 2), per2=st.integers(1, 3), k2=st.integers(0, 3),
       other_nodes=st.booleans(), data=st.data())
def test_node_remainders_stay_on_their_node(n, nodes, per, k, per2, k2, other_nodes, data) -> None:  # type: ignore[no-untyped-def]
    order = EpochOrder(n, shuffle=True, seed=4, epoch=1, shuffle_scope="node")
    first = Segment(Layout(nodes * per, k, per), (0,) * (nodes * per * max(1, k)))
    runs = segment_runs(order, [first])[0]
    counts = tuple(data.draw(st.integers(0, len(r.files))) for r in runs)
    done = Segment(Layout(first.layout.world_size, k, per), counts)
    nodes2 = nodes + 1 if other_nodes else nodes
    target = Layout(nodes2 * per2, k2, per2)
    _, rest = resume_slots(order, [done], target)
    before = [int(f) for r, d in zip(runs, counts, strict=True) for f in r.files[:d]]
    assert Counter(before + [int(f) for r in rest for f in r]) == Counter(range(n))
    if not other_nodes:
        owned = node_files(order, first)
        kk = max(1, k2)
        for s, files in enumerate(rest):
            assert {int(f) for f in files} <= owned[(s // kk) // per2]
