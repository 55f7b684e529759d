"""Resuming an epoch: the re-split rule against a brute-force simulation
(hypothesis), and the state format, merging and refusals."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ucstage.errors import InvalidArgument, ResumeMismatch
from ucstage.resume import LoaderState, load_state, merge_states
from ucstage.sharding import Layout, ReadOrder, Segment, resume_slots, segment_runs
from ucstage.sharding.order import read_order
from ucstage.sharding.resplit import EpochOrder


def deal(items: list[int], slots: int, mode: str | None) -> list[tuple[list[int], list[int]]]:
    """The slot rule the naive way, on a plain list: per slot, (positions in
    ``items`` it reads, in order; how many of them are its real share)."""
    m = len(items)
    count = None if mode is None else (m // slots if mode == "drop" else -(-m // slots))
    out = []
    for t in range(slots):
        real = list(range(t, m, slots))
        if count is None:
            out.append((real, len(real)))
        else:
            out.append(([(t + i * slots) % max(m, 1) for i in range(count)] if m else [],
                        min(len(real), count)))
    return out


def simulate(n: int, order: list[int], layouts: list[tuple[int, int]], delivered: list[list[int]],
             mode: str | None) -> tuple[list[list[list[int]]], list[int]]:
    """Every segment's per-slot files, and the files delivered before the last.

    Segment 0 deals the read order; each later one deals the list of what was
    dealt before and not delivered, kept in its position order (one group)."""
    items = list(order)
    segments, before = [], []
    for j, (w, k) in enumerate(layouts):
        slots = w * max(1, k)
        dealt = deal(items, slots, mode)
        segments.append([[items[p] for p in pos] for pos, _ in dealt])
        if j == len(layouts) - 1:
            break
        left = []
        for t, (pos, real) in enumerate(dealt):
            d = delivered[j][t]
            before += [items[p] for p in pos[:d]]
            left += pos[d:real]
        items = [items[p] for p in sorted(left)]
    return segments, before


layout_st = st.tuples(st.integers(1, 4), st.integers(0, 3))


@settings(max_examples=250, deadline=None)
@given(n=st.integers(0, 90), shuffle=st.booleans(), seed=st.integers(0, 5),
       mode=st.sampled_from([None, "pad", "drop"]),
       layouts=st.lists(layout_st, min_size=2, max_size=4), data=st.data())
def test_resplit_matches_brute_force(n, shuffle, seed, mode, layouts, data) -> None:  # type: ignore[no-untyped-def]
    order = EpochOrder(n, shuffle=shuffle, seed=seed, epoch=2, equal_length=mode)
    base = list(read_order(n, shuffle=shuffle, seed=seed, epoch=2))
    segments: list[Segment] = []
    delivered: list[list[int]] = []
    for w, k in layouts[:-1]:
        runs = segment_runs(order, [*segments, Segment(Layout(w, k), (0,) * (w * max(1, k)))])[-1]
        counts = [data.draw(st.integers(0, len(r.files))) for r in runs]
        segments.append(Segment(Layout(w, k), tuple(counts)))
        delivered.append(counts)
    w, k = layouts[-1]
    target = Layout(w, k)
    expected, before = simulate(n, base, layouts, delivered, mode)
    chain, rest = resume_slots(order, segments, target)
    if (w, max(1, k)) == (layouts[-2][0], max(1, layouts[-2][1])):
        # Same layout as the last segment: every slot continues where it stopped.
        assert chain == segments
        runs = segment_runs(order, segments)[-1]
        assert [r.tolist() for r in rest] == [run.files[d:].tolist()
                                              for run, d in zip(runs, delivered[-1], strict=True)]
        return
    assert [r.tolist() for r in rest] == expected[-1]
    if mode is None:  # the interrupted epoch, across every run: each file exactly once
        got = Counter(before + [f for r in rest for f in r])
        assert got == Counter(range(n))


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 120), layouts=st.lists(layout_st, min_size=1, max_size=3),
       data=st.data())
def test_pad_reads_everything_and_every_slot_reads_the_same_count(n, layouts, data) -> None:  # type: ignore[no-untyped-def]
    order = EpochOrder(n, shuffle=True, seed=1, equal_length="pad")
    segments: list[Segment] = []
    before: list[int] = []
    for w, k in layouts:
        runs = segment_runs(order, [*segments, Segment(Layout(w, k), (0,) * (w * max(1, k)))])[-1]
        counts = tuple(data.draw(st.integers(0, len(r.files))) for r in runs)
        before += [int(f) for r, d in zip(runs, counts, strict=True) for f in r.files[:d]]
        segments.append(Segment(Layout(w, k), counts))
    chain, rest = resume_slots(order, segments, Layout(3, 1))
    if len(chain) > len(segments):
        assert len({len(r) for r in rest}) == 1
    assert set(before) | {int(f) for r in rest for f in r} == set(range(n))


def state(**over) -> dict:  # type: ignore[no-untyped-def]
    doc = LoaderState("ab" * 32,
                      ReadOrder(10, shuffle=True, seed=1, epoch=0, equal_length=None,
                                shuffle_scope="global"),
                      (Segment(Layout(2, 1), (3, None)),), rank=0).to_dict()
    doc.update(over)
    return doc


def test_merge_states_fills_each_slot_from_its_rank() -> None:
    other = state(rank=1)
    other["segments"][0]["delivered"] = [None, 2]
    merged = merge_states([state(), other])
    assert merged["rank"] is None and merged["segments"][0]["delivered"] == [3, 2]
    assert json.loads(json.dumps(merged)) == merged
    with pytest.raises(InvalidArgument, match="no state for rank 1"):
        merge_states([state()])
    with pytest.raises(InvalidArgument, match="different runs or epochs"):
        merge_states([state(), {**other, "epoch": 1}])
    clash = state(rank=1)
    clash["segments"][0]["delivered"] = [4, 2]
    with pytest.raises(InvalidArgument, match="disagree on slot 0:0"):
        merge_states([state(), clash])


def test_a_state_for_another_listing_or_seed_is_refused() -> None:
    parsed = LoaderState.from_dict(state())
    here = EpochOrder(10, shuffle=True, seed=1)  # a state without a scope: "global"
    parsed.check_fits("ab" * 32, here)
    with pytest.raises(ResumeMismatch, match="listing abababababab"):
        parsed.check_fits("cd" * 32, here)
    with pytest.raises(ResumeMismatch, match="seed 1 in the state, 2 here"):
        parsed.check_fits("ab" * 32, EpochOrder(10, shuffle=True, seed=2))
    with pytest.raises(InvalidArgument, match="not a ucstage loader state"):
        LoaderState.from_dict({"epoch": 1})


def test_counts_beyond_a_slot_are_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    doc = state(rank=None)
    doc["segments"][0]["delivered"] = [6, 1]  # slot 0:0 of 10 files over 2 slots reads 5
    path = tmp_path / "s.json"
    path.write_text(json.dumps(doc))
    parsed = load_state(path)
    with pytest.raises(InvalidArgument, match="slot 0:0 delivered 6 files but reads only 5"):
        resume_slots(parsed.order, parsed.segments, Layout(1, 0))


def _valid_state() -> dict:  # type: ignore[type-arg]
    doc = LoaderState("cd" * 32,
                      ReadOrder(12, shuffle=True, seed=3, epoch=2, equal_length=None,
                                shuffle_scope="global"),
                      (Segment(Layout(2, 1), (3, 2)), Segment(Layout(1, 2), (1, None))),
                      rank=0, unit="row-group", partial=((4, 7),)).to_dict()
    assert LoaderState.from_dict(doc).to_dict() == doc
    return doc


_NOT_INT = st.sampled_from(["3", 2.5, True, None, [1], {"a": 1}])
# field (as the message names it) -> how to break it in the state dict
_TAMPERS = {
    "files": (lambda d, v: d.update(files=v), _NOT_INT | st.integers(-10**6, -1)),
    "epoch": (lambda d, v: d.update(epoch=v), _NOT_INT | st.integers(-10**6, -1)),
    "seed": (lambda d, v: d.update(seed=v), _NOT_INT),
    "shuffle": (lambda d, v: d.update(shuffle=v), st.sampled_from(["false", "true", 0, 1, None])),
    "finished": (lambda d, v: d.update(finished=v),
                 st.sampled_from(["false", "true", 0, 1, None, "no"])),
    "rank": (lambda d, v: d.update(rank=v), _NOT_INT.filter(lambda v: v is not None)
             | st.integers(-5, -1) | st.integers(1, 9)),
    "fingerprint": (lambda d, v: d.update(fingerprint=v), st.sampled_from([None, 3, "", []])),
    "unit": (lambda d, v: d.update(unit=v), st.sampled_from(["files", 1, None, "row group"])),
    "equal_length": (lambda d, v: d.update(equal_length=v), st.sampled_from([1, True, [], "x"])),
    "shuffle_scope": (lambda d, v: d.update(shuffle_scope=v),
                      st.sampled_from([1, None, "nodes", "rank"])),
    "segments": (lambda d, v: d.update(segments=v), st.sampled_from([[], None, "x", {}])),
    "segments[1].world_size": (lambda d, v: d["segments"][1].update(world_size=v),
                               _NOT_INT | st.integers(-3, 0)),
    "segments[0].num_workers": (lambda d, v: d["segments"][0].update(num_workers=v),
                                _NOT_INT | st.integers(-3, -1)),
    "segments[0].nproc_per_node": (lambda d, v: d["segments"][0].update(nproc_per_node=v),
                                   _NOT_INT.filter(lambda v: v is not None)
                                   | st.integers(-3, 0)),
    "segments[0].delivered": (lambda d, v: d["segments"][0].update(delivered=v),
                              st.sampled_from([[1], [1, 2, 3], "12", None])),
    "segments[0].delivered[1]": (lambda d, v: d["segments"][0]["delivered"].__setitem__(1, v),
                                 _NOT_INT.filter(lambda v: v is not None)
                                 | st.integers(-10**6, -1)),
    "partial": (lambda d, v: d.update(partial=v),
                st.sampled_from(["x", {}, [[4, 7], [4, 2]], None])),
    "partial[0]": (lambda d, v: d["partial"].__setitem__(0, v),
                   st.sampled_from([[4], [4, 7, 1], 4, "47"])),
    "partial[0][0] (row group)": (lambda d, v: d["partial"][0].__setitem__(0, v),
                                  _NOT_INT | st.integers(-9, -1) | st.integers(12, 99)),
    "partial[0][1] (rows)": (lambda d, v: d["partial"][0].__setitem__(1, v),
                             _NOT_INT | st.integers(-9, 0)),
}


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(sorted(_TAMPERS)), data=st.data())
def test_a_tampered_state_is_refused_naming_its_field(field, data) -> None:  # type: ignore[no-untyped-def]
    # Issue 28: a negative count, a negative epoch, "finished": "false" (a
    # string, which bool() read as true) and the like were accepted or
    # refused with a message about something else.
    doc = _valid_state()
    tamper, values = _TAMPERS[field]
    value = data.draw(values)
    tamper(doc, value)
    with pytest.raises(InvalidArgument) as caught:
        LoaderState.from_dict(json.loads(json.dumps(doc)))
    message = caught.value.message
    assert message.startswith("state is malformed"), message
    if field in ("equal_length", "shuffle_scope") and isinstance(value, str):
        assert field in message, message  # ReadOrder names the value it refuses
    elif field == "segments[0].nproc_per_node" and isinstance(value, int) and value > 0:
        assert "segments[0]" in message, message  # not dividing world_size: Layout says so
    else:
        assert f'"{field}"' in message, message


def test_a_state_of_files_with_partial_rows_or_a_missing_field_is_refused() -> None:
    doc = _valid_state()
    doc["unit"] = "file"
    with pytest.raises(InvalidArgument, match='"partial" must be empty for unit "file"'):
        LoaderState.from_dict(doc)
    doc = _valid_state()
    del doc["seed"]
    with pytest.raises(InvalidArgument, match="state is malformed: it has no 'seed'"):
        LoaderState.from_dict(doc)
    parsed = LoaderState.from_dict(_valid_state())
    parsed.check_partial([10] * 12)
    parsed.check_partial([7] * 12)  # a group done but past the leading run: all its rows
    with pytest.raises(ResumeMismatch, match="7 rows of row group 4 were delivered, but it "
                                             "has 6"):
        parsed.check_partial([6] * 12)
