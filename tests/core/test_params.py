"""One rule for every parameter of a kind (ucstage/params.py): a single str
where names, globs or suffixes are expected is taken whole; whole numbers are
ints, never floats or bools; byte caps take the CLI's size strings. Each
refusal is an InvalidArgument naming the parameter, when the object is built."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.common.tables import table
from ucstage import params
from ucstage.errors import InvalidArgument
from ucstage.manifest.groups import Grouping
from ucstage.units import parse_size
from ucstage.volumes import list_files

text = st.text(max_size=12)
not_str = st.one_of(st.none(), st.integers(), st.floats(allow_nan=False), st.binary(max_size=4),
                    st.lists(st.text(max_size=3), max_size=2))


@given(text)
def test_a_single_str_is_one_item(value: str) -> None:
    assert params.strings(value, "include") == (value,)


@given(st.lists(text, max_size=6), st.sampled_from([list, tuple, iter]))
def test_an_iterable_of_str_is_kept_in_order(values: list[str], kind: Any) -> None:
    assert params.strings(kind(values), "exclude") == tuple(values)


@given(st.lists(text, max_size=4), not_str, st.data())
def test_an_item_that_is_not_a_str_is_refused_by_name_and_place(
        values: list[str], bad: Any, data: st.DataObject) -> None:
    at = data.draw(st.integers(0, len(values)))
    values = [*values[:at], bad, *values[at:]]
    with pytest.raises(InvalidArgument, match=rf"^require\[{at}\] must be a str, got "):
        params.strings(values, "require")


@pytest.mark.parametrize("value", [b"*.jpg", 3, 2.5, object()])
def test_a_value_that_is_neither_str_nor_iterable_of_str_is_refused(value: Any) -> None:
    with pytest.raises(InvalidArgument, match=r"^include must be a str or a list of str, got "):
        params.strings(value, "include")


def test_none_is_empty() -> None:
    assert params.strings(None, "include") == ()


@given(st.integers(-10, 10**12), st.integers(-3, 3))
def test_whole_numbers(value: int, minimum: int) -> None:
    if value >= minimum:
        assert params.whole(value, "batch_rows", minimum) == value
        assert params.whole(np.int64(value), "batch_rows", minimum) == value
    else:
        with pytest.raises(InvalidArgument, match=r"^batch_rows must be "):
            params.whole(value, "batch_rows", minimum)


@given(st.one_of(st.floats(), st.booleans(), st.text(max_size=4), st.none()))
def test_whole_refuses_what_is_not_an_int(value: Any) -> None:
    with pytest.raises(InvalidArgument, match=r"^batch_rows must be a whole number, got "):
        params.whole(value, "batch_rows", 1)


@given(st.integers(1, 10**6), st.sampled_from(["", "K", "M", "G", "KB", "MiB", "g"]))
def test_sizes_take_what_the_cli_takes(number: int, unit: str) -> None:
    assert params.size(f"{number}{unit}", "max_bytes") == parse_size(f"{number}{unit}")
    assert params.size(number, "max_bytes") == number


@pytest.mark.parametrize(("value", "message"), [
    ("lots", r"^max_bytes='lots' is not a size$"),
    (0, r"^max_bytes must be positive, got 0$"),
    ("0M", r"^max_bytes must be positive, got '0M'$"),
    (1.5e9, r"^max_bytes must be a number of bytes or a size such as '500M', got float"),
    (True, r"^max_bytes must be a number of bytes or a size such as '500M', got bool"),
])
def test_sizes_refused(value: Any, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        params.size(value, "max_bytes")


# -- the rule where users meet it -----------------------------------------------------


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    for name in ("a/1.jpg", "a/1.json", "b/2.jpg", "b/2.json", "c.tmp", "d.txt"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(name)
    return src


def test_a_str_glob_lists_what_a_one_glob_list_lists(folder: Path) -> None:
    for include, exclude in (("*.jpg", ()), ((), "*.tmp"), ("*.j*", "*.json")):
        as_list = list_files(str(folder), include=[include] if isinstance(include, str) else (),
                             exclude=[exclude] if isinstance(exclude, str) else ())
        as_str = list_files(str(folder), include=include, exclude=exclude)
        assert [e.path for e in as_str.entries] == [e.path for e in as_list.entries]
    assert [e.path for e in list_files(str(folder), include="*.jpg").entries] == [
        "a/1.jpg", "b/2.jpg"]


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["*.jpg", "*.json", "a/*", "*.t*", "nothing"]))
def test_volume_dataset_takes_a_str_pattern_whole(folder: Path, pattern: str) -> None:
    from ucstage import VolumeDataset

    ds = VolumeDataset(str(folder), include=pattern, exclude=pattern + "x")
    assert ds.include == (pattern,) and ds.exclude == (pattern + "x",)
    expected = list_files(str(folder), include=[pattern]).entries
    if expected:
        assert [e.path for e in ds.freeze().entries] == [e.path for e in expected]


def test_require_as_a_str_is_one_suffix(folder: Path) -> None:
    from ucstage import VolumeDataset

    ds = VolumeDataset(str(folder), group="key", require="jpg")
    assert Grouping("key", "jpg").require == ("jpg",)
    samples = ds.slot_entries(rank=0, world_size=1, num_workers=0, worker=0)
    # Not every sample dropped for lacking "j", "p" and "g".
    assert [[m.path for m in s.members] for s in samples] == [
        ["a/1.jpg", "a/1.json"], ["b/2.jpg", "b/2.json"]]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"include": [None]}, r"^include\[0\] must be a str, got NoneType None$"),
    ({"exclude": ["*.tmp", 3]}, r"^exclude\[1\] must be a str, got int 3$"),
    ({"group": "key", "require": [b"jpg"]}, r"^require\[0\] must be a str, got bytes"),
    ({"max_bytes": "a lot"}, r"^max_bytes='a lot' is not a size$"),
    ({"max_bytes": 2.5}, r"^max_bytes must be a number of bytes or a size"),
    ({"seed": 1.5}, r"^seed must be a whole number, got float 1.5$"),
])
def test_volume_dataset_refuses_wrong_types_when_built(folder: Path, kwargs: dict[str, Any],
                                                      message: str) -> None:
    from ucstage import VolumeDataset

    with pytest.raises(InvalidArgument, match=message):
        VolumeDataset(str(folder), **kwargs)


def test_max_bytes_takes_the_cli_size_strings(folder: Path, tmp_path: Path) -> None:
    from ucstage import LocalCache, VolumeDataset

    ds = VolumeDataset(str(folder), max_bytes="1G", cache_dir=tmp_path / "c")
    assert ds.cache().max_bytes == 1024**3
    assert LocalCache(tmp_path / "c2", max_bytes="500M").max_bytes == 500 * 1024**2


@pytest.fixture
def parquet_folder(tmp_path: Path) -> str:
    src = tmp_path / "t"
    src.mkdir()
    t = table(0, 30)
    t = t.set_column(0, "id", pa.array([None if i % 7 == 0 else i for i in range(30)],
                                       pa.int64()))
    pq.write_table(t, src / "a.parquet", row_group_size=10)
    return str(src)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"batch_rows": 2.5}, r"^batch_rows must be a whole number, got float 2.5$"),
    ({"batch_rows": True}, r"^batch_rows must be a whole number, got bool True$"),
    ({"read_ahead": "2"}, r"^read_ahead must be a whole number, got str '2'$"),
    ({"shuffle_window": 0}, r"^shuffle_window must be 1 or more, got 0$"),
    ({"columns": ["id", None]}, r"^columns\[1\] must be a str, got NoneType None$"),
    ({"max_bytes": [1]}, r"^max_bytes must be a number of bytes"),
    ({"fill_null": [0]}, r"^fill_null must be a number, bool or str, got list \[0\]$"),
])
def test_table_dataset_refuses_wrong_types_when_built(parquet_folder: str,
                                                     kwargs: dict[str, Any],
                                                     message: str) -> None:
    from ucstage import TableDataset

    with pytest.raises(InvalidArgument, match=message):
        TableDataset(parquet_folder, **kwargs)


def test_a_fill_null_a_column_cannot_hold_is_refused_before_the_first_batch(
        parquet_folder: str) -> None:
    from ucstage import TableDataset

    ds = TableDataset(parquet_folder, columns=["id"], format="numpy", fill_null="none")
    with pytest.raises(InvalidArgument, match=r"^fill_null='none' does not fit column 'id' "
                                              r"\(int64\)"):
        ds.freeze()
    ds = TableDataset(parquet_folder, columns=["id"], format="numpy", fill_null=2.5)
    with pytest.raises(InvalidArgument, match=r"^fill_null=2.5 does not fit column 'id'"):
        ds.freeze()
    ok = TableDataset(parquet_folder, columns="id", format="numpy", fill_null=-1)
    assert ok.columns == ["id"]
    got = np.concatenate([b["id"] for b in ok])
    assert sorted(got.tolist()) == sorted([-1 if i % 7 == 0 else i for i in range(30)])


def _volume(**kwargs: Any) -> Any:
    from ucstage import VolumeDataset

    return VolumeDataset("/nowhere", **kwargs)


def _table(**kwargs: Any) -> Any:
    from ucstage import TableDataset

    return TableDataset("/nowhere", **kwargs)


ENTRY_POINTS = {
    "VolumeDataset(include=)": lambda v: _volume(include=v).include,
    "VolumeDataset(exclude=)": lambda v: _volume(exclude=v).exclude,
    "VolumeDataset(require=)": lambda v: _volume(group="key", require=v)._grouping.require,
    "TableDataset(columns=)": lambda v: tuple(_table(columns=v).columns),
    "Grouping(require=)": lambda v: Grouping("key", v).require,
}
"""Every public parameter that takes several names, and how to read it back
(Mix's own parameters are checked by Mix)."""


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(ENTRY_POINTS)), st.text(min_size=1, max_size=10))
def test_every_entry_point_takes_a_str_whole(entry: str, value: str) -> None:
    assert ENTRY_POINTS[entry](value) == (value,)
    assert ENTRY_POINTS[entry]([value, value + "x"]) == (value, value + "x")
    with pytest.raises(InvalidArgument, match=r"\[1\] must be a str, got NoneType None$"):
        ENTRY_POINTS[entry]([value, None])


@given(st.sampled_from(["direct", "cold", "warm"]))
def test_bench_modes_take_one_mode_as_a_str(mode: str) -> None:
    from ucstage.bench.settings import check_modes

    assert check_modes(mode) == [mode]
