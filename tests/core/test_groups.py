"""Grouped samples in the core: keys, ordering, the Arrow manifest's sample
column, and the slot rule dealing samples (hypothesis against a brute-force model)."""

from __future__ import annotations

import itertools
from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ucstage.errors import GroupingError, InvalidArgument, ManifestError
from ucstage.manifest import Manifest, fingerprint, group_manifest, load, save
from ucstage.manifest.groups import Grouping, split_name
from ucstage.sharding import Layout, ReadOrder, slot_array
from ucstage.volumes import FileEntry


def manifest_of(paths: list[str], *, reverse: bool = False) -> Manifest:
    """A manifest of ``paths`` in listing (path) order, or reversed (as a JSON
    manifest written by hand may be: grouping then sorts)."""
    entries = [FileEntry(p, 10 + i, f"v{i}") for i, p in enumerate(sorted(paths))]
    if reverse:
        entries.reverse()
    return Manifest("/data", entries, fingerprint(entries))


def samples_of(m: Manifest) -> list[list[str]]:
    assert m.groups is not None
    off = m.groups.offsets.tolist()
    paths = m.paths()
    return [paths[a:b] for a, b in itertools.pairwise(off)]


def by_folder(path: str) -> str:
    return path.rsplit("/", 1)[0]


def test_key_is_the_path_up_to_the_first_dot_of_the_name() -> None:
    assert split_name("d.x/0001.seg.png") == ("d.x/0001", "seg.png")
    assert split_name("d/README") == ("d/README", "")
    assert split_name(".hidden") == ("", "hidden")


def test_path_order_does_not_keep_a_sample_together(tmp_path) -> None:  # type: ignore[no-untyped-def]
    grouped, found = group_manifest(manifest_of(["d/K.jpg", "d/K.jpgx/a.txt", "d/K.json"]),
                                    Grouping())
    assert samples_of(grouped) == [["d/K.jpg", "d/K.json"], ["d/K.jpgx/a.txt"]]
    assert found.order is not None
    path = str(tmp_path / "k.manifest.arrow")  # the reordered rows survive a full check
    save(grouped, path)
    assert samples_of(load(path)) == samples_of(grouped)
    # K-1 sorts before K by path ('-' < '.'), after it by key.
    again, _ = group_manifest(manifest_of(["K-1.jpg", "K.jpg", "K.json"]), Grouping())
    assert samples_of(again) == [["K.jpg", "K.json"], ["K-1.jpg"]]


def test_a_name_without_a_dot_is_its_own_sample() -> None:
    grouped, _ = group_manifest(manifest_of(["a", "a.txt", "b"]), Grouping())
    assert samples_of(grouped) == [["a", "a.txt"], ["b"]]


def test_two_members_with_one_suffix_name_both() -> None:
    with pytest.raises(GroupingError, match=r"x/1\.jpg and x/2\.jpg"):
        group_manifest(manifest_of(["x/1.jpg", "x/2.jpg"]), Grouping(by_folder))


def test_bad_grouping_arguments() -> None:
    for bad in ({"by": "name"}, {"by": 3}, {"require": ["jpg", 1]}, {"require": b"jpg"},
                {"on_incomplete": "skip"}):
        with pytest.raises(InvalidArgument):
            Grouping(**bad)  # type: ignore[arg-type]
    assert Grouping(require="jpg").require == ("jpg",)  # a str is one suffix (ucstage/params.py)


def test_require_drops_or_refuses_incomplete_samples() -> None:
    m = manifest_of(["a.jpg", "a.json", "b.jpg", "c.JSON", "c.jpg"])
    grouped, found = group_manifest(m, Grouping(require=("jpg", "json")))
    assert samples_of(grouped) == [["a.jpg", "a.json"]]
    assert grouped.groups is not None and grouped.groups.dropped == 2
    assert found.incomplete == [("b", ["json"]), ("c", ["json"])]  # case-sensitive
    with pytest.raises(GroupingError, match="2 samples lack"):
        group_manifest(m, Grouping(require=("jpg", "json"), on_incomplete="error"))


def test_the_arrow_manifest_keeps_the_boundaries_and_its_fingerprint_covers_them(tmp_path) -> None:  # type: ignore[no-untyped-def]
    m = manifest_of(["x/1.jpg", "x/1.json", "y/2.jpg", "y/2.json"])
    by_key, _ = group_manifest(m, Grouping())
    by_dir, _ = group_manifest(manifest_of(["x/1.jpg", "x/1.json", "y/2.jpg", "y/3.json"]),
                               Grouping(by_folder))
    path = str(tmp_path / "g.manifest.arrow")
    save(by_key, path)
    back = load(path)
    assert back.fingerprint == by_key.fingerprint != m.fingerprint
    assert back.groups is not None and back.groups.offsets.tolist() == [0, 2, 4]
    # The same rows grouped another way is another fingerprint.
    same_rows, _ = group_manifest(m, Grouping(lambda p: p[0]))
    assert same_rows.fingerprint != by_key.fingerprint
    assert by_dir.groups is not None and by_dir.groups.by.startswith("callable:")
    with pytest.raises(ManifestError, match="Arrow format only"):
        save(by_key, str(tmp_path / "g.manifest.json"))


def test_an_edited_sample_column_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import pyarrow as pa
    import pyarrow.ipc as ipc

    grouped, _ = group_manifest(manifest_of(["a.jpg", "a.json", "b.jpg"]), Grouping())
    path = str(tmp_path / "g.manifest.arrow")
    save(grouped, path)
    with pa.memory_map(path) as mm:
        table = ipc.open_file(mm).read_all()
    table = table.set_column(3, table.schema.field(3), pa.array([0, 1, 1], pa.int64()))
    with pa.OSFile(path, "wb") as sink, ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    with pytest.raises(ManifestError, match="grouping check"):
        load(path)


names = st.text(alphabet="ab.-/", min_size=1, max_size=7).filter(
    lambda s: not s.startswith("/") and not s.endswith("/") and "//" not in s)


@settings(max_examples=150, deadline=None)
@given(paths=st.lists(names, min_size=0, max_size=40, unique=True),
       world=st.integers(1, 3), workers=st.integers(0, 3), shuffle=st.booleans(),
       seed=st.integers(0, 5), reverse=st.booleans())
def test_grouped_slots_match_a_brute_force_model(paths, world, workers, shuffle, seed,  # type: ignore[no-untyped-def]
                                                 reverse) -> None:
    # A path can't be both a file and a folder in a listing.
    files = [p for p in paths if not any(q.startswith(p + "/") for q in paths)]
    m = manifest_of(files, reverse=reverse)
    # The model: a dict of key -> members sorted by suffix, samples sorted by key.
    model: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for p in files:
        key, suffix = split_name(p)
        model[key].append((suffix, p))
    if any(len({s for s, _ in v}) < len(v) for v in model.values()):  # "a" and "a."
        with pytest.raises(GroupingError):
            group_manifest(m, Grouping())
        return
    grouped, _ = group_manifest(m, Grouping())
    want = [[p for _, p in sorted(model[k])] for k in sorted(model)]
    assert samples_of(grouped) == want
    layout = Layout(world, workers)
    order = ReadOrder(len(want), shuffle, seed)
    seen: list[str] = []
    for slot_index in range(layout.slots):
        slot = layout.slot_at(slot_index)
        dealt = slot_array(order, layout, slot)
        if not shuffle:  # the rule: slot s reads positions s, s + slots, ...
            assert dealt.tolist() == list(range(slot_index, len(want), layout.slots))
        assert grouped.groups is not None
        rows = grouped.groups.rows(dealt).tolist()
        got = [grouped.paths([r])[0] for r in rows]
        sizes = {e.path: e.size for e in m.entries}  # each row keeps its own size and version
        assert [e.size for e in grouped.take(rows)] == [sizes[p] for p in got]
        assert got == [p for s in dealt.tolist() for p in want[s]]  # whole samples, in order
        seen += got
    assert sorted(seen) == sorted(files)  # every file once, no sample split over slots
