"""The row-group slot rule and the rows each slot delivers (ucstage.tables.rowplan),
against brute-force models written out here position by position."""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ucstage.sharding import Layout, ReadOrder, slot_array
from ucstage.sharding.order import read_order
from ucstage.tables.rowplan import equal_batches, slot_rows, windows


def brute_slot(n: int, world: int, k: int, rank: int, worker: int, order: list[int]
               ) -> list[int]:
    """The slot rule as a loop: slot (rank, worker) reads read-order positions
    rank * k + worker, then every world * k further."""
    out, pos = [], rank * k + worker
    while pos < n:
        out.append(order[pos])
        pos += world * k
    return out


layouts = st.tuples(st.integers(1, 4), st.integers(1, 3))
sizes = st.lists(st.integers(0, 40), min_size=0, max_size=30)


@settings(max_examples=150, deadline=None)
@given(sizes=sizes, layout=layouts, shuffle=st.booleans(), seed=st.integers(0, 99),
       epoch=st.integers(0, 3), window=st.integers(1, 5))
def test_every_row_once_by_the_slot_rule(sizes: list[int], layout: tuple[int, int],
                                         shuffle: bool, seed: int, epoch: int,
                                         window: int) -> None:
    world, k = layout
    rows = np.array(sizes, dtype=np.int64)
    n = len(sizes)
    lay = Layout(world, k)
    order = ReadOrder(n, shuffle, seed, epoch, None, "global")
    full = [int(i) for i in read_order(n, shuffle=shuffle, seed=seed, epoch=epoch)] \
        if shuffle else list(range(n))
    delivered: Counter[tuple[int, int]] = Counter()
    for rank in range(world):
        for worker in range(k):
            run = slot_array(order, lay, lay.slot(rank, worker))
            assert run.tolist() == brute_slot(n, world, k, rank, worker, full)
            got = 0
            for plan in windows(run, 0, rows, {}, window=window, shuffle=shuffle, seed=seed,
                                epoch=epoch, slot_key=(rank * k + worker, 0)):
                groups = plan.groups.tolist()
                assert len(groups) <= (window if shuffle else 1)
                delivered.update((groups[int(lab)], int(r))
                                 for lab, r in zip(plan.label, plan.row, strict=True))
                got += len(plan.label)
            assert got == slot_rows(run, 0, rows, {}) == int(rows[run].sum())
    assert delivered == Counter((g, r) for g in range(n) for r in range(sizes[g]))


@settings(max_examples=150, deadline=None)
@given(sizes=st.lists(st.integers(1, 30), min_size=1, max_size=12), window=st.integers(1, 4),
       seed=st.integers(0, 9), cut=st.floats(0, 1))
def test_a_skip_resumes_exactly_the_rest_of_a_window(sizes: list[int], window: int, seed: int,
                                                     cut: float) -> None:
    """Rows delivered of a row group are a prefix of its order: skipping them
    replays the rest of the interrupted sequence exactly (the same layout)."""
    rows = np.array(sizes, dtype=np.int64)
    run = np.arange(len(sizes), dtype=np.int64)
    kw = dict(window=window, shuffle=True, seed=seed, epoch=0, slot_key=(0, 0))
    whole = [(int(p.groups[lab]), int(r)) for p in windows(run, 0, rows, {}, **kw)
             for lab, r in zip(p.label, p.row, strict=True)]
    stop = int(cut * len(whole))
    head = whole[:stop]
    done = Counter(g for g, _ in head)
    # the leading row groups delivered whole, as a state's count says
    start = 0
    while start < len(run) and done[int(run[start])] == sizes[start]:
        start += 1
    skip = {g: c for g, c in done.items()}
    rest = [(int(p.groups[lab]), int(r)) for p in windows(run, start, rows, skip, **kw)
            for lab, r in zip(p.label, p.row, strict=True)]
    assert head + rest == whole


@settings(max_examples=200, deadline=None)
@given(totals=st.lists(st.integers(0, 500), min_size=1, max_size=16),
       batch=st.integers(1, 64), mode=st.sampled_from(["pad", "drop"]))
def test_equal_length_batches_against_a_model(totals: list[int], batch: int, mode: str) -> None:
    if mode == "pad" and 0 in totals and max(totals):
        return  # refused: a slot with no rows cannot re-read any
    count = equal_batches(totals, batch, mode)
    # the model: every slot's own batch counts, floored (drop) or ceiled (pad)
    own = [t // batch for t in totals] if mode == "drop" else [-(-t // batch) for t in totals]
    assert count == (min(own) if mode == "drop" else max(own))
    if mode == "drop":
        assert all(count * batch <= t for t in totals)
    else:
        assert all(count * batch >= t for t in totals)
