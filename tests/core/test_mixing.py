"""The mix's arithmetic (ucstage/sharding/mixing.py) against brute-force models
(hypothesis): per-source counts exact overall and within 1 per slot, passes
that use every item once before any repeats, and the input checks."""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ucstage.errors import InvalidArgument
from ucstage.sharding import Layout, Permutation, mixing
from ucstage.sharding.mixing import MixOrder, SourceStream, mix_plan, mix_shares, slot_mix

sizes_st = st.lists(st.integers(1, 60), min_size=1, max_size=4)


def brute_slots(order: MixOrder, slots: int) -> list[list[tuple[int, int, int]]]:
    """Every position read through the order, dealt by the slot rule written out:
    slot s reads positions s, s + slots, ..."""
    src, items, passes = order.take(np.arange(order.n))
    seq = list(zip(src.tolist(), items.tolist(), passes.tolist(), strict=True))
    return [[seq[p] for p in range(s, order.n, slots)] for s in range(slots)]


@settings(max_examples=150, deadline=None)
@given(sizes=sizes_st, data=st.data(), world=st.integers(1, 4), k=st.integers(0, 3),
       seed=st.integers(0, 5), epoch=st.integers(0, 4))
def test_weights_give_exact_counts_and_within_one_per_slot(sizes, data, world, k, seed,
                                                           epoch) -> None:  # type: ignore[no-untyped-def]
    weights = data.draw(st.lists(st.integers(0, 9), min_size=len(sizes), max_size=len(sizes))
                        .filter(lambda w: sum(w) > 0 and w[int(np.argmax(sizes))] > 0))
    epoch_size = data.draw(st.none() | st.integers(1, 300))
    shares = mix_shares(sizes, weights, epoch_size=epoch_size)
    total = sum(weights)
    if epoch_size is None:  # ceil(n_L / w_L), L the (first) largest source
        big = sizes.index(max(sizes))
        epoch_size = math.ceil(Fraction(sizes[big] * total, weights[big]))
    assert shares.epoch_size == epoch_size
    quotas = [Fraction(epoch_size * w, total) for w in weights]
    # Largest remainder: floor or ceil of each quota, and a source rounded up
    # never has a smaller fractional part than one rounded down.
    assert all(math.floor(q) <= c <= math.ceil(q) for q, c in zip(quotas, shares.counts, strict=True))
    up = [q - math.floor(q) for q, c in zip(quotas, shares.counts, strict=True) if c > q]
    down = [q - math.floor(q) for q, c in zip(quotas, shares.counts, strict=True) if c < q]
    assert not up or not down or min(up) >= max(down)
    layout = Layout(world, k)
    order = MixOrder(shares, seed=seed, epoch=epoch, slots=layout.slots)
    dealt = brute_slots(order, layout.slots)
    overall = Counter(s for slot in dealt for s, _, _ in slot)
    assert [overall[i] for i in range(len(sizes))] == list(shares.counts)
    for i in range(len(sizes)):
        per_slot = [sum(1 for s, _, _ in slot if s == i) for slot in dealt]
        assert max(per_slot) - min(per_slot) <= 1, (i, per_slot)
    # The library's own per-slot view reads the same as the model.
    for index in range(layout.slots):
        mine = slot_mix(shares, layout, layout.slot_at(index), seed=seed, epoch=epoch)
        got = list(zip(mine.sources.tolist(), mine.items.tolist(), mine.passes.tolist(),
                       strict=True))
        assert got == dealt[index]
    plan = mix_plan([str(i) for i in range(len(sizes))], shares, layout, seed=seed, epoch=epoch)
    assert [list(c) for _, c in plan.slots] == [
        [sum(1 for s, _, _ in slot if s == i) for i in range(len(sizes))] for slot in dealt]


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 40), count=st.integers(1, 90), seed=st.integers(0, 3))
def test_passes_use_every_item_once_before_any_repeats(n, count, seed) -> None:  # type: ignore[no-untyped-def]
    # Source 0 has n items and `count` per epoch; the other source fills the rest.
    shares = mix_shares([n, 5], repeat=[Fraction(count, n), 1])
    assert shares.counts[0] == count
    stream: list[tuple[int, int]] = []  # (pass, item) in the order epochs take them
    epochs = max(2, math.ceil(3 * n / count))
    for epoch in range(epochs):
        order = MixOrder(shares, seed=seed, epoch=epoch, slots=3)
        src, items, passes = order.take(np.arange(order.n))
        mine = [(p, i) for s, i, p in zip(src.tolist(), items.tolist(), passes.tolist(),
                                         strict=True) if s == 0]
        assert len(mine) == count
        # The epoch reads a window of the stream: passes first..last, the
        # middle ones whole (a larger source: one pass, a smaller: several).
        first, last = shares.pass_range(0, epoch)
        assert {p for p, _ in mine} == set(range(first, last + 1))
        stream += sorted(mine)
    by_pass: dict[int, list[int]] = {}
    for p, item in stream:
        by_pass.setdefault(p, []).append(item)
    complete = len(stream) // n
    for p, got in by_pass.items():
        assert len(got) == len(set(got)), f"pass {p} repeats an item"
        if p < complete:
            assert sorted(got) == list(range(n)), f"pass {p} misses items"
    # A new permutation per pass (when there is room for a different one).
    if n >= 4 and complete >= 2:
        orders = [[i for p, i in _in_stream_order(shares, seed, epochs) if p == q]
                  for q in range(2)]
        assert orders[0] != orders[1]


def _in_stream_order(shares, seed, epochs):  # type: ignore[no-untyped-def]
    """Source 0's (pass, item) in stream order: the stream's own arithmetic."""
    stream = shares.stream(0, seed)
    for epoch in range(epochs):
        items, passes = stream.items(epoch, np.arange(shares.counts[0]))
        yield from zip(passes.tolist(), items.tolist(), strict=True)


def test_the_issue_example_one_hundred_and_fifty_at_half_and_half() -> None:
    shares = mix_shares([100, 50], [0.5, 0.5], epoch_size=200)
    assert shares.counts == (100, 100)
    assert shares.passes(1) == 2.0
    assert mix_shares([100, 50], [0.7, 0.3]).counts == (100, 43)  # ceil(100 / 0.7) = 143
    assert mix_shares([100, 50], repeat=[0.1, 2.5]).counts == (10, 125)
    assert mix_shares([100, 50]).counts == (100, 50)
    orders = [MixOrder(shares, seed=s, epoch=e, slots=4).sources(np.arange(200)).tolist()
              for s, e in ((0, 0), (0, 0), (0, 1), (1, 0))]
    assert orders[0] == orders[1]  # reproducible
    assert orders[0] != orders[2] and orders[0] != orders[3]  # per epoch, per seed


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"weights": [0, 0]}, "weights must sum to a positive number"),
    ({"weights": [-1, 2]}, "weights must be 0 or more"),
    ({"weights": [1]}, "weights has 1 values for 2 sources"),
    ({"weights": [1, float("nan")]}, "finite"),
    ({"repeat": [1, -0.5]}, "repeat must be 0 or more"),
    ({"weights": [1, 1], "repeat": [1, 1]}, "pass weights or repeat, not both"),
    ({"repeat": [1, 1], "epoch_size": 10}, "epoch_size goes with weights"),
    ({"weights": [1, 1], "epoch_size": 0}, "epoch_size must be a whole number"),
    ({"weights": [0, 1]}, "the largest source"),
    ({"repeat": [0, 0]}, "the mix's epoch has no items"),
])
def test_bad_input_is_one_clear_error(kwargs, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidArgument, match=message):
        mix_shares([10, 5], **kwargs)


def test_an_empty_source_with_a_share_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="source 1 has no items"):
        mix_shares([10, 0], [1, 1])
    assert mix_shares([10, 0], [1, 0]).counts == (10, 0)


def _stream_by_pass(n: int, count: int, seed: int, index: int, epoch: int,
                    local: np.ndarray) -> list[int]:
    """The stream's contract written out: position ``a`` of the stream reads
    ``Permutation(n, seed, epoch=a // n, stream=f"mix{index}")[a % n]``."""
    at = epoch * count + local
    return [int(Permutation(n, seed=seed, epoch=int(a // n), stream=f"mix{index}")
                .take([a % n])[0]) for a in at.tolist()]


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 70), count=st.integers(1, 400), seed=st.integers(0, 2**40),
       index=st.integers(0, 3), epoch=st.integers(0, 50), data=st.data())
def test_every_pass_at_once_reads_what_each_pass_alone_reads(n, count, seed, index, epoch,
                                                              data) -> None:  # type: ignore[no-untyped-def]
    # Any subset of the epoch's positions, in any order (a slot's share).
    local = np.asarray(data.draw(st.lists(st.integers(0, count - 1), max_size=60)),
                       dtype=np.int64)
    stream = SourceStream(n, count, seed, index)
    items, passes = stream.items(epoch, local)
    assert items.tolist() == _stream_by_pass(n, count, seed, index, epoch, local)
    assert passes.tolist() == ((epoch * count + local) // n).tolist()


def test_a_source_repeating_100000_times_builds_no_permutation_per_pass(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Issue 28: one Permutation (and a mask over the epoch) per pass made a
    # 1-file source at half of 200,000 items take 72 s. The passes are now one
    # vectorised network: no permutation object per pass, whatever the count.
    built = []

    class Counting(Permutation):
        def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            built.append(args)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(mixing, "Permutation", Counting)
    for n in (1, 2, 3):
        stream = SourceStream(n, 100_000, 0, 0)
        items, passes = stream.items(1, np.arange(100_000))
        assert int(passes.max() - passes.min()) + 1 >= 100_000 // n
        assert items.min() >= 0 and items.max() < n
        assert np.bincount(items, minlength=n).tolist() == [100_000 // n] * n or n == 3
    assert built == []
    order = mixing.MixOrder(mix_shares([1, 200], [1, 1], epoch_size=200_000), seed=0, epoch=0,
                            slots=8)
    src, _, passes = order.take(np.arange(order.n))
    assert np.bincount(src).tolist() == [100_000, 100_000]
    assert len(built) == 1  # the rounds' permutation, once per epoch order


_NUMPY_KINDS = (np.int64, np.int32, np.uint16, np.float64, np.float32)


@settings(max_examples=150, deadline=None)
@given(sizes=st.lists(st.integers(1, 50), min_size=2, max_size=4), data=st.data())
def test_numpy_numbers_mix_as_the_python_numbers_they_print_as(sizes, data) -> None:  # type: ignore[no-untyped-def]
    kinds = data.draw(st.lists(st.sampled_from(_NUMPY_KINDS), min_size=len(sizes),
                               max_size=len(sizes)))
    weights = data.draw(st.lists(st.integers(1, 9), min_size=len(sizes), max_size=len(sizes)))
    as_numpy = [kind(w) for kind, w in zip(kinds, weights, strict=True)]
    epoch_size = data.draw(st.none() | st.integers(1, 500))
    wrapped = None if epoch_size is None else data.draw(
        st.sampled_from((np.int64, np.int32, int)))(epoch_size)
    assert mix_shares(sizes, as_numpy, epoch_size=wrapped) == mix_shares(
        sizes, [float(str(w)) for w in as_numpy], epoch_size=epoch_size)
    tenths = [kind(w / 10) if kind in (np.float64, np.float32) else kind(w)
              for kind, w in zip(kinds, weights, strict=True)]
    assert _outcome(sizes, repeat=tenths) == _outcome(
        sizes, repeat=[Fraction(str(r)) for r in tenths])


def _outcome(sizes, **kwargs):  # type: ignore[no-untyped-def]
    """The shares, or the one clear error's message."""
    try:
        return mix_shares(sizes, **kwargs)
    except InvalidArgument as exc:
        return exc.message


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(1, 10**6), min_size=2, max_size=3),
       exponent=st.integers(-320, 0), epoch_size=st.none() | st.integers(1, 10**15))
def test_every_epoch_is_bounded_or_one_clear_error(sizes, exponent, epoch_size) -> None:  # type: ignore[no-untyped-def]
    # A tiny weight, a huge epoch_size: either shares within MAX_EPOCH_SIZE
    # whose order can be taken, or InvalidArgument, never a raw numeric error.
    weights = [10.0 ** exponent] + [1] * (len(sizes) - 1)
    try:
        shares = mix_shares(sizes, weights, epoch_size=epoch_size)
    except InvalidArgument as exc:
        assert "the mix's epoch has no items" in exc.message or "a mix allows" in exc.message \
            or "weight 0" in exc.message
        return
    assert 1 <= shares.epoch_size <= mixing.MAX_EPOCH_SIZE
    order = MixOrder(shares, seed=1, epoch=2, slots=3)
    src, _, _ = order.take(np.arange(min(order.n, 1000)))
    assert len(src) == min(order.n, 1000)


@pytest.mark.parametrize("weight", [True, "1", None, [1], complex(1, 0), np.bool_(True)])
def test_what_is_not_a_number_is_refused(weight) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidArgument, match="weights must be numbers"):
        mix_shares([3, 3], [weight, 1])
